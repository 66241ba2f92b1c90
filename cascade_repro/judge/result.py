"""A pair's typed result: its verdict, the rule that decided it, its named evidence pieces and counts.

The pieces (value, threshold, whether it fired, the rule) are ``verdicts.py``'s, whose rules
``decide`` asks; the judge writes pairs.parquet from these results, and a report rebuilds one from
a pairs.parquet row (``PairResult.from_row``, through ``report/view.result_of``) so that old runs
re-render.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from cascade_repro.judge.statistics import ARM_NAMES, evidence_of
from cascade_repro.judge.verdicts import ARM_VS_ARM, EvidencePiece, number


@dataclass(frozen=True)
class Counts:
    """The counts a pair's verdict is read beside: prompts and divergences, the noise control's,
    and the steps its twin took effect on (NaN where the row lacks one)."""

    n: float = math.nan
    n_diverged: float = math.nan
    noise_n: float = math.nan
    noise_n_diverged: float = math.nan
    topk_violations: float = math.nan
    noise_topk_violations: float = math.nan
    cascade_steps: float = math.nan
    total_steps: float = math.nan

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Counts:
        return cls(**{f.name: number(row.get(f.name)) for f in fields(cls)})


@dataclass(frozen=True)
class PairResult:
    """One pair's verdict with its named evidence; ``row``: its pairs.parquet columns as written."""

    pair_id: str
    kind: str
    verdict: str
    rule: str
    decided_by: tuple[str, ...]
    evidence: tuple[EvidencePiece, ...]
    row: Mapping[str, Any]
    counts: Counts = Counts()
    depth: str = ""  # where the twin ran: decode, prefill only, none, ? ("" for a control)

    @classmethod
    def from_row(cls, row: Mapping[str, Any], alpha: float, rep_delta: float, min_topk: float) -> PairResult:
        """Build the typed result back from a pairs.parquet row (any run, old ones included)."""

        def text(k: str) -> str:
            return _text(row.get(k))

        return cls(
            pair_id=text("pair_id"),
            kind=text("kind"),
            verdict=text("verdict"),
            rule=text("rule"),
            decided_by=tuple(k for k in text("decided_by").split(",") if k),
            evidence=evidence_of(row, alpha, rep_delta, min_topk),
            row=row,
            counts=Counts.from_row(row),
            depth=text("depth"),
        )

    def number(self, column: str) -> float:
        """A numeric column of the row, NaN where missing or not a number (an older run's row lacks some)."""
        return number(self.row.get(column))

    def text(self, column: str) -> str:
        """A text column of the row, "" where missing."""
        return _text(self.row.get(column))

    def piece(self, name: str) -> EvidencePiece:
        """The evidence piece called ``name``."""
        return next(p for p in self.evidence if p.name == name)

    def fired(self) -> list[str]:
        """What fired under the arm-vs-arm rule: ``decided_by`` as recorded, else (a run that did not
        record it) each arm-vs-arm piece that fired."""
        recorded = [k for k in self.decided_by if k in ARM_NAMES]
        return recorded or [p.name for p in self.evidence if p.fired and p.rule == ARM_VS_ARM]

    def to_row(self) -> dict[str, Any]:
        """The pairs.parquet row: its columns, with the verdict and what decided it from this result."""
        return {
            **self.row,
            "verdict": self.verdict,
            "rule": self.rule,
            "decided_by": ",".join(self.decided_by),
        }


def _text(v: Any) -> str:
    """A cell as text, "" where missing."""
    try:
        missing = v is None or bool(v != v)  # NaN and pandas NA are not equal to themselves
    except (TypeError, ValueError):
        missing = False
    return "" if missing else str(v)
