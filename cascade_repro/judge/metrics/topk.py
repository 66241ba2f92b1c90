"""Each arm's top-k distribution against the reference: the error over every token id the arm listed.

The chosen-token error (``reference.py``) reads one number per generated position; the engine hands
back its top-k logprobs at every step, and the reference pass stores its own exact logprob (from its
full log-softmax) of every id in the arm's list (``rundir/reference.RefRow.arm_ids``). A fault that
bends the distribution while leaving the argmax alone (a wrong softmax normaliser on some heads, a
misplaced attention output) moves the lower-ranked logprobs more than the chosen one, so their error
is evidence the chosen token's is not. All functions are pure.

Per prompt and arm, ``topk_error``: the mean over generated positions of the mean
``|lp_arm(id) - lp_ref(id)|`` over the ids of the arm's own top-k list at that position.

- **Uniform weight over the ids**, not weighted by probability: greedy decoding's top-1 carries most
  of the mass (0.5-0.99 typically), so a probability weight would repeat the chosen-token statistic;
  the independent evidence is in the lower ranks, which a uniform weight counts as much as the top.
- **The arm's ids, not the reference's**: the engine's own ranking is what it returned, and a fault
  that reorders a tail shows in ids the reference ranks lower. Every id is scored by the reference
  exactly, so no position is limited to the ids both lists share.
- **Per position first, then per prompt**: a position's k numbers share one context (their errors
  are correlated through the normaliser), so a position counts once whatever k is, and a prompt's
  value is an average over its positions as the chosen-token error is.
- **No floor here**: the paired statistic (``judge/reference_verdict.paired_errors``) raises each
  prompt's value to the arms' dtype resolution (``drift.drift_floor``), as it does for the
  chosen-token error, so two arms both within rounding tie instead of one being "infinitely" worse.

Positions whose arm list is empty or unusable, ids the reference record does not hold, and logprobs
that are not finite (an engine that clamps to -inf) are left out; NaN when nothing is left.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["topk_error", "topk_pairs"]


def topk_pairs(arm_topk: Any, ref_by_id: Sequence[Mapping[int, float]]) -> list[list[tuple[float, float]]]:
    """Per generated position, ``(arm logprob, reference logprob)`` of each id in the arm's top-k list
    that both sides give a finite logprob for. ``arm_topk``: ``[[ [id, logprob], ... k ], ... steps]``
    (lists, or the float array ``[steps, k, 2]`` scoring keeps)."""
    if arm_topk is None:
        return []
    steps = arm_topk.tolist() if isinstance(arm_topk, np.ndarray) else arm_topk
    out: list[list[tuple[float, float]]] = []
    for t, step in enumerate(steps[: len(ref_by_id)] if isinstance(steps, list) else []):
        ref, here = ref_by_id[t], []
        for entry in step if isinstance(step, list | tuple) else []:
            if not (isinstance(entry, list | tuple) and len(entry) == 2):
                continue
            tid, a = entry
            if isinstance(tid, float) and tid.is_integer():  # the array form holds ids as floats
                tid = int(tid)
            r = ref.get(tid) if isinstance(tid, int) and not isinstance(tid, bool) else None
            if _finite(a) and _finite(r):
                here.append((float(a), float(r)))  # type: ignore[arg-type]
        out.append(here)
    return out


def topk_error(arm_topk: Any, ref_by_id: Sequence[Mapping[int, float]]) -> float:
    """Mean over positions of the mean ``|arm - reference|`` logprob over the arm's top-k ids; NaN
    when no position has an id both sides scored."""
    per_step = [
        sum(abs(a - r) for a, r in step) / len(step) for step in topk_pairs(arm_topk, ref_by_id) if step
    ]
    return sum(per_step) / len(per_step) if per_step else math.nan


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
