#!/usr/bin/env bash
# The H200 runs behind this directory's README (vLLM 0.26.0, the embedded model in bf16, a float32
# reference, 64 prompts x 128 tokens behind the Korean system prompt). One phase per device call:
#   cal     the top-k verdict's evidence, side by side, untimed: lse-shift ladders on cascade (FA2 at
#           top-20, FA3 at top-5 and top-20, b8 and b64; the FA2 one also compiles FA2's JIT for the
#           later phases), the out-scale ladder on prefix-caching (top-20), and top-5 against top-20
#           throughput in one engine
#   readme  the README's GPU matrix (FA2 and FA3) with engine keys side by side, then one after another
#           (an untimed FA2 start first, which pays FA2's JIT on a fresh machine)
#   fa2     the FA2 ladder alone (cut in the cal phase by FA2's first-start compile)
#   twins   --twin all at b64 side by side, then the same twins one after another (--max-engines-per-gpu 1)
# A step cut at the call's deadline resumes when the phase runs again on the same warm machine
# (same --run-id, same RES).
#   RES=/tmp/res bash run.sh PHASE OUT_DIR
set -u
phase=$1; out=$2
res=${RES:-/tmp/res}
mkdir -p "$out" "$res"
deadline=$(( $(date +%s) + ${BUDGET_S:-540} ))   # the call's 600 s, less packing the results
common=(matrix --engine vllm --tp 1 --limit 64 --max-tokens 128 --system-prompt ko --quiet --results-dir "$res")
step() {  # name, args... ; its wall and exit code appended to RES/name.stdout
  local name=$1; shift
  [ -f "$res/$name.done" ] && return   # finished in an earlier call of this phase
  local left=$(( deadline - $(date +%s) ))
  # NEED_S: the least time left to start it (a timed step is not started where it would be cut)
  [ "$left" -gt "${NEED_S:-20}" ] || { echo "$name: not started, ${left} s left" >> "$res/$name.stdout"; return; }
  local t0=$(date +%s)
  timeout "$left" cascade-repro "${common[@]}" "$@" --run-id "$name" >> "$res/$name.stdout" 2>&1
  local rc=$?
  echo "$name: exit $rc, wall $(( $(date +%s) - t0 )) s" >> "$res/$name.stdout"
  [ "$rc" = 124 ] || touch "$res/$name.done"
}
pack() {  # tgz name, run ids...: each run's small files; records.tgz: samples and reference records
  local tgz=$1; shift
  local small=() recs=()
  for name in "$@"; do
    d="$res/$name"
    [ -d "$d" ] || continue
    tail -c 20000 "$d"/worker-*.log > "$d/worker.log.tail" 2>/dev/null
    small+=("$name.stdout" $(cd "$res" && ls "$name"/{run.json,prompts.jsonl,cells.parquet,pairs.parquet,comparisons.parquet,report.md,summary.json,junit.xml,report.html,worker.log.tail,reference.log} 2>/dev/null))
    recs+=($(cd "$res" && ls -d "$name"/samples "$name"/reference 2>/dev/null))
  done
  tar czf "$out/$tgz.tgz" -C "$res" "${small[@]}"
  # One records file per run: a call brings back at most 16 MB a file (the cal phase's came to 63 MB).
  # NO_RECORDS: the runs are compared on the machine instead
  [ -n "${NO_RECORDS:-}" ] || for name in "$@"; do
    [ -d "$res/$name/samples" ] && tar cJf "$out/$name-records.txz" -C "$res" "$name/samples" $(cd "$res" && ls -d "$name/reference" 2>/dev/null)
  done
  tail -n 2 "$res"/*.stdout > "$out/$tgz.log" 2>&1
}
case $phase in
cal)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.csv" 2>&1
  lse=(--enforce-eager --calibrate 0.003,0.01,0.03,0.1)
  step fa2-cal --batch 8,64 --fa-version 2 --topk 20 "${lse[@]}" &
  step fa3-cal --batch 8,64 --fa-version 3 "${lse[@]}" &
  step fa3-cal-k20 --batch 8,64 --fa-version 3 --topk 20 "${lse[@]}" &
  step prefix-cal --batch 8,64 --twin prefix-caching --topk 20 --enforce-eager --calibrate 0.002,0.005,0.01,0.03 &
  left=$(( deadline - $(date +%s) - 30 ))
  timeout "$left" python3 benchmarks/topk_throughput.py --engine vllm --limit 64 --batch 8,64 --max-tokens 128 \
    --ignore-eos --graphs-for-batches --fa-version 3 --gpu-memory-utilization 0.08 \
    --kv-cache-memory-bytes 6000000000 --budget-s $(( left - 120 )) --out "$out/topk.json" > "$res/topk.stdout" 2>&1
  echo "topk: exit $?" >> "$res/topk.stdout"
  wait
  pack cal fa2-cal fa3-cal fa3-cal-k20 prefix-cal topk
  ;;
fa2)
  # FA2 alone (its first start compiles for minutes on a fresh machine): the ladder and clean pairs.
  step fa2-cal --batch 8,64 --fa-version 2 --topk 20 --enforce-eager --calibrate 0.003,0.01,0.03,0.1
  pack fa2 fa2-cal
  ;;
readme)
  # FA2's first start on a fresh machine compiles its kernels for minutes (in its graph capture and its
  # first waves: jit-cache.sh): an untimed FA2 engine at the same batch sizes pays it first, so neither
  # timed run does. Side by side next: any other first compile it pays, the sequential run then finds
  # cached, so the ratio errs against side by side.
  step warm-fa2 --batch 1,8,32,64 --fa-version 2 --max-tokens 32
  m=(--batch 1,8,32,64,128 --fa-version 2,3)
  NEED_S=300 step readme-side "${m[@]}"
  NEED_S=480 step readme-seq "${m[@]}" --max-engines-per-gpu 1
  if [ -f "$res/readme-side.done" ] && [ -f "$res/readme-seq.done" ]; then
    python3 "$(dirname "$0")/same_samples.py" "$res/readme-side" "$res/readme-seq" > "$out/readme-same.json"
  fi
  pack readme readme-side readme-seq
  ;;
twins)
  # The side-by-side run only with the time to finish alone; the sequential one (~15 min) is cut at the
  # call's deadline and resumed by the next call (its wall: the sum of its invocations in run.json).
  NEED_S=300 step twins-side --twin all --batch 64 --no-auto-controls
  [ -f "$res/twins-side.done" ] && step twins-seq --twin all --batch 64 --no-auto-controls --max-engines-per-gpu 1
  if [ -f "$res/twins-side.done" ] && [ -f "$res/twins-seq.done" ]; then
    python3 "$(dirname "$0")/same_samples.py" "$res/twins-side" "$res/twins-seq" > "$out/twins-same.json"
  fi
  pack twins twins-side twins-seq
  ;;
*) echo "phase: cal, fa2, readme or twins" >&2; exit 2 ;;
esac
