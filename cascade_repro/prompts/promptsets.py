"""Prompt sets and system prompts: built-in names, local files and Hub datasets.

Why this module exists: every run sends many short prompts behind one long, shared system prompt,
because a long common prefix is what makes vLLM pick cascade attention. Prompts come from three
kinds of places (the sets shipped in ``prompts/``, a user's JSONL/CSV/parquet file, or a Hugging Face
dataset) and this module turns all of them into one validated, immutable :class:`PromptSet`.

Design rules:

* Files are streamed one line, row or parquet batch at a time, so a 10,000-line file is held in
  memory once (as the final tuple of records) and never twice.
* Every user mistake becomes a :class:`~cascade_repro.errors.UsageError` whose message is one line
  naming the file, the line or row and the field, so a typo in a data file never surfaces as a
  traceback from deep inside a run.
* Records follow Google IFEval (``key``, ``prompt``, ``instruction_id_list``, ``kwargs``) so that
  instruction-following verifiers can score the outputs later; only ``prompt`` is required.
* Every other column is kept, as JSON data, in the record's ``extra`` (and in the run's
  ``prompts.jsonl``), so a run's prompt records carry whatever the source said about each prompt.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO

from cascade_repro import hub, userpath
from cascade_repro.errors import UsageError
from cascade_repro.prompts.ifeval_kwargs import kwargs_type_problem

PACKAGE_DATA = "cascade_repro.prompts_data"
"""The package that ships ``prompts/`` (pyproject maps the folder to it)."""

BUILTIN_SETS: dict[str, str] = {"ko-ifeval-style": "ko-ifeval-style.jsonl"}
"""Built-in prompt-set name -> file name in ``prompts/``."""

BUILTIN_SYSTEM_PROMPTS: dict[str, str] = {"ko": "system_ko.txt", "en": "system_en.txt"}
"""Built-in system-prompt name -> file name in ``prompts/``."""

NO_SYSTEM_PROMPT = "none"
HUB_PREFIX = "hf:"
HUB_DEFAULT_SPLIT = "train"

_JSONL_SUFFIXES = (".jsonl", ".json")
_CSV_SUFFIXES = (".csv",)
_PARQUET_SUFFIXES = (".parquet",)
_FIELDS = ("key", "prompt", "instruction_id_list", "kwargs", "lang")
EXTRA_FIELD = "extra"
"""The field of a run's ``prompts.jsonl`` (and of any JSON Lines file) that holds a record's other columns."""
RUN_FIELDS = ("prompt_hash",)
"""Fields a run's ``prompts.jsonl`` adds about that run (``layout.PROMPT_HASH``: the prompt as its
tokenizer rendered it), not about the prompt: a run's prompts read back as a prompt file leave them out."""
# Columns pandas adds for a DataFrame index when it writes parquet: not data about a prompt.
_PANDAS_INDEX = re.compile(r"__index_level_\d+__")
_LIST_FIELDS = ("instruction_id_list", "kwargs")
_PARQUET_BATCH_ROWS = 1024


@dataclass(frozen=True)
class Columns:
    """Which column holds the prompt and which the key (``--prompt-field``, ``--key-field``).

    ``key`` None: a ``key`` column, else an ``id`` column (Hub datasets and many CSVs have one),
    else the file's stem and the row number.
    """

    prompt: str = "prompt"
    key: str | None = None

    def source(self, field: str, present: Iterable[str]) -> str:
        """The column a record field is read from, given the columns the data has."""
        if field == "prompt":
            return self.prompt
        if field == "key":
            if self.key is not None:
                return self.key
            names = set(present)
            return "key" if "key" in names or "id" not in names else "id"
        return field


# Set by load_prompt_set while it reads (records are read within the call).
_COLUMNS: ContextVar[Columns] = ContextVar("prompt_columns", default=Columns())  # noqa: B039 - frozen


def _split(row: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the record's fields under their own names, every other column) of one row.

    The prompt and key come from the user's columns (:class:`Columns`); a column the record does not
    read, including a ``prompt`` or ``key`` column that another one replaced, is an extra column. An
    ``extra`` field holding an object is a run's ``prompts.jsonl`` speaking: its entries are the
    extra columns (the other columns are added to them).
    """
    cols = _COLUMNS.get()
    sources = {name: cols.source(name, row.keys()) for name in _FIELDS}
    fields = {name: row[src] for name, src in sources.items() if src in row}
    used = set(sources.values())
    extra = {
        k: v
        for k, v in row.items()
        if k not in used and k not in RUN_FIELDS and not _PANDAS_INDEX.fullmatch(str(k))
    }
    nested = extra.get(EXTRA_FIELD)
    if isinstance(nested, dict):
        extra = {**nested, **{k: v for k, v in extra.items() if k != EXTRA_FIELD}}
    return fields, extra


_BOM = "\ufeff"

PromptPath = str | os.PathLike[str] | Traversable


@dataclass(frozen=True)
class PromptRecord:
    """One prompt, plus the IFEval instructions (parallel ``instruction_id_list``/``kwargs``) it carries.

    ``extra`` holds the source's other columns (column name -> JSON data), e.g. a category or a
    reference answer.
    """

    key: str
    prompt: str
    instruction_id_list: tuple[str, ...] = ()
    kwargs: tuple[dict, ...] = ()
    lang: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The record as a run's ``prompts.jsonl`` stores it; ``extra`` only when there are extra columns.

        Reading that line back (:func:`iter_prompt_records`) gives the same record.
        """
        out: dict[str, Any] = {
            "key": self.key,
            "prompt": self.prompt,
            "instruction_id_list": list(self.instruction_id_list),
            "kwargs": [dict(k) for k in self.kwargs],
            "lang": self.lang,
        }
        if self.extra:
            out[EXTRA_FIELD] = dict(self.extra)
        return out


@dataclass(frozen=True)
class PromptSet:
    """A named, validated, ordered set of prompts; ``source`` says where it was read from."""

    name: str
    source: str
    records: tuple[PromptRecord, ...]


@dataclass(frozen=True)
class _Where:
    """Where a record came from, so error messages can point at it (``file line 7``, ``file row 3``)."""

    source: str
    unit: str
    number: int

    @property
    def short(self) -> str:
        return f"{self.unit} {self.number}"

    def __str__(self) -> str:
        return f"{self.source} {self.short}"


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def load_prompt_set(
    spec: str, limit: int | None = None, prompt_field: str | None = None, key_field: str | None = None
) -> PromptSet:
    """Load a built-in name, a local ``.jsonl``/``.json``/``.csv``/``.parquet`` file or ``hf:owner/name[:split]``.

    ``limit`` keeps the first N records (and stops reading there). Keys must be unique, and an
    empty set is an error, because a run over zero prompts would report nothing while looking green.
    ``prompt_field`` / ``key_field`` name the columns that hold the prompt and the key (see
    :class:`Columns`).
    """
    _check_limit(limit)
    for flag, value in (("--prompt-field", prompt_field), ("--key-field", key_field)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise UsageError(f"{flag} must name a column, got {value!r}")
    token = _COLUMNS.set(Columns(prompt_field or "prompt", key_field))
    try:
        name, source, display, located = _resolve_set(spec)
        # islice rejects a stop above sys.maxsize; a --limit that large means "all of them".
        stop = None if limit is None else min(limit, sys.maxsize)
        records = tuple(islice(_unique_keys(located), stop))
    finally:
        _COLUMNS.reset(token)
    if not records:
        raise UsageError(f"no prompts in {display}")
    return PromptSet(name=name, source=source, records=records)


def load_system_prompt(spec: str) -> str:
    """Return the system prompt for a built-in name (``ko``, ``en``; ``none`` gives ``""``) or a text file.

    Leading and trailing whitespace is stripped: an editor's final newline should not change the
    tokenized prefix that the cascade-vs-flat comparison depends on.
    """
    if spec == NO_SYSTEM_PROMPT:
        return ""
    if spec in BUILTIN_SYSTEM_PROMPTS:
        file = _shipped(BUILTIN_SYSTEM_PROMPTS[spec])
        return _read_system_prompt(file, str(file))
    path = userpath.resolve(spec, "--system-prompt")
    if not path.is_file():
        if path.exists() or _looks_like_path(spec):
            raise _not_a_file(path, spec, "system prompt file")
        builtins = ", ".join([*BUILTIN_SYSTEM_PROMPTS, NO_SYSTEM_PROMPT])
        raise UsageError(
            f"unknown system prompt {spec!r}; built-in: {builtins}; or give a path to a text file"
        )
    return _read_system_prompt(path, spec)


def iter_prompt_records(path: PromptPath, *, check_kwarg_types: bool = True) -> Iterator[PromptRecord]:
    """Stream validated records from a local file, one at a time (keys are not checked for duplicates).

    ``check_kwarg_types=False`` lets a kwarg of the wrong type through (scoring a finished run's
    ``prompts.jsonl``: that prompt is then not scored, and the report says why, where a refusal would
    leave every prompt unscored).
    """
    for _where, record in _file_records(_as_file(path), str(path), check_kwarg_types):
        yield record


def list_builtin_sets() -> list[PromptSet]:
    """Load every shipped prompt set, in the order of :data:`BUILTIN_SETS`."""
    return [load_prompt_set(name) for name in BUILTIN_SETS]


# --------------------------------------------------------------------------------------------
# Resolving a spec
# --------------------------------------------------------------------------------------------


def _resolve_set(spec: str) -> tuple[str, str, str, Iterator[tuple[_Where, PromptRecord]]]:
    """Return (set name, source, name for messages, located records) for any kind of spec."""
    if spec in BUILTIN_SETS:
        file = _shipped(BUILTIN_SETS[spec])
        return spec, str(file), str(file), _file_records(file, str(file))
    if spec.startswith(HUB_PREFIX):
        return spec, spec, spec, _hub_records(spec)
    path = userpath.resolve(spec, "--prompts")
    if not path.exists() and not _looks_like_path(spec):
        raise UsageError(
            f"unknown prompt set {spec!r}; built-in sets: {', '.join(BUILTIN_SETS)}; "
            "or give a .jsonl, .json, .csv or .parquet file, or hf:owner/name[:split]"
        )
    return path.stem, str(path.resolve()), spec, _file_records(path, spec)


def _looks_like_path(spec: str) -> bool:
    """A spec with a folder or an extension was meant as a file, so 'not found' beats 'unknown name'."""
    return "/" in spec or os.sep in spec or bool(Path(spec).suffix)


def _shipped(file_name: str) -> Traversable:
    """Find a shipped file: in the installed wheel, or in prompts/ of a source checkout.

    Running from a checkout (``python -m ...`` in the repo root) imports the source package, where
    ``prompts_data`` is only a packaging-time alias of ``prompts/``.
    """
    try:
        return resources.files(PACKAGE_DATA).joinpath(file_name)
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2].joinpath("prompts", file_name)


def _as_file(path: PromptPath) -> Path | Traversable:
    return Path(path) if isinstance(path, str | os.PathLike) else path


def _check_limit(limit: int | None) -> None:
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        raise UsageError(f"limit must be a positive number of prompts, got {limit!r}")


def _unique_keys(located: Iterable[tuple[_Where, PromptRecord]]) -> Iterator[PromptRecord]:
    """Reject a repeated key: results are joined on it, so a duplicate would silently mix two prompts."""
    seen: dict[str, _Where] = {}
    for where, record in located:
        first = seen.setdefault(record.key, where)
        if first is not where:
            raise UsageError(f"{where}: duplicate key {record.key!r} (first used on {first.short})")
        yield record


# --------------------------------------------------------------------------------------------
# Local files
# --------------------------------------------------------------------------------------------


def _file_records(
    file: Path | Traversable, display: str, check_kwarg_types: bool = True
) -> Iterator[tuple[_Where, PromptRecord]]:
    """Stream (location, record) pairs from a local or shipped file of any supported format."""
    if not file.is_file():
        raise _not_a_file(file, display, "prompt file")
    read_rows = _reader_for(file.name, display)
    stem = Path(file.name).stem
    try:
        for index, (where, (fields, extra)) in enumerate(read_rows(file, display)):
            yield where, _to_record(fields, where, f"{stem}-{index:04d}", extra, check_kwarg_types)
    except OSError as exc:  # permissions, a vanished file, an I/O error mid-read
        raise UsageError(f"cannot read {display}: {_one_line(exc)}") from None


def _reader_for(file_name: str, display: str):
    suffix = Path(file_name).suffix.lower()
    if suffix in _JSONL_SUFFIXES:
        return _jsonl_rows
    if suffix in _CSV_SUFFIXES:
        return _csv_rows
    if suffix in _PARQUET_SUFFIXES:
        return _parquet_rows
    raise UsageError(
        f"unsupported prompt file type {suffix or '(none)'!r} for {display}; use .jsonl, .json, .csv or .parquet"
    )


def _decoded_lines(stream: BinaryIO, display: str) -> Iterator[str]:
    """Decode a byte stream line by line so bad UTF-8 is reported with its line and byte offset."""
    offset = 0
    for number, raw in enumerate(stream, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"{display} line {number}: not valid UTF-8 (byte offset {offset + exc.start} in the file)"
            ) from None
        offset += len(raw)
        yield text.removeprefix(_BOM) if number == 1 else text


_Row = tuple[dict[str, Any], dict[str, Any]]  # (record fields, extra columns)


def _jsonl_rows(file: Path | Traversable, display: str) -> Iterator[tuple[_Where, _Row]]:
    """JSON Lines: one object per line; blank lines are skipped."""
    with file.open("rb") as stream:
        for number, line in enumerate(_decoded_lines(stream, display), 1):
            if line.strip():
                where = _Where(display, "line", number)
                yield where, _split(_parse_json_object(line, where))


def _parse_json_object(line: str, where: _Where) -> dict:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        # A JSON array or object spread over lines ("[" or "{" alone on the first) is not JSON Lines.
        hint = " (this loader reads JSON Lines: one object per line)" if line.strip() in ("[", "{") else ""
        raise UsageError(f"{where}: malformed JSON at column {exc.colno}: {exc.msg}{hint}") from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{where}: cannot parse JSON: {_one_line(exc)}") from None
    if not isinstance(value, dict):
        hint = " (this loader reads JSON Lines: one object per line)" if isinstance(value, list) else ""
        raise UsageError(f"{where}: expected a JSON object, got {_type_name(value)}{hint}")
    return value


def _csv_rows(file: Path | Traversable, display: str) -> Iterator[tuple[_Where, _Row]]:
    """CSV with a header row; list columns may hold JSON text. Line numbers count the header as line 1."""
    with file.open("rb") as stream:
        reader = csv.DictReader(_decoded_lines(stream, display), strict=True)
        header = _next_csv(reader, display, lambda: reader.fieldnames)
        if header is None:
            return
        prompt_col = _COLUMNS.get().prompt
        if prompt_col not in header:
            raise UsageError(
                f"{display} line 1: no {prompt_col!r} column (columns: {', '.join(' '.join(h.splitlines()) for h in header)})"
                + _field_hint(prompt_col)
            )
        while (row := _next_csv(reader, display, lambda: next(reader, None))) is not None:
            where = _Where(display, "line", reader.line_num)
            if None in row:
                raise UsageError(f"{where}: row has more fields than the header ({len(header)})")
            yield where, _table_row(row, where)


def _next_csv(reader: csv.DictReader, display: str, step):
    """Run one csv step; csv.Error carries no file or line, so add both."""
    try:
        return step()
    except csv.Error as exc:
        raise UsageError(f"{display} line {reader.line_num}: malformed CSV: {_one_line(exc)}") from None


def _parquet_rows(file: Path | Traversable, display: str) -> Iterator[tuple[_Where, _Row]]:
    """Parquet, read one batch at a time (every column but a pandas index: the others are kept as extra)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with file.open("rb") as stream:
        try:
            parquet = pq.ParquetFile(stream)
            names = parquet.schema_arrow.names
            cols = _COLUMNS.get()
            columns = [name for name in names if not _PANDAS_INDEX.fullmatch(name)]
            batches = parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=columns)
        except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
            # UnicodeDecodeError: pyarrow decodes a footer's column paths as UTF-8 (a damaged or
            # hostile file; found by tests/fuzz/atheris_inputs.py).
            raise UsageError(f"{display}: not a readable parquet file: {_one_line(exc)}") from None
        if cols.prompt not in names:
            raise UsageError(
                f"{display}: no {cols.prompt!r} column (columns: {', '.join(' '.join(n.splitlines()) for n in names)})"
                + _field_hint(cols.prompt)
            )
        number = 0
        while (batch := _next_batch(batches, display, number)) is not None:
            for row in _batch_rows(batch, display, number):
                number += 1
                where = _Where(display, "row", number)
                yield where, _table_row(row, where)


def _batch_rows(batch, display: str, rows_before: int) -> list[dict]:
    """Rows of a parquet batch as dicts; a string column holding bad UTF-8 is named by its row."""
    try:
        return batch.to_pylist()
    except UnicodeDecodeError:
        pass
    # Only on failure: convert row by row to say which row carries the bad bytes.
    for i in range(batch.num_rows):
        try:
            batch.slice(i, 1).to_pylist()
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"{display} row {rows_before + i + 1}: text is not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None
    raise UsageError(f"{display}: text is not valid UTF-8")


def _next_batch(batches, display: str, rows_read: int):
    """Next parquet batch or None; a corrupt page is reported at the first row it would have held."""
    import pyarrow as pa

    try:
        return next(batches, None)
    except (pa.ArrowException, OSError) as exc:
        raise UsageError(
            f"{display} row {rows_read + 1}: unreadable parquet data: {_one_line(exc)}"
        ) from None


# --------------------------------------------------------------------------------------------
# Hugging Face Hub
# --------------------------------------------------------------------------------------------


def _parse_hub_spec(spec: str) -> tuple[str, str]:
    """``hf:owner/name[:split]`` -> (``owner/name``, split); the split defaults to ``train``."""
    name, sep, split = spec.removeprefix(HUB_PREFIX).partition(":")
    owner, slash, dataset = name.partition("/")
    if not (owner and slash and dataset) or "/" in dataset or (sep and not split):
        raise UsageError(f"bad Hub dataset spec {spec!r}; expected hf:owner/name or hf:owner/name:split")
    return name, split or HUB_DEFAULT_SPLIT


def _hub_records(spec: str) -> Iterator[tuple[_Where, PromptRecord]]:
    """Rows of a Hub dataset split. ``datasets`` is imported only here: most runs never touch the Hub.

    The split is downloaded (not streamed) so that a second run can reuse the local cache offline.
    """
    name, split = _parse_hub_spec(spec)
    offline = hub.offline()
    if not offline and (why := hub.unreachable()) is not None:
        # datasets would retry for ~25 s, a line per retry, before failing.
        raise UsageError(
            f"could not load Hub dataset {name}: the Hub cannot be reached ({why}); give a local "
            ".jsonl, .csv or .parquet file, or set HF_HUB_OFFLINE=1 to read the dataset from the local cache"
        )
    try:
        import datasets

        dataset = datasets.load_dataset(name, split=split)
    except Exception as exc:
        # Any network, auth, missing-dataset or import failure means the same thing to the user.
        where = "; HF_HUB_OFFLINE is set, so only the local cache was read" if offline else ""
        raise UsageError(f"could not load Hub dataset {name}: {_one_line(exc)}{where}") from None
    prompt_col = _COLUMNS.get().prompt
    if prompt_col not in dataset.column_names:
        raise UsageError(
            f"{spec}: no {prompt_col!r} column (columns: {', '.join(dataset.column_names)})"
            + _field_hint(prompt_col)
        )
    stem = name.rpartition("/")[2]
    for index, row in enumerate(dataset):
        where = _Where(spec, "row", index + 1)
        fields, extra = _table_row(row, where)
        yield where, _to_record(fields, where, f"{stem}-{index:04d}", extra)


# --------------------------------------------------------------------------------------------
# Record validation
# --------------------------------------------------------------------------------------------


def _field_hint(prompt_col: str) -> str:
    return (
        "; name the prompt column with --prompt-field (and the key with --key-field)"
        if prompt_col == "prompt"
        else ""
    )


def _table_row(row: Mapping[str, Any], where: _Where) -> _Row:
    """Normalise a CSV/parquet/Hub row: blank cells count as absent, list columns may hold JSON text.

    Extra columns are kept as they are (a blank CSV cell stays ``""``).
    """
    mapped, extra = _split(row)
    fields: dict[str, Any] = {}
    for name in _FIELDS:
        value = mapped.get(name)
        if value is None or (value == "" and name != "prompt"):
            continue
        if name in _LIST_FIELDS and isinstance(value, str):
            value = _json_cell(value, where, name)
        fields[name] = value
    return fields, extra


def _json_cell(text: str, where: _Where, field: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise UsageError(f"{where}: field {field!r} is not valid JSON (expected a JSON list)") from None


def _to_record(
    row: Mapping[str, Any],
    where: _Where,
    default_key: str,
    extra: Mapping[str, Any] | None = None,
    check_kwarg_types: bool = True,
) -> PromptRecord:
    """Validate one row (already a mapping of record fields) and build its record."""
    ids = _instruction_ids(row.get("instruction_id_list"), where)
    kwargs = _kwargs(row.get("kwargs"), where, len(ids))
    if check_kwarg_types:
        _check_kwarg_types(ids, kwargs, where)
    return PromptRecord(
        key=_key(row.get("key"), where, default_key),
        prompt=_prompt(row, where),
        instruction_id_list=ids,
        kwargs=kwargs,
        lang=_optional_text(row.get("lang"), where, "lang"),
        extra=_extra_columns(extra or {}, where),
    )


def _extra_columns(extra: Mapping[str, Any], where: _Where) -> dict[str, Any]:
    """Extra columns as JSON data, so the run's ``prompts.jsonl`` can hold them.

    A value that is not JSON data (a parquet timestamp, bytes, a decimal) becomes its text form
    (ISO 8601 for dates and times, ``str()`` otherwise); an unpaired surrogate becomes ``?``.
    """
    out: dict[str, Any] = {}
    for name, value in extra.items():
        try:
            text = json.dumps(value, ensure_ascii=False, default=_text_form)
        except TypeError:  # e.g. a dict with tuple keys
            text = json.dumps(_text_form(value), ensure_ascii=False)
        except (ValueError, RecursionError):
            raise UsageError(f"{where}: column {name!r} is nested too deeply to store") from None
        try:
            out[_valid_text(str(name))] = json.loads(_valid_text(text))
        except (ValueError, RecursionError):
            raise UsageError(f"{where}: column {name!r} is nested too deeply to store") from None
    return out


def _text_form(value: Any) -> str:
    iso = getattr(value, "isoformat", None)
    return iso() if callable(iso) else str(value)


def _valid_text(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


def _prompt(row: Mapping[str, Any], where: _Where) -> str:
    value = row.get("prompt")
    if value is None:
        raise UsageError(f"{where}: field {_COLUMNS.get().prompt!r} is missing")
    if not isinstance(value, str):
        raise UsageError(f"{where}: field 'prompt' must be a string, got {_type_name(value)}")
    if not value.strip():
        raise UsageError(f"{where}: field 'prompt' is empty")
    return _encodable(value, where, "prompt")


def _key(value: Any, where: _Where, default: str) -> str:
    """Keys may be strings or integers (Google IFEval uses integers); absent or blank -> a default."""
    if value is None or value == "":
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise UsageError(f"{where}: field 'key' must be a string or an integer, got {_type_name(value)}")
    return _encodable(value, where, "key")


def _optional_text(value: Any, where: _Where, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise UsageError(f"{where}: field {field!r} must be a string, got {_type_name(value)}")
    return _encodable(value, where, field)


def _instruction_ids(value: Any, where: _Where) -> tuple[str, ...]:
    items = _list_field(value, where, "instruction_id_list")
    for position, item in enumerate(items):
        if not isinstance(item, str):
            raise UsageError(
                f"{where}: field 'instruction_id_list' item {position} must be a string, got {_type_name(item)}"
            )
        _encodable(item, where, "instruction_id_list")
    return tuple(items)


def _kwargs(value: Any, where: _Where, n_instructions: int) -> tuple[dict, ...]:
    """IFEval kwargs, one object per instruction id; absent kwargs mean ``{}`` for each id.

    Keys whose value is null are dropped: Arrow struct columns (parquet, the Hub's google/IFEval)
    fill every absent key with null, and verifiers expect only the keys their instruction takes.
    """
    items = _list_field(value, where, "kwargs")
    if not items:
        return tuple({} for _ in range(n_instructions))
    if len(items) != n_instructions:
        raise UsageError(
            f"{where}: field 'kwargs' has {len(items)} entries but 'instruction_id_list' has {n_instructions}"
        )
    result = []
    for position, item in enumerate(items):
        if item is None:
            item = {}
        if not isinstance(item, dict):
            raise UsageError(
                f"{where}: field 'kwargs' item {position} must be an object, got {_type_name(item)}"
            )
        item = {name: arg for name, arg in item.items() if arg is not None}
        try:  # the run directory stores kwargs as JSON: a parquet timestamp or bytes cannot go there
            json.dumps(item)
        except (TypeError, ValueError, RecursionError) as exc:
            raise UsageError(
                f"{where}: field 'kwargs' item {position} is not JSON data: {_one_line(exc)}"
            ) from None
        result.append(item)
    return tuple(result)


def _check_kwarg_types(ids: tuple[str, ...], kwargs: tuple[dict, ...], where: _Where) -> None:
    """Refuse a kwarg whose value is not of the type its instruction's verifier takes (text, a whole
    number, a list of texts): found here, it costs nothing; found by scoring, it came after every
    cell had run. Values of the right type that no verifier can use (a language a script test cannot
    decide) are not refused: the prompt is then not scored, and `prompts show` says so."""
    for position, (iid, kw) in enumerate(zip(ids, kwargs, strict=False)):
        if (problem := kwargs_type_problem(iid, kw)) is not None:
            raise UsageError(f"{where}: field 'kwargs' item {position} ({iid}): {problem}")


def _list_field(value: Any, where: _Where, field: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise UsageError(f"{where}: field {field!r} must be a list, got {_type_name(value)}")
    return list(value)


def _encodable(text: str, where: _Where, field: str) -> str:
    """Reject lone surrogates (e.g. a JSON ``\\ud800`` escape): tokenizers and parquet writers cannot encode them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"{where}: field {field!r} contains an unpaired surrogate and is not valid Unicode"
        ) from None
    return text


# --------------------------------------------------------------------------------------------
# System prompts and small helpers
# --------------------------------------------------------------------------------------------


def _not_a_file(file: Path | Traversable, display: str, what: str) -> UsageError:
    """Why ``file`` cannot be read as ``what``: "not found" only when nothing is there; a folder or
    a device (/dev/null) is there, and a FIFO would hang the reader."""
    if isinstance(file, Path) and file.is_dir():
        return UsageError(f"{what} {display} is a folder, not a file")
    if isinstance(file, Path) and file.exists():
        return UsageError(f"{what} {display} is not a regular file (a device, a pipe or a socket)")
    return UsageError(f"{what} not found: {display}")


def _read_system_prompt(file: Path | Traversable, display: str) -> str:
    """Read a whole system prompt (it is small) and strip it; bad UTF-8 is reported by line and byte."""
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read system prompt file {display}: {_one_line(exc)}") from None
    try:
        text = raw.decode("utf-8").removeprefix(_BOM).strip()
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise UsageError(
            f"{display} line {line}: not valid UTF-8 (byte offset {exc.start} in the file)"
        ) from None
    if not text:
        raise UsageError(
            f"system prompt file {display} is empty; use '{NO_SYSTEM_PROMPT}' for no system prompt"
        )
    return text


_JSON_TYPE_NAMES = {
    dict: "object",
    list: "array",
    str: "string",
    bool: "boolean",
    int: "number",
    float: "number",
}


def _type_name(value: Any) -> str:
    """Name a value's type the way a JSON/CSV author thinks of it."""
    if value is None:
        return "null"
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def _one_line(exc: BaseException) -> str:
    """Collapse an exception message to one line: UsageError messages are printed as a single line."""
    return " ".join(str(exc).split()) or type(exc).__name__
