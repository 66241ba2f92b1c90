"""The one writer of a run directory's JSONL files (samples, reference records), and the raw reader."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cascade_repro.errors import name_oserror, naming
from cascade_repro.rundir.codec import Record, encode
from cascade_repro.rundir.safety import safe_open


class JsonlWriter:
    """Append records to a JSONL file, one whole line per write.

    ``flush`` hands the lines to the OS (a killed process loses nothing flushed); ``sync`` also
    fsyncs, for the records resume depends on (``cell_done``), since only a machine crash can lose
    flushed lines and resume restarts unfinished cells anyway (an fsync per wave would cost a disk
    round trip for nothing). On open, a torn
    last line (a crash mid-write) is cut off so appends start on a clean line.

    ``background=True`` encodes and writes on a thread, in the order the calls came: the caller's
    ``write`` and ``flush`` only queue, so a vLLM worker's next wave starts while the last one's
    records are still being turned into JSON. ``wait`` returns once everything queued is written; ``sync`` and
    ``close`` wait first. A write that failed on the thread is raised by the next call. A process
    killed with records still queued loses them, as it loses the wave it was generating: resume
    counts only what reached the file.
    """

    _WRITE, _RAW, _FLUSH, _WAIT, _STOP = range(5)

    def __init__(self, path: Path, *, background: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        truncate_torn_tail(path)
        # Never through a link planted in the run directory (see refuse_links).
        fd = safe_open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._f = os.fdopen(fd, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.path = path  # what an error of a write names (a full disk)
        self._queue: Any = None
        self._error: BaseException | None = None
        if background:
            import queue
            import threading

            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._run, name="jsonl-writer", daemon=True)
            self._thread.start()

    @staticmethod
    def _line(record: Record | dict[str, Any]) -> str:
        if isinstance(record, dict):
            return json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        return encode(record) + "\n"

    def write(self, record: Record | dict[str, Any]) -> None:
        """Append one record (a typed record through :func:`encode`, or a JSON object as is)."""
        if self._queue is not None:
            self._raise_pending()
            self._queue.put((self._WRITE, record))
        else:
            try:
                self._f.write(self._line(record))
            except OSError as e:
                raise name_oserror(e, self.path) from None

    def write_line(self, raw: bytes) -> None:
        """Append a line another writer wrote (a kept wave's record), byte for byte."""
        if self._queue is not None:
            self._raise_pending()
            self._queue.put((self._RAW, raw))
        else:
            try:
                self._f.write(raw.decode("utf-8"))
            except OSError as e:
                raise name_oserror(e, self.path) from None

    def flush(self) -> None:
        if self._queue is not None:
            self._raise_pending()
            self._queue.put((self._FLUSH, None))
        else:
            with naming(self.path):
                self._f.flush()

    def wait(self) -> None:
        """Return once every record queued so far is written and flushed (no-op in the foreground)."""
        if self._queue is not None and self._thread.is_alive():
            import threading

            done = threading.Event()
            self._queue.put((self._WAIT, done))
            done.wait()
        self._raise_pending()

    def sync(self) -> None:
        self.wait()
        with naming(self.path):
            self._f.flush()
            os.fsync(self._f.fileno())

    def close(self) -> None:
        if self._f.closed:
            return
        try:
            self.sync()
        finally:
            if self._queue is not None:
                self._queue.put((self._STOP, None))
                self._thread.join()
            with naming(self.path):
                self._f.close()

    def _raise_pending(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _run(self) -> None:
        while True:
            op, arg = self._queue.get()
            if op == self._STOP:
                return
            if op == self._WAIT:
                if self._error is None:
                    try:
                        self._f.flush()
                    except BaseException as e:  # noqa: BLE001 - handed to the caller
                        self._error = name_oserror(e, self.path)
                arg.set()
                continue
            if self._error is not None:
                continue  # after a failed write nothing more is written: the caller sees the error
            try:
                if op == self._WRITE:
                    self._f.write(self._line(arg))
                elif op == self._RAW:
                    self._f.write(arg.decode("utf-8"))
                else:
                    self._f.flush()
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                self._error = name_oserror(e, self.path)


def truncate_torn_tail(path: Path) -> None:
    """Drop bytes after the last newline (an interrupted write); never through a link."""
    if not path.exists():
        return
    size = path.stat().st_size
    if size == 0:
        return
    with os.fdopen(safe_open(path, os.O_RDWR), "rb+") as f:
        f.seek(max(0, size - 1))
        if f.read(1) == b"\n":
            return
        # Scan back in chunks for the last newline.
        pos = size
        chunk = 65536
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            buf = f.read(pos - start)
            i = buf.rfind(b"\n")
            if i >= 0:
                f.truncate(start + i + 1)
                return
            pos = start
        f.truncate(0)


def iter_records(path: Path) -> Iterator[dict[str, Any]]:
    """Yield whole records of a JSONL file; skip a torn last line and undecodable lines."""
    if not path.exists():
        return
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                return  # torn tail
            try:
                yield json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
