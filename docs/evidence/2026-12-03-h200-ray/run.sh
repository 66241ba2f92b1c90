#!/usr/bin/env bash
# The H200 run behind this directory's README (issue "More GPUs than one box"): the same TP 1 matrix
# through the local executor and through `--executor ray` (a local Ray on the one GPU), one after the
# other, then local again to bound what two local runs of it differ by. Each gets its own run id.
#   RES=/tmp/res bash run.sh OUT_DIR      (LOCAL2=0: skip the second local run)
set -u
out=$1
res=${RES:-/tmp/res}
mkdir -p "$out" "$res"
A=(matrix --engine vllm --tp 1 --batch 8,64 --limit 64 --max-tokens 128 --no-auto-controls --graphs-for-batches
   --fail-on never --quiet --results-dir "$res")
step() {  # name, args...
  local name=$1; shift
  local t0=$(date +%s.%N)
  timeout "${STEP_TIMEOUT:-240}" cascade-repro "${A[@]}" "$@" --run-id "$name" > "$res/$name.stdout" 2>&1
  echo "$name: exit $?, wall $(python3 -c "import time; print(round(time.time() - $t0, 1))") s" | tee -a "$out/all.log"
}
step local-1
step ray --executor ray
[ "${LOCAL2:-1}" = 1 ] && step local-2
python3 - "$res" <<'PY' | tee -a "$out/all.log"
import json, sys
import pandas as pd
res = sys.argv[1]
import os
runs = tuple(r for r in ("local-1", "ray", "local-2") if os.path.isfile(f"{res}/{r}/pairs.parquet"))
pairs = {r: pd.read_parquet(f"{res}/{r}/pairs.parquet")[["pair_id", "verdict", "ref_ratio", "n_diverged"]] for r in runs}
for r in runs:
    inv = json.load(open(f"{res}/{r}/run.json"))["invocations"][-1]
    print(r, "total_s", inv.get("total_s"), pairs[r].to_dict("records"))
print("ray verdicts == local-1:", pairs["ray"]["verdict"].tolist() == pairs["local-1"]["verdict"].tolist())
PY
small=()
for name in local-1 ray local-2; do
  small+=("$name.stdout" $(cd "$res" && ls "$name"/{run.json,cells.parquet,pairs.parquet,comparisons.parquet,report.md,summary.json,junit.xml} 2>/dev/null))
  tail -c 20000 "$res/$name"/worker-*.log > "$out/$name-worker.log.tail" 2>/dev/null
done
tar czf "$out/tables.tgz" -C "$res" "${small[@]}"
