"""One worker process under watch: its own session, its log, timeouts, and the whole group killed.

The matrix runner (one worker per engine key, ``runner.py``) and ``cascade-repro kernel`` (one
worker for the grid, restarted after a crash, ``kernel/worker.py``) both do their GPU work in a
child process. vLLM starts processes of its own under it (the engine core, one per TP rank), which
outlive a killed worker and keep the GPU; so a worker starts a new session, its pid is the group id
of everything under it, and stopping it kills that whole group (``kill_group``).

:class:`Worker` starts the process (output appended to a log, or inherited) and measures activity:
``idle_s`` is the time since the log last grew or the caller last saw progress (``mark_active``).
:func:`watch` polls until the process ends, or kills it when the caller's check gives a reason;
leaving the ``with`` block of a :class:`Worker` kills the group in any case (what an exiting worker
left behind, and everything on Ctrl-C or SIGTERM). :func:`sigterm_as_interrupt` makes SIGTERM
unwind like Ctrl-C, so that ``with`` block (and every other cleanup on the way out) runs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

T = TypeVar("T")

# How long to wait for a killed process to be reaped: one stuck in the driver can take long.
KILL_WAIT_S = 30.0
ERROR_LINE = re.compile(r"(Error|Exception|Killed|out of memory)")


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW, 0o666)


class Worker:
    """A child process in a session of its own; a context manager that kills its group on exit."""

    def __init__(
        self, argv: Sequence[str], *, env: dict[str, str] | None = None, log_path: Path | None = None
    ) -> None:
        self.log_path = log_path
        # O_NOFOLLOW: a log planted as a link in a run directory must not append to its target.
        self._log: IO[bytes] | None = (
            open(log_path, "ab", opener=_no_follow) if log_path is not None else None
        )
        try:
            # subprocess.Popen looked up here, at call time: tests stand a fake in for it.
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT if self._log is not None else None,
                env=env,
                start_new_session=True,
            )
        except BaseException:
            self.close()
            raise
        self.started = time.monotonic()
        self._active = self.started
        self._log_size = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def age_s(self) -> float:
        """Seconds since the process started."""
        return time.monotonic() - self.started

    def mark_active(self) -> None:
        """The caller saw progress (a record, an event): the idle clock starts again."""
        self._active = time.monotonic()

    def idle_s(self) -> float:
        """Seconds without progress: since the last ``mark_active`` or the log's last growth."""
        if self.log_path is not None:
            try:
                size = self.log_path.stat().st_size
            except OSError:
                size = self._log_size
            if size != self._log_size:
                self._log_size = size
                self.mark_active()
        return time.monotonic() - self._active

    def kill(self) -> None:
        """Kill the process and everything in its group, then reap it."""
        kill_group(self.proc)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Worker:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.kill()
        finally:
            self.close()


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group led by ``proc`` (its session), then wait for ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:  # not a group leader after all (a stand-in Popen): the process itself
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        pass


def watch(worker: Worker, check: Callable[[], T | None], poll_s: float) -> T | None:
    """Call ``check()`` every ``poll_s`` seconds until the worker exits (and once after, to read
    what it wrote last); when ``check`` returns a reason to stop first, kill the group and return it.

    Returns None when the process ended on its own (its exit code is ``worker.returncode``).
    """
    while True:
        exited = worker.poll() is not None
        reason = check()
        if exited:
            return None
        if reason is not None:
            worker.kill()
            return reason
        time.sleep(poll_s)


def exit_text(rc: int | None) -> str:
    """How a process ended, in words: ``exit code 1``, ``killed by SIGKILL``."""
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def last_error_line(log_path: Path) -> str:
    """The last line of a worker's log (of its last 200) that names an error, for a report."""
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-200:]
    except OSError:
        return ""
    for line in reversed(lines):
        if ERROR_LINE.search(line):
            return line.strip()[:300]
    return ""


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Let SIGTERM and SIGHUP unwind like Ctrl-C (a KeyboardInterrupt) inside the block.

    `timeout`, a cancelled CI job or a container stop send SIGTERM, which by default ends Python
    without cleanup: exit 143 and no message, a run directory's ``.lock`` left behind, a model
    conversion's temp folder left in the cache, and a worker's engine-core process orphaned with
    the GPU (seen on the H200 when a `timeout` cut a run: the worker died by PDEATHSIG, vLLM's
    process under it did not). As a KeyboardInterrupt it reaches the same handlers as Ctrl-C: every
    ``with`` and ``finally`` on the way out, and the command's exit 130 with its resume line.

    One SIGTERM is one interrupt: a second while the first unwinds is ignored, so it cannot cut the
    cleanup the first one started (a ``.lock`` half released). Only the main thread can take signal
    handlers; elsewhere the block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        if _sigterm["fired"]:
            return
        _sigterm["fired"] = True
        raise KeyboardInterrupt

    # SIGHUP (the terminal or the ssh session closed) ends the command the same way: by default it
    # too ends Python with no cleanup and no message (exit 129).
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    _sigterm["depth"] += 1
    try:
        yield
    finally:
        _sigterm["depth"] -= 1
        if not _sigterm["depth"]:  # the outermost block: the next SIGTERM is a new interrupt
            _sigterm["fired"] = False
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# Shared by nested blocks (the command's, the runner's inside it): the first SIGTERM fires in the
# innermost, and a second must not fire in an outer one while the first still unwinds.
_sigterm = {"depth": 0, "fired": False}
