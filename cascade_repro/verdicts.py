"""Noise-aware verdicts: is cascade-vs-flat divergence beyond what flat-vs-flat controls show?

Raw divergence cries wolf: on an H200 with vLLM 0.26, cascade vs flat at batch 64 differed on 37/64
prompts while flat batch 1 vs flat batch 64 differed on 36/64. So a pair is only called a
``regression`` on evidence measured against a noise floor from flat-vs-flat controls:

- divergence: Fisher's exact test (one-sided) on diverged-prompt counts, pair vs noise control;
- top-k: Fisher's exact test on counts of divergences where a side's token is outside the other
  side's top-k (vLLM's ``check_logprobs_close`` rule), pair vs noise control;
- repetition: the paired bootstrap CI of per-prompt seq-rep-4 deltas (cascade − flat) lies above
  a minimum effect.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

NOT_EXERCISED = "not exercised"
IDENTICAL = "identical"
WITHIN_NOISE = "within noise"
REGRESSION = "regression"
ERROR = "error"
VERDICTS = (NOT_EXERCISED, IDENTICAL, WITHIN_NOISE, REGRESSION, ERROR)


@dataclass(frozen=True)
class Thresholds:
    """Knobs behind every verdict; all are shown in the report."""

    alpha: float = 0.01
    rep_delta: float = 0.02
    min_topk_violations: int = 1
    bootstrap: int = 2000
    ci: float = 0.95
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def fisher_greater(a_hits: int, a_n: int, b_hits: int, b_n: int) -> float:
    """One-sided Fisher exact p-value that group A's hit rate exceeds group B's."""
    if a_n <= 0:
        return 1.0
    total, hits, row = a_n + b_n, a_hits + b_hits, a_n

    def log_pmf(x: int) -> float:
        return _log_comb(hits, x) + _log_comb(total - hits, row - x) - _log_comb(total, row)

    lo, hi = a_hits, min(row, hits)
    if lo > hi:
        return 0.0
    logs = [log_pmf(x) for x in range(lo, hi + 1)]
    m = max(logs)
    return min(1.0, math.exp(m) * sum(math.exp(v - m) for v in logs))


def _log_comb(n: int, k: int) -> float:
    if k < 0 or k > n:
        return float("-inf")
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def paired_bootstrap_ci(
    deltas: Sequence[float], n_boot: int = 2000, ci: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """Return (mean, lo, hi) of the mean of ``deltas`` with a percentile bootstrap CI."""
    d = np.asarray(deltas, dtype=float)
    if d.size == 0:
        return 0.0, 0.0, 0.0
    if d.size == 1 or np.all(d == d[0]):
        return float(d.mean()), float(d[0]), float(d[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(n_boot, d.size))
    means = d[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - ci) / 2, 1 - (1 - ci) / 2])
    return float(d.mean()), float(lo), float(hi)


@dataclass
class Evidence:
    """The numbers a verdict is decided on."""

    n: int
    n_diverged: int
    topk_violations: int
    noise_n: int
    noise_n_diverged: int
    noise_topk_violations: int
    d_rep_mean: float
    d_rep_lo: float
    d_rep_hi: float
    cascade_steps: int
    status_ok: bool = True


def decide(ev: Evidence, th: Thresholds, has_noise: bool) -> tuple[str, str, float, float]:
    """Return (verdict, reasons, p_divergence, p_topk) for one cascade pair."""
    p_div = fisher_greater(ev.n_diverged, ev.n, ev.noise_n_diverged, ev.noise_n if has_noise else ev.n)
    p_topk = fisher_greater(
        ev.topk_violations, ev.n, ev.noise_topk_violations, ev.noise_n if has_noise else ev.n
    )
    if not ev.status_ok:
        return ERROR, "a cell of this pair did not finish", p_div, p_topk
    if ev.cascade_steps == 0:
        return NOT_EXERCISED, "cascade never fired in this cell: the comparison proves nothing", p_div, p_topk
    if ev.n_diverged == 0:
        return IDENTICAL, f"all {ev.n} outputs token-identical", p_div, p_topk
    noise_txt = (
        f"noise {ev.noise_n_diverged}/{ev.noise_n}"
        if has_noise
        else "no noise control measured (floor taken as 0)"
    )
    fired = []
    if p_div < th.alpha:
        fired.append(f"diverged {ev.n_diverged}/{ev.n} vs {noise_txt}, Fisher p={p_div:.3g} < {th.alpha}")
    if ev.topk_violations >= th.min_topk_violations and p_topk < th.alpha:
        fired.append(
            f"{ev.topk_violations} divergences outside top-k vs {ev.noise_topk_violations} in noise, Fisher p={p_topk:.3g}"
        )
    if ev.d_rep_lo > th.rep_delta:
        fired.append(
            f"seq-rep-4 up by {ev.d_rep_mean:+.3f} (CI {ev.d_rep_lo:+.3f}..{ev.d_rep_hi:+.3f} > {th.rep_delta})"
        )
    if fired:
        return REGRESSION, "; ".join(fired), p_div, p_topk
    return (
        WITHIN_NOISE,
        f"diverged {ev.n_diverged}/{ev.n} vs {noise_txt} (p={p_div:.3g}); top-k violations {ev.topk_violations} "
        f"(p={p_topk:.3g}); Δseq-rep-4 {ev.d_rep_mean:+.3f} CI {ev.d_rep_lo:+.3f}..{ev.d_rep_hi:+.3f}",
        p_div,
        p_topk,
    )
