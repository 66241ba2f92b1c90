#!/usr/bin/env bash
# The H200 runs behind this directory's README, on vLLM 0.10.2 (scripts/old-vllm):
#   RESULTS=/path/to/results bash run.sh OUT_DIR STEP...
# Step "band": one matrix over FA2 and FA3 (one engine start each, FA2 first), run id "band". A
# call to the GPU machine lasts at most 10 minutes, so the step is cut by STEP_TIMEOUT (SIGTERM: the runner
# kills its workers' process groups) and resumed by running it again in the next call, with the
# same RESULTS; the report then puts FA2 and FA3 side by side.
# OUT_DIR gets, per step, STEP.tgz (tables, reports, run.json, worker log tail) and STEP-waves.json
# (every wave record: the probe's counts per wave, including FA2 split-path calls). Samples (top-k
# logprobs of every token, ~100 MB) stay in RESULTS.
set -u
out=$1; shift
res=${RESULTS:-$out/results}
mkdir -p "$out" "$res"
# Every request generates 1024 tokens (--ignore-eos), so a wave keeps its batch size in every decode
# step and each request's own part passes FA2's split thresholds (513 and 769 tokens at 48-64
# requests: see `cascade-repro explain --gpu H200 --batch 32,48,56,64,96 --max-tokens 1024`).
common=(matrix --engine vllm --tp 1 --limit 64 --max-tokens 1024 --ignore-eos --enforce-eager
        --batch 32,48,56,64,96 --system-prompt ko --engine-timeout 400 --quiet --results-dir "$res"
        --run-id band)
for step in "$@"; do
  case $step in
    band) args=(--fa-version 2,3) ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
  t0=$(date +%s)
  timeout "${STEP_TIMEOUT:-540}" cascade-repro "${common[@]}" "${args[@]}" > "$res/$step.stdout" 2>&1
  rc=$?
  echo "$step: exit $rc, wall $(( $(date +%s) - t0 )) s" | tee -a "$res/$step.stdout"
  tail -5 "$res/$step.stdout"
  d="$res/band"
  tail -c 30000 "$d"/worker-*.log > "$d/worker.log.tail" 2>/dev/null
  python - "$d" > "$out/$step-waves.json" <<'PY'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
waves = []
for f in sorted((d / "samples").glob("*.jsonl")):
    for line in f.open(encoding="utf-8"):
        if '"type": "wave"' in line or '"type":"wave"' in line:
            try:
                waves.append(json.loads(line))
            except ValueError:
                pass
print(json.dumps(waves, indent=1))
PY
  tar czf "$out/$step.tgz" -C "$res" "$step.stdout" \
    $(cd "$res" && ls band/{run.json,prompts.jsonl,cells.parquet,pairs.parquet,comparisons.parquet,report.md,summary.json,junit.xml,report.html,worker.log.tail} 2>/dev/null)
  ls -la "$out"/$step*
done
