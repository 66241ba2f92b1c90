#!/usr/bin/env bash
# One device call of the second 0.26.0 session; every call runs this same command, and each resumes
# what the one before cut (same RES, same warm machine):
#   A  run.sh fa2 (the FA2 ladder and clean pairs) beside ../2026-12-03-h200-real-bugs/run.sh good (the
#      real bugs' workloads on a good release): untimed work, side by side, FA2's first compile paid once
#   B  run.sh readme: the README matrix side by side, then one after another, each started only when the
#      call has the time to finish it alone on the GPU (its wall time is the measurement)
#   C  run.sh twins: --twin all side by side (started only with the time to finish), then one engine at a
#      time (cut and resumed across calls)
# PHASES names the ones to run, in this order (default "A B", the second 0.26.0 session's; the third
# ran PHASES=B: its A had run).
# Then OUT gets at most 8 files of at most 15 MB: the small files of every step in one tgz, the records
# of A where they fit (B's are compared on the machine: readme-same.json), and the timed runs of B and C
# whole (their samples included: resume.txz.N), so a run cut by the loss of the machine resumes on the
# next one: unpack them into results/resume/ and carry that folder (SEED), which seeds RES where RES
# lacks a run (a fresh machine).
#   RES=/tmp/res bash calls.sh OUT
set -u
out=$1
here=$(cd "$(dirname "$0")" && pwd)
bugs=$here/../2026-12-03-h200-real-bugs
res=${RES:-/tmp/res}
mkdir -p "$res" "$out"
t_end=$(( $(date +%s) + ${BUDGET_S:-535} ))
left() { echo $(( t_end - $(date +%s) )); }
work=$(mktemp -d)
call=$(date +%H%M%S)
phases=" ${PHASES:-A B} "
has() { case $phases in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

unfinished_good() {  # the good group's steps not run yet or cut by their timeout
  for s in field-good preempt-good penalties-good; do
    f=$res/bugs/$s.stdout
    if [ ! -f "$f" ] || ! tail -n 1 "$f" | grep -q ": exit " || tail -n 1 "$f" | grep -q ": exit 124,"; then
      echo "$s"
    fi
  done
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$work/gpu.csv" 2>&1
timed="readme-side readme-seq twins-side twins-seq"   # what a fresh machine resumes (never a warm-up)
seed=${SEED:-results/resume}
for name in $timed; do
  if [ -d "$seed/$name" ] && [ ! -e "$res/$name" ]; then
    cp -r "$seed/$name" "$res/" && cp "$seed/$name".stdout "$seed/$name".done "$res/" 2>/dev/null
    echo "$name: seeded from an earlier machine's copy" >> "$res/$name.stdout"
  fi
done
good=$(has A && unfinished_good | tr '\n' ' ')
a_done() { ! has A || { [ -f "$res/fa2-cal.done" ] && [ -z "$(unfinished_good)" ]; }; }
if has A && { [ ! -f "$res/fa2-cal.done" ] || [ -n "$good" ]; }; then
  if [ ! -f "$res/fa2-cal.done" ]; then
    mkdir -p "$work/fa2"
    RES=$res BUDGET_S=$(( $(left) - 45 )) bash "$here/run.sh" fa2 "$work/fa2" > "$work/fa2.out" 2>&1 &
  fi
  if [ -n "$good" ]; then
    mkdir -p "$work/good" "$res/bugs"
    # shellcheck disable=SC2086
    RES=$res/bugs STEP_TIMEOUT=$(( $(left) - 70 )) bash "$bugs/run.sh" "$work/good" good $good > "$work/good.out" 2>&1 &
  fi
  wait
fi
if has B && a_done && [ ! -f "$res/readme.brought" ]; then
  mkdir -p "$work/readme"
  NO_RECORDS=1 RES=$res BUDGET_S=$(( $(left) - 30 )) bash "$here/run.sh" readme "$work/readme" > "$work/readme.out" 2>&1
  rm -f "$work"/readme/*-records.txz
  [ -f "$work/readme/readme-same.json" ] && touch "$res/readme.brought"
fi
if has C && a_done && { ! has B || [ -f "$res/readme.brought" ]; } && [ ! -f "$res/twins.brought" ]; then
  mkdir -p "$work/twins"
  NO_RECORDS=1 RES=$res BUDGET_S=$(( $(left) - 30 )) bash "$here/run.sh" twins "$work/twins" > "$work/twins.out" 2>&1
  [ -f "$work/twins/twins-same.json" ] && touch "$res/twins.brought"
fi

# The timed runs whole (worker logs out: their tails are in the small tgz).
keep=()
for name in $timed; do
  [ -d "$res/$name" ] || continue
  keep+=("$name")
  for f in "$name.stdout" "$name.done"; do [ -f "$res/$f" ] && keep+=("$f"); done
done
[ ${#keep[@]} -gt 0 ] && XZ_OPT=-T0 tar cJf "$work/resume.txz" --exclude='worker-*.log' -C "$res" "${keep[@]}"
# Bring back: the records first where they fit, then the timed runs, then one tgz of everything else.
n=0; total=0; dropped=()
for f in "$work"/fa2/fa2-cal-records.txz "$work"/good/records-good.tgz "$work"/resume.txz; do
  [ -f "$f" ] || continue
  size=$(stat -c %s "$f")
  parts=$(( (size + 15000000 - 1) / 15000000 ))
  if [ $(( n + parts )) -le 7 ] && [ $(( total + size )) -le 60000000 ]; then
    split -b 15000000 -d -a 1 "$f" "$out/$call-$(basename "$f")."
    n=$(( n + parts )); total=$(( total + size ))
  else
    dropped+=("$(basename "$f") ($size bytes)")
  fi
  rm -f "$f"
done
printf '%s\n' "${dropped[@]}" > "$work/dropped.txt"
ls -la "$res" "$res/bugs" > "$work/res-listing.txt" 2>&1
tar czf "$out/$call-small.tgz" -C "$work" .
ls -la "$out"
cat "$work"/*.out 2>/dev/null | tail -n 40
tail -n 2 "$res"/*.stdout "$res"/bugs/*.stdout 2>/dev/null
