"""Run-directory layout, append-only JSONL records, the lock file and resume bookkeeping.

This module owns the run directory's file names: no other module spells one out.

    run.json                 the manifest: spec, plan, prompt-set facts, environment, engines, timings
    prompts.jsonl            the prompt records, index i = prompt_index i
    samples/<key>.jsonl      append-only records of one engine key's worker
    worker-<key>.log         that worker's stderr
    probe/<key>/             the vLLM probe's control and counts files of that engine
    cells.parquet pairs.parquet comparisons.parquet     the scored tables
    report.md report.html summary.json junit.xml        the reports
    minimize/<pair>/         `cascade-repro minimize` output
    .lock                    held while a process writes here
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade_repro.errors import EnvironmentFailure, RunLockedError, UsageError

RUN_JSON = "run.json"
PROMPTS = "prompts.jsonl"
SAMPLES = "samples"
PROBE = "probe"
MINIMIZE = "minimize"
LOCK = ".lock"
CELLS, PAIRS, COMPARISONS = "cells.parquet", "pairs.parquet", "comparisons.parquet"
TABLES = (CELLS, PAIRS, COMPARISONS)
REPORT_MD, REPORT_HTML, SUMMARY_JSON, JUNIT_XML = "report.md", "report.html", "summary.json", "junit.xml"
REPORTS = (REPORT_MD, REPORT_HTML, SUMMARY_JSON, JUNIT_XML)
SWEEP_MD = "sweep.md"  # explain --measure's table


# Records of a samples file, one JSON object per line, written by JsonlWriter only (compact
# separators, keys in insertion order). A sample record starts with its type, cell id, wave and
# prompt index, in that order (sample_record builds it so): readers skip sample lines by SAMPLE_PREFIX
# without parsing them, and report/load picks wanted ones by SAMPLE_HEAD.
SAMPLE, WAVE, ENGINE = "sample", "wave", "engine"
CELL_START, CELL_DONE, CELL_ERROR = "cell_start", "cell_done", "cell_error"
SAMPLE_PREFIX = b'{"type":"sample"'
SAMPLE_HEAD = re.compile(
    rb'\{\s*"type"\s*:\s*"sample"\s*,\s*"cell_id"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,'
    rb'(?:\s*"wave"\s*:\s*-?\d+\s*,)?\s*"prompt_index"\s*:\s*(-?\d+)\s*[,}]'
)


def sample_record(cell_id: str, wave: int, prompt_index: int, fields: dict[str, Any]) -> dict[str, Any]:
    """A sample record with its head in the layout SAMPLE_PREFIX and SAMPLE_HEAD read."""
    return {"type": SAMPLE, "cell_id": cell_id, "wave": wave, "prompt_index": prompt_index, **fields}


def is_sample_line(raw: bytes) -> bool:
    return raw.startswith(SAMPLE_PREFIX)


def samples_path(run_dir: Path, engine_key: str) -> Path:
    return run_dir / SAMPLES / f"{engine_key}.jsonl"


def samples_files(run_dir: Path) -> list[Path]:
    """Every engine key's samples file, sorted by name."""
    return sorted((Path(run_dir) / SAMPLES).glob("*.jsonl"))


def probe_dir(run_dir: Path, engine_key: str) -> Path:
    return Path(run_dir) / PROBE / engine_key


def prompts_path(run_dir: Path) -> Path:
    return Path(run_dir) / PROMPTS


def read_prompts(run_dir: Path) -> list[dict[str, Any]]:
    """The run's prompt records as written by the runner (``key``, ``prompt``, IFEval fields)."""
    with open(prompts_path(run_dir), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_prompts(run_dir: Path, records: list[dict[str, Any]]) -> None:
    """Write prompts.jsonl atomically (temp file and rename)."""
    write_text_atomic(
        prompts_path(run_dir), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    )


def write_parquet_atomic(df: Any, path: Path) -> None:
    """Write a table through a temp file and rename; a failed write leaves no temp file behind."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_run_json(run_dir: Path, run: dict[str, Any]) -> None:
    write_json_atomic(Path(run_dir) / RUN_JSON, run)


def worker_log(run_dir: Path, engine_key: str) -> Path:
    return run_dir / f"worker-{engine_key}.log"


def new_run_id(now: str) -> str:
    """Return a sortable run id from an ISO timestamp (``20261130-053012``)."""
    return re.sub(r"[^0-9]", "", now)[:14].ljust(14, "0")[:8] + "-" + re.sub(r"[^0-9]", "", now)[8:14]


def sweep_path(run_dir: Path) -> Path:
    return run_dir / SWEEP_MD


def write_text_atomic(path: Path, text: str) -> None:
    """Write text through a temp file and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temp file and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_run_json(run_dir: Path) -> dict[str, Any]:
    p = run_dir / RUN_JSON
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"not a cascade-repro run directory: {run_dir} (missing run.json)") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{p}: corrupt JSON at line {e.lineno}") from None


class JsonlWriter:
    """Append records to a JSONL file, one whole line per write.

    ``flush`` hands the lines to the OS (a killed process loses nothing flushed); ``sync`` also
    fsyncs, for the records resume depends on (``cell_done``), since only a machine crash can lose
    flushed lines and resume restarts unfinished cells anyway (an fsync costs a disk round trip
    per wave for nothing: 0.2-1.3 ms on the CPU box, benchmarks/RESULTS.md). On open, a torn
    last line (a crash mid-write) is cut off so appends start on a clean line.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        truncate_torn_tail(path)
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        self._f.flush()

    def sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if not self._f.closed:
            self.sync()
            self._f.close()


def truncate_torn_tail(path: Path) -> None:
    """Drop bytes after the last newline (an interrupted write)."""
    if not path.exists():
        return
    size = path.stat().st_size
    if size == 0:
        return
    with open(path, "rb+") as f:
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


@dataclass
class CellProgress:
    """What a samples file says about its cells."""

    done: set[str] = field(default_factory=set)
    errors: dict[str, str] = field(default_factory=dict)
    waves: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    # Whole lines that do not parse (1-based line numbers), by the cell whose attempt they fell in
    # ("" before any cell_start). Such a cell has lost a record: it counts as unfinished.
    corrupt: dict[str, list[int]] = field(default_factory=dict)


def read_progress(path: Path) -> CellProgress:
    """Scan a samples file's control records (engine, cell_start, wave, cell_done, cell_error)."""
    prog = CellProgress()
    current = ""
    for lineno, rec in _iter_control(path, with_corrupt=True):
        if rec is None:
            prog.corrupt.setdefault(current, []).append(lineno + 1)
            continue
        t, cid = rec.get("type"), rec.get("cell_id")
        if t == CELL_START:
            current = str(cid)
            prog.corrupt.pop(current, None)  # a new attempt rewrites the cell
            # A new attempt: the earlier attempt's waves and error no longer describe this cell.
            prog.waves[cid] = []
            prog.errors.pop(cid, None)
        elif t == CELL_DONE:
            if cid not in prog.corrupt:  # a lost record in this attempt: the cell must run again
                prog.done.add(cid)
            prog.errors.pop(cid, None)
        elif t == CELL_ERROR:
            prog.errors[cid] = rec.get("reason", "")
        elif t == WAVE:
            prog.waves.setdefault(cid, []).append(rec)
        elif t == ENGINE:
            prog.engine = rec
    return prog


def corrupt_reason(engine_key: str, lines: list[int]) -> str:
    """One line naming the unreadable records of a cell and what to do about them."""
    where = ", ".join(map(str, lines[:5])) + (f" and {len(lines) - 5} more" if len(lines) > 5 else "")
    return (
        f"unreadable record in {SAMPLES}/{engine_key}.jsonl at line{'s' if len(lines) > 1 else ''} {where}: "
        "the cell counts as unfinished; rerun the same command to redo it"
    )


def finished_spans(path: Path) -> dict[str, tuple[int, int]]:
    """Return, per finished cell, the line span (start, done) of the attempt that finished it."""
    spans: dict[str, tuple[int, int]] = {}
    starts: dict[str, int] = {}
    for lineno, rec in _iter_control(path):
        t, cid = rec.get("type"), rec.get("cell_id")
        if t == CELL_START:
            starts[cid] = lineno
        elif t == CELL_DONE and cid in starts:
            spans[cid] = (starts[cid], lineno)
    return spans


def _iter_control(path: Path, with_corrupt: bool = False) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """Yield (line number, record) for every non-sample record, without parsing sample lines.

    With ``with_corrupt``, a whole line that does not parse yields (line number, None); a torn last
    line (no newline: a write cut short, truncated by the next writer) is never reported.
    """
    if not path.exists():
        return
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f):
            if not raw.endswith(b"\n") or is_sample_line(raw):
                continue
            try:
                rec = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                if with_corrupt and raw.strip():
                    yield lineno, None
                continue
            if isinstance(rec, dict):
                yield lineno, rec
            elif with_corrupt:
                yield lineno, None


def iter_samples(path: Path, cells: set[str] | None = None) -> Iterator[dict[str, Any]]:
    """Stream the sample records of finished cells, from the attempt that finished each.

    A resumed cell starts again with a ``cell_start`` line and rewrites all its samples, so earlier
    partial attempts are skipped. Two passes over the file; nothing but line spans is held in memory.
    """
    spans = finished_spans(path)
    if cells is not None:
        spans = {c: s for c, s in spans.items() if c in cells}
    if not spans:
        return
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f):
            if not is_sample_line(raw) or not raw.endswith(b"\n"):
                continue
            rec = json.loads(raw)
            span = spans.get(rec.get("cell_id"))
            if span and span[0] < lineno < span[1]:
                yield rec


class RunLock:
    """An exclusive lock on a results directory: ``flock`` on a lock file holding the owner's pid.

    The kernel drops the lock when its holder dies, so a kill -9 does not block the rerun, and
    two reruns racing over a dead holder's file cannot both win (a pid check followed by
    unlink-and-recreate could hand the lock to both). The pid is only for the message.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK
        self._fd: int | None = None

    def acquire(self) -> None:
        import fcntl

        for _ in range(10):
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            except OSError as e:  # a read-only or foreign directory: one line, not a traceback
                raise EnvironmentFailure(f"cannot write in {self.path.parent}: {e.strerror or e}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                pid = _read_pid(self.path)
                raise RunLockedError(
                    f"{self.path.parent} is in use by another cascade-repro run (pid {pid or 'unknown'}); "
                    "wait for it or choose another --results-dir"
                ) from None
            # A holder releasing meanwhile unlinks the path: make sure we locked the file that is there.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            self._fd = fd
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


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None
