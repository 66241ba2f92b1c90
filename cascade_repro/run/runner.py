"""Run a matrix's workers: one per engine key, one after another or side by side through
``run/pool.py`` where the packing allows, their progress and timeouts (``execute``); then the
reference pass (``start``, then ``run_workers`` under the lock ``pipeline`` holds).

Preparing the run is ``run/preparation.py``'s, launching the reference pass
``run/reference_launch.py``'s; their public names are importable from here too. Scoring and
reporting sit above the stages, in ``pipeline``: it holds the run's lock around :func:`run_workers`
and the scoring that follows."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from cascade_repro.engines import get as engine_info
from cascade_repro.errors import UsageError
from cascade_repro.plan import cuda_cache
from cascade_repro.plan import gpus as gpu_inventory
from cascade_repro.plan import packing as packings
from cascade_repro.plan.matrix import MatrixSpec, spec_of
from cascade_repro.plan.shard import restrict
from cascade_repro.run import pool, supervise
from cascade_repro.run.preparation import (
    EXECUTORS,
    MAX_RUN_ID,
    STACK_KEYS,
    Executor,
    PreparedRun,
    RunSetup,
    check_run_id,
    context_limit_of,
    default_run_id,
    machine_gpus,
    packing_of,
    prepare,
    resumed_run,
    stack_of,
    visible_gpus,
)
from cascade_repro.run.preparation import markup_escaped as _escape
from cascade_repro.run.reference_launch import (
    arm_dtypes,
    merged_reference,
    planned_dtypes,
    quick_run_seconds,
    reference_cost,
    run_reference,
)
from cascade_repro.rundir import codec, jsonl, layout, manifest, sample_scan
from cascade_repro.rundir.manifest import (
    Invocation,
    Manifest,
    Timings,
)

__all__ = [
    "EXECUTORS",
    "MAX_RUN_ID",
    "STACK_KEYS",
    "Executor",
    "PreparedRun",
    "RunSetup",
    "arm_dtypes",
    "cells_done",
    "check_run_id",
    "context_limit_of",
    "default_run_id",
    "execute",
    "machine_gpus",
    "merged_reference",
    "packing_of",
    "planned_dtypes",
    "prepare",
    "quick_run_seconds",
    "reference_cost",
    "resumed_run",
    "run_reference",
    "run_workers",
    "stack_of",
    "start",
    "visible_gpus",
]

POLL_S = pool.POLL_S
FA2_JIT_NOTE = "compiling FlashAttention 2 kernels for this GPU, first run only: about 4 min"


_Tail = pool.Tail  # the one reader of a worker's new records (tests wrap its poll)


def _progress_by_key(run_dir: Path, run: Manifest) -> dict[str, sample_scan.CellProgress]:
    """Each engine key's samples file, scanned once."""
    keys = sample_scan.prompt_ids(run_dir)
    return {
        key: sample_scan.read_progress(layout.samples_path(run_dir, key), keys) for key in run.plan.engines
    }


def cells_done(
    run_dir: Path,
    run: Manifest | None = None,
    progs: dict[str, sample_scan.CellProgress] | None = None,
) -> int:
    """Cells of the run (its shard, if it is one) with a ``cell_done`` record."""
    m = restrict(run if run is not None else manifest.read_manifest(run_dir))
    progs = progs if progs is not None else _progress_by_key(run_dir, m)
    return sum(len([c for c in ep.cells if c in progs[key].done]) for key, ep in m.plan.engines.items())


def execute(
    run_dir: Path,
    show_progress: bool = True,
    console: Any = None,
    bar: bool = True,
    fresh: bool = False,
    executor: Executor | None = None,
    max_engines_per_gpu: int | None = 1,
    inventory: gpu_inventory.Inventory | None = None,
) -> list[str]:
    """Run one worker per engine key with unfinished cells; return error lines for the summary.

    ``bar=False``: plain progress lines even on a terminal. ``fresh``: the run directory was just
    cleared (``--fresh``), said as starting over, never as a resume. ``executor``: where the
    workers run (default: here; ``ray``: each key a task on a Ray cluster, ``run/ray_executor.py``).
    Here the keys run side by side as ``plan/packing.py`` places them on ``inventory`` (default:
    this machine's GPUs), at most ``max_engines_per_gpu`` per GPU (None: as many as fit; 1 on a
    one-GPU machine, or for an engine without GPU placement: one after another)."""
    executor = executor or Executor()
    from cascade_repro.plan import estimate
    from cascade_repro.run.progress import RunProgress

    whole = manifest.read_manifest(run_dir)
    run = restrict(whole)  # a shard runs only its own engine keys
    spec = spec_of(run.spec_json)
    cells = run.plan.cell_map()
    errors: list[str] = []
    if console is None:
        from rich.console import Console

        console = Console(stderr=True, soft_wrap=True, emoji=False)
    # Each key's samples file is written only by its own worker, so this one scan stays true for a
    # key until its worker runs.
    progs = _progress_by_key(run_dir, run)
    # cells_done cuts the plan to the shard itself; cutting the cut plan again would re-assign its
    # keys as if they were the whole matrix (shard 2/2 of two keys would count none).
    done_before = cells_done(run_dir, whole, progs)
    notes = [
        f"warning: {layout.shown(cid) or 'before any cell'}: {sample_scan.corrupt_reason(key, lines, prog.why)}"
        for key, prog in progs.items()
        for cid, lines in prog.corrupt.items()
    ]
    kept = 0
    if engine_info(spec.engine).exact_wave_resume:
        kept = sum(
            sample_scan.kept_wave_count(progs[k], c) for k, ep in run.plan.engines.items() for c in ep.cells
        )
    if fresh:
        notes.append(f"starting {run_dir.name} over (--fresh): {len(cells)} cells to run")
    elif done_before or kept:
        # Said once, before the bar: a rerun that silently skipped work would look like a fast run.
        waves_kept = f", {kept} finished wave{'s' if kept != 1 else ''} of cut cells kept" if kept else ""
        notes.append(
            f"resuming {run_dir.name}: {done_before} of {len(cells)} cells already done{waves_kept}, "
            f"running the other {len(cells) - done_before} (--fresh starts over)"
        )
    for line in notes:
        console.print(line, highlight=False, markup=False)
    device = estimate.run_device(spec.engine, spec.device)
    packing = packing_of(run, max_engines_per_gpu, inventory) if executor.name == "local" else None
    if packing is not None and packing.concurrent and show_progress:
        for line in packings.describe(packing):
            console.print(line, highlight=False, markup=False)
    progress = RunProgress(
        console,
        show=show_progress,
        plain=None if bar else True,
        cells={cid: c.to_json() for cid, c in cells.items()},  # the progress line reads run.json's form
        n_prompts=int(run.prompt_set.n),
        max_tokens=int(spec.max_tokens),
        table=estimate.SPEEDS.get((spec.engine, device)),
        measured=[w for prog in progs.values() for ws in prog.waves.values() for w in ws],
        starts_left=sum(
            1 for k, ep in run.plan.engines.items() if any(c not in progs[k].done for c in ep.cells)
        ),
        parallel=packings.parallel(packing, [ep.tp for ep in run.plan.engines.values()]) if packing else 1,
    )

    def ended(key: str, rc: int, reason: str) -> list[str]:
        """A key's worker is done for good: its unfinished cells are errors with ``reason``."""
        path = layout.samples_path(run_dir, key)
        prog = sample_scan.read_progress(path, sample_scan.prompt_ids(run_dir))
        unfinished = [c for c in run.plan.engines[key].cells if c not in prog.done and c not in prog.errors]
        if unfinished:
            writer = jsonl.JsonlWriter(path)
            for cid in unfinished:
                writer.write(codec.CellError(cid, reason or f"worker exited {rc}"))
            writer.close()
            progress.cells_failed(len(unfinished))
        return [f"{cid}: {why}" for cid, why in sample_scan.read_progress(path, samples=False).errors.items()]

    with progress, supervise.sigterm_as_interrupt():
        todo = []
        for key, ep in run.plan.engines.items():
            done = [c for c in ep.cells if c in progs[key].done]
            progress.already_done(done)
            if len(done) < len(ep.cells):
                todo.append(key)
        ended_by: dict[str, list[str]] = {}  # each key's error lines, listed in plan order at the end
        if executor.name == "ray":
            from cascade_repro.run import ray_executor

            with ray_executor.Session(executor.ray_address, executor.retries) as session:
                session.run_keys(
                    run_dir,
                    todo,
                    float(spec.engine_timeout),
                    progress,
                    lambda key, rc, reason: ended_by.__setitem__(key, ended(key, rc, reason)),
                )
            for key in todo:  # in plan order, as the local executor lists them
                errors += ended_by.get(key, [])
            return errors
        gpu = str(run.stack_env.get("gpu_name") or "")
        jits: dict[str, bool] = {}

        def env_of(key: str, placed: dict[str, str]) -> dict[str, str]:
            return cuda_cache.apply(dict(os.environ, PYTHONUNBUFFERED="1", **placed))

        def starting(key: str, env: dict[str, str]) -> None:
            ep = run.plan.engines[key]
            jits[key] = cuda_cache.needs_fa2_jit(ep.fa_version, gpu) and not cuda_cache.fa2_compiled(env, gpu)
            # A silent first FA2 start on a fresh Hopper machine lasts minutes: say why.
            progress.engine_starting(key, FA2_JIT_NOTE if jits[key] else "", compiles=jits[key])

        def finished(key: str, rc: int, reason: str, env: dict[str, str]) -> None:
            if (
                jits.get(key)
                and sample_scan.read_progress(layout.samples_path(run_dir, key), samples=False).engine
            ):
                cuda_cache.mark_fa2_compiled(env, gpu)
            progress.engine_done(key)
            ended_by[key] = ended(key, rc, reason)

        if packing is not None and packing.concurrent:
            base = env_of("", {})
            pool.run_side_by_side(
                run_dir, [(k, run.plan.engines[k].tp) for k in todo], packing, float(spec.engine_timeout),
                progress, env_of, lambda key: starting(key, base),
                lambda key, rc, reason: finished(key, rc, reason, base),
            )  # fmt: skip
        else:  # one after another, as before engines ran side by side
            for key in todo:
                env = env_of(key, {})
                starting(key, env)
                rc, reason = _run_worker(run_dir, key, float(spec.engine_timeout), progress, env=env)
                finished(key, rc, reason, env)
        for key in todo:  # in plan order, whichever ended first
            errors += ended_by.get(key, [])
    return errors


def _run_worker(
    run_dir: Path,
    key: str,
    timeout: float,
    progress: Any,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Run the worker of one engine key; kill its process group when it hangs past ``timeout``.

    ``timeout`` is inactivity: seconds without a new record or a new line in the worker's log, so a
    slow engine start (logging as it goes) is not killed but a silent hang is. Every control record
    the worker appends goes to ``progress`` (a :class:`~cascade_repro.run.progress.RunProgress`).
    """
    log_path = layout.worker_log(run_dir, key)
    if env is None:
        env = cuda_cache.apply(dict(os.environ, PYTHONUNBUFFERED="1"))
    watch = pool.KeyWatch(run_dir, key, timeout, progress)
    with supervise.Worker(pool.worker_argv(run_dir, key), env=env, log_path=log_path) as w:
        # its last check reads what the worker wrote last
        stopped = supervise.watch(w, lambda: watch.check(w), POLL_S)
    return pool.outcome(w, stopped, log_path)


def start(spec: MatrixSpec, opts: RunSetup, console: Any = None) -> PreparedRun:
    """Prepare a matrix run and say, before anything starts, what it will cost: a reference pass
    that cannot fit is refused, a long CPU run is warned about. Nothing is written."""
    prepared = prepare(spec, opts, console)
    run_dir = prepared.run_dir
    n_samples = len(prepared.run.plan.cells) * int(prepared.run.prompt_set.n)
    if (cost := reference_cost(spec, opts.reference, n_samples, prepared.run.model_path)) is not None:
        if not cost.fits:  # said before any engine starts, not after the matrix has run
            raise UsageError(cost.refusal(spec.model))
    if console is not None:
        from cascade_repro.plan import estimate

        # Before anything starts: a CPU run of an hour should not be discovered an hour in.
        device = estimate.run_device(spec.engine, spec.device)
        # Only a CPU run is warned about: a GPU run need not pay the estimate's scan of its samples.
        est = estimate.for_run(prepared.run, run_dir) if device == "cpu" else None
        ref_s = cost.est_s if cost is not None else None
        if est is not None and estimate.warning_for(est, device, ref_s) is not None:
            quick = quick_run_seconds(spec, opts, prepared.run.model_path, int(prepared.run.prompt_set.n))
            warning = estimate.warning_for(est, device, ref_s, quick)
            console.print(f"[yellow]warning:[/] {_escape(str(warning))}", highlight=False)
    return prepared


def run_workers(
    prepared: PreparedRun, spec: MatrixSpec, opts: RunSetup, t0: float, console: Any = None
) -> tuple[Manifest, list[str]]:
    """Write the prepared run, run its workers and its reference pass, record the invocation's
    timings; return run.json as written and the error lines. Called holding the run's lock (the
    caller scores under the same lock)."""
    run_dir = prepared.run_dir
    prepared.write()
    if console is not None and prepared.newer:
        console.print(f"note: {_escape(prepared.newer)}", highlight=False)
    kept = cells_done(run_dir)
    errors = execute(
        run_dir, opts.progress, console, bar=opts.bar, fresh=opts.fresh, executor=opts.executor,
        max_engines_per_gpu=opts.max_engines_per_gpu,
    )  # fmt: skip
    # The reference pass writes only reference/: run.json read once serves before and after it.
    run = manifest.read_manifest(run_dir)
    if restrict(run).plan.cells:
        reference = run_reference(run_dir, opts.reference, float(spec.engine_timeout), console)
        run.update(reference=merged_reference(run.reference, reference))
    took = round(time.time() - t0, 2)
    if run.invocations is None:
        run.update(invocations=[Invocation.of()])
    inv = run.invocations[-1]
    inv.update(cells_kept=kept, cells_run=len(restrict(run).plan.cells) - kept, total_s=took)
    # The run's total is every invocation's, not the last one's.
    run.update(timings=Timings.of(total_s=round(sum(float(i.total_s or 0) for i in run.invocations), 2)))
    manifest.write_manifest(run_dir, run)
    return run, errors
