#!/usr/bin/env bash
# The H200 runs behind this directory's README (vLLM 0.26.0, torch 2.11), one step per call:
#   RESULTS=/path/to/results bash run.sh OUT_DIR STEP [STEP...]
# Steps:
#   ab        benchmarks/bench_wave_ab.py: raw, harness and harness-without-GC waves interleaved in one
#             engine (FA3 default, 48 prompts x 128 tokens, b1/8/32/64)
#   mqa       the embedded model reshaped to MQA (9 query heads, 1 KV head; dummy weights), FA2,
#             cascade forced, b16/b64 x on/off with the planner's noise controls, 64 prompts x 64 tokens
#   gqa       the same with the model's own 9/3 heads (dummy weights): the control for mqa
#   kernel3   `kernel --fa-version 3` (bf16 and fp16), the full grid
#   kernel2   `kernel --fa-version 2` (bf16 and fp16), as far as MAX_S allows
# OUT_DIR gets STEP.log (the command's output with wall times) and STEP.tgz (tables, reports,
# run.json, wave records, worker log tails). A step cut by its timeout resumes when run again.
set -u
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

dummy_matrix() {  # dummy_matrix STEP [extra matrix flags...]
  local step=$1; shift
  timeout "${STEP_TIMEOUT:-400}" cascade-repro matrix --engine vllm --fa-version 2 --load-format dummy \
    --batch 16,64 --cascade on,off --force-cascade --max-tokens 64 --limit 64 --graphs-for-batches \
    --results-dir "$res" --run-id "$step" --fail-on never "$@" >> "$log" 2>&1
  echo "exit $?" >> "$log"; pack "$step" "$res/$step"
}

for step in "$@"; do
  log="$out/$step.log"
  t0=$(date +%s.%N)
  echo "step $step start $(date -u +%FT%TZ)" >> "$log"
  case $step in
    ab)
      timeout "${AB_TIMEOUT:-330}" python3 benchmarks/bench_wave_ab.py --out "$out/ab.json" \
        --budget-s "${AB_BUDGET:-300}" >> "$log" 2>&1
      echo "exit $?" >> "$log" ;;
    mqa) dummy_matrix mqa --hf-overrides '{"num_key_value_heads": 1}' ;;
    gqa) dummy_matrix gqa ;;
    kernel3|kernel2)
      timeout "${STEP_TIMEOUT:-560}" cascade-repro kernel --fa-version "${step#kernel}" --dtype bf16,fp16 \
        --max-seconds "${MAX_S:-400}" --out "$res/$step" >> "$log" 2>&1
      echo "exit $?" >> "$log"
      tar czf "$out/$step.tgz" -C "$res" "$step" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
  echo "step $step wall $(python3 -c "import time; print(round(time.time() - $t0, 1))") s" >> "$log"
  tail -30 "$log"
done
