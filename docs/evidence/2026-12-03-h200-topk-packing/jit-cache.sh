#!/usr/bin/env bash
# Does FA2's first-start cost on a fresh machine (the CUDA driver JIT-compiling its sm_80 PTX for the
# H200) live in the driver's compute cache, and how large is that cache? One FA2 matrix at the README's
# batch sizes (short answers: the kernels, not the tokens, are the point), then the cache is brought
# back, split into pieces a call can return.
#   bash jit-cache.sh OUT
set -u
out=$1
mkdir -p "$out"
export CUDA_CACHE_MAXSIZE=4294967296   # the driver's default (256 MiB) could evict what this run compiles
cache=${CUDA_CACHE_PATH:-$HOME/.nv/ComputeCache}
du -sb "$cache" > "$out/cache-before.txt" 2>&1
t0=$(date +%s)
timeout "${BUDGET_S:-450}" cascade-repro matrix --engine vllm --tp 1 --limit 64 --max-tokens 32 --system-prompt ko \
  --batch 1,8,32,64 --fa-version 2 --quiet --results-dir /tmp/res --run-id jit-fa2 > "$out/jit-fa2.stdout" 2>&1
echo "jit-fa2: exit $?, wall $(( $(date +%s) - t0 )) s" >> "$out/jit-fa2.stdout"
grep -h "init engine\|torch.compile took\|Graph capturing" /tmp/res/jit-fa2/worker-*.log > "$out/engine-times.txt" 2>&1
{ du -sb "$cache"; find "$cache" -type f | wc -l; } > "$out/cache-after.txt" 2>&1
XZ_OPT=-T0 tar cJf /tmp/nvcache.txz -C "$(dirname "$cache")" "$(basename "$cache")"
ls -la /tmp/nvcache.txz >> "$out/cache-after.txt"
split -b 15000000 -d -a 1 /tmp/nvcache.txz "$out/nvcache.txz."
ls -la "$out"; cat "$out"/*.txt; tail -n 3 "$out/jit-fa2.stdout"
