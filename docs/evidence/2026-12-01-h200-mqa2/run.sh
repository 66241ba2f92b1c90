#!/usr/bin/env bash
# The H200 runs behind this directory's README (vLLM 0.26.0, torch 2.11), one step per call:
#   RESULTS=/path/to/results bash run.sh OUT_DIR STEP [STEP...]
# Steps:
#   ab        benchmarks/bench_wave_ab.py --ignore-eos: raw, harness and harness-without-GC waves
#             interleaved in one engine (FA3 default, 48 prompts x 128 tokens, b1/8/32/64, 4 waves)
#   abf       the same with --gc-freeze (worker.freeze_heap() after the engine start)
#   mqa       the embedded model with its 3 KV heads reduced to 1 (pool_kv_heads.py MODE), FA2,
#             cascade forced, b32/b128 x on/off with the planner's noise controls, 112 prompts x 64 tokens
#   gqa       the same matrix with the embedded model as it is (3 KV heads): the control for mqa
# OUT_DIR gets STEP.log (the command's output with wall times) and STEP.tgz (tables, reports,
# run.json, wave records, worker log tails). A step cut by its timeout resumes when run again.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=$1; shift
res=${RESULTS:-$out/results}
mkdir -p "$out" "$res"

pack() {  # pack STEP RUN_DIR: the run's small files and its wave/engine/cell records (no samples)
  local step=$1 d=$2
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
    $(cd "$(dirname "$d")" && ls "$(basename "$d")"/{run.json,cells.parquet,pairs.parquet,comparisons.parquet,report.md,summary.json,junit.xml,records.jsonl,worker.log.tail} 2>/dev/null)
}

for step in "$@"; do
  log="$out/$step.log"
  t0=$(date +%s.%N)
  echo "step $step start $(date -u +%FT%TZ)" >> "$log"
  case $step in
    ab|abf)
      extra=(); [ "$step" = abf ] && extra=(--gc-freeze)
      timeout "${AB_TIMEOUT:-420}" python3 benchmarks/bench_wave_ab.py --out "$out/$step.json" --ignore-eos \
        --waves 4 --budget-s "${AB_BUDGET:-340}" "${extra[@]}" >> "$log" 2>&1
      echo "exit $?" >> "$log" ;;
    mqa|gqa)
      model=embedded
      if [ "$step" = mqa ]; then
        model=${MQA_MODEL:-/tmp/mqa-model}
        [ -f "$model/config.json" ] || python3 "$here/pool_kv_heads.py" "${POOL_MODE:-0}" "$model" >> "$log" 2>&1
      fi
      timeout "${STEP_TIMEOUT:-540}" cascade-repro matrix --engine vllm --model "$model" --fa-version 2 \
        --batch 32,128 --cascade on,off --force-cascade --max-tokens 64 --limit 112 --graphs-for-batches \
        --results-dir "$res" --run-id "$step" --fail-on never >> "$log" 2>&1
      echo "exit $?" >> "$log"; pack "$step" "$res/$step" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
  echo "step $step wall $(python3 -c "import time; print(round(time.time() - $t0, 1))") s" >> "$log"
  tail -30 "$log"
done
