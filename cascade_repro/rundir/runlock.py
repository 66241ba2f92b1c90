"""``.lock``: one process writes in a run directory at a time."""

from __future__ import annotations

import os
from pathlib import Path

from cascade_repro.errors import EnvironmentFailure, RunLockedError, UsageError, naming
from cascade_repro.rundir.layout import LOCK, shown
from cascade_repro.rundir.safety import refuse_run_links, safe_open


class RunLock:
    """An exclusive lock on a results directory: ``flock`` on a lock file holding the owner's pid.

    The kernel drops the lock when its holder dies, so a kill -9 does not block the rerun, and
    two reruns racing over a dead holder's file cannot both win (a pid check followed by
    unlink-and-recreate could hand the lock to both). The pid is only for the message.

    ``matrix``, ``report`` and ``merge`` write in a run directory under it, so it is also where a
    directory holding a link among its own files is refused (:func:`refuse_run_links`), the lock
    file first: it is opened with O_NOFOLLOW, as truncating it for the pid would empty a link's target.
    """

    def __init__(self, run_dir: Path, instead: str = "choose another --results-dir") -> None:
        self.path = run_dir / LOCK
        self.instead = instead  # what the "in use" line offers besides waiting ("" for nothing)
        self._fd: int | None = None

    def acquire(self) -> None:
        import fcntl

        for _ in range(10):
            if (file := not_a_folder(self.path.parent)) is not None:
                raise UsageError(
                    f"{shown(file)} is a file, not a folder: it cannot hold {shown(self.path.parent)}"
                )
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = safe_open(self.path, os.O_CREAT | os.O_RDWR)
            except OSError as e:  # a read-only or foreign directory: one line, not a traceback
                raise EnvironmentFailure(f"cannot write in {self.path.parent}: {e.strerror or e}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                pid = _read_pid(self.path)
                raise RunLockedError(
                    f"{shown(self.path.parent)} is in use by another cascade-repro run (pid {pid or 'unknown'}); "
                    f"wait for it{' or ' + self.instead if self.instead else ''}"
                ) from None
            # A holder releasing meanwhile unlinks the path: make sure we locked the file that is there.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            self._fd = fd
            try:
                refuse_run_links(self.path.parent)
                with naming(self.path):  # a full disk: the one line names the lock file
                    os.ftruncate(fd, 0)
                    os.write(fd, str(os.getpid()).encode())
            except BaseException:  # a refusal, or Ctrl-C / SIGTERM: ``with`` never reaches __exit__
                self.release()
                raise
            return
        raise RunLockedError(f"could not lock {self.path.parent}")

    def release(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)  # while still locked, so no one locks a doomed file
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def not_a_folder(path: Path) -> Path | None:
    """The first of ``path`` and the folders above it that exists and is not a folder (a file
    given as ``--results-dir`` or as a merge's output), or None: the command line named a file
    where a folder belongs, a usage error, not the machine refusing."""
    path = Path(path)
    for p in (*reversed(path.parents), path):
        if p.exists() and not p.is_dir():
            return p
    return None


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None
