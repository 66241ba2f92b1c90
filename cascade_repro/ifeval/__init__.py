"""Instruction-following accuracy (IFEval-style strict and loose) for Korean and English responses."""

from __future__ import annotations

from cascade_repro.ifeval.score import if_accuracy, mcnemar_exact, paired_if, score_response
from cascade_repro.ifeval.verifiers import VERIFIERS, check, check_loose, count_sentences, count_words

__all__ = [
    "VERIFIERS",
    "check",
    "check_loose",
    "count_sentences",
    "count_words",
    "if_accuracy",
    "mcnemar_exact",
    "paired_if",
    "score_response",
]
