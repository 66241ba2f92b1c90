"""A samples file's records: the typed records, their one encoder and one decoder."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cascade_repro.rundir.manifest import type_problem

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
