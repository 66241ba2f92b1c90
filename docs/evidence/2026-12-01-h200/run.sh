#!/usr/bin/env bash
# The H200 runs behind this directory's README, one named step per argument:
#   bash run.sh OUT_DIR STEP...
# Each step is one `cascade-repro matrix` (one engine start); its tables, reports and run.json are
# packed into OUT_DIR/STEP.tgz, its samples/*.jsonl (tens of MB of top-k logprobs, kept out of the
# repository) into OUT_DIR/STEP-samples.tgz, so the run can be rescored offline.
set -u
out=$1; shift
mkdir -p "$out/results"
export VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0
common=(matrix --engine vllm --tp 1 --limit 64 --max-tokens 128 --graphs-for-batches
        --engine-timeout 300 --quiet --results-dir "$out/results")
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
  cascade-repro "${common[@]}" "${args[@]}" --run-id "$step" > "$out/results/$step.stdout" 2>&1
  rc=$?
  echo "$step: exit $rc, wall $(( $(date +%s) - t0 )) s" | tee -a "$out/results/$step.stdout"
  tail -4 "$out/results/$step.stdout"
  d="$out/results/$step"
  tail -c 20000 "$d"/worker-*.log > "$d/worker.log.tail" 2>/dev/null
  tar czf "$out/$step.tgz" -C "$out/results" "$step.stdout" \
    $(cd "$out/results" && ls "$step"/{run.json,prompts.jsonl,cells.parquet,pairs.parquet,comparisons.parquet,report.md,summary.json,junit.xml,report.html,worker.log.tail} 2>/dev/null)
  tar czf "$out/$step-samples.tgz" -C "$out/results" "$step/samples"
  ls -la "$out"/$step*.tgz
done
