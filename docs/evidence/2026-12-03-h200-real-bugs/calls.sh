#!/usr/bin/env bash
# One device call of the bad-release session; after the stacks are staged every call runs the same
# command, and each resumes the steps the one before cut (same RES, same warm machine):
#   bash scripts/old-vllm/device.sh && bash scripts/vllm-0.11/device.sh && RES=/tmp/res bash calls.sh OUT
# STEPS names the steps this session runs (default: field prefixneg flashinfer preempt penalties).
# It runs run.sh's "old" group, only the steps not yet finished (a step cut by STEP_TIMEOUT resumes),
# then brings back at most 8 files of at most 15 MB: one tgz of every step's small files, then the
# group's records in 15 MB pieces where they fit (cat OUT/*-records-old.tgz.* | tar xz).
set -u
out=$1
here=$(cd "$(dirname "$0")" && pwd)
res=${RES:-/tmp/res}
mkdir -p "$res" "$out"
t_end=$(( $(date +%s) + ${BUDGET_S:-535} ))
work=$(mktemp -d)
call=$(date +%H%M%S)

unfinished() {  # steps not run yet, or cut by their timeout
  for s in ${STEPS:-field prefixneg flashinfer preempt penalties}; do
    f=$res/$s.stdout
    last=$(tail -n 1 "$f" 2>/dev/null)
    case $last in
      *": skipped"*) ;;
      *": exit 124,"*|"") echo "$s" ;;
      *": exit "*) ;;
      *) echo "$s" ;;
    esac
  done
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$work/gpu.csv" 2>&1
steps=$(unfinished | tr '\n' ' ')
if [ -n "$steps" ]; then
  mkdir -p "$work/old"
  # shellcheck disable=SC2086
  STEP_TIMEOUT=$(( t_end - $(date +%s) - 75 )) RES=$res bash "$here/run.sh" "$work/old" old $steps \
    > "$work/old.out" 2>&1
fi

# Bring back: the records in pieces where they fit, then one tgz of everything else.
n=0; total=0
for f in "$work"/old/records-old.tgz; do
  [ -f "$f" ] || continue
  size=$(stat -c %s "$f")
  parts=$(( (size + 15000000 - 1) / 15000000 ))
  if [ $(( n + parts )) -le 7 ] && [ $(( total + size )) -le 60000000 ]; then
    split -b 15000000 -d -a 1 "$f" "$out/$call-records-old.tgz."
    n=$(( n + parts )); total=$(( total + size ))
  else
    echo "$(basename "$f") ($size bytes) left out: over what a call brings back" >> "$work/dropped.txt"
  fi
  rm -f "$f"
done
cp "$res"/*.stdout "$work/" 2>/dev/null
ls -la "$res" > "$work/res-listing.txt" 2>&1
tar czf "$out/$call-small.tgz" -C "$work" .
ls -la "$out"
tail -n 3 "$res"/*.stdout 2>/dev/null
