"""Worker process: build one engine for one engine key and run all its unfinished cells.

Started by the runner as ``python -m cascade_repro.run.worker RUN_DIR ENGINE_KEY``. It reads the plan
from ``run.json`` and the prompts from ``prompts.jsonl``, and appends records to
``samples/<key>.jsonl`` (flushed after every wave). One engine per process: vLLM cannot build a
second engine in a process that held one, and a crash or hang stays contained.
"""

from __future__ import annotations

import gc
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from cascade_repro import twin as twins
from cascade_repro.errors import UsageError
from cascade_repro.plan.matrix import MatrixSpec, spec_of
from cascade_repro.plan.waves import waves
from cascade_repro.rundir import codec, jsonl, layout, manifest, sample_scan
from cascade_repro.rundir.cells import Cell, EnginePlan
from cascade_repro.rundir.manifest import Manifest
from cascade_repro.twin import CASCADE as TWIN
from cascade_repro.vllm_surface import faults

# Exit codes the runner understands.
EXIT_OK = 0
EXIT_CELL_ERRORS = 3
EXIT_FATAL = 4

FATAL_MARKERS = ("CUDA out of memory", "CUDA error", "NCCL", "OutOfMemoryError", "cudaErrorLaunchFailure")


def load_prompts(run_dir: Path) -> list[dict[str, Any]]:
    return layout.read_prompts(run_dir)


def build_engine(m: Manifest, eplan: EnginePlan | dict[str, Any], run_dir: Path | None = None):
    """Construct the engine named by the run's spec for one engine plan (the registry in engines/).

    ``eplan`` may come as its run.json form (converted here); ``run_dir`` defaults to a ``run_dir``
    key the run carries. The builder is handed the run's spec and ``plan/models`` (how to read the
    model's tokenizer and config), so engines/ never imports the planner.
    """
    from cascade_repro.engines import get as engine_info

    ep = eplan if isinstance(eplan, EnginePlan) else EnginePlan.from_json(eplan)
    if run_dir is None and m.extra.get("run_dir"):
        run_dir = Path(m.extra["run_dir"])
    from cascade_repro.plan import models

    spec = engine_spec(m, ep)
    return engine_info(spec.engine).load_builder()(m, ep, run_dir, spec, models)


def engine_spec(m: Manifest, ep: EnginePlan) -> MatrixSpec:
    """The spec one engine runs under: the run's, narrowed to the engine's twin in a run of several
    (its arms' settings, its effect reader, its fault's arm)."""
    spec = spec_of(m.spec_json)
    return spec.for_twin(ep.twin) if ep.twin else spec


def freeze_heap() -> int:
    """Put every object alive after the engine start out of the garbage collector's scans.

    A vLLM engine leaves millions of long-lived objects in this process (modules, the tokenizer,
    the engine's own state); each full collection that the wave's outputs trigger walks all of
    them, inside the timed wave. ``gc.freeze()`` moves them to a permanent generation once, so
    collections see only what the waves allocate. Returns how many objects were frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def run_engine(run_dir: Path, engine_key: str) -> int:
    """Run every unfinished cell of ``engine_key``; return the process exit code."""
    run = manifest.read_manifest(run_dir)
    eplan = run.plan.engines[engine_key]
    cells = run.plan.cell_map()
    spec = engine_spec(run, eplan)
    out_path = layout.samples_path(run_dir, engine_key)
    prog = sample_scan.read_progress(out_path, sample_scan.prompt_ids(run_dir))
    todo = [cells[cid] for cid in eplan.cells if cid not in prog.done]
    if not todo:
        return EXIT_OK
    from cascade_repro.engines import get as engine_info

    info = engine_info(spec.engine)
    keep: dict[str, int] = {}
    if info.exact_wave_resume:
        keep = {c.cell_id: k for c in todo if (k := sample_scan.kept_wave_count(prog, c.cell_id))}
    kept_lines = sample_scan.kept_wave_lines(out_path, keep)

    prompts = load_prompts(run_dir)
    # Earlier attempts appended to the same log: a cause of death is looked for in this one's lines only.
    log_path = layout.worker_log(run_dir, engine_key)
    log_start = faults.log_size(log_path)
    writer = jsonl.JsonlWriter(out_path, background=info.background_writes)
    t0 = time.time()
    engine = build_engine(run, eplan, run_dir)
    from cascade_repro.prompts.chat import measure_prefix

    measured = measure_prefix(engine.tokenizer(), run.prompt_set.system_prompt_text, prompts)
    rendered, shared = measured.rendered, measured.tokens
    writer.write(
        codec.EngineStart(
            engine_key=engine_key,
            effective=engine.effective(),
            shared_prefix_tokens=shared,
            start_s=round(time.time() - t0, 3),
            started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )
    )
    writer.flush()
    hashes = measured.hashes()
    check_hashes(run_dir, hashes)
    freeze_heap()
    status = EXIT_OK
    for cell in todo:
        cid = cell.cell_id
        kept = keep.get(cid, 0)
        # A resumed attempt copies the finished waves of the cut one right after its cell_start, so
        # every reader sees one whole attempt between cell_start and cell_done.
        writer.write(codec.CellStart(cid, kept_waves=kept))
        for raw in kept_lines.get(cid, []):
            writer.write_line(raw)
        writer.flush()
        c0 = time.time()
        n = sum(1 for raw in kept_lines.get(cid, []) if codec.is_sample_line(raw))
        engine.inject = cell_inject(cell, spec)
        try:
            for w, wave in enumerate(waves(len(prompts), cell.batch)):
                if w < kept:
                    continue
                _maybe_fault(cid, w, writer)
                w0 = time.time()
                comps, stats = engine.run_wave(
                    [rendered[i] for i, _ in wave],
                    cell.arm,
                    spec.max_tokens,
                    prefix_len=shared,
                )
                if spec.twin_axis is not TWIN:
                    stats.extra = {**(stats.extra or {}), "effect": wave_effect(spec.twin_axis, cell, stats)}
                samples, wave_rec = typed_wave_records(cid, w, wave, comps, stats, prompts, hashes, rendered)
                # A background writer starts on these at once.
                for rec in samples:
                    writer.write(rec)
                # Generation, conversion and the records (their JSON too, unless a background
                # writer encodes it while the next wave runs).
                wave_rec.wall_s = round(time.time() - w0, 4)
                writer.write(wave_rec)
                n += len(samples)
                writer.flush()
        except Exception as e:  # noqa: BLE001 - recorded for the report, then decide whether to go on
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
            traceback.print_exc(file=sys.stderr)
            sys.stderr.flush()
            # The engine core's own words for why it died are in this worker's log, not the exception.
            reason = faults.with_cause(reason, faults.cause_from_file(log_path, log_start))
            writer.write(codec.CellError(cid, reason))
            writer.sync()
            status = EXIT_CELL_ERRORS
            if any(m in reason for m in FATAL_MARKERS):
                # The device context is unusable after these; the runner marks the rest.
                writer.close()
                return EXIT_FATAL
            continue
        writer.write(codec.CellDone(cid, n_samples=n, wall_s=round(time.time() - c0, 3)))
        writer.sync()  # resume trusts cell_done, so it (and the samples before it) must reach the disk
    writer.close()
    engine.close()
    return status


def cell_inject(cell: Cell, spec: MatrixSpec) -> str | None:
    """The fault a cell's cascade arm runs with: the cell's own (calibration) or the spec's (a cell
    planned by a version without a per-cell ``inject``)."""
    if cell.arm != spec.twin_axis.test:
        return None
    return cell.inject if cell.has("inject") else spec.inject


def wave_effect(twin: twins.TwinAxis, cell: Cell, stats: Any) -> dict[str, Any]:
    """A wave's proof that the twin's setting took effect: the engine's own, else what the worker
    knows (a batch twin's test arm takes effect on every step of a wave of its batch size)."""
    given = (stats.extra or {}).get("effect")
    if isinstance(given, dict):
        return given
    if twin.axis == "batch":
        on = cell.arm == twin.test and cell.batch == twin.test_value
        return twins.effect_record(twin, stats.total_steps if on else 0, {"batch": cell.batch})
    return twins.effect_record(twin, 0, {}, "this engine does not report it")


def typed_wave_records(
    cid: str,
    w: int,
    wave: list[tuple[int, bool]],
    comps: list[Any],
    stats: Any,
    prompts: list[dict[str, Any]],
    hashes: list[str],
    rendered: list[list[int]],
) -> tuple[list[codec.SampleRecord], codec.WaveRecord]:
    """The sample records of a wave's real requests (fillers are not recorded) and its wave record.

    The wave record's ``wall_s`` is left for the caller to set once the samples are written.
    """
    samples = [
        codec.SampleRecord(
            cell_id=cid,
            wave=w,
            prompt_index=i,
            prompt_key=prompts[i]["key"],
            prompt_hash=hashes[i],
            prompt_tokens=len(rendered[i]),
            token_ids=c.token_ids,
            text=c.text,
            finish_reason=c.finish_reason,
            logprobs=c.logprobs,
            topk=c.topk,
        )
        for (i, real), c in zip(wave, comps, strict=True)
        if real
    ]
    wave_rec = codec.WaveRecord(
        cell_id=cid,
        wave=w,
        batch=len(wave),
        n_real=sum(1 for _, r in wave if r),
        cascade_steps=stats.cascade_steps,
        total_steps=stats.total_steps,
        cascade_calls=stats.cascade_calls,
        cascade_decode_steps=stats.cascade_decode_steps,
        common_prefix_len=stats.common_prefix_len,
        wall_s=None,
        tokens=sum(len(r.token_ids) for r in samples),
        extra=stats.extra or {},
    )
    return samples, wave_rec


def wave_records(*args: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """:func:`typed_wave_records` as JSON objects (the benchmarks time and write these)."""
    samples, wave_rec = typed_wave_records(*args)
    return [codec.record_json(r) for r in samples], codec.record_json(wave_rec)


def check_hashes(run_dir: Path, hashes: list[str]) -> None:
    """Refuse to generate when this engine's tokenizer renders a prompt otherwise than the one that
    prepared the run (prompts.jsonl's hashes): every sample would then fail the check against
    prompts.jsonl and its cell would rerun on every resume, never finishing."""
    recorded = sample_scan.prompt_ids(run_dir)
    if recorded is None:
        return
    for i, (mine, theirs) in enumerate(zip(hashes, recorded.hashes, strict=False)):
        if theirs is not None and mine != theirs:
            raise UsageError(
                f"prompt {i} renders as {mine} under this engine's tokenizer, but as {theirs} in "
                f"{layout.PROMPTS} (when the run was prepared): the tokenizers differ"
            )


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when the runner dies, so a kill -9 leaves no orphan writer."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import os
    import signal

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _maybe_fault(cell_id: str, wave: int, writer: jsonl.JsonlWriter | None = None) -> None:
    """Test hook: CASCADE_REPRO_FAULT="KIND:CELL_ID[:WAVE]" makes the worker fail on purpose.

    KIND is ``exit`` (exit 9), ``hang`` (sleep forever), ``oom`` (raise a CUDA-OOM-like error),
    ``raise`` (an ordinary exception), ``assert`` (print a kernel's device-side assertion to stderr,
    as a dying vLLM engine core does, then raise the error vLLM's client raises) or ``kill-parent`` (SIGKILL the process that started this
    worker, then this one: a Ray task's worker or node lost). Used by the crash-isolation tests on
    CPU. The fault strikes at the start of the wave, once ``writer`` has written every earlier wave
    (a background writer would otherwise make what a test finds on disk depend on the thread's
    timing). With CASCADE_REPRO_FAULT_ONCE=PATH it strikes only where it can create PATH (the
    first attempt; a retry runs clean).
    """
    import os
    import signal

    spec = os.environ.get("CASCADE_REPRO_FAULT", "")
    if not spec:
        return
    kind, _, rest = spec.partition(":")
    target, _, w = rest.partition(":")
    if target != cell_id or (w and int(w) != wave):
        return
    if once := os.environ.get("CASCADE_REPRO_FAULT_ONCE"):
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    if writer is not None:
        writer.wait()
    if kind == "kill-parent":
        os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "exit":
        os._exit(9)
    if kind == "hang":
        while True:
            time.sleep(3600)
    if kind == "oom":
        raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")
    if kind == "raise":
        raise RuntimeError("simulated failure")
    if kind == "assert":
        print(
            "/pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: vectorized_gather_kernel: block: [19,0,0], "
            'thread: [64,0,0] Assertion `ind >=0 && ind < ind_dim_size && "vectorized gather kernel index out of '
            'bounds"` failed. (simulated)',
            file=sys.stderr,
            flush=True,
        )
        raise RuntimeError(
            "EngineCore encountered an issue. See stack trace (above) for the root cause. (simulated)"
        )


def main(argv: list[str] | None = None) -> int:
    _die_with_parent()
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m cascade_repro.run.worker RUN_DIR ENGINE_KEY", file=sys.stderr)
        return 2
    return run_engine(Path(argv[0]), argv[1])


if __name__ == "__main__":
    sys.exit(main())
