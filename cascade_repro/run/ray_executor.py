"""`matrix --executor ray`: every engine key as one Ray task, the run directory written by the driver.

Imported only when asked for: Ray is an optional extra. Each engine key with unfinished cells
becomes one streaming Ray task (:func:`_key_task`) asking for the key's GPUs (``tp`` for vLLM, none
for the CPU engines, which ask one CPU) inside a placement group of one ``STRICT_PACK`` bundle, so a
TP>1 key's GPUs are on one node. No shared filesystem is assumed: the task gets run.json,
prompts.jsonl and the key's samples so far as bytes, runs the same worker process as the local
executor (``python -m cascade_repro.run.worker``) in a private temporary run directory under the
same watch (``supervise.Worker``, ``--engine-timeout`` as inactivity), and yields the samples
file's new whole lines and the worker log's new bytes as they appear. The driver appends them to
the run directory with the samples writer the local path uses (``jsonl.JsonlWriter``), so
resume, scoring and every report read what a local run would have written.

A task that died (its Ray worker or node lost, a cancelled task, the worker process killed by a
signal) is run again up to ``retries`` times, each attempt resuming from what the driver holds;
then its unfinished cells are ``error`` with the reason, as a dead local worker's are. A timeout is
not retried: a hang would hang again, as it does locally.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade_repro.engines import get as engine_info
from cascade_repro.errors import UsageError
from cascade_repro.plan import cuda_cache
from cascade_repro.plan.matrix import MatrixSpec, spec_of
from cascade_repro.run import supervise
from cascade_repro.rundir import codec, jsonl, layout, manifest
from cascade_repro.rundir.cells import EnginePlan

# The `ray` extra's requirement (tests/test_packaging.py holds pyproject.toml to it). The line names
# Ray itself: cascade-repro is not on the package index, so `cascade-repro[ray]` would not install.
RAY_REQUIREMENT = "ray>=2.9"
RAY_MISSING = f'--executor ray needs Ray: pip install "{RAY_REQUIREMENT}"'
POLL_S = 0.5
# How long after the task last said anything the driver gives up on it, beyond --engine-timeout
# (which the task applies itself): only a task whose node went silent without Ray noticing.
SILENCE_GRACE_S = 60.0
# The tool's own settings and test hooks travel with a task; nothing else of the driver's
# environment does (a remote node has its own PATH, caches and CUDA_VISIBLE_DEVICES).
ENV_PREFIX = "CASCADE_REPRO_"
OMP = "OMP_NUM_THREADS"


def import_ray() -> Any:
    """Ray, or the one line saying how to install it (exit 2)."""
    try:
        import ray
    except ImportError:
        raise UsageError(RAY_MISSING) from None
    return ray


def address_of(given: str | None) -> str | None:
    """The cluster to join: ``--ray-address``, else ``auto`` where RAY_ADDRESS is set, else None
    (start a local Ray)."""
    if given:
        return given
    return "auto" if os.environ.get("RAY_ADDRESS") else None


@dataclass(frozen=True)
class KeyNeed:
    """What one engine key's task asks of the cluster."""

    key: str
    gpus: int
    cpus: int

    def bundle(self) -> dict[str, float]:
        """The placement group's one bundle: the key's GPUs (and its CPU) on one node."""
        return {"GPU": float(self.gpus), "CPU": float(self.cpus)} if self.gpus else {"CPU": float(self.cpus)}

    def text(self) -> str:
        gpus = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"
        return f"{gpus}, {self.cpus} CPU" if self.gpus else f"{self.cpus} CPU"


def needs(
    spec: MatrixSpec, engines: Mapping[str, EnginePlan], keys: list[str] | None = None
) -> list[KeyNeed]:
    """Each engine key's ask: vLLM takes ``tp`` GPUs and a CPU; the CPU engines (hf, fake) a CPU,
    the hf engine on ``--device cuda`` a GPU too."""
    info = engine_info(spec.engine)
    out = []
    for key, ep in engines.items():
        if keys is not None and key not in keys:
            continue
        if info.is_vllm:
            gpus = int(ep.tp)
        else:
            gpus = 1 if str(spec.device).startswith("cuda") else 0
        out.append(KeyNeed(key, gpus, 1))
    return out


def node_resources(ray: Any) -> list[dict[str, float]]:
    """Each alive node's total resources."""
    return [dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")]


def unplaceable(need: KeyNeed, nodes: list[dict[str, float]]) -> str | None:
    """Why no node of the cluster can ever hold this key's bundle; None when one can."""
    bundle = need.bundle()
    if any(all(float(n.get(r, 0.0)) >= v for r, v in bundle.items()) for n in nodes):
        return None
    most = max((float(n.get("GPU", 0.0)) for n in nodes), default=0.0)
    return (
        f"engine key {need.key} asks for {need.text()} on one node; the cluster's largest node has "
        f"{most:g} GPU{'s' if most != 1 else ''} ({len(nodes)} node{'s' if len(nodes) != 1 else ''})"
    )


def coverage_lines(needs_: list[KeyNeed], nodes: list[dict[str, float]] | None) -> list[str]:
    """What ``--dry-run --executor ray`` says: each key's ask, and where a cluster was reachable,
    whether its nodes can hold it."""
    lines = []
    for n in needs_:
        line = f"ray task {n.key}: {n.text()}" + (" (STRICT_PACK placement group)" if n.gpus else "")
        if nodes is not None:
            why = unplaceable(n, nodes)
            line += f": cannot be placed ({why.partition('; ')[2]})" if why else ": the cluster has it"
        lines.append(line)
    if nodes is None:
        lines.append("no cluster asked (give --ray-address or set RAY_ADDRESS to check its resources)")
    else:
        gpus = sum(float(n.get("GPU", 0.0)) for n in nodes)
        cpus = sum(float(n.get("CPU", 0.0)) for n in nodes)
        lines.append(f"cluster: {len(nodes)} node(s), {gpus:g} GPUs, {cpus:g} CPUs")
    return lines


def dry_run_lines(spec: MatrixSpec, engines: Mapping[str, EnginePlan], address: str | None) -> list[str]:
    """``coverage_lines`` for a dry run: a cluster is joined only where one is named (never started)."""
    ray = import_ray()
    addr = address_of(address)
    nodes = None
    unreachable = ""
    if addr is not None:
        joined = not ray.is_initialized()
        try:
            if joined:
                _init(ray, addr)
            nodes = node_resources(ray)
        except UsageError as e:  # a plan is still a plan: said, not refused
            unreachable = str(e)
        finally:
            if joined and ray.is_initialized():
                ray.shutdown()
    lines = coverage_lines(needs(spec, engines), nodes)
    if unreachable:
        lines[-1] = f"{unreachable}; its resources were not checked"
    return lines


def _init(ray: Any, address: str | None) -> None:
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__
        raise UsageError(f"--ray-address {address}: cannot join the Ray cluster: {first}") from None


@dataclass
class _Attempt:
    """One key's task in flight."""

    key: str
    gen: Any
    pg: Any
    started: bool = False
    last_seen: float = field(default_factory=time.monotonic)
    writer: jsonl.JsonlWriter | None = None
    result: tuple[int, str, bool] | None = None  # the worker's end: rc, reason, worth a retry


class Session:
    """The driver's side: Ray joined (or started, and stopped again on exit), the keys run."""

    def __init__(self, address: str | None = None, retries: int = 1) -> None:
        self.ray = import_ray()
        self.address = address_of(address)
        self.retries = retries
        self._started = False

    def __enter__(self) -> Session:
        if not self.ray.is_initialized():
            _init(self.ray, self.address)
            self._started = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            self.ray.shutdown()

    def run_keys(
        self,
        run_dir: Path,
        keys: list[str],
        timeout: float,
        progress: Any,
        on_done: Callable[[str, int, str], None],
    ) -> None:
        """Run every key in ``keys`` as its own task, all at once (Ray queues what does not fit);
        ``on_done(key, rc, reason)`` once a key is finished for good (rc 0 or 3: the worker's own
        end; otherwise ``reason`` says why its unfinished cells failed)."""
        ray = self.ray
        run = manifest.read_manifest(run_dir)
        asks = {n.key: n for n in needs(spec_of(run.spec_json), run.plan.engines, keys)}
        nodes = node_resources(ray)
        for n in asks.values():  # fail fast: a bundle no node can hold would wait forever
            if (why := unplaceable(n, nodes)) is not None:
                raise UsageError(f"--executor ray: {why}")
        tries = dict.fromkeys(keys, 0)
        live: dict[Any, _Attempt] = {}

        def submit(key: str) -> None:
            live_attempt = self._submit(run_dir, key, asks[key], timeout)
            live[live_attempt.gen] = live_attempt
            progress.engine_starting(key, "queued on the Ray cluster")

        def finish(a: _Attempt, rc: int, reason: str, died: bool) -> None:
            self._release(a)
            if died and tries[a.key] < self.retries:
                tries[a.key] += 1
                _say(progress, f"engine key {a.key}: {reason}; retrying ({tries[a.key]} of {self.retries})")
                submit(a.key)
                return
            if died and self.retries:
                reason = f"{reason} (after {tries[a.key] + 1} attempts)"
            on_done(a.key, rc, reason)

        try:
            for key in keys:
                submit(key)
            while live:
                ready, _ = ray.wait(list(live), num_returns=1, timeout=POLL_S)
                for gen in ready:
                    a = live[gen]
                    try:
                        item = ray.get(next(gen))
                    except StopIteration:  # read to its end, so no result of the task is left unread
                        del live[gen]
                        if a.result is None:
                            a.result = (70, "the Ray task ended without saying how its worker exited", False)
                        finish(a, *a.result)
                        continue
                    except Exception as e:  # noqa: BLE001 - every Ray failure of a task: its worker or node died, it was cancelled
                        del live[gen]
                        finish(a, -9, f"Ray task died: {_one_line(e)}", True)
                        continue
                    a.last_seen = time.monotonic()
                    if (done := self._take(run_dir, a, item, progress)) is not None:
                        a.result = done
                progress.tick()
                now = time.monotonic()
                for gen, a in list(live.items()):
                    if a.started and now - a.last_seen > timeout + SILENCE_GRACE_S:
                        ray.cancel(gen, force=True)
                        del live[gen]
                        finish(a, -9, f"Ray task silent for {now - a.last_seen:.0f}s; cancelled", True)
        finally:  # Ctrl-C, SIGTERM or an error here: no task may go on writing for nobody
            for gen, a in live.items():
                ray.cancel(gen, force=True)
                self._release(a)

    def _submit(self, run_dir: Path, key: str, need: KeyNeed, timeout: float) -> _Attempt:
        ray = self.ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        pg = placement_group([need.bundle()], strategy="STRICT_PACK", name=f"cascade-repro:{key}")
        # Ray's own retry is off: an attempt must resume from the lines the driver holds by then.
        task = ray.remote(num_returns="streaming", max_retries=0)(_key_task)
        env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
        # Ray sets OMP_NUM_THREADS to a task's CPUs (1): a CPU engine would run on one thread and
        # report torch_threads 1. The worker gets this driver's setting instead, or none, as locally.
        env[OMP] = os.environ.get(OMP, "")
        gen = task.options(
            num_cpus=need.cpus,
            num_gpus=need.gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0),
        ).remote(key, _shipped(run_dir, key), float(timeout), env, _tool_version())
        return _Attempt(key, gen, pg)

    def _take(
        self, run_dir: Path, a: _Attempt, item: tuple[Any, ...], progress: Any
    ) -> tuple[int, str, bool] | None:
        """One message of a task: its start, new lines and log bytes (appended here), or its end."""
        kind = item[0]
        if kind == "start":
            a.started = True
            _append_log(layout.worker_log(run_dir, a.key), b"")  # there, as a local run's is
            return None
        if kind == "data":
            _, lines, log = item
            if log:
                _append_log(layout.worker_log(run_dir, a.key), log)
            if lines:
                if a.writer is None:
                    a.writer = jsonl.JsonlWriter(layout.samples_path(run_dir, a.key))
                for raw in lines.splitlines(keepends=True):
                    a.writer.write_line(raw)
                a.writer.sync()  # the worker synced its cell_done; resume trusts this copy now
                _feed(progress, a.key, lines)
            return None
        _, rc, stopped, last = item  # "exit"
        if stopped:
            return -9, stopped, False
        if rc in (0, 3):
            return rc, "", False
        reason = f"worker {supervise.exit_text(rc)}" + (f": {last}" if last else "")
        return rc, reason, rc < 0  # killed by a signal (the OOM killer, a kill -9): worth another try

    def _release(self, a: _Attempt) -> None:
        if a.writer is not None:
            a.writer.close()
            a.writer = None
        from ray.util.placement_group import remove_placement_group

        try:
            remove_placement_group(a.pg)
        except Exception:  # noqa: BLE001 - the group went with its node: nothing left to free
            pass


def _say(progress: Any, line: str) -> None:
    console = getattr(progress, "console", None)
    if console is not None and getattr(progress, "show", True):
        console.print(line, highlight=False, markup=False)


def _feed(progress: Any, key: str, lines: bytes) -> None:
    """The control records among ``lines`` to the progress display, as the local runner's tail does."""
    for line in lines.splitlines():
        if codec.is_sample_line(line):
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if r.get("type") == codec.ENGINE:
            progress.engine_up(key, float(r.get("start_s") or 0.0))
        else:
            progress.record(r)


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {first}"[:300]


def _append_log(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    with os.fdopen(fd, "ab") as f:
        f.write(data)


def _tool_version() -> str:
    from cascade_repro.run import envinfo

    return str(envinfo._version("cascade-repro"))


def _whole_lines(data: bytes) -> bytes:
    return data[: data.rfind(b"\n") + 1]


def _shipped(run_dir: Path, key: str) -> dict[str, bytes]:
    """What a task needs of the run directory, by its path inside it: run.json, prompts.jsonl and
    the key's samples so far (whole lines: a torn last line is the driver's to cut)."""
    files = {
        layout.RUN_JSON: (run_dir / layout.RUN_JSON).read_bytes(),
        layout.PROMPTS: layout.prompts_path(run_dir).read_bytes(),
    }
    samples = layout.samples_path(run_dir, key)
    if samples.is_file():
        files[str(samples.relative_to(run_dir))] = _whole_lines(samples.read_bytes())
    return files


def _key_task(
    key: str, files: dict[str, bytes], timeout: float, env_vars: dict[str, str], version: str
) -> Iterator[tuple[Any, ...]]:
    """The Ray task of one engine key (on whichever node Ray picked): the worker run in a private
    copy of the run directory; yields ``("start", host)``, then ``("data", lines, log)``
    as the samples file and the worker log grow, then ``("exit", rc, stopped, last_error_line)``."""
    tmp = Path(tempfile.mkdtemp(prefix="cascade-repro-ray-"))
    try:
        run_dir = tmp / "run"
        for rel, data in files.items():
            path = run_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        (run_dir / layout.SAMPLES).mkdir(exist_ok=True)
        host, mine = socket.gethostname(), _tool_version()
        yield ("start", host)
        if mine != version:  # records of another release would be scored as this one's
            yield ("exit", None, f"node {host} runs cascade-repro {mine}, the driver {version}", "")
            return
        samples = layout.samples_path(run_dir, key)
        log_path = layout.worker_log(run_dir, key)
        sent = samples.stat().st_size if samples.exists() else 0
        log_sent = 0

        def new() -> tuple[bytes, bytes]:
            nonlocal sent, log_sent
            lines = log = b""
            if samples.exists():
                with open(samples, "rb") as f:
                    f.seek(sent)
                    lines = _whole_lines(f.read())
                sent += len(lines)
            if log_path.exists():
                with open(log_path, "rb") as f:
                    f.seek(log_sent)
                    log = f.read()
                log_sent += len(log)
            return lines, log

        env = cuda_cache.apply(dict(os.environ, PYTHONUNBUFFERED="1", **env_vars))
        if not env.get(OMP):
            env.pop(OMP, None)
        argv = [sys.executable, "-m", "cascade_repro.run.worker", str(run_dir), key]
        stopped = None
        with supervise.Worker(argv, env=env, log_path=log_path) as w:
            while True:
                exited = w.poll() is not None
                lines, log = new()
                if lines:
                    w.mark_active()
                if lines or log:
                    yield ("data", lines, log)
                if exited:
                    break
                if w.idle_s() > timeout:
                    stopped = f"timeout: no progress for {timeout:.0f}s (--engine-timeout); worker killed"
                    break
                time.sleep(POLL_S)
        lines, log = new()  # what it wrote before it ended or was killed
        if lines or log:
            yield ("data", lines, log)
        yield ("exit", w.returncode, stopped, supervise.last_error_line(log_path))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
