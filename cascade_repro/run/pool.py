"""The local executor's workers: one per engine key, one at a time or several side by side.

Each worker runs under the same watch (``KeyWatch``): the records it appends go to the progress,
and a worker silent past ``--engine-timeout`` is killed with its whole process group. Run side by
side (``run_side_by_side``), each key is placed by the packing (``plan/packing.py``: its GPUs, its
memory), started in plan order as room frees, and ends on its own: a crash or a hang of one kills
only that one, whose unfinished cells the runner marks as errors while the others go on. Ctrl-C or
SIGTERM kills every running group.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cascade_repro.plan.packing import Packing
from cascade_repro.run import supervise
from cascade_repro.rundir import codec, layout

POLL_S = 0.5


class Tail:
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


class KeyWatch:
    """What the runner checks of one key's worker every poll: its new control records (to the
    progress, each one resetting the idle clock) and the inactivity timeout."""

    def __init__(self, run_dir: Path, key: str, timeout: float, progress: Any) -> None:
        self.key, self.timeout, self.progress = key, timeout, progress
        self.tail = Tail(layout.samples_path(run_dir, key))

    def check(self, w: supervise.Worker) -> str | None:
        recs = self.tail.poll()
        if recs:
            w.mark_active()
        for r in recs:
            if r.get("type") == codec.ENGINE:
                self.progress.engine_up(self.key, float(r.get("start_s") or 0.0))
            else:
                self.progress.record(r)
        self.progress.tick()
        if w.idle_s() > self.timeout:
            return f"timeout: no progress for {self.timeout:.0f}s (--engine-timeout); worker killed"
        return None


def worker_argv(run_dir: Path, key: str) -> list[str]:
    return [sys.executable, "-m", "cascade_repro.run.worker", str(run_dir), key]


def outcome(w: supervise.Worker, stopped: str | None, log_path: Path) -> tuple[int, str]:
    """A finished worker's (exit code, reason): -9 and the watch's reason when it was stopped; a
    clean exit (0, or 3: some cells errored, each recorded) has no reason."""
    if stopped is not None:
        return -9, stopped
    rc = w.returncode if w.returncode is not None else -9
    if rc in (0, 3):
        return rc, ""
    line = supervise.last_error_line(log_path)
    return rc, f"worker exited with code {rc}" + (f": {line}" if line else "")


def run_side_by_side(
    run_dir: Path,
    keys: Sequence[tuple[str, int]],
    packing: Packing,
    timeout: float,
    progress: Any,
    env_of: Callable[[str, dict[str, str]], dict[str, str]],
    starting: Callable[[str], None],
    ended: Callable[[str, int, str], None],
    poll_s: float = POLL_S,
) -> None:
    """Run the workers of ``keys`` (in plan order, with their TP sizes) as the packing places them.

    ``env_of(key, placed)``: the worker's environment, given the packing's variables for its GPUs;
    ``starting(key)`` is called as it starts, ``ended(key, rc, reason)`` as it ends (its unfinished
    cells become errors there), whatever the others do. A key waits for room; none overtakes it.
    """
    packer = packing.packer()
    pending = list(keys)
    running: dict[str, tuple[supervise.Worker, KeyWatch]] = {}
    try:
        while pending or running:
            while pending:
                key, tp = pending[0]
                gpus = packer.place(key, tp)
                if gpus is None:
                    break
                pending.pop(0)
                starting(key)
                env = env_of(key, packing.env_for(tp, gpus))
                w = supervise.Worker(
                    worker_argv(run_dir, key), env=env, log_path=layout.worker_log(run_dir, key)
                )
                running[key] = (w, KeyWatch(run_dir, key, timeout, progress))
            if not running and pending:  # the packing refuses what can never fit: never wait forever
                raise RuntimeError(f"engine key {pending[0][0]} fits nowhere and nothing is running")
            for key, (w, watch) in list(running.items()):
                exited = w.poll() is not None
                reason = watch.check(w)  # after an exit: what the worker wrote last
                if not exited and reason is None:
                    continue
                # As a sequential run's `with` does when its worker ends: the whole group killed
                # (what the worker left running: vLLM's engine core), at once, before its pid is reused.
                w.__exit__(None, None, None)
                del running[key]
                packer.release(key)
                ended(key, *outcome(w, None if exited else reason, layout.worker_log(run_dir, key)))
            if running:
                time.sleep(poll_s)
    finally:  # an interrupt (Ctrl-C, SIGTERM) or a bug: every group still running is killed
        for w, _ in running.values():
            w.__exit__(None, None, None)
