"""A pair's typed result: its verdict, the rule that decided it, and named evidence pieces.

Each piece of arm-vs-arm evidence (``verdicts.decide``'s order: bias, drift, divergence, top-k,
repetition) is built here, once, with its value, the threshold it is held against and whether it
fired: ``verdicts.decide`` asks a piece whether it fired, and so does the report, which rebuilds a
pair's result from its pairs.parquet row (``PairResult.from_row``) so that old runs re-render.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

ARM_VS_ARM = "arm-vs-arm"
REFERENCE = "reference"
# The evidence a regression can rest on, in the order ``verdicts.decide`` weighs it.
EVIDENCE_NAMES = ("bias", "drift", "divergence", "top-k", "repetition")


def number(v: Any) -> float:
    """v as a float, NaN where missing or not a number (a pairs.parquet cell may be None or NA)."""
    if v is None:
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


@dataclass(frozen=True)
class EvidencePiece:
    """One named piece of a pair's evidence: its value against its threshold, and whether it fired."""

    name: str  # one of EVIDENCE_NAMES
    value: float
    threshold: float
    fired: bool
    rule: str = ARM_VS_ARM


def bias_piece(p_bias: Any, alpha: float) -> EvidencePiece:
    """The sign test of the chosen token's logprob, at ``alpha / 2`` (it shares alpha with drift)."""
    p = number(p_bias)
    return EvidencePiece("bias", p, alpha / 2, p < alpha / 2)


def drift_piece(ratio: Any, threshold: Any) -> EvidencePiece:
    """The drift ratio against its threshold (``max(null_q, drift_min)``)."""
    r, t = number(ratio), number(threshold)
    return EvidencePiece("drift", r, t, r > t)


def divergence_piece(p_divergence: Any, alpha: float) -> EvidencePiece:
    """Fisher's test of diverged-prompt counts against the noise control."""
    p = number(p_divergence)
    return EvidencePiece("divergence", p, alpha, p < alpha)


def topk_piece(p_topk: Any, violations: Any, alpha: float, min_violations: float) -> EvidencePiece:
    """Fisher's test of outside-top-k divergences, given at least ``min_violations`` of them."""
    p = number(p_topk)
    return EvidencePiece("top-k", p, alpha, number(violations) >= min_violations and p < alpha)


def repetition_piece(d_rep_lo: Any, rep_delta: float) -> EvidencePiece:
    """The seq-rep-4 delta's CI low end against the minimum effect."""
    lo = number(d_rep_lo)
    return EvidencePiece("repetition", lo, rep_delta, lo > rep_delta)


def reference_piece(ratio: Any, min_effect: Any, p_ref: Any, alpha: float) -> EvidencePiece:
    """The error ratio against the reference over the run's minimum effect, given its test's p below alpha."""
    r, floor = number(ratio), number(min_effect)
    return EvidencePiece("reference", r, floor, number(p_ref) < alpha and r > floor, rule=REFERENCE)


def evidence_of(
    row: Mapping[str, Any], alpha: float, rep_delta: float, min_topk: float
) -> tuple[EvidencePiece, ...]:
    """A pair's evidence pieces from its pairs.parquet columns: the arm-vs-arm ones in ``decide``'s
    order, then the reference's where it decided."""
    reference = (
        (reference_piece(row.get("ref_ratio"), row.get("ref_min_effect"), row.get("p_ref"), alpha),)
        if row.get("rule") == REFERENCE
        else ()
    )
    return (
        bias_piece(row.get("p_bias"), alpha),
        drift_piece(row.get("drift_ratio"), row.get("drift_threshold")),
        divergence_piece(row.get("p_divergence"), alpha),
        topk_piece(row.get("p_topk"), row.get("topk_violations"), alpha, min_topk),
        repetition_piece(row.get("d_seq_rep_4_lo"), rep_delta),
        *reference,
    )


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

    @classmethod
    def from_row(cls, row: Mapping[str, Any], alpha: float, rep_delta: float, min_topk: float) -> PairResult:
        """Build the typed result back from a pairs.parquet row (any run, old ones included)."""

        def text(k: str) -> str:
            v = row.get(k)
            return "" if v is None or (isinstance(v, float) and v != v) else str(v)

        return cls(
            pair_id=text("pair_id"),
            kind=text("kind"),
            verdict=text("verdict"),
            rule=text("rule"),
            decided_by=tuple(k for k in text("decided_by").split(",") if k),
            evidence=evidence_of(row, alpha, rep_delta, min_topk),
            row=row,
            counts=Counts.from_row(row),
        )

    def piece(self, name: str) -> EvidencePiece:
        """The evidence piece called ``name``."""
        return next(p for p in self.evidence if p.name == name)

    def fired(self) -> list[str]:
        """What fired: ``decided_by`` as recorded, else (a run that did not record it) each piece that fired."""
        recorded = [k for k in self.decided_by if k in EVIDENCE_NAMES]
        return recorded or [p.name for p in self.evidence if p.fired and p.rule == ARM_VS_ARM]

    def to_row(self) -> dict[str, Any]:
        """The pairs.parquet row: its columns, with the verdict and what decided it from this result."""
        return {
            **self.row,
            "verdict": self.verdict,
            "rule": self.rule,
            "decided_by": ",".join(self.decided_by),
        }
