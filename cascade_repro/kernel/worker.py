"""Run the grid in a worker process, so that no single case can take the whole run down with it.

A kernel that segfaults or aborts kills its process, and one illegal memory access leaves the CUDA
context unusable for every later case of that process. :func:`run_grid_isolated` (the parent, which
never touches CUDA or vLLM) therefore starts ``python -m cascade_repro.kernel.worker SPEC EVENTS``,
which imports vLLM once and runs the cases in order, appending one JSON line per event to EVENTS:

- ``{"event": "ready", "env": {...}}`` once vLLM is imported;
- ``{"event": "start", "i": i}`` before case ``i`` (its index in the parent's list);
- ``{"event": "result", "i": i, "result": {...}}`` after it (``CaseResult.to_dict``);
- ``{"event": "fatal", "message": "..."}`` when vLLM cannot be loaded (exit code 2).

After a case that ends in an error the worker checks that the CUDA context still runs work; if not,
it exits with :data:`EXIT_CUDA_LOST`. When the worker dies, hangs past ``case_timeout`` or fails to
start, the parent records the case in flight as an ``error`` row and starts a new worker for the cases
left (at most ``max_restarts`` times). ``max_seconds`` bounds the whole run: cases not finished by
then are ``skipped``, so a run under a hard time limit still ends with complete reports. The worker
runs in a session of its own, under the runner's supervisor (:mod:`cascade_repro.run.supervise`):
stopping it kills its whole process group.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cascade_repro.kernel.grid import KernelCase
from cascade_repro.kernel.run import (
    DEFAULT_EPS,
    DEFAULT_FACTOR,
    CaseResult,
    MissingRequirement,
    VllmApi,
    check_inject,
    cuda_usable,
    environment,
    error_line,
    load_vllm,
    run_one,
)
from cascade_repro.plan import cuda_cache
from cascade_repro.run import supervise

EXIT_OK = 0
EXIT_FATAL = 2
EXIT_CUDA_LOST = 3
DEFAULT_CASE_TIMEOUT = 180.0
DEFAULT_STARTUP_TIMEOUT = 300.0
DEFAULT_MAX_RESTARTS = 8
POLL_S = 0.05


# --------------------------------------------------------------------------------------------
# The worker process
# --------------------------------------------------------------------------------------------


def load_api(fake_module: str | None) -> VllmApi:
    """vLLM's backend, or (tests) a stand-in module loaded from a file with the same functions."""
    if not fake_module:
        return load_vllm()
    import importlib.util

    spec = importlib.util.spec_from_file_location("cascade_repro_fake_flash_attn", fake_module)
    if spec is None or spec.loader is None:
        raise MissingRequirement(f"cannot load {fake_module}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    unsupported = getattr(mod, "UNSUPPORTED", {})
    return VllmApi(module=mod, version="fake", unsupported_reason=lambda v: unsupported.get(v))


def _emit(f: Any, event: dict) -> None:
    f.write(json.dumps(event) + "\n")
    f.flush()


def worker_main(spec_path: str, events_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    device = spec.get("device", "cuda")
    with open(events_path, "a", encoding="utf-8") as ev:
        try:
            api = load_api(spec.get("fake_module"))
            env = environment(api, device)
        except MissingRequirement as e:
            _emit(ev, {"event": "fatal", "message": str(e)})
            return EXIT_FATAL
        except Exception as e:  # noqa: BLE001 - e.g. CUDA failing to initialise
            _emit(
                ev, {"event": "fatal", "message": f"cascade-repro kernel: starting failed: {error_line(e)}"}
            )
            return EXIT_FATAL
        _emit(ev, {"event": "ready", "env": env})
        cases = [KernelCase(**c) for c in spec["cases"]]
        unsupported = {v: api.unsupported_reason(v) for v in sorted({c.fa_version for c in cases})}
        for i, case in zip(spec["index"], cases, strict=True):
            _emit(ev, {"event": "start", "i": i})
            res = run_one(api, case, inject=spec.get("inject"), factor=spec["factor"], eps=spec["eps"],
                          device=device, num_sms=env.get("sms"), unsupported=unsupported)  # fmt: skip
            _emit(ev, {"event": "result", "i": i, "result": res.to_dict()})
            if res.status == "error" and not cuda_usable(device):
                return EXIT_CUDA_LOST
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m cascade_repro.kernel.worker SPEC_JSON EVENTS_JSONL", file=sys.stderr)
        return EXIT_FATAL
    return worker_main(argv[0], argv[1])


# --------------------------------------------------------------------------------------------
# The parent
# --------------------------------------------------------------------------------------------


class _Events:
    """Reads the complete lines appended to the events file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.buf = ""

    def new(self) -> list[dict]:
        try:
            with open(self.path, encoding="utf-8") as f:
                f.seek(self.pos)
                chunk = f.read()
                self.pos = f.tell()
        except FileNotFoundError:
            return []
        self.buf += chunk
        *lines, self.buf = self.buf.split("\n")
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


def _child_env() -> dict[str, str]:
    """The parent's environment, with this copy of cascade_repro first on the worker's path."""
    import cascade_repro

    root = str(Path(cascade_repro.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    # The first FA2 call of each configuration compiles PTX for minutes on a Hopper GPU; the
    # machine's cache (cuda_cache.py) keeps every configuration.
    return dict(cuda_cache.apply(env))


@dataclass
class _Attempt:
    """What one worker process did: whether it reported ready, the case in flight when it ended, why
    it could not start, why the parent stopped it (status and reason for that case), its exit code."""

    ready: bool = False
    current: int | None = None
    fatal: str | None = None
    stop: tuple[str, str] | None = None
    rc: int | None = None


def _run_worker(
    spec_path: Path,
    events_path: Path,
    on_ready: Callable[[dict], None],
    on_case: Callable[[int, dict], None],
    *,
    deadline: float | None,
    max_seconds: float | None,
    startup_timeout: float,
    case_timeout: float,
) -> _Attempt:
    """Run one worker over a spec until it exits, or kill its process group when it hangs (no start
    within ``startup_timeout``, one case past ``case_timeout``) or the run's ``deadline`` passes."""
    att = _Attempt()
    reader = _Events(events_path)

    def check() -> tuple[str, str] | None:
        for ev in reader.new():
            kind = ev.get("event")
            if kind == "ready":
                att.ready = True
                w.mark_active()
                on_ready(ev.get("env") or {})
            elif kind == "start":
                att.current = int(ev["i"])
                w.mark_active()
            elif kind == "result":
                on_case(int(ev["i"]), ev["result"])
                att.current = None
                w.mark_active()
            elif kind == "fatal":
                att.fatal = str(ev.get("message") or "the worker could not start")
        if deadline is not None and time.monotonic() >= deadline:
            return ("skipped", f"not run to the end: the run's time limit (--max-seconds "
                               f"{max_seconds:g}) was reached")  # fmt: skip
        if not att.ready and w.age_s() > startup_timeout:
            return ("error", f"the worker did not start within {startup_timeout:g} s")
        if att.ready and att.current is not None and w.idle_s() > case_timeout:
            return ("error", f"timed out after {case_timeout:g} s (worker killed)")
        return None

    argv = [sys.executable, "-m", "cascade_repro.kernel.worker", str(spec_path), str(events_path)]
    with supervise.Worker(argv, env=_child_env()) as w:
        att.stop = supervise.watch(w, check, POLL_S)
    att.rc = w.returncode
    return att


def run_grid_isolated(
    cases: list[KernelCase],
    *,
    inject: str | None = None,
    factor: float = DEFAULT_FACTOR,
    eps: float = DEFAULT_EPS,
    device: str = "cuda",
    on_result: Callable[[CaseResult, int, int], None] | None = None,
    case_timeout: float = DEFAULT_CASE_TIMEOUT,
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
    max_seconds: float | None = None,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    fake_module: str | None = None,
    env: dict[str, Any] | None = None,
) -> tuple[list[CaseResult], dict]:
    """Run ``cases`` in worker processes; return one result per case, in order, and the environment.

    ``on_result(result, k, n)`` is called for the k-th finished case of n (results come in order,
    except the rows the parent writes for the rest of the grid when it gives up). Raises
    MissingRequirement when the first worker reports that vLLM cannot be loaded. ``env``, if given,
    is filled with the environment as soon as the first worker reports it.
    """
    check_inject(inject)
    n = len(cases)
    results: dict[int, CaseResult] = {}
    env = {} if env is None else env
    notes: list[str] = []
    t_start = time.monotonic()
    deadline = None if max_seconds is None else t_start + max_seconds
    restarts = 0

    def record(i: int, res: CaseResult) -> None:
        if i in results:
            return
        results[i] = res
        if on_result is not None:
            on_result(res, len(results) - 1, n)

    def give_up(status: str, reason: str) -> None:
        for i in range(n):
            if i not in results:
                record(i, CaseResult(cases[i], status, reason))

    with tempfile.TemporaryDirectory(prefix="cascade-repro-kernel-") as tmp:
        attempt = 0
        while len(results) < n:
            if deadline is not None and time.monotonic() >= deadline:
                give_up(
                    "skipped", f"not run: the run's time limit (--max-seconds {max_seconds:g}) was reached"
                )
                break
            if restarts > max_restarts:
                give_up(
                    "error", f"not run: the worker process failed {restarts} times ({'; '.join(notes[-3:])})"
                )
                break
            pending = [i for i in range(n) if i not in results]
            attempt += 1
            spec_path = Path(tmp) / f"spec-{attempt}.json"
            events_path = Path(tmp) / f"events-{attempt}.jsonl"
            spec_path.write_text(
                json.dumps({"cases": [asdict(cases[i]) for i in pending], "index": pending, "inject": inject,
                            "factor": factor, "eps": eps, "device": device, "fake_module": fake_module}),
                encoding="utf-8",
            )  # fmt: skip
            events_path.touch()

            def on_ready(worker_env: dict) -> None:
                if not env:
                    env.update(worker_env)

            def on_case(i: int, result: dict) -> None:
                record(i, CaseResult.from_dict(cases[i], result))

            att = _run_worker(spec_path, events_path, on_ready, on_case, deadline=deadline,
                              max_seconds=max_seconds, startup_timeout=startup_timeout,
                              case_timeout=case_timeout)  # fmt: skip
            ready, current, fatal, stop, rc = att.ready, att.current, att.fatal, att.stop, att.rc
            if fatal is not None and not ready:
                if not results:
                    raise MissingRequirement(fatal)
                give_up("error", f"not run: a restarted worker could not start: {fatal}")
                break
            if stop is not None and stop[0] == "skipped":
                give_up(*stop)
                break
            if len(results) == n:
                break
            if stop is not None:
                what = stop[1]
            elif rc == EXIT_CUDA_LOST:
                what = "the CUDA context was lost"
            else:
                what = f"the worker process died ({supervise.exit_text(rc)})"
            if current is not None and current not in results:
                reason = what if stop is not None else f"{what} while running this case"
                record(current, CaseResult(cases[current], "error", reason))
            elif not ready:
                if attempt == 1:
                    raise MissingRequirement(
                        f"cascade-repro kernel: the worker process did not start ({what}); its output is above"
                    )
                what = f"the worker did not start ({what})"
            notes.append(what)
            restarts += 1
    return [results[i] for i in range(n)], env


if __name__ == "__main__":
    sys.exit(main())
