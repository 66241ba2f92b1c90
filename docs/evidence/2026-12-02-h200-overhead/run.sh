#!/usr/bin/env bash
# The H200 runs behind this directory's README (vLLM 0.26.0, torch 2.11), one step per call:
#   bash run.sh OUT_DIR STEP [STEP...]
# Steps:
#   ab*   benchmarks/bench_wave_ab.py --ignore-eos --gc-freeze with the arms ab1-ab3 had (raw,
#         harness, harness-fg, raw-nested, harness-nested; the worker did not hold then, as now),
#         interleaved in one engine: FA3 default, 48 prompts x 128 tokens, b1/8/32/64, 4 waves per
#         batch size and round, 6 rounds (the first is warm-up)
#         (these runs had the arms in plain rotation; the benchmark now also runs the reversed
#         rotations, bench_wave_ab.arm_orders)
#   hold* the same with raw, harness, harness-hold, harness-defer and harness-loop, 6 rounds: does
#         the writer's hold pay on the GPU, would the conversion on the writer's thread, and what did
#         the whole-list conversion of flat logprobs take off? (hold1 ran it when the worker held its
#         records: its "harness" is today's harness-hold, its "harness-nohold" today's harness)
#   detok* raw, harness, raw-detok and harness-detok, 6 rounds: what vLLM's own detokenization (the
#         text and a string per logprob token, in the LLM process) costs a wave, now that the engine
#         asks for detokenize=False and decodes each completion once (detok1's harness arms held)
#   hn*   raw, harness and harness-hold, 8 rounds: the hold against none, with more waves per arm
#         (hn1 and hn2 ran as raw,harness,harness-nohold with the names of hold1)
# OUT_DIR gets STEP.log (the command's output with wall times) and STEP.json (every wave of every arm).
set -u
out=$1; shift
mkdir -p "$out"
for step in "$@"; do
  log="$out/$step.log"
  t0=$(date +%s.%N)
  echo "step $step start $(date -u +%FT%TZ)" >> "$log"
  case $step in
    ab*|hold*|detok*|hn*)
      if [ "${step#hold}" != "$step" ]; then arms=raw,harness,harness-hold,harness-defer,harness-loop; rounds=${AB_ROUNDS:-6}
      elif [ "${step#detok}" != "$step" ]; then arms=raw,harness,raw-detok,harness-detok; rounds=${AB_ROUNDS:-6}
      elif [ "${step#hn}" != "$step" ]; then arms=raw,harness,harness-hold; rounds=${AB_ROUNDS:-8}
      else arms=raw,harness-nohold,harness-fg,raw-nested,harness-nested; rounds=${AB_ROUNDS:-6}; fi
      timeout "${AB_TIMEOUT:-570}" python3 benchmarks/bench_wave_ab.py --out "$out/$step.json" --ignore-eos \
        --gc-freeze --arms "$arms" --waves 4 --rounds "$rounds" --budget-s "${AB_BUDGET:-500}" >> "$log" 2>&1
      echo "exit $?" >> "$log" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
  echo "step $step wall $(python3 -c "import time; print(round(time.time() - $t0, 1))") s" >> "$log"
  grep -v -E "INFO|WARNING|reset prefix cache" "$log" | tail -40
done
