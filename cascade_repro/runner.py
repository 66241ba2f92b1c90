"""Orchestrate a matrix run: prepare the run dir, run one worker per engine key, score, report."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade_repro import cuda_cache, runstore
from cascade_repro.engines import get as engine_info
from cascade_repro.errors import UsageError
from cascade_repro.matrix import MatrixSpec, all_cells, plan, spec_hash
from cascade_repro.shard import Shard, empty_warning, restrict
from cascade_repro.verdicts import Thresholds

POLL_S = 0.5
FA2_JIT_NOTE = "compiling FlashAttention 2 kernels for this GPU, first run only: about 3 min"


@dataclass
class RunOptions:
    """How to run a matrix, as opposed to what the matrix is (MatrixSpec)."""

    results_dir: Path = Path("results")
    run_id: str | None = None
    fresh: bool = False
    fail_on: str = "regression"
    thresholds: Thresholds = field(default_factory=Thresholds)
    command: str = ""
    progress: bool = True
    shard: Shard | None = None  # run only this shard's engine keys (see shard.py); not part of the matrix


@dataclass
class RunOutcome:
    run_dir: Path
    exit_code: int
    counts: dict[str, int]
    errors: list[str]
    headline: str = ""
    reason: str = ""


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
    """A validated run, not yet on disk: ``write`` it while holding the directory's lock."""

    run_dir: Path
    run: dict[str, Any]
    records: list[Any]
    fresh: bool

    def write(self) -> None:
        run_dir = self.run_dir
        if (run_dir / runstore.RUN_JSON).exists():
            old = runstore.read_run_json(run_dir)
            if self.fresh:
                shutil.rmtree(run_dir / runstore.SAMPLES, ignore_errors=True)
                for p in run_dir.glob("worker-*.log"):
                    p.unlink(missing_ok=True)
            elif old.get("spec_hash") != self.run["spec_hash"]:
                raise UsageError(
                    f"{run_dir} holds a different matrix; pass --fresh to start it over or choose another --run-id"
                )
            elif (was := old.get("shard")) != (now := self.run.get("shard")):
                was, now = (f"shard {s}" if s else "the unsharded run" for s in (was, now))
                raise UsageError(f"{run_dir} holds {was} of this matrix, not {now}: one --run-id per shard")
        (run_dir / runstore.SAMPLES).mkdir(parents=True, exist_ok=True)
        runstore.write_prompts(
            run_dir,
            [{"key": r.key, "prompt": r.prompt, "instruction_id_list": list(r.instruction_id_list),
              "kwargs": list(r.kwargs), "lang": r.lang} for r in self.records],
        )  # fmt: skip
        runstore.write_run_json(run_dir, self.run)


def check_run_id(run_id: str) -> None:
    """Refuse a run id that is not one plain directory name inside the results dir.

    "." and ".." pass the character check but name the results dir itself or its parent (with
    --fresh, that parent's samples/ would be deleted); a leading dot would hide the run. Checked
    before the model loads (and by --dry-run), so the mistake costs nothing.
    """
    if not re.fullmatch(r"[A-Za-z0-9._-]+", run_id) or run_id.startswith("."):
        raise UsageError(f"--run-id {run_id!r}: use letters, digits, '.', '_' and '-', not starting with '.'")


def prepare(spec: MatrixSpec, opts: RunOptions, console: Any = None) -> PreparedRun:
    """Validate everything a user can get wrong and build run.json's content.

    Nothing is written here, so a usage error leaves no half-made run directory behind.
    """
    from cascade_repro import envinfo
    from cascade_repro.chat import MIN_CASCADE_PREFIX, render_all
    from cascade_repro.models import load_tokenizer, resolve_model
    from cascade_repro.promptsets import load_prompt_set, load_system_prompt

    spec.validate()
    run_id = opts.run_id or default_run_id(spec)
    if opts.shard and not opts.run_id:
        run_id += f"-shard{opts.shard.index}of{opts.shard.count}"
    check_run_id(run_id)
    if engine_info(spec.engine).tensor_parallel:
        gpus = visible_gpus()
        if max(spec.tp) > gpus:
            raise UsageError(f"--tp {max(spec.tp)} needs {max(spec.tp)} GPUs, {gpus} visible")
    pset = load_prompt_set(spec.prompts, spec.limit)
    system_text = load_system_prompt(spec.system_prompt)
    model_path, model_name = resolve_model(spec.model)
    tokenizer = load_tokenizer(model_path, spec.trust_remote_code)
    rendered, shared = render_all(tokenizer, system_text, [r.prompt for r in pset.records])

    run_dir = opts.results_dir / run_id
    engines = plan(spec)
    if opts.shard and console is not None and (warning := empty_warning(engines, opts.shard)):
        console.print(f"[yellow]warning:[/] {warning}")
    run = {
        "run_id": run_id,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": opts.command,
        "tool_version": envinfo._version("cascade-repro"),
        "spec": spec.to_dict(),
        "spec_hash": spec_hash(spec),
        "model_path": model_path,
        "model_name": model_name,
        "prompt_set": {
            "name": pset.name,
            "source": pset.source,
            "n": len(pset.records),
            "system_prompt": spec.system_prompt,
            "system_prompt_text": system_text,
            "shared_prefix_tokens": shared,
            "prompt_tokens_mean": sum(map(len, rendered)) / len(rendered),
            "prompt_tokens_max": max(map(len, rendered)),
            "tokenizer": model_name,
            "min_cascade_prefix": MIN_CASCADE_PREFIX,
        },
        "env": envinfo.capture(include_gpu=engine_info(spec.engine).is_vllm or spec.device != "cpu"),
        "plan": {
            "engines": {k: ep.to_dict() for k, ep in engines.items()},
            "cells": [c.to_dict() for c in all_cells(engines)],
        },
        "arm_switch": spec.arm_switch if engine_info(spec.engine).attention_axes else "shared",
        "thresholds": opts.thresholds.to_dict(),
        "fail_on": opts.fail_on,
        "engines": {},
        "timings": {},
    }
    if opts.shard:
        run["shard"] = str(opts.shard)  # the plan stays whole: every shard of a matrix has the same one
    from cascade_repro.explain import predictions_for

    run["predictions"] = predictions_for(run)  # what vLLM's rule says, shown next to the probe's counts
    if console is not None and shared < MIN_CASCADE_PREFIX:
        console.print(
            f"[yellow]warning:[/] shared prefix is {shared} tokens (< {MIN_CASCADE_PREFIX}): cascade cannot fire"
        )
    return PreparedRun(run_dir, run, list(pset.records), opts.fresh)


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
            if runstore.is_sample_line(line):
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Let SIGTERM unwind like Ctrl-C while workers run, so their process groups are killed.

    `timeout`, a cancelled CI job or a container stop send SIGTERM, which by default ends Python
    without cleanup: the worker then dies by PDEATHSIG but vLLM's engine-core process under it is
    orphaned and keeps the GPU (seen on the H200 when a `timeout` cut a run). Raising
    KeyboardInterrupt instead reaches ``_run_worker``'s handler, which kills the whole group.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def execute(run_dir: Path, show_progress: bool = True, console: Any = None) -> list[str]:
    """Run one worker per engine key with unfinished cells; return error lines for the summary."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    run = restrict(runstore.read_run_json(run_dir))  # a shard runs only its own engine keys
    spec = run["spec"]
    n_prompts = run["prompt_set"]["n"]
    cells = {c["cell_id"]: c for c in run["plan"]["cells"]}
    errors: list[str] = []
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), console=console, disable=not show_progress, transient=False,
    )  # fmt: skip
    done_before = sum(
        len([c for c in ep["cells"] if c in runstore.read_progress(runstore.samples_path(run_dir, key)).done])
        for key, ep in run["plan"]["engines"].items()
    )
    if done_before:
        # Said once, before the bar: a rerun that silently skipped work would look like a fast run.
        from rich.console import Console

        out = console if console is not None else Console(stderr=True, soft_wrap=True)
        out.print(
            f"resuming {run_dir.name}: {done_before} of {len(cells)} cells already done, "
            f"running the other {len(cells) - done_before} (--fresh starts over)",
            highlight=False,
        )
    with progress, sigterm_as_interrupt():
        total_waves = sum(math.ceil(n_prompts / c["batch"]) for c in cells.values())
        t_cells = progress.add_task("cells", total=len(cells), info="")
        t_waves = progress.add_task("waves", total=total_waves, info="")
        for key, ep in run["plan"]["engines"].items():
            path = runstore.samples_path(run_dir, key)
            prog = runstore.read_progress(path)
            done = [c for c in ep["cells"] if c in prog.done]
            progress.advance(t_cells, len(done))
            progress.advance(t_waves, sum(math.ceil(n_prompts / cells[c]["batch"]) for c in done))
            if len(done) == len(ep["cells"]):
                continue
            env = cuda_cache.apply(dict(os.environ, PYTHONUNBUFFERED="1"))
            gpu = str((run.get("env") or {}).get("gpu_name") or "")
            jit = cuda_cache.needs_fa2_jit(ep.get("fa_version"), gpu) and not cuda_cache.fa2_compiled(
                env, gpu
            )
            # A silent first FA2 start on a fresh Hopper machine lasts minutes: say why.
            progress.update(t_cells, info=f"engine {key}: starting" + (f" ({FA2_JIT_NOTE})" if jit else ""))
            rc, reason = _run_worker(
                run_dir, key, float(spec["engine_timeout"]), progress, t_cells, t_waves, env=env
            )
            if jit and runstore.read_progress(path).engine:
                cuda_cache.mark_fa2_compiled(env, gpu)
            prog = runstore.read_progress(path)
            unfinished = [c for c in ep["cells"] if c not in prog.done and c not in prog.errors]
            if unfinished:
                writer = runstore.JsonlWriter(path)
                for cid in unfinished:
                    writer.write(
                        {
                            "type": runstore.CELL_ERROR,
                            "cell_id": cid,
                            "reason": reason or f"worker exited {rc}",
                        }
                    )
                writer.close()
                progress.advance(t_cells, len(unfinished))
            for cid, why in runstore.read_progress(path).errors.items():
                errors.append(f"{cid}: {why}")
        progress.update(t_cells, info="")
    return errors


def _run_worker(
    run_dir: Path,
    key: str,
    timeout: float,
    progress: Any,
    t_cells: Any,
    t_waves: Any,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Run the worker of one engine key; kill its process group when it hangs past ``timeout``.

    ``timeout`` is inactivity: seconds without a new record or a new line in the worker's log, so a
    slow engine start (logging as it goes) is not killed but a silent hang is.
    """
    log_path = runstore.worker_log(run_dir, key)
    tail = _Tail(runstore.samples_path(run_dir, key))
    if env is None:
        env = cuda_cache.apply(dict(os.environ, PYTHONUNBUFFERED="1"))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cascade_repro.worker", str(run_dir), key],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
        last_activity = time.monotonic()
        log_size = 0
        tokens = 0
        t_start = time.monotonic()
        try:
            while proc.poll() is None:
                time.sleep(POLL_S)
                recs = tail.poll()
                size = log_path.stat().st_size
                if recs or size != log_size:
                    last_activity, log_size = time.monotonic(), size
                for r in recs:
                    t = r.get("type")
                    if t == runstore.WAVE:
                        progress.advance(t_waves)
                        tokens += r.get("tokens", 0)
                        rate = tokens / max(time.monotonic() - t_start, 1e-9)
                        progress.update(t_waves, info=f"{r['cell_id']} · {rate:,.0f} tok/s")
                    elif t in (runstore.CELL_DONE, runstore.CELL_ERROR):
                        progress.advance(t_cells)
                    elif t == runstore.ENGINE:
                        progress.update(t_cells, info=f"engine {key} up in {r.get('start_s', 0):.0f}s")
                if time.monotonic() - last_activity > timeout:
                    _kill_group(proc)
                    return -9, f"timeout: no progress for {timeout:.0f}s (--engine-timeout); worker killed"
        except BaseException:
            _kill_group(proc)
            raise
        for r in tail.poll():
            if r.get("type") in (runstore.CELL_DONE, runstore.CELL_ERROR):
                progress.advance(t_cells)
            elif r.get("type") == runstore.WAVE:
                progress.advance(t_waves)
    rc = proc.returncode
    if rc in (0, 3):
        return rc, ""
    line = _last_error_line(log_path)
    return rc, f"worker exited with code {rc}" + (f": {line}" if line else "")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _last_error_line(log_path: Path) -> str:
    """Return the last line of the worker log that names an error, for the report."""
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-200:]
    except OSError:
        return ""
    for line in reversed(lines):
        if re.search(r"(Error|Exception|Killed|out of memory)", line):
            return line.strip()[:300]
    return ""


def finalize(run_dir: Path, thresholds: Thresholds | None = None) -> tuple[Path, Any]:
    """Score the samples, write the tables and every report; return (run_dir, RunData)."""
    from cascade_repro.compare import build_tables
    from cascade_repro.report import write_reports
    from cascade_repro.report.load import load_run

    run = runstore.read_run_json(run_dir)
    th = thresholds or Thresholds(**run.get("thresholds", {}))
    scored = restrict(run)  # a shard scores its own cells; merge scores them all
    cells_df, pairs_df, comp_df = build_tables(scored, run_dir, th)
    for name, df in (("cells", cells_df), ("pairs", pairs_df), ("comparisons", comp_df)):
        tmp = run_dir / f".{name}.parquet.tmp"
        df.to_parquet(tmp, index=False)
        os.replace(tmp, run_dir / f"{name}.parquet")
    engines = {}
    for key in scored["plan"]["engines"]:
        prog = runstore.read_progress(runstore.samples_path(run_dir, key))
        eff = dict(prog.engine.get("effective", {}))
        errs = {c: e for c, e in prog.errors.items()}
        engines[key] = {
            "effective": eff,
            "start_s": prog.engine.get("start_s"),
            "status": "error" if errs else ("done" if prog.engine else "pending"),
            "error": next(iter(errs.values()), ""),
        }
    run["engines"] = engines
    run["thresholds"] = th.to_dict()
    runstore.write_run_json(run_dir, run)
    write_reports(run_dir)
    return run_dir, load_run(run_dir)


def run_matrix(spec: MatrixSpec, opts: RunOptions, console: Any = None) -> RunOutcome:
    """Prepare, execute and finalize a matrix; the library entry point behind ``cascade-repro matrix``."""
    from cascade_repro.outcome import outcome_of

    t0 = time.time()
    prepared = prepare(spec, opts, console)
    run_dir = prepared.run_dir
    with runstore.RunLock(run_dir):
        prepared.write()
        errors = execute(run_dir, opts.progress, console)
        run = runstore.read_run_json(run_dir)
        run["timings"] = {"total_s": round(time.time() - t0, 2)}
        runstore.write_run_json(run_dir, run)
        if not restrict(run)["plan"]["cells"]:  # an empty shard: nothing to score
            return RunOutcome(run_dir, 0, {}, errors)
        _, data = finalize(run_dir, opts.thresholds)
    o = outcome_of(data, opts.fail_on)
    return RunOutcome(run_dir, o.exit_code, o.counts, errors, o.headline, o.reason)
