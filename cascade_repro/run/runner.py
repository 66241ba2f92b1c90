"""Run a matrix: prepare the run dir, run one worker per engine key, then the reference pass.

Scoring and reporting sit above the stages, in ``pipeline``: it holds the run's lock around
:func:`run_workers` and the scoring that follows."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade_repro import userpath
from cascade_repro.engines import get as engine_info
from cascade_repro.errors import UsageError
from cascade_repro.plan import cuda_cache
from cascade_repro.plan.matrix import MatrixSpec, plan, plan_warnings, spec_hash, spec_of
from cascade_repro.plan.shard import Shard, empty_warning, restrict
from cascade_repro.run import supervise
from cascade_repro.run.reference import ReferenceOptions
from cascade_repro.rundir import codec, jsonl, layout, manifest, runlock, safety, sample_scan
from cascade_repro.rundir.manifest import (
    Invocation,
    Manifest,
    PromptSetFacts,
    Timings,
    newer_version_note,
)

POLL_S = 0.5
FA2_JIT_NOTE = "compiling FlashAttention 2 kernels for this GPU, first run only: about 3 min"


EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class Executor:
    """Where the engine keys' workers run; a run setting, not part of the matrix (nor its hash)."""

    name: str = "local"  # local: one after the other on this machine; ray: tasks on a Ray cluster
    ray_address: str | None = None  # None: `auto` where RAY_ADDRESS is set, else a local Ray
    retries: int = 1  # ray: attempts after a task died, before its unfinished cells are errors

    def __post_init__(self) -> None:
        if self.name not in EXECUTORS:
            raise UsageError(f"--executor {self.name!r}: choose from {', '.join(EXECUTORS)}")
        if self.retries < 0:
            raise UsageError(f"--retries {self.retries}: must be 0 or more")
        if self.ray_address is not None and self.name != "ray":
            raise UsageError("--ray-address names a Ray cluster: give it with --executor ray")


@dataclass
class RunSetup:
    """How to run a matrix's workers, as opposed to what the matrix is (MatrixSpec); the thresholds
    it is judged by are the pipeline's (``pipeline.RunOptions`` adds them)."""

    results_dir: Path = Path("results")
    run_id: str | None = None
    fresh: bool = False
    fail_on: str = "regression"
    command: str = ""
    progress: bool = True  # False: nothing at all (tests, benchmarks); the CLI always shows progress
    bar: bool = True  # the live bar on a terminal; False (--quiet): the plain lines a log gets
    shard: Shard | None = None  # run only this shard's engine keys (see shard.py); not part of the matrix
    allow_mixed: bool = False  # resume under another vLLM/torch/transformers/GPU than the run began with
    reference: ReferenceOptions = field(default_factory=ReferenceOptions)  # what the judge compares with
    executor: Executor = field(default_factory=Executor)  # where the workers run

    def __post_init__(self) -> None:
        self.results_dir = userpath.resolve(self.results_dir, "--results-dir")

    def thresholds_record(self) -> dict[str, Any]:
        """run.json's ``thresholds`` as prepared (scoring writes the ones it judged by): none here,
        ``pipeline.RunOptions`` records its own."""
        return {}


def default_run_id(spec: MatrixSpec) -> str:
    """Same matrix, same run id: rerunning a command resumes it instead of starting over."""
    model = (
        re.sub(r"[^A-Za-z0-9]+", "-", Path(spec.model).name or spec.model).strip("-").lower()[:32] or "model"
    )
    return f"{spec.engine}-{model}-{spec_hash(spec)}"


def visible_gpus() -> int:
    """Count GPUs without initialising CUDA in this process (nvidia-smi, then CUDA_VISIBLE_DEVICES)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
        n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.SubprocessError):
        return 0
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        n = min(n, len([d for d in cvd.split(",") if d.strip() and d.strip() != "-1"]))
    return n


@dataclass
class PreparedRun:
    """A validated run, not yet on disk: ``write`` it while holding the directory's lock.

    ``run`` is its manifest (run.json's dict form is converted on construction).
    """

    run_dir: Path
    run: Manifest
    records: list[Any]
    fresh: bool
    allow_mixed: bool = False
    # Each prompt's hash as the run's tokenizer renders it (chat.prompt_hash), for prompts.jsonl.
    hashes: list[str] | None = None
    newer: str | None = None  # set by ``write`` where the run resumed was made by a newer version

    def write(self) -> None:
        run_dir = self.run_dir
        if (
            run_dir.is_dir()
            and not (run_dir / layout.RUN_JSON).exists()
            and (theirs := sorted(p.name for p in run_dir.iterdir() if p.name != layout.LOCK))
        ):
            # Not a run (run.json is the first file a run writes): the user's own folder, whose
            # samples/, minimize/ and reports --fresh would delete and a run would overwrite.
            raise UsageError(
                f"{run_dir} is not a cascade-repro run (no {layout.RUN_JSON}) and holds "
                f"{_first_names(theirs)}: choose another --run-id or --results-dir"
            )
        if self.fresh:
            # Whatever the folder holds, run.json or not: samples left beside a lost run.json would
            # otherwise be resumed by the run that was asked to start over.
            safety.clear_derived(run_dir)
        elif (run_dir / layout.RUN_JSON).exists():
            old = manifest.read_manifest(run_dir)
            if old.stored("spec_hash") != self.run.spec_hash:
                raise UsageError(
                    f"{run_dir} holds a different matrix; pass --fresh to start it over or choose another --run-id"
                )
            elif (was := old.shard) != (now := self.run.shard):
                was, now = (f"shard {s}" if s else "the unsharded run" for s in (was, now))
                raise UsageError(f"{run_dir} holds {was} of this matrix, not {now}: one --run-id per shard")
            else:
                self.run = resumed_run(old, self.run, self.allow_mixed)
                self.newer = newer_version_note(old, self.run.tool_version)
        # run.json first: a folder without one was never begun by this tool (see above).
        manifest.write_manifest(run_dir, self.run)
        (run_dir / layout.SAMPLES).mkdir(parents=True, exist_ok=True)
        # With the prompt source's extra columns, and each prompt's hash as this tokenizer renders it.
        layout.write_prompts(run_dir, self.records, self.hashes)


def _first_names(names: list[str]) -> str:
    """``a, b and 3 more``: what a folder holds, in a few words."""
    more = f" and {len(names) - 2} more" if len(names) > 2 else ""
    return ", ".join(names[:2]) + more


# What a comparison must not mix: two of these differing between invocations of one run means its
# cells were generated by two stacks (a cascade cell by one, its flat twin by the other).
STACK_KEYS = ("vllm", "vllm_flash_attn", "torch", "transformers", "gpu_name", "driver")


def stack_of(env: dict[str, Any]) -> dict[str, str]:
    return {k: str(env[k]) for k in STACK_KEYS if env.get(k) not in (None, "")}


def resumed_run(old_m: Manifest, new_m: Manifest, allow_mixed: bool) -> Manifest:
    """run.json for a resume: the first invocation's identity kept, this one appended.

    A resume under another stack (vLLM, torch, transformers, GPU model, driver) would put cells
    generated by two stacks into one comparison: refused unless ``allow_mixed``, and then marked.
    """
    first = old_m.first_invocation()
    was, now = stack_of(first.env or {}), stack_of(new_m.env or {})
    differ = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
    if differ and not allow_mixed:
        what = "; ".join(f"{k} {was.get(k, 'absent')} -> {now.get(k, 'absent')}" for k in differ)
        raise UsageError(
            f"{new_m.run_id} began under another stack ({what}): finishing it here would compare cells "
            "of two stacks; rerun where it began, pass --fresh to start over, or --allow-mixed to mix them"
        )
    out = copy.copy(new_m)
    out.update(
        created_at=old_m.created_at if old_m.has("created_at") else new_m.created_at,
        env=old_m.env if old_m.has("env") else new_m.env,
        invocations=[*(old_m.invocations or [old_m.own_invocation()]), *new_m.invocations],
    )
    if differ or old_m.mixed_stack:
        out.update(mixed_stack=sorted(set(differ) | set(old_m.mixed_stack or [])))
    out.update(timings=copy.deepcopy(old_m.timings))
    if old_m.has("engines"):  # until scoring writes them anew (each record's unknown keys kept)
        out.update(engines=copy.deepcopy(old_m.engines))
    out.keep_unknown(old_m)  # a newer version's keys survive this version's rewrite
    return out


def check_run_id(run_id: str) -> None:
    """Refuse a run id that is not one plain directory name inside the results dir.

    "." and ".." pass the character check but name the results dir itself or its parent (with
    --fresh, that parent's samples/ would be deleted); a leading dot would hide the run. Checked
    before the model loads (and by --dry-run), so the mistake costs nothing.
    """
    if not re.fullmatch(r"[A-Za-z0-9._-]+", run_id) or run_id.startswith("."):
        raise UsageError(f"--run-id {run_id!r}: use letters, digits, '.', '_' and '-', not starting with '.'")
    if len(run_id) > MAX_RUN_ID:  # a folder name: the filesystem refuses one past 255 bytes
        raise UsageError(f"--run-id: at most {MAX_RUN_ID} characters, got {len(run_id):,}")


MAX_RUN_ID = 200


def prepare(spec: MatrixSpec, opts: RunSetup, console: Any = None) -> PreparedRun:
    """Validate everything a user can get wrong and build run.json's content.

    Nothing is written here, so a usage error leaves no half-made run directory behind.
    """
    from cascade_repro.plan.models import (
        EMBEDDED,
        embedded_converted,
        embedded_gguf_path,
        load_tokenizer,
        quiet_progress,
        resolve_model,
    )
    from cascade_repro.prompts.chat import MIN_CASCADE_PREFIX, check_context, measure_prefix
    from cascade_repro.prompts.promptsets import load_prompt_set, load_system_prompt
    from cascade_repro.run import envinfo

    spec.validate()
    run_id = opts.run_id or default_run_id(spec)
    if opts.shard and not opts.run_id:
        run_id += f"-shard{opts.shard.index}of{opts.shard.count}"
    check_run_id(run_id)
    if (file := runlock.not_a_folder(opts.results_dir / run_id)) is not None:
        raise UsageError(f"--results-dir {opts.results_dir}: {file} is a file, not a folder")
    # A Ray cluster's GPUs are counted where its tasks are placed (ray_executor), not on the driver.
    if engine_info(spec.engine).tensor_parallel and opts.executor.name == "local":
        gpus = visible_gpus()
        if max(spec.tp) > gpus:
            raise UsageError(f"--tp {max(spec.tp)} needs {max(spec.tp)} GPUs, {gpus} visible")
    elif spec.device.startswith("cuda") and opts.executor.name == "local":
        # Said now, not as every cell's error once the engine has started on a machine without one.
        index, gpus = int(spec.device.partition(":")[2] or 0), visible_gpus()
        if index >= gpus:  # nvidia-smi may be absent where CUDA works: torch has the last word
            import torch

            gpus = max(gpus, torch.cuda.device_count())
        if index >= gpus:
            raise UsageError(f"--device {spec.device}: {gpus} CUDA GPU{'s' if gpus != 1 else ''} visible")
    pset = load_prompt_set(spec.prompts, spec.limit, spec.prompt_field, spec.key_field)
    system_text = load_system_prompt(spec.system_prompt)
    # The first conversion of the embedded model takes tens of seconds: one line says what is
    # happening, on a terminal too (its bars were few and late, so the terminal sat silent); in a log
    # the bars themselves are carriage-return noise and stay off.
    plain = not getattr(console, "is_terminal", False) or not opts.bar
    info = engine_info(spec.engine)
    if info.has_weights and spec.model in ("", EMBEDDED):
        embedded_gguf_path()  # a missing model package: its one install line, before anything else is said
        if opts.progress and console is not None and not embedded_converted():
            console.print(
                "converting the embedded model into the user cache (first run only; under a minute, then kept)",
                highlight=False,
            )
    if not info.has_weights:  # the fake: no model to resolve, its own tokenizer
        model_path, model_name, tokenizer = "", f"none ({spec.engine} engine)", info.own_tokenizer()
    else:
        with quiet_progress(not opts.progress or plain):
            model_path, model_name = resolve_model(spec.model)
            tokenizer = load_tokenizer(model_path, spec.trust_remote_code)
    measured = measure_prefix(tokenizer, system_text, pset.records)
    rendered, shared = measured.rendered, measured.tokens
    if info.has_weights and (limit := context_limit_of(spec, model_path, model_name)) is not None:
        check_context(rendered, [r.key for r in pset.records], int(spec.max_tokens), *limit)

    run_dir = opts.results_dir / run_id
    planned = plan(spec, len(pset.records))
    if console is not None:
        for warning in plan_warnings(spec, len(pset.records)):
            console.print(f"[yellow]warning:[/] {_escape(warning)}", highlight=False)
    if opts.shard and console is not None and (warning := empty_warning(planned.engines, opts.shard)):
        console.print(f"[yellow]warning:[/] {_escape(warning)}", highlight=False)
    # Built in code, the manifest writes every field but the optional ones left unset: those set
    # below only where they apply.
    run = Manifest(
        run_id=run_id,
        created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        command=opts.command,
        tool_version=envinfo._version("cascade-repro"),
        tool_source=envinfo.source_info(),  # commit and repository, for the report's install line
        spec_json=spec.to_dict(),
        spec_hash=spec_hash(spec),
        model_path=model_path,
        model_name=model_name,
        prompt_set=PromptSetFacts(
            name=pset.name,
            source=pset.source,
            n=len(pset.records),
            system_prompt=spec.system_prompt,
            system_prompt_text=system_text,
            shared_prefix_tokens=shared,
            prompt_tokens_mean=sum(map(len, rendered)) / len(rendered),
            prompt_tokens_max=max(map(len, rendered)),
            tokenizer=model_name,
            min_cascade_prefix=MIN_CASCADE_PREFIX,
        ),
        # The fake runs on no device: nothing to ask torch (whose import is seconds) about.
        env=envinfo.capture(include_gpu=info.is_vllm or (info.has_weights and spec.device != "cpu")),
        plan=planned,
        arm_switch=spec.arm_switch if engine_info(spec.engine).attention_axes else "shared",
        thresholds=opts.thresholds_record(),
        fail_on=opts.fail_on,
        engines={},
        timings=Timings(),
    )
    if engine_info(spec.engine).is_vllm and (collected := envinfo.vllm_collect_env()) is not None:
        run.vllm_collect_env = collected  # vLLM's bug template asks for exactly this
    if opts.shard:
        run.shard = str(opts.shard)  # the plan stays whole: every shard of a matrix has the same one
    from cascade_repro.run.predictions import predictions_for

    run.predictions = predictions_for(run)  # what vLLM's rule says, shown next to the probe's counts
    if console is not None and (warning := measured.warning()) is not None:
        console.print(f"[yellow]warning:[/] {warning}")
    run.invocations = [run.own_invocation()]
    hashes = measured.hashes()
    return PreparedRun(run_dir, run, list(pset.records), opts.fresh, opts.allow_mixed, hashes)


def context_limit_of(spec: MatrixSpec, model_path: str, model_name: str) -> tuple[int, str] | None:
    """``models.context_limit`` for this matrix: vLLM's ``--max-model-len`` and ``--hf-overrides``
    count only where vLLM runs (the hf engine reads neither)."""
    from cascade_repro.plan.models import context_limit

    if engine_info(spec.engine).is_vllm:
        return context_limit(model_path, model_name, spec.max_model_len, spec.hf_overrides)
    return context_limit(model_path, model_name)


class _Tail:
    """Read records appended to a JSONL file since the last call (whole lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self._buf = b""

    def poll(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        out = []
        for line in lines:
            if codec.is_sample_line(line):
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


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
) -> list[str]:
    """Run one worker per engine key with unfinished cells; return error lines for the summary.

    ``bar=False``: plain progress lines even on a terminal. ``fresh``: the run directory was just
    cleared (``--fresh``), said as starting over, never as a resume. ``executor``: where the
    workers run (default: here, one after the other; ``ray``: each key a task on a Ray cluster,
    ``run/ray_executor.py``)."""
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
        if executor.name == "ray":
            from cascade_repro.run import ray_executor

            ended_by: dict[str, list[str]] = {}
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
        for key in todo:
            ep = run.plan.engines[key]
            env = cuda_cache.apply(dict(os.environ, PYTHONUNBUFFERED="1"))
            gpu = str(run.stack_env.get("gpu_name") or "")
            jit = cuda_cache.needs_fa2_jit(ep.fa_version, gpu) and not cuda_cache.fa2_compiled(env, gpu)
            # A silent first FA2 start on a fresh Hopper machine lasts minutes: say why.
            progress.engine_starting(key, FA2_JIT_NOTE if jit else "")
            rc, reason = _run_worker(run_dir, key, float(spec.engine_timeout), progress, env=env)
            if jit and sample_scan.read_progress(layout.samples_path(run_dir, key), samples=False).engine:
                cuda_cache.mark_fa2_compiled(env, gpu)
            errors += ended(key, rc, reason)
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
    tail = _Tail(layout.samples_path(run_dir, key))
    if env is None:
        env = cuda_cache.apply(dict(os.environ, PYTHONUNBUFFERED="1"))

    def check() -> str | None:
        recs = tail.poll()
        if recs:
            w.mark_active()
        for r in recs:
            if r.get("type") == codec.ENGINE:
                progress.engine_up(key, float(r.get("start_s") or 0.0))
            else:
                progress.record(r)
        progress.tick()
        if w.idle_s() > timeout:
            return f"timeout: no progress for {timeout:.0f}s (--engine-timeout); worker killed"
        return None

    argv = [sys.executable, "-m", "cascade_repro.run.worker", str(run_dir), key]
    with supervise.Worker(argv, env=env, log_path=log_path) as w:
        stopped = supervise.watch(w, check, POLL_S)  # its last check reads what the worker wrote last
    if stopped is not None:
        return -9, stopped
    rc = w.returncode
    if rc in (0, 3):
        return rc, ""
    line = supervise.last_error_line(log_path)
    return rc, f"worker exited with code {rc}" + (f": {line}" if line else "")


def arm_dtypes(run_dir: Path, run: Manifest) -> list[str]:
    """The dtypes the arms ran in, as their engines reported them (the plan's where none did)."""
    out = []
    for key, ep in run.plan.engines.items():
        eff = (
            sample_scan.read_progress(layout.samples_path(run_dir, key), samples=False).engine.get(
                "effective"
            )
            or {}
        )
        out.append(str(eff.get("dtype") or ep.dtype).replace("torch.", ""))
    return out


def planned_dtypes(spec: MatrixSpec, model_path: str | None = None) -> list[str]:
    """The dtypes the arms will run in, before any engine has said (``auto`` resolved as the engines do:
    float32 for the hf engine on a CPU, the model's bf16/fp16 on a GPU; vLLM never runs float32 for
    ``auto``)."""
    info = engine_info(spec.engine)
    cpu = spec.device == "cpu" or (spec.device == "auto" and not info.is_vllm and visible_gpus() == 0)
    return [
        d if d != "auto" else ("float32" if cpu and not info.is_vllm else "bfloat16") for d in spec.dtypes
    ]


def quick_run_seconds(
    spec: MatrixSpec, opts: RunSetup, model_path: str | None, n_prompts: int
) -> float | None:
    """The estimate of the quick first run (``estimate.QUICK_RUN``) with this run's other settings
    (model, prompts, device, reference): the matrix and its reference pass; None when unknown."""
    import dataclasses

    from cascade_repro.plan import estimate

    quick = dataclasses.replace(spec, **estimate.QUICK_RUN)
    planned = plan(quick)
    n = min(n_prompts, int(estimate.QUICK_RUN["limit"]))
    engines = {
        k: {"cells": [{"cell_id": c.cell_id, "batch": c.batch} for c in planned.cells_of(k)], "fa_version": ep.fa_version}
        for k, ep in planned.engines.items()
    }  # fmt: skip
    est = estimate.for_plan(quick, n, engines)
    if est.seconds is None:
        return None
    cost = reference_cost(quick, opts.reference, n * len(planned.cells), model_path)
    return est.seconds + (cost.est_s if cost is not None else 0.0)


def reference_cost(
    spec: MatrixSpec, ref: ReferenceOptions, samples: int, model_path: str | None = None
) -> Any:
    """What the reference pass of this matrix will take (``reference.Cost``), None when it is off."""
    from cascade_repro.plan.models import resolve_model
    from cascade_repro.run import reference as refpass

    precision = ref.resolve(planned_dtypes(spec))
    if precision is None or not engine_info(spec.engine).has_weights:
        return None
    path = model_path or resolve_model(spec.model)[0]
    return refpass.cost(path, precision, ref.device, samples, float(spec.max_tokens))


def run_reference(
    run_dir: Path, ref: ReferenceOptions, timeout: float, console: Any = None
) -> dict[str, Any]:
    """Run the reference pass in a process of its own (the engines have exited); return run.json's record.

    A failed pass is not fatal: the verdicts fall back to the arm-vs-arm rule, and the report says so.
    """
    from cascade_repro.run import reference as refpass
    from cascade_repro.rundir.reference import count_records

    run = restrict(manifest.read_manifest(run_dir))
    precision = ref.resolve(arm_dtypes(run_dir, run))
    if precision is None:
        return {"precision": "off", "status": "off"}
    if not engine_info(
        spec_of(run.spec_json).engine
    ).has_weights:  # nothing to teacher-force: the arm-vs-arm rule
        return {"precision": "off", "status": "no weights"}
    device = refpass.pick_device(ref.device)
    record: dict[str, Any] = {"precision": precision, "device": device}
    log_path = run_dir / layout.REFERENCE_LOG
    before = count_records(run_dir)
    t0 = time.time()
    seen = log_path.stat().st_size if log_path.exists() else 0

    def check() -> str | None:
        nonlocal seen
        if log_path.exists() and log_path.stat().st_size > seen:
            with open(log_path, "rb") as f:
                f.seek(seen)
                chunk = f.read()
            cut = chunk.rfind(b"\n") + 1
            seen += cut
            for line in chunk[:cut].decode("utf-8", "replace").splitlines():
                if line.startswith("reference:") and console is not None:
                    console.print(line, highlight=False, markup=False)
            w.mark_active()
        if w.idle_s() > timeout:
            return f"timeout: no progress for {timeout:.0f}s (--engine-timeout); reference pass killed"
        return None

    argv = [sys.executable, "-m", "cascade_repro.run.reference", str(run_dir), precision, device]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with supervise.Worker(argv, env=env, log_path=log_path) as w:
        stopped = supervise.watch(w, check, POLL_S)
    rc = w.returncode
    record["wall_s"] = round(time.time() - t0, 2)
    on_disk = count_records(run_dir)
    record["sequences"] = on_disk - before
    if stopped is not None or rc != 0:
        why = stopped or f"exited with code {rc}" + (
            f": {line}" if (line := supervise.last_error_line(log_path)) else ""
        )
        record["status"] = f"error: {why}"
        if console is not None:
            console.print(
                f"warning: reference pass failed ({why}); verdicts fall back to the arm-vs-arm rule",
                highlight=False,
                markup=False,
            )
    else:
        record["status"] = "done"
        # Scored over every pass (docs/summary-json.md): an earlier pass that was killed kept its
        # records, and this one, finding them, may score none itself.
        record["sequences"] = on_disk
    return record


def merged_reference(old: Any, new: dict[str, Any]) -> dict[str, Any]:
    """run.json's ``reference`` after another pass: a resumed run adds its seconds to the earlier
    passes' (a resume that found everything scored must not erase what the first pass cost); a done
    pass's ``sequences`` already counts every pass's records."""
    same = isinstance(old, dict) and all(old.get(k) == new.get(k) for k in ("precision", "device"))
    if not same or old.get("status") != "done" or new.get("status") != "done":
        return new
    return {
        **new,
        "wall_s": round(float(old.get("wall_s") or 0) + float(new.get("wall_s") or 0), 2),
        "passes": int(old.get("passes") or 1) + 1,
    }


def _escape(text: str) -> str:
    """Text for a rich console message: markup escaped, so "[x]" in a path or a key prints as is."""
    from rich.markup import escape

    return escape(text)


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
    errors = execute(run_dir, opts.progress, console, bar=opts.bar, fresh=opts.fresh, executor=opts.executor)
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
