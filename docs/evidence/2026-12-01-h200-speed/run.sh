#!/usr/bin/env bash
# The H200 runs behind this directory's README (vLLM 0.26.0, torch 2.11), one step per call:
#   RESULTS=/path/to/results bash run.sh OUT_DIR STEP
# Steps:
#   cold      the README's GPU matrix (FA2 and FA3, TP 1, b1-128, 64 prompts x 128 tokens) as the first
#             engine work of a fresh machine: cold engine starts, FA2's driver JIT, waves, scoring
#   overhead  benchmarks/bench_vllm_overhead.py, this code and the session's starting commit
#             (BASELINE: a folder holding that commit's cascade_repro package) on one machine
#   sweep     `explain --measure` (vLLM #15647): cascade forced vs flat around the decode threshold
#   kernel2 / kernel2-inject   `kernel --fa-version 2` clean / with --inject lse-layout (bf16)
# OUT_DIR gets STEP.log (the command's output with wall times) and STEP.tgz (tables, reports,
# run.json, wave records, worker log tails). A step cut by STEP_TIMEOUT resumes when run again.
set -u
out=$1; step=$2
res=${RESULTS:-$out/results}
mkdir -p "$out" "$res"
log="$out/$step.log"

pack() {  # pack RUN_DIR: the run's small files and its wave/engine/cell records (no samples)
  local d=$1
  tail -c 40000 "$d"/worker-*.log > "$d/worker.log.tail" 2>/dev/null
  python3 - "$d" > "$d/records.jsonl" <<'PY'
import pathlib, sys
d = pathlib.Path(sys.argv[1])
for f in sorted((d / "samples").glob("*.jsonl")):
    for line in f.open(encoding="utf-8"):
        if not line.startswith('{"type":"sample"'):
            sys.stdout.write(line)
PY
  tar czf "$out/$step.tgz" -C "$(dirname "$d")" \
    $(cd "$(dirname "$d")" && ls "$(basename "$d")"/{run.json,cells.parquet,pairs.parquet,comparisons.parquet,report.md,summary.json,junit.xml,sweep.md,records.jsonl,worker.log.tail} 2>/dev/null)
}

t0=$(date +%s.%N)
echo "step $step start $(date -u +%FT%TZ)" > "$log"
case $step in
  cold)
    timeout "${STEP_TIMEOUT:-560}" cascade-repro matrix --engine vllm --batch 1,8,32,64,128 --fa-version 2,3 \
      --max-tokens 128 --limit 64 --graphs-for-batches --results-dir "$res" --run-id cold --fail-on never \
      >> "$log" 2>&1
    echo "exit $?" >> "$log"; pack "$res/cold" ;;
  overhead)
    timeout "${STEP_TIMEOUT:-570}" python3 benchmarks/bench_vllm_overhead.py \
      --out "$out/overhead.json" --baseline-src "${BASELINE:?}" --budget-s 550 --workdir "$res/overhead" \
      >> "$log" 2>&1
    echo "exit $?" >> "$log" ;;
  sweep)
    timeout "${STEP_TIMEOUT:-560}" cascade-repro explain --measure --limit 64 --results-dir "$res" \
      --run-id sweep >> "$log" 2>&1
    echo "exit $?" >> "$log"; pack "$res/sweep" ;;
  kernel2|kernel2-inject)
    extra=(); [ "$step" = kernel2-inject ] && extra=(--inject lse-layout)
    timeout "${STEP_TIMEOUT:-560}" cascade-repro kernel --fa-version 2 --dtype bf16 \
      --max-seconds "${MAX_S:-400}" --out "$res/$step" "${extra[@]}" >> "$log" 2>&1
    echo "exit $?" >> "$log"
    tar czf "$out/$step.tgz" -C "$res" "$step" ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
echo "step $step wall $(python3 -c "import time; print(round(time.time() - $t0, 1))") s" >> "$log"
tail -25 "$log"
