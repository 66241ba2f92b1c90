"""Logprob drift on agreeing contexts: the evidence a fault leaves before it flips any token.

Three completions of one prompt: the test arm ``a`` (cascade at batch B), its twin ``b`` (flat at
batch B) and the other side ``c`` of the matched noise control (flat at another batch, or a flat
rerun in another engine start). On the positions where all three have emitted the same tokens so
far (and the same token at that position), the contexts are identical, so any difference in the
chosen token's logprob is the computation's alone:

- test drift ``|lp_a - lp_b|`` (what cascade changes) and control drift ``|lp_c - lp_b|`` (what an
  equivalent recomputation changes), per position, averaged per prompt;
- the same over the top-k vectors: per position, the largest ``|Δ logprob|`` over the token ids
  both top-k lists share (the chosen token always is one of them when greedy choices agree);
- the signed drift ``lp_a - lp_b`` averaged per prompt (the *bias*): rounding has no preferred
  direction, a systematic fault does.

After the first divergence the contexts differ and logprobs are no longer comparable, which is why
the positions stop there. All functions are pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from cascade_repro.judge.metrics.divergence import _common_prefix_len
from cascade_repro.judge.metrics.repetition import _as_list

__all__ = ["agreeing_len", "chosen_bias", "chosen_drift", "drift_floor", "drift_triple", "topk_drift"]

# A logprob difference below this is at the resolution of the computation, not evidence. For 16-bit
# dtypes it is the dtype's unit roundoff (bf16 2^-8, fp16 2^-11): activations cannot resolve a
# smaller relative change. For fp32 it is what an fp32 30-layer forward pass recomputed in another
# order already differs by (on CPU the reference cascade and SDPA differ by up to ~2e-5 in a
# logprob), which the unit roundoff (6e-8) would turn into "infinitely above" an exact control.
FP32_RECOMPUTE_FLOOR = 1e-4
_UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def drift_floor(dtype: str | None) -> float:
    """Return the absolute drift floor of a dtype name (``bfloat16``, ``torch.float16``, ...).

    Unknown names get the largest floor (bf16's): a floor set too low would turn rounding into
    evidence, one set too high only costs sensitivity.
    """
    name = str(dtype or "").replace("torch.", "").strip().lower()
    name = {
        "bf16": "bfloat16",
        "half": "float16",
        "fp16": "float16",
        "float": "float32",
        "fp32": "float32",
    }.get(name, name)
    u = _UNIT_ROUNDOFF.get(name, _UNIT_ROUNDOFF["bfloat16"])
    return max(u, FP32_RECOMPUTE_FLOOR)


def agreeing_len(*seqs: Sequence[int]) -> int:
    """Number of leading positions where every sequence has the same token."""
    lists = [_as_list(s) for s in seqs]
    if not lists:
        return 0
    first = lists[0]
    n = len(first)
    for other in lists[1:]:
        n = min(n, _common_prefix_len(first, other))
    return n


def _diffs(a_logprobs: Sequence[float], b_logprobs: Sequence[float], upto: int) -> np.ndarray | None:
    """``a - b`` over the first ``upto`` positions (clipped to both lengths); None when none."""
    u = min(upto, len(a_logprobs), len(b_logprobs))
    if u <= 0:
        return None
    return np.asarray(a_logprobs[:u], dtype=np.float64) - np.asarray(b_logprobs[:u], dtype=np.float64)


def chosen_drift(a_logprobs: Sequence[float], b_logprobs: Sequence[float], upto: int) -> float:
    """Mean ``|a - b|`` over the first ``upto`` positions (clipped to both lengths); NaN when none."""
    d = _diffs(a_logprobs, b_logprobs, upto)
    return math.nan if d is None else float(np.abs(d).mean())


def chosen_bias(a_logprobs: Sequence[float], b_logprobs: Sequence[float], upto: int) -> float:
    """Mean ``a - b`` (signed) over the first ``upto`` positions; NaN when none."""
    d = _diffs(a_logprobs, b_logprobs, upto)
    return math.nan if d is None else float(d.mean())


def _topk_array(topk: Any, upto: int) -> np.ndarray | None:
    """Top-k of the first ``upto`` steps as float64 ``[steps, k, 2]``, or None when unusable."""
    if topk is None or len(topk) == 0:
        return None
    try:
        arr = np.asarray(topk[:upto], dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return arr if arr.ndim == 3 and arr.shape[2] == 2 else None


def topk_drift(a_topk: Any, b_topk: Any, upto: int) -> float:
    """Mean over the first ``upto`` positions of the largest ``|Δ logprob|`` among shared top-k ids.

    Positions where the two lists share no id (impossible when both chose the same greedy token,
    possible with hand-made data) are skipped; NaN when no position is left.
    """
    a, b = _topk_array(a_topk, upto), _topk_array(b_topk, upto)
    if a is None or b is None:
        return math.nan
    u = min(len(a), len(b), upto)
    if u <= 0:
        return math.nan
    a, b = a[:u], b[:u]
    shared = a[:, :, None, 0] == b[:, None, :, 0]  # [steps, ka, kb]
    diff = np.abs(a[:, :, None, 1] - b[:, None, :, 1])
    per_step = np.where(shared, diff, -np.inf).max(axis=(1, 2))
    per_step = per_step[np.isfinite(per_step)]
    return float(per_step.mean()) if per_step.size else math.nan


def drift_triple(
    a_tokens: Sequence[int],
    a_logprobs: Sequence[float],
    a_topk: Any,
    b_tokens: Sequence[int],
    b_logprobs: Sequence[float],
    b_topk: Any,
    c_tokens: Sequence[int],
    c_logprobs: Sequence[float],
    c_topk: Any,
) -> dict[str, float | int]:
    """Drift of test ``a`` and of control side ``c``, both against twin ``b``, on agreeing positions.

    Keys: ``drift_positions`` (positions where a, b and c agree), ``drift_test``, ``drift_control``,
    ``bias_test``, ``bias_control`` (signed), ``topk_drift_test``, ``topk_drift_control`` (NaN when
    there is no agreeing position).
    """
    n = agreeing_len(a_tokens, b_tokens, c_tokens)
    return {
        "drift_positions": n,
        "drift_test": chosen_drift(a_logprobs, b_logprobs, n),
        "drift_control": chosen_drift(c_logprobs, b_logprobs, n),
        "bias_test": chosen_bias(a_logprobs, b_logprobs, n),
        "bias_control": chosen_bias(c_logprobs, b_logprobs, n),
        "topk_drift_test": topk_drift(a_topk, b_topk, n),
        "topk_drift_control": topk_drift(c_topk, b_topk, n),
    }
