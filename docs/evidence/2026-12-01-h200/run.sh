#!/usr/bin/env bash
# The H200 runs behind this directory's README, one named step per argument:
#   RESULTS=/path/to/results bash run.sh OUT_DIR STEP...
# RESULTS (default OUT_DIR/results) should outlive OUT_DIR when a cut step is to be resumed by
# running it again (the run id is the step name); each step is capped at STEP_TIMEOUT seconds.
# Each step is one `cascade-repro matrix` (one engine start); its tables, reports and run.json are
# packed into OUT_DIR/STEP.tgz, its samples/*.jsonl (tens of MB of top-k logprobs, kept out of the
# repository) into OUT_DIR/STEP-samples.tgz, so the run can be rescored offline.
set -u
out=$1; shift
res=${RESULTS:-$out/results}
mkdir -p "$out" "$res"
export VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0
common=(matrix --engine vllm --tp 1 --limit 64 --max-tokens 128 --graphs-for-batches
        --engine-timeout 300 --quiet --results-dir "$res")
for step in "$@"; do
  case $step in
    fa3-ko-cal) args=(--fa-version 3 --batch 8,64,128 --system-prompt ko --calibrate default) ;;
    fa3-en)     args=(--fa-version 3 --batch 8,64,128 --system-prompt en) ;;
    fa3-b64)    args=(--fa-version 3 --batch 64 --system-prompt ko) ;;
    fa2-ko-cal) args=(--fa-version 2 --batch 8,64,128 --system-prompt ko --calibrate default) ;;
    fa2-en)     args=(--fa-version 2 --batch 8,64,128 --system-prompt en) ;;
    fa2-b64)    args=(--fa-version 2 --batch 64 --system-prompt ko) ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
  t0=$(date +%s)
  timeout "${STEP_TIMEOUT:-560}" cascade-repro "${common[@]}" "${args[@]}" --run-id "$step" > "$res/$step.stdout" 2>&1
  rc=$?
  echo "$step: exit $rc, wall $(( $(date +%s) - t0 )) s" | tee -a "$res/$step.stdout"
  tail -4 "$res/$step.stdout"
  d="$res/$step"
  tail -c 20000 "$d"/worker-*.log > "$d/worker.log.tail" 2>/dev/null
  tar czf "$out/$step.tgz" -C "$res" "$step.stdout" \
    $(cd "$res" && ls "$step"/{run.json,prompts.jsonl,cells.parquet,pairs.parquet,comparisons.parquet,report.md,summary.json,junit.xml,report.html,worker.log.tail} 2>/dev/null)
  tar czf "$out/$step-samples.tgz" -C "$res" "$step/samples"
  ls -la "$out"/$step*.tgz
done
