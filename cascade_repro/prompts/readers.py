"""The rows of each kind of prompt source: a JSON Lines, CSV or parquet file (local or shipped with
the package) and a Hugging Face Hub dataset's split, each row made a record by ``records.py``.

Files are streamed one line, row or parquet batch at a time, so a 10,000-line file is held in memory
once (as the final tuple of records) and never twice. Bad UTF-8, malformed JSON or CSV and
unreadable parquet are each one :class:`~cascade_repro.errors.UsageError` naming the file and the
line or row.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import BinaryIO

from cascade_repro import hub
from cascade_repro.errors import UsageError
from cascade_repro.prompts.records import (
    COLUMNS,
    PANDAS_INDEX,
    PromptRecord,
    Row,
    Where,
    field_hint,
    one_line,
    split_row,
    table_row,
    to_record,
    type_name,
)

HUB_PREFIX = "hf:"
HUB_DEFAULT_SPLIT = "train"

_JSONL_SUFFIXES = (".jsonl", ".json")
_CSV_SUFFIXES = (".csv",)
_PARQUET_SUFFIXES = (".parquet",)
_PARQUET_BATCH_ROWS = 1024

BOM = "\ufeff"

# --------------------------------------------------------------------------------------------
# Local files
# --------------------------------------------------------------------------------------------


def file_records(
    file: Path | Traversable, display: str, check_kwarg_types: bool = True
) -> Iterator[tuple[Where, PromptRecord]]:
    """Stream (location, record) pairs from a local or shipped file of any supported format."""
    if not file.is_file():
        raise not_a_file(file, display, "prompt file")
    read_rows = _reader_for(file.name, display)
    stem = Path(file.name).stem
    try:
        for index, (where, (fields, extra)) in enumerate(read_rows(file, display)):
            yield where, to_record(fields, where, f"{stem}-{index:04d}", extra, check_kwarg_types)
    except OSError as exc:  # permissions, a vanished file, an I/O error mid-read
        raise UsageError(f"cannot read {display}: {one_line(exc)}") from None


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
        yield text.removeprefix(BOM) if number == 1 else text


def _jsonl_rows(file: Path | Traversable, display: str) -> Iterator[tuple[Where, Row]]:
    """JSON Lines: one object per line; blank lines are skipped."""
    with file.open("rb") as stream:
        for number, line in enumerate(_decoded_lines(stream, display), 1):
            if line.strip():
                where = Where(display, "line", number)
                yield where, split_row(_parse_json_object(line, where))


def _parse_json_object(line: str, where: Where) -> dict:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        # A JSON array or object spread over lines ("[" or "{" alone on the first) is not JSON Lines.
        hint = " (this loader reads JSON Lines: one object per line)" if line.strip() in ("[", "{") else ""
        raise UsageError(f"{where}: malformed JSON at column {exc.colno}: {exc.msg}{hint}") from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{where}: cannot parse JSON: {one_line(exc)}") from None
    if not isinstance(value, dict):
        hint = " (this loader reads JSON Lines: one object per line)" if isinstance(value, list) else ""
        raise UsageError(f"{where}: expected a JSON object, got {type_name(value)}{hint}")
    return value


def _csv_rows(file: Path | Traversable, display: str) -> Iterator[tuple[Where, Row]]:
    """CSV with a header row; list columns may hold JSON text. Line numbers count the header as line 1."""
    with file.open("rb") as stream:
        reader = csv.DictReader(_decoded_lines(stream, display), strict=True)
        header = _next_csv(reader, display, lambda: reader.fieldnames)
        if header is None:
            return
        prompt_col = COLUMNS.get().prompt
        if prompt_col not in header:
            raise UsageError(
                f"{display} line 1: no {prompt_col!r} column (columns: {', '.join(' '.join(h.splitlines()) for h in header)})"
                + field_hint(prompt_col)
            )
        while (row := _next_csv(reader, display, lambda: next(reader, None))) is not None:
            where = Where(display, "line", reader.line_num)
            if None in row:
                raise UsageError(f"{where}: row has more fields than the header ({len(header)})")
            yield where, table_row(row, where)


def _next_csv(reader: csv.DictReader, display: str, step):
    """Run one csv step; csv.Error carries no file or line, so add both."""
    try:
        return step()
    except csv.Error as exc:
        raise UsageError(f"{display} line {reader.line_num}: malformed CSV: {one_line(exc)}") from None


def _parquet_rows(file: Path | Traversable, display: str) -> Iterator[tuple[Where, Row]]:
    """Parquet, read one batch at a time (every column but a pandas index: the others are kept as extra)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with file.open("rb") as stream:
        try:
            parquet = pq.ParquetFile(stream)
            names = parquet.schema_arrow.names
            cols = COLUMNS.get()
            columns = [name for name in names if not PANDAS_INDEX.fullmatch(name)]
            batches = parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=columns)
        except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
            # UnicodeDecodeError: pyarrow decodes a footer's column paths as UTF-8 (a damaged or
            # hostile file; found by tests/fuzz/atheris_inputs.py).
            raise UsageError(f"{display}: not a readable parquet file: {one_line(exc)}") from None
        if cols.prompt not in names:
            raise UsageError(
                f"{display}: no {cols.prompt!r} column (columns: {', '.join(' '.join(n.splitlines()) for n in names)})"
                + field_hint(cols.prompt)
            )
        number = 0
        while (batch := _next_batch(batches, display, number)) is not None:
            for row in _batch_rows(batch, display, number):
                number += 1
                where = Where(display, "row", number)
                yield where, table_row(row, where)


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
        raise UsageError(f"{display} row {rows_read + 1}: unreadable parquet data: {one_line(exc)}") from None


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


def hub_records(spec: str) -> Iterator[tuple[Where, PromptRecord]]:
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
        raise UsageError(f"could not load Hub dataset {name}: {one_line(exc)}{where}") from None
    prompt_col = COLUMNS.get().prompt
    if prompt_col not in dataset.column_names:
        raise UsageError(
            f"{spec}: no {prompt_col!r} column (columns: {', '.join(dataset.column_names)})"
            + field_hint(prompt_col)
        )
    stem = name.rpartition("/")[2]
    for index, row in enumerate(dataset):
        where = Where(spec, "row", index + 1)
        fields, extra = table_row(row, where)
        yield where, to_record(fields, where, f"{stem}-{index:04d}", extra)


def not_a_file(file: Path | Traversable, display: str, what: str) -> UsageError:
    """Why ``file`` cannot be read as ``what``: "not found" only when nothing is there; a folder or
    a device (/dev/null) is there, and a FIFO would hang the reader."""
    if isinstance(file, Path) and file.is_dir():
        return UsageError(f"{what} {display} is a folder, not a file")
    if isinstance(file, Path) and file.exists():
        return UsageError(f"{what} {display} is not a regular file (a device, a pipe or a socket)")
    return UsageError(f"{what} not found: {display}")
