"""The run as every report reads it: run.json's stored sections, the tables' rows in display
order, and the format-neutral `Table`.

run.json's sections are of their declared types here (``manifest.read_manifest`` refuses a file
where one is not); what may still be absent is a section or field an older file lacks, read as
missing (``Section.stored``: a default is not what the file said).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cascade_repro import engines
from cascade_repro.judge import calibration, outcome
from cascade_repro.judge.outcome import CALIBRATION, TWIN_KINDS
from cascade_repro.judge.result import PairResult
from cascade_repro.judge.verdicts import Thresholds
from cascade_repro.plan.matrix import MatrixSpec, spec_of
from cascade_repro.report.load import RunData
from cascade_repro.report.text import MISSING, as_int, is_missing, text_of
from cascade_repro.rundir.manifest import Invocation, PromptSetFacts
from cascade_repro.twin import CASCADE, TwinAxis, pair_prefix

AXES = ("seed", "dtype", "fa_version", "backend")
# The thresholds a report compares against, at the verdict's defaults (for a run.json that
# recorded none).
DEFAULTS = {k: float(getattr(Thresholds(), k)) for k in ("alpha", "rep_delta", "min_topk_violations")}


@dataclass
class Table:
    """A format-neutral table of plain-text cells."""

    headers: list[str]
    rows: list[list[str]]
    # Headers of free-text columns (reasons, notes): HTML lets these wrap; every other cell stays on one line.
    wrap: frozenset[str] = field(default_factory=frozenset)


def ran_vllm(spec: MatrixSpec) -> bool:
    """Whether the run's engine was vLLM itself; a name the registry does not know is not assumed to be."""
    info = engines.ENGINES.get(str(spec.engine))
    return info is not None and info.is_vllm


def prompt_set(data: RunData) -> PromptSetFacts:
    """run.json's ``prompt_set``; where the file has none, one that recorded nothing (the manifest's
    default section, built in code, would claim every field)."""
    m = data.manifest
    return m.prompt_set if m.has("prompt_set") else PromptSetFacts.from_json({})


def stored_spec(data: RunData) -> dict:
    """The spec as run.json stored it, every key it holds and no other (``plan.matrix.spec_of`` fills in
    defaults)."""
    return data.manifest.spec_json


def spec_field(data: RunData, name: str) -> Any:
    """A spec field where the stored spec holds it, else None (not MatrixSpec's default)."""
    return getattr(spec_of(data.manifest.spec_json), name) if name in stored_spec(data) else None


def predictions(data: RunData) -> dict[str, dict]:
    """Return run.json's cascade predictions per cell id (``{"cells": {...}}`` or a bare map), or {}."""
    p = data.manifest.predictions
    if not p:
        return {}
    cells = p.get("cells") if isinstance(p.get("cells"), dict) else p
    return {str(k): v for k, v in cells.items() if isinstance(v, dict)}


def invocations(data: RunData) -> list[Invocation]:
    """run.json's ``invocations`` (what a resumed run adds to), [] where it has none."""
    return list(data.manifest.invocations or [])


def _axis(v) -> tuple:
    i = as_int(v)
    return (0, i, "") if i is not None else (1, 0, text_of(v))


def _sort_key(r: dict) -> tuple:
    # Numbers sort numerically (batch 8 before 16); missing values go last.
    return (_axis(r.get("tp")), _axis(r.get("batch")), *(_axis(r.get(a)) for a in AXES))


def _pairs_of(data: RunData, keep: Callable[[object], bool]) -> list[dict]:
    rows = (r for r in data.rows("pairs") if keep(r.get("kind")))
    return sorted(rows, key=lambda r: (*_sort_key(r), str(r.get("pair_id"))))


def cascade_pairs(data: RunData) -> list[dict]:
    """Return cascade pair rows ordered by tp, batch and the other axes (calibration rows excluded)."""
    return _pairs_of(data, lambda k: k in TWIN_KINDS)


def calibration_pairs(data: RunData) -> list[dict]:
    """Return calibration pair rows (positive controls: never in the headline, counts or exit code).

    Ordered like the other pairs, then by injected shift (a ladder reads small to large).
    """
    rows = (r for r in data.rows("pairs") if r.get("kind") == CALIBRATION)
    return sorted(rows, key=lambda r: (*_sort_key(r), _shift(r), str(r.get("pair_id"))))


def _shift(r: dict) -> float:
    x = calibration.shift_of(r.get("inject"))
    return math.inf if x is None else x


def control_pairs(data: RunData) -> list[dict]:
    """Return noise-control pair rows in the same order."""
    return _pairs_of(data, lambda k: k not in TWIN_KINDS and k != CALIBRATION)


def cells(data: RunData) -> list[dict]:
    """Return cell rows ordered by tp, batch, the other axes, arm and id."""
    return sorted(
        data.rows("cells"), key=lambda r: (*_sort_key(r), text_of(r.get("arm")), str(r.get("cell_id")))
    )


def verdict_counts(data: RunData) -> dict[str, int]:
    """Count cascade pairs per verdict (:func:`~cascade_repro.judge.outcome.verdict_counts`), a
    missing verdict under the missing marker."""
    return outcome.verdict_counts(text_of(r.get("verdict")) for r in cascade_pairs(data))


def varying_axes(pairs: list[dict]) -> list[str]:
    """Return the axes besides tp and batch that take more than one value."""
    return [a for a in AXES if len({text_of(r.get(a)) for r in pairs} - {MISSING}) > 1]


def if_column(data: RunData) -> str:
    """The verdict table's heading of IFEval accuracy, in the run's arms."""
    return f"IF strict {data.twin.test} vs {data.twin.ref}"


def has_if(rows: list[dict], key: str = "if_n") -> bool:
    """Return True when any row carries instruction-following scores."""
    return any((as_int(r.get(key)) or 0) > 0 for r in rows)


def _num(v) -> float:
    """v as a float, NaN where missing or not a number."""
    try:
        return float("nan") if is_missing(v) else float(v)
    except (TypeError, ValueError):
        return float("nan")


def thresholds(data: RunData) -> dict:
    """The run's thresholds (run.json), the verdict's defaults where a number is missing."""
    th = data.manifest.thresholds or {}
    out = {}
    for k, default in DEFAULTS.items():
        v = _num(th.get(k))
        out[k] = default if v != v else v
    return out


def shows_depth(twin: TwinAxis) -> bool:
    """Whether a twin's pairs have a depth to show: where cascade ran (decode, prefill only, none) is
    the cascade twin's alone; another twin's pairs would show an empty column."""
    return twin is CASCADE


def pair_label(data: RunData, pair_id: str) -> str:
    """A pair's id as a report shows it: in a run of several twins each twin's section shows its own
    pairs, so without the twin every id there begins with (``prefix-caching/``); in a run of one, whole."""
    return pair_id.removeprefix(pair_prefix(data.twin))


def result_of(row: dict, th: dict) -> PairResult:
    """A pair's typed result rebuilt from its pairs.parquet row: the one place a report does so."""
    return PairResult.from_row(row, th["alpha"], th["rep_delta"], th["min_topk_violations"])


def cascade_results(data: RunData) -> list[PairResult]:
    """The typed results of the cascade pairs, in ``cascade_pairs``' order."""
    th = thresholds(data)
    return [result_of(r, th) for r in cascade_pairs(data)]


def calibration_results(data: RunData) -> list[PairResult]:
    """The typed results of the calibration pairs, in ``calibration_pairs``' order."""
    th = thresholds(data)
    return [result_of(r, th) for r in calibration_pairs(data)]


def control_results(data: RunData) -> list[PairResult]:
    """The typed results of the flat-vs-flat control pairs, in ``control_pairs``' order."""
    th = thresholds(data)
    return [result_of(r, th) for r in control_pairs(data)]
