#!/usr/bin/env bash
# The H200 runs behind this directory's README: every single-GPU twin on vLLM 0.34.0 (torch 2.14.0,
# staged by scripts/vllm-0.34), the embedded model in bf16, a float32 reference. One matrix per twin,
# all started at once on the one GPU with a fixed KV cache each (-E kv_cache_memory_bytes=..., which skips
# vLLM's free-memory profiling that engines starting side by side would break), as
# docs/evidence/2026-12-03-h200-twins/run.sh did on 0.26.0. A step cut by STEP_TIMEOUT resumes when this
# runs again on the same warm machine (same --run-id, same RES).
#   bash scripts/vllm-0.34/device.sh && . /tmp/vllm-0.34/env.sh && RES=/tmp/res bash run.sh OUT_DIR
# Steps (64 Korean-system-prompt prompts, 128 tokens, batch 64, no flat-vs-flat controls: the reference judges):
#   prefix|chunked|async  their twin, eager, with --calibrate: the out-scale ladder on the test arm (positive control)
#   graphs fp8 triton flashinfer  their twin
#   batch             --twin batch=1:64
# misc.log: doctor, the README's first GPU command (cascade, the default twin, on a release without it),
# and explain --twin chunked-prefill.
# OUT_DIR gets tables.tgz (every step's run.json, tables, reports, logs' tails), records-1/2.tgz (samples
# and reference records, to rescore offline), misc.log and all.log.
set -u
out=$1
res=${RES:-/tmp/res}
mkdir -p "$out" "$res"
export VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0
common=(matrix --engine vllm --tp 1 --limit 64 --max-tokens 128 --system-prompt ko --no-auto-controls
        --gpu-memory-utilization 0.08 -E kv_cache_memory_bytes=6000000000 --engine-timeout 400
        --quiet --results-dir "$res")
step() {  # name, args...
  local name=$1; shift
  local t0=$(date +%s)
  timeout "${STEP_TIMEOUT:-540}" cascade-repro "${common[@]}" "$@" --run-id "$name" > "$res/$name.stdout" 2>&1
  echo "$name: exit $?, wall $(( $(date +%s) - t0 )) s" >> "$res/$name.stdout"
}
{
  python3 -c "import torch, vllm, flashinfer; print('torch', torch.__version__, 'vllm', vllm.__version__, 'flashinfer', flashinfer.__version__)"
  cascade-repro doctor; echo "doctor: exit $?"
  cascade-repro matrix --engine vllm --batch 1,8,32,64,128 --fa-version 2,3 --max-tokens 128 --dry-run
  echo "README's first GPU command (dry run): exit $?"
  cascade-repro explain --twin chunked-prefill --batch 8,64 --max-tokens 128; echo "explain: exit $?"
} > "$out/misc.log" 2>&1
cal=(--enforce-eager --calibrate 0.01,0.1,1)
step prefix --batch 64 --twin prefix-caching "${cal[@]}" &
step chunked --batch 64 --twin chunked-prefill "${cal[@]}" &
step async --batch 64 --twin async-scheduling "${cal[@]}" &
step graphs --batch 64 --twin cuda-graphs &
step fp8 --batch 64 --twin kv-cache-dtype=fp8 --graphs-for-batches &
step triton --batch 64 --twin attention-backend=FLASH_ATTN:TRITON_ATTN --graphs-for-batches &
step flashinfer --batch 64 --twin attention-backend=FLASH_ATTN:FLASHINFER --graphs-for-batches &
step batch --twin batch=1:64 --graphs-for-batches &
wait
names="prefix chunked async graphs fp8 triton flashinfer batch"
small=(); rec1=(); rec2=(); i=0
for name in $names; do
  d="$res/$name"
  [ -d "$d" ] || continue
  tail -c 20000 "$d"/worker-*.log > "$d/worker.log.tail" 2>/dev/null
  small+=("$name.stdout" $(cd "$res" && ls "$name"/{run.json,prompts.jsonl,cells.parquet,pairs.parquet,comparisons.parquet,report.md,summary.json,junit.xml,report.html,worker.log.tail,reference.log} 2>/dev/null))
  recs=$(cd "$res" && ls -d "$name"/samples "$name"/reference "$name"/probe 2>/dev/null)
  if [ $((i % 2)) = 0 ]; then rec1+=($recs); else rec2+=($recs); fi
  i=$((i + 1))
done
tar czf "$out/tables.tgz" -C "$res" "${small[@]}"
[ ${#rec1[@]} -gt 0 ] && tar czf "$out/records-1.tgz" -C "$res" "${rec1[@]}"
[ ${#rec2[@]} -gt 0 ] && tar czf "$out/records-2.tgz" -C "$res" "${rec2[@]}"
tail -n 3 "$res"/*.stdout | tee "$out/all.log"
