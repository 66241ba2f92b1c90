#!/usr/bin/env bash
# The H200 runs behind this directory's README (vLLM 0.26.0, the embedded model in bf16, a float32
# reference), all in one call: every matrix runs as its own process, side by side on the one GPU, so
# the whole set fits one 10-minute call. Each engine gets a fixed 8 GB KV cache
# (-E kv_cache_memory_bytes=...), which skips vLLM's free-memory profiling: five engines starting and
# ending at once on one GPU would break each other's profiling ("Error in memory profiling"). A step cut by
# STEP_TIMEOUT is resumed by running this again on the same warm machine (same --run-id, same RES).
#   RES=/tmp/res bash run.sh OUT_DIR
# Steps:
#   readme-s1/-s2  the README's GPU matrix (--batch 1,8,32,64,128 --fa-version 2,3 --max-tokens 128),
#                  as its two shards (one engine key each: FA2, FA3), merged into readme/
#   fa3-cal fa2-cal  --calibrate default at b8/64/128, 64 prompts (the detection power)
#   fa3-mid          --inject lse-shift=0.1@48 at b8/64/128, 64 prompts (a fault that begins mid-answer)
# OUT_DIR gets tables.tgz (every step's run.json, tables, reports, logs' tails), per step
# STEP-records.tgz (its samples and reference records, to rescore offline) and all.log.
set -u
out=$1
res=${RES:-/tmp/res}
mkdir -p "$out" "$res"
export VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0
common=(matrix --engine vllm --tp 1 --max-tokens 128 --gpu-memory-utilization 0.12 -E kv_cache_memory_bytes=8000000000 --engine-timeout 400
        --quiet --results-dir "$res")
cal=(--limit 64 --batch 8,64,128 --graphs-for-batches)
step() {  # name, args...
  local name=$1; shift
  local t0=$(date +%s)
  timeout "${STEP_TIMEOUT:-540}" cascade-repro "${common[@]}" "$@" --run-id "$name" > "$res/$name.stdout" 2>&1
  echo "$name: exit $?, wall $(( $(date +%s) - t0 )) s" >> "$res/$name.stdout"
}
step readme-s1 --batch 1,8,32,64,128 --fa-version 2,3 --shard 1/2 &
step readme-s2 --batch 1,8,32,64,128 --fa-version 2,3 --shard 2/2 &
step fa3-cal "${cal[@]}" --fa-version 3 --calibrate default &
step fa2-cal "${cal[@]}" --fa-version 2 --calibrate default &
step fa3-mid "${cal[@]}" --fa-version 3 --inject lse-shift=0.1@48 &
wait
t0=$(date +%s)
cascade-repro merge "$res/readme" "$res/readme-s1" "$res/readme-s2" > "$res/readme.stdout" 2>&1
echo "readme (merge): exit $?, wall $(( $(date +%s) - t0 )) s" >> "$res/readme.stdout"
names="readme-s1 readme-s2 readme fa3-cal fa2-cal fa3-mid"
small=()
for name in $names; do
  d="$res/$name"
  [ -d "$d" ] || continue
  tail -c 20000 "$d"/worker-*.log > "$d/worker.log.tail" 2>/dev/null
  small+=("$name.stdout" $(cd "$res" && ls "$name"/{run.json,prompts.jsonl,cells.parquet,pairs.parquet,comparisons.parquet,report.md,summary.json,junit.xml,report.html,worker.log.tail,reference.log} 2>/dev/null))
  # samples and reference records, so the runs can be rescored offline (merged readme: the shards')
  [ "$name" = readme ] || tar czf "$out/$name-records.tgz" -C "$res" $(cd "$res" && ls -d "$name"/samples "$name"/reference 2>/dev/null)
done
tar czf "$out/tables.tgz" -C "$res" "${small[@]}"
tail -n 3 "$res"/*.stdout | tee "$out/all.log"
du -sh "$res"/*/samples "$res"/*/reference 2>/dev/null | tee -a "$out/all.log"
ls -la "$out" | tee -a "$out/all.log"
