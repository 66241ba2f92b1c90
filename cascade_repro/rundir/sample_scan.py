"""The one reader of a samples file (``SampleScan``): each cell's progress, the span of the attempt
that finished it, its samples checked against prompts.jsonl; resume's bookkeeping built on it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade_repro.rundir.codec import (
    CELL_DONE,
    CELL_ERROR,
    CELL_START,
    ENGINE,
    SAMPLE,
    SAMPLE_HEAD,
    SAMPLE_PREFIX,
    WAVE,
    record_problem,
)
from cascade_repro.rundir.layout import PROMPT_HASH, PROMPTS, SAMPLES, prompts_path, read_prompts, shown
from cascade_repro.rundir.manifest import Manifest


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
