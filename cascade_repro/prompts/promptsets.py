"""Prompt sets and system prompts: built-in names, local files and Hub datasets.

Why this module exists: every run sends many short prompts behind one long, shared system prompt,
because a long common prefix is what makes vLLM pick cascade attention. Prompts come from three
kinds of places (the sets shipped in ``prompts/``, a user's JSONL/CSV/parquet file, or a Hugging Face
dataset) and this module turns all of them into one validated, immutable :class:`PromptSet`: it
resolves a spec to its source, reads that source's rows (``readers.py``), each made a checked
:class:`PromptRecord` (``records.py``), keeps the keys unique and stops at ``--limit``. System
prompts are read here too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from importlib import resources
from importlib.resources.abc import Traversable
from itertools import islice
from pathlib import Path

from cascade_repro import userpath
from cascade_repro.errors import UsageError
from cascade_repro.prompts.readers import BOM, HUB_PREFIX, file_records, hub_records, not_a_file

# EXTRA_FIELD and RUN_FIELDS (a run's prompts.jsonl fields) are named here too, for its readers.
from cascade_repro.prompts.records import (  # noqa: F401
    COLUMNS,
    EXTRA_FIELD,
    RUN_FIELDS,
    Columns,
    PromptRecord,
    PromptSet,
    Where,
    one_line,
)

PACKAGE_DATA = "cascade_repro.prompts_data"
"""The package that ships ``prompts/`` (pyproject maps the folder to it)."""

BUILTIN_SETS: dict[str, str] = {"ko-ifeval-style": "ko-ifeval-style.jsonl"}
"""Built-in prompt-set name -> file name in ``prompts/``."""

BUILTIN_SYSTEM_PROMPTS: dict[str, str] = {"ko": "system_ko.txt", "en": "system_en.txt"}
"""Built-in system-prompt name -> file name in ``prompts/``."""

NO_SYSTEM_PROMPT = "none"

PromptPath = str | os.PathLike[str] | Traversable

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
    token = COLUMNS.set(Columns(prompt_field or "prompt", key_field))
    try:
        name, source, display, located = _resolve_set(spec)
        # islice rejects a stop above sys.maxsize; a --limit that large means "all of them".
        stop = None if limit is None else min(limit, sys.maxsize)
        records = tuple(islice(_unique_keys(located), stop))
    finally:
        COLUMNS.reset(token)
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
            raise not_a_file(path, spec, "system prompt file")
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
    for _where, record in file_records(_as_file(path), str(path), check_kwarg_types):
        yield record


def list_builtin_sets() -> list[PromptSet]:
    """Load every shipped prompt set, in the order of :data:`BUILTIN_SETS`."""
    return [load_prompt_set(name) for name in BUILTIN_SETS]


# --------------------------------------------------------------------------------------------
# Resolving a spec
# --------------------------------------------------------------------------------------------


def _resolve_set(spec: str) -> tuple[str, str, str, Iterator[tuple[Where, PromptRecord]]]:
    """Return (set name, source, name for messages, located records) for any kind of spec."""
    if spec in BUILTIN_SETS:
        file = _shipped(BUILTIN_SETS[spec])
        return spec, str(file), str(file), file_records(file, str(file))
    if spec.startswith(HUB_PREFIX):
        return spec, spec, spec, hub_records(spec)
    path = userpath.resolve(spec, "--prompts")
    if not path.exists() and not _looks_like_path(spec):
        raise UsageError(
            f"unknown prompt set {spec!r}; built-in sets: {', '.join(BUILTIN_SETS)}; "
            "or give a .jsonl, .json, .csv or .parquet file, or hf:owner/name[:split]"
        )
    return path.stem, str(path.resolve()), spec, file_records(path, spec)


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


def _unique_keys(located: Iterable[tuple[Where, PromptRecord]]) -> Iterator[PromptRecord]:
    """Reject a repeated key: results are joined on it, so a duplicate would silently mix two prompts."""
    seen: dict[str, Where] = {}
    for where, record in located:
        first = seen.setdefault(record.key, where)
        if first is not where:
            raise UsageError(f"{where}: duplicate key {record.key!r} (first used on {first.short})")
        yield record


def _read_system_prompt(file: Path | Traversable, display: str) -> str:
    """Read a whole system prompt (it is small) and strip it; bad UTF-8 is reported by line and byte."""
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read system prompt file {display}: {one_line(exc)}") from None
    try:
        text = raw.decode("utf-8").removeprefix(BOM).strip()
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
