#!/usr/bin/env bash
# The H200 runs behind docs/real-bugs.md: historical vLLM output bugs, each run with the tool's normal
# command line on the release that had it and on a release that does not.
#   RES=/tmp/res bash run.sh OUT_DIR GROUP [STEP...]
# GROUP "old": every bad-release matrix side by side on the one GPU, vLLM 0.10.2 (. /tmp/old-vllm/env.sh,
#   scripts/old-vllm) and 0.11.0 (. /tmp/vllm-0.11/env.sh, scripts/vllm-0.11) in one call: both stacks must
#   be installed first. GROUP "good": the same workloads on the image's vLLM (0.26.0), no staging.
# Steps (all of a group when none is named; each its own --run-id, so running the same command again in
# the next call, with the same RES, resumes every step where the last call's STEP_TIMEOUT cut it):
#   old:  field      0.10.2, FA2 vs FA3, cascade twin at b48/b56 (FA2's split band: regression predicted
#                    from step ~312) and b64 (no split below 769 own tokens: clean predicted), 384 tokens
#         prefixneg  0.10.2, --twin prefix-caching (negative control: the old "prefix caching changes
#                    outputs" reports were near-tie rounding: clean expected)
#         flashinfer 0.10.2, cascade twin on --backend FLASHINFER (0.10.2's FlashInfer backend runs its own
#                    cascade wrapper); skipped with a line when the stack has no flashinfer
#         preempt    0.11.0, --twin async-scheduling under a fixed 800-block KV cache (preemptions counted
#                    per wave: preempted_reqs in STEP-waves.json)
#         penalties  0.11.0, --twin async-scheduling with --sampling repetition_penalty=1.3
#         preempt-whole, penalties-whole: the same with a token budget that holds every prompt of the wave
#                    in one step (-E max_num_batched_tokens=131072): no running request is ever left out
#                    of a step by chunked prefill. On 0.11.0 preempt and penalties killed the async
#                    engine at its first steps (a device-side assert in a scatter/gather) while chunked
#                    prefill left running requests unscheduled, the case PR #27756 fixed after #26385.
#   good: field, preempt, penalties on the image's vLLM (0.26.0: FA2 has PR #87, async scheduling has
#         PRs #26385 and #26467/#27910; GOOD_VLLM names another version prefix); run ids end in -good
# Device time: "old" (estimated, not run yet) ~10 min, so STEP_TIMEOUT=540 cuts it once and a second
# identical call (~3-4 min) finishes the field matrix, every reference pass and the reports; FA2's first
# engine start on a fresh machine pays the driver's JIT of its sm_80 PTX (~3-5 min; FA3 ~1 min), every
# other engine start ~1-3 min. "good" (measured, side by side with an FA2 ladder on one H200): preempt-good
# 173 s and penalties-good 164 s; field-good cut at 468 s in FA2's first compile (1 of 6 cells done),
# then 220 s on resume.
# Every engine gets a fixed KV cache (-E kv_cache_memory_bytes=...): vLLM then skips its free-memory
# profiling, which engines starting side by side would break. One KV block of the embedded model is
# 30 layers x K,V x 16 tokens x 3 KV heads x 64 x 2 bytes = 368,640 bytes: 2,000,000,000 bytes hold
# 5,425 blocks (86,800 tokens), 294,912,000 bytes 800 blocks (12,800 tokens).
# OUT_DIR gets per step STEP.tgz (tables, reports, run.json, worker log tails) and STEP-waves.json (every
# wave record: cascade and FA2 split-path calls, preempted requests); records.tgz holds the samples and
# reference records of the whole group (to rescore offline); GROUP.log the exit codes and wall times.
set -u
out=$1; group=$2; shift 2
res=${RES:-/tmp/res}
mkdir -p "$out" "$res"
export VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0
KV_BIG=2000000000      # 5,425 blocks: no request ever waits for KV
KV_TIGHT=294912000     # 800 blocks: 64 requests of ~1,700 prompt tokens (1,584 shared) growing by 256 do not fit
common=(matrix --engine vllm --tp 1 --limit 64 --system-prompt ko --gpu-memory-utilization 0.08
        --engine-timeout 400 --quiet --results-dir "$res")
field=(--batch 48,56,64 --max-tokens 384 --ignore-eos --enforce-eager -E kv_cache_memory_bytes=$KV_BIG)
WHOLE="-E max_num_batched_tokens=131072"   # 64 prompts of <= 1,700 tokens in one step
asyncs=(--twin async-scheduling --batch 64 --max-tokens 256 --ignore-eos --enforce-eager --no-auto-controls)

env_of() {  # the stack a step runs on: old (0.10.2), new (0.11.0), image (whatever the image has)
  case $1 in
    old) echo /tmp/old-vllm/env.sh ;;
    new) echo /tmp/vllm-0.11/env.sh ;;
    *) echo "" ;;
  esac
}

step() {  # name, stack, expected vLLM version prefix, args...
  local name=$1 stack=$2 want=$3; shift 3
  local envf; envf=$(env_of "$stack")
  local t0; t0=$(date +%s)
  (
    if [ -n "$envf" ]; then
      [ -f "$envf" ] || { echo "$name: $envf missing: stage the $stack stack first"; exit 3; }
      . "$envf"
    fi
    got=$(python3 -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null)
    case $got in "$want"*) ;; *) echo "$name: vLLM $got here, the step wants $want"; exit 3 ;; esac
    exec timeout "${STEP_TIMEOUT:-540}" cascade-repro "${common[@]}" "$@" --run-id "$name"
  ) >> "$res/$name.stdout" 2>&1   # appended: a resumed step keeps the cut call's lines
  echo "$name: exit $?, wall $(( $(date +%s) - t0 )) s" >> "$res/$name.stdout"
}

has_flashinfer() {
  ( . "$(env_of old)" && python3 -c 'import flashinfer' ) > /dev/null 2>&1
}

case $group in
  old) all="field prefixneg flashinfer preempt penalties preempt-whole penalties-whole" ;;
  good) all="field-good preempt-good penalties-good" ;;
  *) echo "unknown group $group (old or good)" >&2; exit 2 ;;
esac
steps=${*:-$all}
for s in $steps; do
  case $s in
    field) step field old 0.10.2 "${field[@]}" --fa-version 2,3 & ;;
    prefixneg) step prefixneg old 0.10.2 --twin prefix-caching --batch 64 --max-tokens 128 --enforce-eager \
                 --no-auto-controls -E kv_cache_memory_bytes=$KV_BIG & ;;
    flashinfer)
      if has_flashinfer; then
        step flashinfer old 0.10.2 --backend FLASHINFER --batch 64 --max-tokens 256 --ignore-eos --enforce-eager \
          -E kv_cache_memory_bytes=$KV_BIG &
      else
        echo "flashinfer: skipped: the 0.10.2 stack has no flashinfer (docs/real-bugs.md says what it needs)" \
          > "$res/flashinfer.stdout"
      fi ;;
    preempt) step preempt new 0.11.0 "${asyncs[@]}" -E kv_cache_memory_bytes=$KV_TIGHT & ;;
    penalties) step penalties new 0.11.0 "${asyncs[@]}" --sampling repetition_penalty=1.3 \
                 -E kv_cache_memory_bytes=$KV_BIG & ;;
    preempt-whole) step preempt-whole new 0.11.0 "${asyncs[@]}" -E kv_cache_memory_bytes=$KV_TIGHT $WHOLE & ;;
    penalties-whole) step penalties-whole new 0.11.0 "${asyncs[@]}" --sampling repetition_penalty=1.3 \
                       -E kv_cache_memory_bytes=$KV_BIG $WHOLE & ;;
    field-good) step field-good image "${GOOD_VLLM:-0.26}" "${field[@]}" --fa-version 2 & ;;
    preempt-good) step preempt-good image "${GOOD_VLLM:-0.26}" "${asyncs[@]}" -E kv_cache_memory_bytes=$KV_TIGHT & ;;
    penalties-good) step penalties-good image "${GOOD_VLLM:-0.26}" "${asyncs[@]}" --sampling repetition_penalty=1.3 \
                      -E kv_cache_memory_bytes=$KV_BIG & ;;
    *) echo "unknown step $s" >&2; exit 2 ;;
  esac
  sleep "${STAGGER_S:-5}"   # engine starts a few seconds apart: less contention for the CPU cores
done
wait

recs=()
for s in $steps; do
  d="$res/$s"
  if [ -d "$d" ]; then
    tail -c 20000 "$d"/worker-*.log > "$d/worker.log.tail" 2>/dev/null
    # The whole log of an engine that died: its first lines hold vLLM's dump of the failing step.
    for w in "$d"/worker-*.log; do
      grep -q "EngineCore encountered" "$w" 2>/dev/null && gzip -c "$w" > "$d/$(basename "$w").dead.gz"
    done
    python3 - "$d" > "$out/$s-waves.json" <<'PY'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
waves = []
for f in sorted((d / "samples").glob("*.jsonl")):
    for line in f.open(encoding="utf-8"):
        if line.startswith('{"type": "wave"') or line.startswith('{"type":"wave"'):
            try:
                waves.append(json.loads(line))
            except ValueError:
                pass
print(json.dumps(waves, indent=1))
PY
    tar czf "$out/$s.tgz" -C "$res" "$s.stdout" $(cd "$res" && ls "$s"/{run.json,prompts.jsonl,cells.parquet,pairs.parquet,comparisons.parquet,report.md,summary.json,junit.xml,report.html,worker.log.tail,reference.log,*.dead.gz} 2>/dev/null)
    recs+=($(cd "$res" && ls -d "$s"/samples "$s"/reference 2>/dev/null))
  elif [ -f "$res/$s.stdout" ]; then
    cp "$res/$s.stdout" "$out/$s.stdout"
  fi
done
[ ${#recs[@]} -gt 0 ] && tar czf "$out/records-$group.tgz" -C "$res" "${recs[@]}"
for s in $steps; do tail -n 3 "$res/$s.stdout" 2>/dev/null; done | tee -a "$out/$group.log"
ls -la "$out" | tee -a "$out/$group.log"
