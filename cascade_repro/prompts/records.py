"""A prompt record, and how one row of any source becomes one.

The fields follow Google IFEval (``key``, ``prompt``, ``instruction_id_list``, ``kwargs``) so that
instruction-following verifiers can score the outputs later; only ``prompt`` is required. Which
column holds the prompt and which the key is the user's (:class:`Columns`); every other column is
kept, as JSON data, in the record's ``extra`` (and in the run's ``prompts.jsonl``), so a run's prompt
records carry whatever the source said about each prompt.

Every user mistake becomes a :class:`~cascade_repro.errors.UsageError` whose message is one line
naming the file, the line or row (:class:`Where`) and the field, so a typo in a data file never
surfaces as a traceback from deep inside a run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from cascade_repro.errors import UsageError
from cascade_repro.prompts.ifeval_kwargs import kwargs_type_problem

_FIELDS = ("key", "prompt", "instruction_id_list", "kwargs", "lang")
EXTRA_FIELD = "extra"
"""The field of a run's ``prompts.jsonl`` (and of any JSON Lines file) that holds a record's other columns."""
RUN_FIELDS = ("prompt_hash",)
"""Fields a run's ``prompts.jsonl`` adds about that run (``layout.PROMPT_HASH``: the prompt as its
tokenizer rendered it), not about the prompt: a run's prompts read back as a prompt file leave them out."""
# Columns pandas adds for a DataFrame index when it writes parquet: not data about a prompt.
PANDAS_INDEX = re.compile(r"__index_level_\d+__")
_LIST_FIELDS = ("instruction_id_list", "kwargs")


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
COLUMNS: ContextVar[Columns] = ContextVar("prompt_columns", default=Columns())  # noqa: B039 - frozen


def split_row(row: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the record's fields under their own names, every other column) of one row.

    The prompt and key come from the user's columns (:class:`Columns`); a column the record does not
    read, including a ``prompt`` or ``key`` column that another one replaced, is an extra column. An
    ``extra`` field holding an object is a run's ``prompts.jsonl`` speaking: its entries are the
    extra columns (the other columns are added to them).
    """
    cols = COLUMNS.get()
    sources = {name: cols.source(name, row.keys()) for name in _FIELDS}
    fields = {name: row[src] for name, src in sources.items() if src in row}
    used = set(sources.values())
    extra = {
        k: v
        for k, v in row.items()
        if k not in used and k not in RUN_FIELDS and not PANDAS_INDEX.fullmatch(str(k))
    }
    nested = extra.get(EXTRA_FIELD)
    if isinstance(nested, dict):
        extra = {**nested, **{k: v for k, v in extra.items() if k != EXTRA_FIELD}}
    return fields, extra


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
class Where:
    """Where a record came from, so error messages can point at it (``file line 7``, ``file row 3``)."""

    source: str
    unit: str
    number: int

    @property
    def short(self) -> str:
        return f"{self.unit} {self.number}"

    def __str__(self) -> str:
        return f"{self.source} {self.short}"


Row = tuple[dict[str, Any], dict[str, Any]]  # (record fields, extra columns)

# --------------------------------------------------------------------------------------------
# Record validation
# --------------------------------------------------------------------------------------------


def field_hint(prompt_col: str) -> str:
    return (
        "; name the prompt column with --prompt-field (and the key with --key-field)"
        if prompt_col == "prompt"
        else ""
    )


def table_row(row: Mapping[str, Any], where: Where) -> Row:
    """Normalise a CSV/parquet/Hub row: blank cells count as absent, list columns may hold JSON text.

    Extra columns are kept as they are (a blank CSV cell stays ``""``).
    """
    mapped, extra = split_row(row)
    fields: dict[str, Any] = {}
    for name in _FIELDS:
        value = mapped.get(name)
        if value is None or (value == "" and name != "prompt"):
            continue
        if name in _LIST_FIELDS and isinstance(value, str):
            value = _json_cell(value, where, name)
        fields[name] = value
    return fields, extra


def _json_cell(text: str, where: Where, field: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise UsageError(f"{where}: field {field!r} is not valid JSON (expected a JSON list)") from None


def to_record(
    row: Mapping[str, Any],
    where: Where,
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


def _extra_columns(extra: Mapping[str, Any], where: Where) -> dict[str, Any]:
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


def _prompt(row: Mapping[str, Any], where: Where) -> str:
    value = row.get("prompt")
    if value is None:
        raise UsageError(f"{where}: field {COLUMNS.get().prompt!r} is missing")
    if not isinstance(value, str):
        raise UsageError(f"{where}: field 'prompt' must be a string, got {type_name(value)}")
    if not value.strip():
        raise UsageError(f"{where}: field 'prompt' is empty")
    return _encodable(value, where, "prompt")


def _key(value: Any, where: Where, default: str) -> str:
    """Keys may be strings or integers (Google IFEval uses integers); absent or blank -> a default."""
    if value is None or value == "":
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise UsageError(f"{where}: field 'key' must be a string or an integer, got {type_name(value)}")
    return _encodable(value, where, "key")


def _optional_text(value: Any, where: Where, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise UsageError(f"{where}: field {field!r} must be a string, got {type_name(value)}")
    return _encodable(value, where, field)


def _instruction_ids(value: Any, where: Where) -> tuple[str, ...]:
    items = _list_field(value, where, "instruction_id_list")
    for position, item in enumerate(items):
        if not isinstance(item, str):
            raise UsageError(
                f"{where}: field 'instruction_id_list' item {position} must be a string, got {type_name(item)}"
            )
        _encodable(item, where, "instruction_id_list")
    return tuple(items)


def _kwargs(value: Any, where: Where, n_instructions: int) -> tuple[dict, ...]:
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
                f"{where}: field 'kwargs' item {position} must be an object, got {type_name(item)}"
            )
        item = {name: arg for name, arg in item.items() if arg is not None}
        try:  # the run directory stores kwargs as JSON: a parquet timestamp or bytes cannot go there
            json.dumps(item)
        except (TypeError, ValueError, RecursionError) as exc:
            raise UsageError(
                f"{where}: field 'kwargs' item {position} is not JSON data: {one_line(exc)}"
            ) from None
        result.append(item)
    return tuple(result)


def _check_kwarg_types(ids: tuple[str, ...], kwargs: tuple[dict, ...], where: Where) -> None:
    """Refuse a kwarg whose value is not of the type its instruction's verifier takes (text, a whole
    number, a list of texts): found here, it costs nothing; found by scoring, it came after every
    cell had run. Values of the right type that no verifier can use (a language a script test cannot
    decide) are not refused: the prompt is then not scored, and `prompts show` says so."""
    for position, (iid, kw) in enumerate(zip(ids, kwargs, strict=False)):
        if (problem := kwargs_type_problem(iid, kw)) is not None:
            raise UsageError(f"{where}: field 'kwargs' item {position} ({iid}): {problem}")


def _list_field(value: Any, where: Where, field: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise UsageError(f"{where}: field {field!r} must be a list, got {type_name(value)}")
    return list(value)


def _encodable(text: str, where: Where, field: str) -> str:
    """Reject lone surrogates (e.g. a JSON ``\\ud800`` escape): tokenizers and parquet writers cannot encode them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"{where}: field {field!r} contains an unpaired surrogate and is not valid Unicode"
        ) from None
    return text


_JSON_TYPE_NAMES = {
    dict: "object",
    list: "array",
    str: "string",
    bool: "boolean",
    int: "number",
    float: "number",
}


def type_name(value: Any) -> str:
    """Name a value's type the way a JSON/CSV author thinks of it."""
    if value is None:
        return "null"
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def one_line(exc: BaseException) -> str:
    """Collapse an exception message to one line: UsageError messages are printed as a single line."""
    return " ".join(str(exc).split()) or type(exc).__name__
