"""Instruction-following accuracy (IFEval-style strict and loose) for Korean and English responses."""

from __future__ import annotations

from cascade_repro.judge.ifeval.counting import count_sentences, count_words
from cascade_repro.judge.ifeval.score import (
    Unscorable,
    if_accuracy,
    mcnemar_exact,
    paired_if,
    score_response,
    unknown_instruction_ids,
    unscorable,
)
from cascade_repro.judge.ifeval.verifiers import (
    ALIASES,
    GOOGLE_IFEVAL_IDS,
    VERIFIERS,
    canonical_id,
    check,
    check_loose,
    kwargs_problem,
)

__all__ = [
    "ALIASES",
    "GOOGLE_IFEVAL_IDS",
    "VERIFIERS",
    "Unscorable",
    "canonical_id",
    "check",
    "check_loose",
    "count_sentences",
    "count_words",
    "if_accuracy",
    "kwargs_problem",
    "mcnemar_exact",
    "paired_if",
    "score_response",
    "unknown_instruction_ids",
    "unscorable",
]
