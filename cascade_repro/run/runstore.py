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

import dataclasses
import errno
import functools
import json
import os
import re
import stat
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from cascade_repro import userpath
from cascade_repro.atomic import write_atomic
from cascade_repro.errors import EnvironmentFailure, RunLockedError, UsageError, name_oserror, naming
from cascade_repro.run.manifest import Manifest, manifest_problem, type_problem

RUN_JSON = "run.json"
PROMPTS = "prompts.jsonl"
# A prompts.jsonl record's field holding the hash of the prompt as the run's tokenizer rendered it
# (``chat.prompt_hash``): the run's, not the prompt's, so the prompt loaders leave it out of the
# record they read back.
PROMPT_HASH = "prompt_hash"
SAMPLES = "samples"
REFERENCE = "reference"  # the reference pass's records, one file per engine key (run/reference.py)
REFERENCE_LOG = "reference.log"  # the reference pass's output
PROBE = "probe"
MINIMIZE = "minimize"
LOCK = ".lock"
# A merge in progress (its spec hash): a merge cut before it finished is cleared and redone by the
# next merge of the same matrix, where a folder of half-copied files would read as someone else's.
MERGING = ".merging"
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


# The typed records. Each one's JSON form is {"type": TYPE, its fields in declaration order (an
# optional one left out while unset), then ``other``: keys this version does not know, kept}.
# ``encode`` and ``decode`` are the only translation between a record and its line.


@dataclass
class EngineStart:
    """An engine came up: the flags read back from it, the prompts' shared prefix, its start time."""

    TYPE: ClassVar[str] = ENGINE
    engine_key: str = ""
    effective: dict[str, Any] = field(default_factory=dict)
    shared_prefix_tokens: int = 0
    start_s: float = 0.0
    started_at: str = ""
    other: dict[str, Any] = field(default_factory=dict)


@dataclass
class CellStart:
    """An attempt at a cell begins; ``kept_waves``: waves of the cut attempt copied after it."""

    TYPE: ClassVar[str] = CELL_START
    _OPTIONAL: ClassVar[dict[str, Any]] = {
        "kept_waves": 0
    }  # a field left out of the line while it has this value
    cell_id: str = ""
    kept_waves: int = 0
    other: dict[str, Any] = field(default_factory=dict)


@dataclass
class SampleRecord:
    """One prompt's completion in one wave of a cell (its head: type, cell_id, wave, prompt_index)."""

    TYPE: ClassVar[str] = SAMPLE
    _OPTIONAL: ClassVar[dict[str, Any]] = {"wave": None}  # samples of early versions had none
    cell_id: str = ""
    wave: int | None = None
    prompt_index: int = 0
    prompt_key: str = ""
    prompt_hash: str = ""
    prompt_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""
    logprobs: list[float] = field(default_factory=list)
    topk: list[Any] = field(default_factory=list)
    other: dict[str, Any] = field(default_factory=dict)


@dataclass
class WaveRecord:
    """The probe's counters and timings of one wave; ``extra``: the engine's own (steps, phases)."""

    TYPE: ClassVar[str] = WAVE
    _OPTIONAL: ClassVar[dict[str, Any]] = {"extra": {}}
    cell_id: str = ""
    wave: int = 0
    batch: int = 0
    n_real: int = 0
    cascade_steps: int | None = 0
    total_steps: int | None = 0
    cascade_calls: int | None = 0
    cascade_decode_steps: int | None = None
    common_prefix_len: int | None = 0
    wall_s: float | None = None
    tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    other: dict[str, Any] = field(default_factory=dict)


@dataclass
class CellDone:
    """A cell's last wave is written: the cell counts as finished."""

    TYPE: ClassVar[str] = CELL_DONE
    cell_id: str = ""
    n_samples: int = 0
    wall_s: float = 0.0
    other: dict[str, Any] = field(default_factory=dict)


@dataclass
class CellError:
    """A cell failed (the worker's exception, or the runner's reason for a worker that died)."""

    TYPE: ClassVar[str] = CELL_ERROR
    cell_id: str = ""
    reason: str = ""
    other: dict[str, Any] = field(default_factory=dict)


Record = EngineStart | CellStart | SampleRecord | WaveRecord | CellDone | CellError
RECORD_TYPES: dict[str, type] = {
    c.TYPE: c for c in (EngineStart, CellStart, SampleRecord, WaveRecord, CellDone, CellError)
}
_FIELDS: dict[type, tuple[str, ...]] = {
    c: tuple(f.name for f in dataclasses.fields(c) if f.name != "other") for c in RECORD_TYPES.values()
}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return {n: t for n, t in typing.get_type_hints(cls).items() if n in _FIELDS[cls]}


def record_problem(rec: dict[str, Any]) -> str | None:
    """What is wrong with a control record (engine, cell_start, wave, cell_done, cell_error), or None:
    each field its annotation's JSON type, as run.json's sections are checked. A wave record's
    counters are summed and its times divided by scoring; a wrong type there is a lost record, not
    a crash. Samples are :func:`sample_problem`'s."""
    t = rec.get("type")
    cls = RECORD_TYPES.get(t) if isinstance(t, str) else None
    if cls is None or cls is SampleRecord:
        return None
    for name, hint in _hints(cls).items():
        if name in rec and (why := type_problem(rec[name], hint, name)) is not None:
            return f"{rec['type']} record: {why}"
    return None


def record_json(record: Record) -> dict[str, Any]:
    """A record's JSON object, ``type`` first (a sample's head in the layout SAMPLE_HEAD reads)."""
    out: dict[str, Any] = {"type": record.TYPE}
    unset = getattr(record, "_OPTIONAL", {})
    for name in _FIELDS[type(record)]:
        value = getattr(record, name)
        if name in unset and (value is None or value == unset[name]):
            continue
        out[name] = value
    out.update(record.other)
    return out


def encode(record: Record) -> str:
    """The record's line without its newline: compact JSON, keys in the order of ``record_json``."""
    return json.dumps(record_json(record), ensure_ascii=False, separators=(",", ":"))


def decode(line: bytes | str | dict[str, Any]) -> Record | None:
    """The record of a line (or of its parsed object); None for a line that is not a known record.

    Raises ``json.JSONDecodeError`` / ``UnicodeDecodeError`` on a line that is not JSON.
    """
    obj = line if isinstance(line, dict) else json.loads(line)
    if not isinstance(obj, dict) or (cls := RECORD_TYPES.get(obj.get("type"))) is None:
        return None
    names = _FIELDS[cls]
    kw = {k: v for k, v in obj.items() if k in names}
    other = {k: v for k, v in obj.items() if k not in names and k != "type"}
    return cls(**kw, other=other)


def is_sample_line(raw: bytes) -> bool:
    return raw.startswith(SAMPLE_PREFIX)


def samples_path(run_dir: Path, engine_key: str) -> Path:
    return run_dir / SAMPLES / f"{engine_key}.jsonl"


def samples_files(run_dir: Path) -> list[Path]:
    """Every engine key's samples file, sorted by name."""
    return sorted((Path(run_dir) / SAMPLES).glob("*.jsonl"))


def reference_path(run_dir: Path, engine_key: str) -> Path:
    return Path(run_dir) / REFERENCE / f"{engine_key}.jsonl"


def reference_files(run_dir: Path) -> list[Path]:
    """The reference pass's files of a run, sorted (none before the pass ran)."""
    return sorted((Path(run_dir) / REFERENCE).glob("*.jsonl"))


def probe_dir(run_dir: Path, engine_key: str) -> Path:
    return Path(run_dir) / PROBE / engine_key


def prompts_path(run_dir: Path) -> Path:
    return Path(run_dir) / PROMPTS


def read_prompts(run_dir: Path) -> list[dict[str, Any]]:
    """The run's prompt records as written by the runner.

    Each is a dict with ``key``, ``prompt``, the IFEval fields (``instruction_id_list``, ``kwargs``,
    ``lang``) and, when the prompt source had other columns, ``extra`` (column name -> JSON data).
    """
    with open(prompts_path(run_dir), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_prompts(run_dir: Path, records: list[Any], hashes: list[str] | None = None) -> None:
    """Write prompts.jsonl atomically (temp file and rename).

    A record is a dict, or a :class:`~cascade_repro.prompts.promptsets.PromptRecord`, written as its
    ``to_json()`` (its extra columns under ``extra``). ``hashes``: each prompt's hash as the run's
    tokenizer renders it (``chat.prompt_hash``), written as its ``prompt_hash``: what every sample
    of that prompt must carry (:func:`sample_problem`).
    """
    rows: Iterable[dict[str, Any]] = (r if isinstance(r, dict) else r.to_json() for r in records)
    if hashes is not None:
        rows = ({**r, PROMPT_HASH: h} for r, h in zip(rows, hashes, strict=True))
    write_text_atomic(prompts_path(run_dir), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def write_parquet_atomic(df: Any, path: Path) -> None:
    """Write a table through a temp file and rename (:func:`~cascade_repro.atomic.write_atomic`)."""
    write_atomic(path, lambda tmp: df.to_parquet(tmp, index=False))


def write_run_json(run_dir: Path, run: dict[str, Any]) -> None:
    """Write run.json's JSON form atomically (:func:`write_manifest` writes a Manifest)."""
    write_json_atomic(Path(run_dir) / RUN_JSON, run)


def worker_log(run_dir: Path, engine_key: str) -> Path:
    return run_dir / f"worker-{engine_key}.log"


def clear_derived(run_dir: Path) -> None:
    """Remove what a run made from its engines' output (``--fresh``): samples, worker logs, probe
    counters, the tables, every report, ``minimize/`` and the sweep table.

    The reports go with the samples: a ``--fresh`` run cut before it scored would otherwise leave
    the old run's verdict (a passing junit.xml) beside samples that no longer hold it. A link among
    them is refused (:func:`refuse_links`), and a folder that cannot be removed is an error: a
    ``--fresh`` that quietly kept the old samples would resume the old run instead.
    """
    run_dir = Path(run_dir)
    for name in (SAMPLES, REFERENCE, PROBE, MINIMIZE):
        remove_tree(run_dir, name)
    for name in (*TABLES, *REPORTS, SWEEP_MD, REFERENCE_LOG):
        (run_dir / name).unlink(missing_ok=True)
    for p in run_dir.glob("worker-*.log"):
        p.unlink(missing_ok=True)


def remove_tree(run_dir: Path, name: str) -> None:
    """Delete the folder ``name`` of a run directory, if there is one; a link there is refused."""
    import shutil

    path = Path(run_dir) / name
    refuse_links(run_dir, [path])
    if path.is_dir():
        shutil.rmtree(path)


# --- links in a run directory ----------------------------------------------------------------------
# A run directory is input from elsewhere (a CI artifact, a tarball, a copy): a symbolic link
# planted in it, .lock -> ~/.bashrc or samples/k.jsonl -> /etc/passwd, would make a command
# truncate, append to, delete or copy a file outside it. Every command that writes in a run
# directory or copies out of one refuses it first (the lock, --fresh, merge, minimize), and the
# files it appends to are opened with O_NOFOLLOW. The run directory itself may be a link: that is
# the user's own choice, not the directory's content.


def owned_paths(run_dir: Path) -> list[Path]:
    """Every path of a run directory some command opens for writing, truncates, deletes or copies:
    the fixed names, the worker logs, and everything under samples/, reference/, probe/ and minimize/."""
    run_dir = Path(run_dir)
    out = [
        run_dir / n for n in (LOCK, MERGING, RUN_JSON, PROMPTS, *TABLES, *REPORTS, SWEEP_MD, REFERENCE_LOG)
    ]
    out += sorted(run_dir.glob("worker-*.log"))
    for name in (SAMPLES, REFERENCE, PROBE, MINIMIZE):
        top = run_dir / name
        out.append(top)
        if top.is_dir() and not top.is_symlink():
            for root, dirs, files in os.walk(top):  # a link to a folder is listed, never entered
                out += [Path(root) / n for n in sorted((*dirs, *files))]
    return out


def refuse_links(run_dir: Path, paths: Iterable[Path | str]) -> None:
    """Raise a one-line UsageError naming the first of ``paths``, or a folder on the way to it from
    ``run_dir``, that is a symbolic link (or is neither a file nor a folder: a FIFO would hang a
    reader, a device node is no record). ``paths`` lie in ``run_dir`` (or are relative to it); a
    path not there yet is fine."""
    run_dir = Path(run_dir)
    for p in paths:
        p = Path(p)
        rel = p.relative_to(run_dir) if p.is_relative_to(run_dir) else p
        if rel.is_absolute() or ".." in rel.parts:
            raise ValueError(f"{p} is not inside {run_dir}")
        cur = run_dir
        for part in rel.parts:
            cur = cur / part
            try:
                st = os.lstat(cur)
            except (FileNotFoundError, NotADirectoryError):
                break
            if stat.S_ISLNK(st.st_mode):
                raise UsageError(_link_message(cur))
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise UsageError(
                    f"{shown(cur)} is neither a file nor a folder: refusing it in a run directory; remove it"
                )


def refuse_run_links(run_dir: Path) -> None:
    """:func:`refuse_links` over :func:`owned_paths`: what a command checks before it writes in a
    run directory, or copies out of one."""
    refuse_links(run_dir, owned_paths(run_dir))


def safe_open(path: Path, flags: int, mode: int = 0o666) -> int:
    """``os.open`` that never follows a symbolic link at ``path`` (O_NOFOLLOW): a planted link is a
    UsageError naming it, not a write into the file it points at. A file it creates gets ``mode``
    less the umask, as every file of a run directory does."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(path):
            raise UsageError(_link_message(Path(path))) from None
        raise


def _link_message(path: Path) -> str:
    try:
        target = f" (to {shown(os.readlink(path))})"
    except OSError:
        target = ""
    return (
        f"{shown(path)} is a symbolic link{target}: refusing to follow a link in a run directory; remove it"
    )


def shown(path: Path | str) -> str:
    """A path for a one-line message: relative to the current folder below it (as the user likely
    typed it; ``userpath.display``), a control character in a hostile name shown as ``?``."""
    return re.sub(r"[\x00-\x1f\x7f]", "?", userpath.display(path))


def sweep_path(run_dir: Path) -> Path:
    return run_dir / SWEEP_MD


def write_text_atomic(path: Path, text: str, *, mode: int | None = None, durable: bool = False) -> None:
    """Write text through a temp file and rename, so readers never see half a file.

    ``mode``: the file's permissions (else 0666 less the umask, as for every file of a run
    directory); ``durable``: fsync before the rename, so a power loss cannot leave an empty file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text, mode=mode, durable=durable)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temp file and rename, so readers never see half a file."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


def read_manifest(run_dir: Path, require: tuple[str, ...] = ()) -> Manifest:
    """run.json as a :class:`~cascade_repro.run.manifest.Manifest` (any version's file), checked
    (:func:`read_run_json`); ``require``: sections it must hold (``manifest.SCORED`` to score it)."""
    return Manifest.from_json(read_run_json(run_dir, require))


def write_manifest(run_dir: Path, manifest: Manifest) -> None:
    write_run_json(run_dir, manifest.to_json())


def read_run_json(run_dir: Path, require: tuple[str, ...] = ()) -> dict[str, Any]:
    """run.json's JSON object, checked where it enters (:func:`~cascade_repro.run.manifest.manifest_problem`):
    a file that is not JSON, not an object, lacks a section in ``require`` or holds a section of the
    wrong type is a one-line UsageError naming the file and the section, before any caller reads or
    writes a thing."""
    p = Path(run_dir) / RUN_JSON
    try:
        data = json.loads(p.read_bytes())
    except FileNotFoundError:
        raise UsageError(f"not a cascade-repro run directory: {shown(run_dir)} (missing run.json)") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{shown(p)}: corrupt JSON at line {e.lineno}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{shown(p)}: corrupt JSON (not UTF-8 text)") from None
    except IsADirectoryError:
        raise UsageError(f"{shown(p)} is a folder, not a file") from None
    except OSError as e:
        raise EnvironmentFailure.from_oserror(e, "cannot read run.json") from None
    if (why := manifest_problem(data, require)) is not None:
        raise UsageError(f"{shown(p)}: {why}; not a run.json this tool wrote (damaged or edited)")
    return data


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


@dataclass
class CellProgress:
    """What a samples file says about its cells."""

    done: set[str] = field(default_factory=set)
    errors: dict[str, str] = field(default_factory=dict)
    waves: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    # Damaged lines (1-based line numbers) by the cell whose attempt they fell in ("" before any
    # cell_start): a line that does not parse, a record that is not an object, a sample record of the
    # wrong shape (:func:`sample_problem`). Such a cell has lost a record: it counts as unfinished.
    corrupt: dict[str, list[int]] = field(default_factory=dict)
    # Of a cell in ``corrupt``: the wave its first damaged line fell in (wave records of the attempt
    # before it). Waves before it are whole: a wave-level resume may keep them.
    damaged_wave: dict[str, int] = field(default_factory=dict)
    # Why a damaged line is damaged, by line number (a line that does not parse has none).
    why: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PromptIds:
    """What prompts.jsonl says each prompt is, by prompt index: its key, and the hash of its
    rendered tokens (None for a run written before prompts.jsonl recorded it)."""

    keys: list[str]
    hashes: list[str | None]

    def __len__(self) -> int:
        return len(self.keys)


def sample_problem(rec: Any, prompts: PromptIds | None = None) -> str | None:
    """What is wrong with a sample record, or None for one every reader can use.

    Checks the fields scoring reads: ``cell_id`` text, ``prompt_index`` a whole number naming a prompt
    (below ``len(prompts)`` when given), ``token_ids`` a list of whole numbers, ``wave`` a whole
    number or absent, text fields text, ``logprobs`` numbers, ``topk`` a list; given ``prompts``
    (prompts.jsonl's :class:`PromptIds`), a ``prompt_key`` or ``prompt_hash`` that is not its
    prompt's (a sample of another run, or of another rendering of the prompt).
    """
    if not isinstance(rec, dict):
        return "not a JSON object"
    if not isinstance(rec.get("cell_id"), str):
        return "cell_id is not text"
    i = rec.get("prompt_index")
    if type(i) is not int or i < 0 or (prompts is not None and i >= len(prompts)):
        n = f" (this run has {len(prompts)})" if prompts is not None else ""
        return f"prompt_index {_brief(i)} names no prompt{n}"
    if (w := rec.get("wave")) is not None and type(w) is not int:
        return f"wave {_brief(w)} is not a whole number"
    ids = rec.get("token_ids")
    if not isinstance(ids, list) or not all(type(t) is int for t in ids):
        return "token_ids is not a list of whole numbers"
    for name in ("prompt_key", "prompt_hash", "text", "finish_reason"):
        if name in rec and not isinstance(rec[name], str):
            return f"{name} is not text"
    lps = rec.get("logprobs")
    if lps is not None and (
        not isinstance(lps, list) or not all(x is None or type(x) in (int, float) for x in lps)
    ):
        return "logprobs is not a list of numbers"
    if (topk := rec.get("topk")) is not None and not isinstance(topk, list):
        return "topk is not a list"
    if prompts is None:
        return None
    if "prompt_key" in rec and rec["prompt_key"] != prompts.keys[i]:
        return (
            f"prompt_key {_brief(rec['prompt_key'])} is not prompt {i}'s key {_brief(prompts.keys[i])} "
            f"in {PROMPTS} (a sample of another run?)"
        )
    if (h := prompts.hashes[i]) is not None and rec.get("prompt_hash") != h:
        return (
            f"prompt_hash {_brief(rec.get('prompt_hash'))} is not prompt {i}'s hash {_brief(h)} "
            f"in {PROMPTS} (a sample of another run, or of another rendering of the prompt?)"
        )
    return None


def _brief(v: Any, limit: int = 40) -> str:
    """A value for a one-line message: repr (control characters escaped), cut at ``limit``."""
    s = repr(v)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def prompt_ids(run_dir: Path) -> PromptIds | None:
    """prompts.jsonl's keys and hashes, in prompt-index order, read once for a whole scan of the
    samples; None when it cannot be read (:func:`prompts_problem` says why)."""
    try:
        rows = read_prompts(run_dir)
    except (OSError, ValueError):
        return None
    keys, hashes = [], []
    for i, r in enumerate(rows):
        r = r if isinstance(r, dict) else {}
        keys.append(k if isinstance(k := r.get("key"), str) else str(i))
        hashes.append(h if isinstance(h := r.get(PROMPT_HASH), str) else None)
    return PromptIds(keys, hashes)


def prompts_problem(run_dir: Path) -> str | None:
    """Why prompts.jsonl cannot serve as the run's prompts (missing, a line that is not a JSON
    object), in words naming the file and line; None when every line reads."""
    path = prompts_path(run_dir)
    try:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    rec = json.loads(raw)
                except ValueError:  # JSONDecodeError and UnicodeDecodeError both
                    return f"{PROMPTS} line {lineno} is not JSON"
                if not isinstance(rec, dict):
                    return f"{PROMPTS} line {lineno} is not a JSON object"
    except FileNotFoundError:
        return f"{PROMPTS} is missing"
    except OSError as e:
        return f"{PROMPTS} is unreadable ({e.strerror or type(e).__name__})"
    return None


class SampleScan:
    """One pass over a samples file, the one reader of its records: the file's :class:`CellProgress`
    (``progress``), the line span of the attempt that finished each cell (``spans``), and, iterated,
    every sample record that may belong to such an attempt.

    Iterating yields ``(start, record)``: ``start`` the line of the ``cell_start`` that opened the
    record's attempt. A cell's samples are those of the attempt that finished it, ``start ==
    spans[cell_id][0]``; which attempt that is is known only once the pass is over, so a caller that
    streams keeps each attempt apart until then. A resumed cell starts again with a ``cell_start`` line
    and rewrites its samples, so an earlier cut attempt never counts. A record after its attempt's
    ``cell_done`` is held back until another ``cell_done`` closes the attempt again (and dropped if none
    does): the samples of a finished attempt lie between its two lines.

    Sample records are checked against prompts.jsonl's :class:`PromptIds` when given
    (:func:`sample_problem`); a damaged one unfinishes its cell (``progress.corrupt``) and is not
    yielded. ``cells``: the cells whose records are yielded (all when None). ``keys``: only these
    ``(cell_id, prompt_index)`` records are wanted, and a sample line in the worker's layout naming
    another is skipped by its head (:data:`SAMPLE_HEAD`) without being parsed, so ``progress`` does
    not see its damage: for a reader of a few records (a report's examples). ``parse_samples=False``
    parses no sample line at all, for a caller that wants only the control records.
    """

    def __init__(
        self,
        path: Path,
        prompts: PromptIds | None = None,
        *,
        cells: set[str] | None = None,
        keys: set[tuple[str, int]] | None = None,
        parse_samples: bool = True,
    ) -> None:
        self.path = Path(path)
        self.prompts = prompts
        self.cells = cells if keys is None else {c for c, _ in keys}
        self.keys = keys
        self.parse_samples = parse_samples
        self.progress = CellProgress()
        self.spans: dict[str, tuple[int, int]] = {}
        # Every damaged sample line (0-based line, why), for :meth:`warnings`.
        self.damaged: list[tuple[int, str]] = []

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        prog, prompts, cells, keys = self.progress, self.prompts, self.cells, self.keys
        current = ""
        starts: dict[str, int] = {}  # cell -> line of its latest cell_start
        closed: set[str] = set()  # cells whose latest attempt has seen a cell_done
        late: dict[str, list[dict[str, Any]]] = {}  # records after such a cell_done, held back
        head = SAMPLE_HEAD.match
        engine_damage: tuple[int, str] | None = None

        def damaged(lineno: int, why: str | None) -> None:
            lines = prog.corrupt.setdefault(current, [])
            if not lines:
                prog.damaged_wave[current] = len(prog.waves.get(current, []))
            lines.append(lineno + 1)
            if why:
                prog.why[lineno + 1] = why

        for lineno, (buf, start, end) in enumerate(_lines(self.path)):
            if buf.startswith(SAMPLE_PREFIX, start, end):
                if not self.parse_samples:
                    continue
                if keys is not None and (m := head(buf, start, end)) is not None:
                    cid = _json_string(m.group(1))
                    if (cid, int(m.group(2))) not in keys:
                        continue  # a sample nobody asked for: not decoded
                try:
                    obj = json.loads(bytes(buf[start:end]))
                except (json.JSONDecodeError, UnicodeDecodeError):
                    damaged(lineno, None)
                    self.damaged.append((lineno, "not JSON"))
                    continue
                if (why := sample_problem(obj, prompts)) is not None:
                    damaged(lineno, why)
                    self.damaged.append((lineno, why))
                    continue
                cid = obj["cell_id"]
                if (cells is not None and cid not in cells) or cid not in starts:
                    continue
                if keys is not None and (cid, obj["prompt_index"]) not in keys:
                    continue
                if cid in closed:
                    late.setdefault(cid, []).append(obj)
                else:
                    yield starts[cid], obj
                continue
            if not buf[start:end].strip():
                continue
            try:
                rec = json.loads(bytes(buf[start:end]))
            except (json.JSONDecodeError, UnicodeDecodeError):
                rec = None
            if not isinstance(rec, dict):
                damaged(lineno, None)
                continue
            t, cid = rec.get("type"), rec.get("cell_id")
            if t in (CELL_START, CELL_DONE, CELL_ERROR, WAVE) and not isinstance(cid, str):
                damaged(lineno, f"{t} record whose cell_id is not text")
                continue
            if (why := record_problem(rec)) is not None:
                if t == ENGINE:  # what the engine read back is lost: every cell it then runs is unproven
                    engine_damage, prog.engine = (lineno, why), {}
                else:
                    damaged(lineno, why)
                continue
            if t == CELL_START:
                current = cid
                starts[cid] = lineno
                closed.discard(cid)
                late.pop(cid, None)
                # A new attempt rewrites the cell: its earlier attempt's damage, waves and error go.
                for line in prog.corrupt.pop(current, []):
                    prog.why.pop(line, None)
                prog.damaged_wave.pop(current, None)
                prog.waves[cid] = []
                prog.errors.pop(cid, None)
                if engine_damage is not None:
                    damaged(*engine_damage)
            elif t == CELL_DONE:
                if cid not in prog.corrupt:  # a lost record in this attempt: the cell must run again
                    prog.done.add(cid)
                prog.errors.pop(cid, None)
                if cid in starts:
                    self.spans[cid] = (starts[cid], lineno)
                    closed.add(cid)
                    for obj in late.pop(cid, []):
                        yield starts[cid], obj
            elif t == CELL_ERROR:
                prog.errors[cid] = rec.get("reason", "")
            elif t == WAVE:
                prog.waves.setdefault(cid, []).append(rec)
            elif t == ENGINE:
                engine_damage, prog.engine = None, rec

    def finished(self, start: int, cell_id: str) -> bool:
        """Whether a record yielded with ``start`` is of the attempt that finished ``cell_id``."""
        span = self.spans.get(cell_id)
        return span is not None and span[0] == start

    def warnings(self) -> list[str]:
        """One line per damaged sample line inside a finished attempt (of ``cells``), in file order:
        what scoring skipped."""
        spans = [s for c, s in self.spans.items() if self.cells is None or c in self.cells]
        return [
            f"{SAMPLES}/{shown(self.path.name)} line {lineno + 1}: {why}; skipped"
            for lineno, why in self.damaged
            if any(s < lineno < e for s, e in spans)
        ]


def read_progress(path: Path, prompts: PromptIds | None = None, *, samples: bool = True) -> CellProgress:
    """Scan a samples file's records: the control records (engine, cell_start, wave, cell_done,
    cell_error) and the shape of every sample record (:func:`sample_problem`, against prompts.jsonl's
    keys and hashes when given); a damaged line unfinishes the cell it falls in.

    ``samples=False`` skips the sample records unparsed, for a caller that reads only the engine
    record or the errors: parsing every sample is most of a large file's scan."""
    scan = SampleScan(path, prompts, cells=set(), parse_samples=samples)
    for _ in scan:
        pass
    return scan.progress


def kept_wave_count(prog: CellProgress, cell_id: str) -> int:
    """Waves 0..K-1 of an unfinished cell's last attempt that are whole (their wave record is there,
    so are their samples, written before it): what a wave-level resume keeps. 0 for a finished
    cell; an attempt with a damaged line keeps only the waves before the one that line fell in."""
    if cell_id in prog.done:
        return 0
    limit = prog.damaged_wave.get(cell_id, 0) if cell_id in prog.corrupt else None
    k = 0
    for w in prog.waves.get(cell_id, []):
        if w.get("wave") != k or (limit is not None and k >= limit):
            break
        k += 1
    return k


def kept_wave_lines(path: Path, cells: dict[str, int]) -> dict[str, list[bytes]]:
    """The raw sample and wave lines of waves 0..K-1 of each cell's last attempt (``cells``: cell id
    -> K from :func:`kept_wave_count`), in file order, for a resumed attempt to copy after its
    ``cell_start``: readers then see one whole attempt, as if it had never been cut."""
    out: dict[str, list[bytes]] = {c: [] for c in cells}
    if not cells or not path.exists():
        return out
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break  # a torn tail
            try:
                rec = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if not isinstance(rec, dict) or (cid := rec.get("cell_id")) not in cells:
                continue
            t = rec.get("type")
            if t == CELL_START:
                out[cid] = []
            elif t in (SAMPLE, WAVE) and isinstance(rec.get("wave"), int) and rec["wave"] < cells[cid]:
                out[cid].append(raw)
    return out


def finish_hint(run: Manifest, engine_keys: Iterable[str]) -> str | None:
    """What finishes the unfinished cells of ``engine_keys`` in a merged run, or None for a run of
    one ``matrix`` command (rerunning that command resumes it). A merge copies its shards' samples:
    rerunning the merge copies the same ones again, so a cell is finished in its shard."""
    shards = run.shards if isinstance(run.shards, list) else None
    if not shards:
        return None
    keys = set(engine_keys)
    labels = [
        str(e.get("shard"))
        for e in shards
        if isinstance(e, dict)
        and isinstance(e.get("engine_keys"), list)
        and keys & set(map(str, e["engine_keys"]))
    ]
    which = f"shard {', '.join(map(shown, labels))}" if labels else "their shard"
    return (
        f"finish {which} (rerun its matrix command), then merge again, or merge without it (--allow-partial)"
    )


def corrupt_reason(
    engine_key: str, lines: list[int], why: dict[int, str] | None = None, finish: str | None = None
) -> str:
    """One line naming the damaged records of a cell (and, given ``why``, what is wrong with the
    first) and what to do about them: rerun the same command, or ``finish`` (a merged run's
    :func:`finish_hint`)."""
    where = ", ".join(map(str, lines[:5])) + (f" and {len(lines) - 5} more" if len(lines) > 5 else "")
    first = (why or {}).get(lines[0]) if lines else None
    return (
        f"{'damaged' if first else 'unreadable'} record in {SAMPLES}/{shown(engine_key)}.jsonl "
        f"at line{'s' if len(lines) > 1 else ''} "
        f"{where}{f' ({first})' if first else ''}: "
        f"the cell counts as unfinished; {finish or 'rerun the same command to redo it'}"
    )


def finished_spans(path: Path) -> dict[str, tuple[int, int]]:
    """Return, per finished cell, the line span (start, done) of the attempt that finished it."""
    scan = SampleScan(path, parse_samples=False)
    for _ in scan:
        pass
    return scan.spans


def iter_samples(
    path: Path,
    cells: set[str] | None = None,
    prompts: PromptIds | None = None,
    warn: Callable[[str], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Stream the sample records of finished cells, from the attempt that finished each.

    Two passes of :class:`SampleScan` (the first parses no sample, the second yields only the
    finishing attempts' records), so nothing but line spans is held in memory: for a caller that
    reads samples without scoring them (the reference pass, ``minimize``); scoring reads the file
    once. A damaged sample line inside a finished attempt (:func:`sample_problem`, against
    ``prompts`` when given) is skipped, and ``warn`` is told its file and line.
    """
    spans = finished_spans(path)
    if cells is not None:
        spans = {c: s for c, s in spans.items() if c in cells}
    if not spans:
        return
    scan = SampleScan(path, prompts, cells=set(spans))
    for start, rec in scan:
        if spans[rec["cell_id"]][0] == start:
            yield rec
    if warn is not None:
        for line in scan.warnings():
            warn(line)


def _lines(path: Path, chunk: int = 1 << 24) -> Iterator[tuple[bytearray, int, int]]:
    """Yield ``(buffer, start, end)`` per complete line of a file (``end`` is past its newline); none
    for a missing file.

    Lines are found with ``bytearray.find`` inside one reused buffer (grown for a longer line), so a
    line that is not wanted is never copied. A last line without a newline (a torn write) is not
    yielded. The buffer is only valid until the next line is requested.
    """
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        buf = bytearray(chunk)
        filled = start = 0
        while True:
            if start:
                buf[: filled - start] = buf[start:filled]  # keep the partial line, same size: no resize
                filled -= start
                start = 0
            if filled == len(buf):
                buf.extend(bytes(len(buf)))
            with memoryview(buf) as view:
                n = f.readinto(view[filled:])
            if not n:
                return
            filled += n
            find = buf.find
            while True:
                nl = find(b"\n", start, filled)
                if nl < 0:
                    break
                yield buf, start, nl + 1
                start = nl + 1


def _json_string(body: bytes) -> str | None:
    """A JSON string's body (as :data:`SAMPLE_HEAD` captures it) decoded; None when it is not one."""
    try:
        return json.loads(b'"' + body + b'"')
    except ValueError:
        return None


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
