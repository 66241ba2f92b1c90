"""Noise-aware verdicts: is cascade-vs-flat drift beyond what flat-vs-flat controls show?

Raw divergence cries wolf: flat at another batch size diverges from flat about as often as cascade
does. So a pair is only called a
``regression`` on evidence measured against a noise control:

- bias (the most sensitive): on positions where the cascade cell, its flat twin and the matched
  control's other side all agree so far (``metrics/drift.py``), the signed mean of
  ``logprob(cascade) - logprob(twin)`` per prompt. Null model: rounding has no preferred direction,
  so each prompt's sign is a fair coin whatever the rounding's size (FA2's cascade drifts 1.2-1.5x
  more than its flat path, without a direction). Exact two-sided sign test at ``alpha / 2``;
- drift magnitude: the mean |Δ logprob| of the chosen token, cascade vs twin, over the same for
  the control. Flagged when it exceeds ``drift_min`` and the ``1 - alpha / 2`` quantile of its
  distribution with cascade and control labels swapped at random within prompts (for small
  samples, where that quantile is the binding one). It catches what has no direction (a fault
  confined to the prefill at batch 8, where the sign test saw nothing);
- divergence: Fisher's exact test (one-sided) on diverged-prompt counts, pair vs noise control;
- top-k: Fisher's exact test on counts of divergences where a side's token is outside the other
  side's top-k (vLLM's ``check_logprobs_close`` rule), pair vs noise control;
- repetition: the paired bootstrap CI of per-prompt seq-rep-4 deltas (cascade − flat) lies above
  a minimum effect.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from cascade_repro.errors import UsageError
from cascade_repro.judge.outcome import (
    ERROR,
    IDENTICAL,
    INCONCLUSIVE,
    NOT_EXERCISED,
    PREFILL_ONLY,
    REGRESSION,
    WITHIN_NOISE,
)
from cascade_repro.vllm_surface import faults

# --- evidence pieces: each statistic's value against its bar, and the one rule for whether it fired;
# ``decide`` asks them, and so does a report through ``judge/result.PairResult`` (the statistics
# themselves are declared in ``judge/statistics.py``).

ARM_VS_ARM = "arm-vs-arm"
REFERENCE = "reference"
# ``decided_by`` of a pair whose test arm's engine died of a kernel fault (no statistic decided it).
ENGINE_FAULT = "engine fault"


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

    name: str  # one of judge/statistics.EVIDENCE_NAMES
    value: float
    threshold: float
    fired: bool
    rule: str = ARM_VS_ARM
    level: float = math.nan  # a reference statistic's: the p-value's bar (alpha shared by Bonferroni)


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


def reference_piece(
    ratio: Any, min_effect: Any, p_ref: Any, alpha: float, name: str = REFERENCE
) -> EvidencePiece:
    """An error ratio against the reference over the run's minimum effect, given its test's p below
    ``alpha`` (the level its statistic was given: ``reference_verdict.level``)."""
    r, floor = number(ratio), number(min_effect)
    return EvidencePiece(name, r, floor, number(p_ref) < alpha and r > floor, rule=REFERENCE, level=alpha)


EXACT_PERMUTATION_MAX_N = 10  # up to 2**10 sign patterns are enumerated; more are sampled


@dataclass(frozen=True)
class Thresholds:
    """Knobs behind every verdict; all are shown in the report."""

    alpha: float = 0.01
    rep_delta: float = 0.02
    # Cascade's drift may be a constant factor larger than flat-vs-flat drift without any fault; 2
    # lies above clean runs' ratios and below an injected fault's (docs/architecture.md, "Noise controls").
    drift_min: float = 2.0
    min_topk_violations: int = 1
    bootstrap: int = 2000
    ci: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        # Out of range, a knob silently changes what every verdict means (alpha 2 flags every
        # pair, a negative drift_min none of the ratio's floor): refused, named as the flag.
        checks = (
            ("alpha", _finite(self.alpha) and 0 < self.alpha < 1, "in (0, 1)"),
            ("rep_delta", _finite(self.rep_delta) and self.rep_delta >= 0, "a number >= 0"),
            ("drift_min", _finite(self.drift_min) and self.drift_min >= 0, "a number >= 0"),
            ("min_topk_violations", _count(self.min_topk_violations, 0), "an integer >= 0"),
            ("bootstrap", _count(self.bootstrap, 1), "an integer >= 1"),
            ("ci", _finite(self.ci) and 0 < self.ci < 1, "in (0, 1)"),
            ("seed", _count(self.seed, 0), "an integer >= 0"),
        )
        for name, ok, want in checks:
            if not ok:
                # bootstrap, ci and seed have no flag: only a run.json can hold a bad one
                where = f"--{name.replace('_', '-')}" if name in _FLAGGED else f"thresholds: {name}"
                raise UsageError(f"{where} must be {want}, got {getattr(self, name)!r}")

    @classmethod
    def from_record(cls, record: Mapping[str, object]) -> Thresholds:
        """run.json's ``thresholds``: a knob this version does not know is refused in one line (a
        verdict judged without it would not be the one the run asked for)."""
        known = [f.name for f in fields(cls)]
        if unknown := sorted(set(map(str, record)) - set(known)):
            raise UsageError(
                f"run.json's thresholds hold an unknown knob {unknown[0]!r} (known: {', '.join(known)})"
            )
        try:
            return cls(**record)  # type: ignore[arg-type]  # each value is checked by __post_init__
        except UsageError as e:
            raise UsageError(f"run.json's thresholds: {e}") from None

    def to_dict(self) -> dict:
        return asdict(self)


_FLAGGED = ("alpha", "rep_delta", "drift_min", "min_topk_violations")  # matrix's own flags


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _count(v: object, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


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
class DriftStats:
    """The drift ratio of one pair against its control, with what it is judged by."""

    n: int = 0  # prompts with at least one agreeing position
    test: float = math.nan  # mean per-prompt drift, test vs twin
    control: float = math.nan  # the same, control side vs twin
    floor: float = math.nan
    ratio: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    p: float = math.nan  # permutation p-value, one-sided (test drift larger)
    null_q: float = math.nan  # 1 - alpha quantile of the ratio under the permutation null
    threshold: float = math.nan  # max(null_q, drift_min): what the ratio must exceed
    up: int = 0  # prompts whose test drift exceeds their control drift

    @property
    def measured(self) -> bool:
        return self.n > 0 and math.isfinite(self.ratio)


def _floored_ratio(t: np.ndarray, c: np.ndarray, floor: float) -> np.ndarray:
    """max(mean t, floor) / max(mean c, floor) along the last axis."""
    return np.maximum(t.mean(axis=-1), floor) / np.maximum(c.mean(axis=-1), floor)


def drift_ratio_stats(
    test: Sequence[float], control: Sequence[float], floor: float, th: Thresholds
) -> DriftStats:
    """Ratio of mean test drift to mean control drift over prompts, its bootstrap CI and permutation null.

    Both means are raised to ``floor`` first, so two drifts at the dtype's resolution give 1, not
    1e-6 / 1e-9. The null swaps test and control of a prompt with probability 1/2 (exactly
    enumerated for up to ``EXACT_PERMUTATION_MAX_N`` prompts, else ``th.bootstrap`` draws).
    """
    t = np.asarray(test, dtype=float)
    c = np.asarray(control, dtype=float)
    keep = np.isfinite(t) & np.isfinite(c)
    t, c = t[keep], c[keep]
    n = int(t.size)
    if n == 0:
        return DriftStats(floor=floor)
    ratio = float(_floored_ratio(t, c, floor))
    rng = np.random.default_rng(th.seed)
    # Resamples are drawn in blocks of about a million values: 2,000 resamples of 10,000 prompts
    # at once held ~0.5 GB of index and value matrices (tests/run/test_scale.py).
    block = max(1, 1_000_000 // n)
    if n > 1:
        boots = np.concatenate(
            [
                _floored_ratio(t[idx], c[idx], floor)
                for idx in (
                    rng.integers(0, n, size=(min(block, th.bootstrap - i), n))
                    for i in range(0, th.bootstrap, block)
                )
            ]
        )
        lo, hi = (float(x) for x in np.quantile(boots, [(1 - th.ci) / 2, 1 - (1 - th.ci) / 2]))
    else:
        lo = hi = ratio
    if n <= EXACT_PERMUTATION_MAX_N:
        codes = np.arange(2**n)[:, None]
        swaps = [((codes >> np.arange(n)) & 1).astype(bool)]
    else:
        swaps = (rng.random((min(block, th.bootstrap - i), n)) < 0.5 for i in range(0, th.bootstrap, block))
    perm = np.concatenate([_floored_ratio(np.where(sw, c, t), np.where(sw, t, c), floor) for sw in swaps])
    # A permuted ratio equal to the observed one counts against it (ties are not evidence).
    hits = int((perm >= ratio - 1e-12 * abs(ratio)).sum())
    p = hits / perm.size if n <= EXACT_PERMUTATION_MAX_N else (1 + hits) / (1 + perm.size)
    # alpha / 2: the magnitude and the bias test share the run's alpha (Bonferroni).
    null_q = float(np.quantile(perm, 1 - th.alpha / 2, method="higher"))
    return DriftStats(
        n=n,
        test=float(t.mean()),
        control=float(c.mean()),
        floor=floor,
        ratio=ratio,
        lo=lo,
        hi=hi,
        p=float(p),
        null_q=null_q,
        threshold=max(null_q, th.drift_min),
        up=int((t > c).sum()),
    )


def sign_test_greater(up: int, down: int) -> float:
    """Exact one-sided sign test: P(at least ``up`` heads in ``up + down`` fair tosses)."""
    n = up + down
    if n == 0:
        return 1.0
    tail = sum(math.exp(_log_comb(n, i) - n * math.log(2)) for i in range(up, n + 1))
    return min(1.0, tail)


WILCOXON_EXACT_MAX_N = 60  # exact null by counting subsets of ranks up to here (no tied ranks)


def wilcoxon_greater(diffs: Sequence[float]) -> float:
    """One-sided Wilcoxon signed-rank test that the differences lean positive; zeros are dropped.

    Ranks of |d| with ties averaged. Exact (the null's distribution counted over every sign
    pattern) for up to ``WILCOXON_EXACT_MAX_N`` differences without tied ranks; otherwise the
    normal approximation with the tie correction and a continuity correction.
    """
    d = [float(x) for x in diffs if math.isfinite(x) and x != 0]
    n = len(d)
    if n == 0:
        return 1.0
    order = sorted(range(n), key=lambda i: abs(d[i]))
    ranks = [0.0] * n
    ties: list[int] = []
    i = 0
    while i < n:
        j = i
        while j + 1 < n and abs(d[order[j + 1]]) == abs(d[order[i]]):
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        ties.append(j - i + 1)
        i = j + 1
    w = sum(r for r, x in zip(ranks, d, strict=True) if x > 0)
    if n <= WILCOXON_EXACT_MAX_N and all(t == 1 for t in ties):
        top = n * (n + 1) // 2
        counts = [1] + [0] * top  # subsets of {1..n} by their sum
        for r in range(1, n + 1):
            for s in range(top, r - 1, -1):
                counts[s] += counts[s - r]
        need = math.ceil(w - 1e-9)
        return min(1.0, sum(counts[need:]) / 2.0**n)
    mean = n * (n + 1) / 4
    var = n * (n + 1) * (2 * n + 1) / 24 - sum(t**3 - t for t in ties) / 48
    if var <= 0:
        return 1.0
    z = (w - mean - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2))


@dataclass
class BiasStats:
    """Which way cascade moves the chosen token's logprob, prompt by prompt, with a sign test."""

    n: int = 0  # prompts whose signed drift is beyond the floor (the others are ties)
    up: int = 0
    down: int = 0
    mean: float = math.nan  # mean signed drift over all measured prompts
    p: float = math.nan  # exact two-sided sign test
    p_control: float = math.nan  # the same test on the control: a check that the null holds there

    @property
    def measured(self) -> bool:
        return self.n > 0


def sign_test(up: int, down: int) -> float:
    """Exact two-sided sign test: P(a split at least this uneven) for a fair coin."""
    n = up + down
    if n == 0:
        return 1.0
    k = min(up, down)
    tail = sum(math.exp(_log_comb(n, i) - n * math.log(2)) for i in range(k + 1))
    return min(1.0, 2 * tail)


def bias_stats(
    test: Sequence[tuple[float, float]], control: Sequence[tuple[float, float]], floor: float
) -> BiasStats:
    """Sign test of per-prompt signed drifts, each given as ``(signed mean, mean |Δ|)``.

    A prompt whose mean |Δ| is within ``floor`` is a tie, not a sign: nothing on it moved beyond
    the dtype's resolution (fp32 on CPU: ~1e-6, in a consistent direction that is rounding's, not
    a fault's). Its signed mean may be far below the floor and still count: it averages up to
    hundreds of positions.
    """

    def counts(rows: Sequence[tuple[float, float]]) -> tuple[int, int, list[float]]:
        vals = [(sg, ab) for sg, ab in rows if math.isfinite(sg) and math.isfinite(ab)]
        moved = [sg for sg, ab in vals if ab > floor]
        return sum(1 for v in moved if v > 0), sum(1 for v in moved if v < 0), [sg for sg, _ in vals]

    up, down, signed = counts(test)
    if not signed:
        return BiasStats()
    cu, cd, _ = counts(control)
    return BiasStats(
        n=up + down,
        up=up,
        down=down,
        mean=float(np.mean(signed)),
        p=sign_test(up, down),
        p_control=sign_test(cu, cd),
    )


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
    drift: DriftStats | None = None
    bias: BiasStats | None = None
    cascade_decode_steps: int | None = None  # None: the engine did not say
    # A twin other than cascade: its name, and why its setting never took effect (``cascade_steps``
    # then holds the steps it took effect on, judge/effect.py).
    twin: str = ""
    effect_why: str = ""
    # The test arm's engine died of a kernel fault (vllm_surface/faults.py) where its twin finished
    # the same prompts: what the fault was, else ''.
    test_fault: str = ""


@dataclass
class Decision:
    verdict: str
    reasons: str
    p_divergence: float
    p_topk: float
    decided_by: str = ""  # comma list of the evidence that fired: bias, drift, divergence, top-k, repetition
    rule: str = "arm-vs-arm"  # which rule decided: "reference" (reference_verdict.py) or "arm-vs-arm"
    # Every piece of evidence weighed, fired or not (``judge/result.py``), in ``decide``'s order.
    evidence: tuple[EvidencePiece, ...] = ()


def depth(cascade_steps: int, cascade_decode_steps: int | None) -> str:
    """``decode`` when cascade ran on decode steps, ``prefill only``, ``none``; ``?`` when unknown."""
    if cascade_steps <= 0:
        return "none"
    if cascade_decode_steps is None:
        return "?"
    return "decode" if cascade_decode_steps > 0 else PREFILL_ONLY


def _bias_text(b: BiasStats, th: Thresholds) -> str:
    way = "lower" if b.down >= b.up else "higher"
    return (
        f"bias: chosen-token logprob {way} under cascade on {max(b.up, b.down)} of {b.n} prompts "
        f"(mean {b.mean:+.3g}), sign test p={b.p:.3g} vs {th.alpha / 2:g} (control p={b.p_control:.3g})"
    )


def _drift_text(d: DriftStats) -> str:
    return (
        f"drift ratio {d.ratio:.2f} (CI {d.lo:.2f}..{d.hi:.2f}, test {d.test:.3g} vs control {d.control:.3g} "
        f"over {d.n} prompts, higher on {d.up}) vs threshold {d.threshold:.2f}, p={d.p:.3g}"
    )


def decide(ev: Evidence, th: Thresholds, has_noise: bool) -> Decision:
    """Return the verdict of one cascade pair, the evidence line that decided it and its p-values.

    ``has_noise``: a count control (flat vs flat) was measured. Without one, and without a drift
    control, nothing can be judged beyond noise: the pair is ``inconclusive``.
    """
    p_div = fisher_greater(ev.n_diverged, ev.n, ev.noise_n_diverged, ev.noise_n if has_noise else ev.n)
    p_topk = fisher_greater(
        ev.topk_violations, ev.n, ev.noise_topk_violations, ev.noise_n if has_noise else ev.n
    )
    pieces = arm_evidence(ev, th, has_noise, p_div, p_topk)
    dec = _arm_verdict(ev, th, has_noise, p_div, p_topk, {p.name: p.fired for p in pieces})
    dec.evidence = pieces
    return dec


def arm_evidence(
    ev: Evidence, th: Thresholds, has_noise: bool, p_div: float, p_topk: float
) -> tuple[EvidencePiece, ...]:
    """The pair's arm-vs-arm evidence pieces, each fired only where it was measured (a drift or bias
    statistic with no agreeing prompts, a count test with no noise control, never fires)."""
    d, b = ev.drift, ev.bias
    pieces = (
        bias_piece(b.p if b is not None else math.nan, th.alpha),
        drift_piece(d.ratio, d.threshold) if d is not None else drift_piece(math.nan, math.nan),
        divergence_piece(p_div, th.alpha),
        topk_piece(p_topk, ev.topk_violations, th.alpha, th.min_topk_violations),
        repetition_piece(ev.d_rep_lo, th.rep_delta),
    )
    measured = {
        "bias": b is not None and b.measured,
        "drift": d is not None and d.measured,
        "divergence": has_noise,
        "top-k": has_noise,
        "repetition": True,
    }
    return tuple(replace(p, fired=p.fired and measured[p.name]) for p in pieces)


def _arm_verdict(
    ev: Evidence, th: Thresholds, has_noise: bool, p_div: float, p_topk: float, fires: dict[str, bool]
) -> Decision:
    """The arm-vs-arm verdict, given what each piece of evidence says (``fires``, by name)."""
    if ev.test_fault:
        # Only the test arm's engine tripped a kernel fault, on prompts its twin finished: the setting
        # broke the engine, which changes every answer it was to give. Running out of memory is not
        # counted here (engines side by side share the GPU): that stays an error.
        return Decision(
            REGRESSION,
            f"the test arm's engine died of a {faults.KERNEL} ({ev.test_fault}) on prompts its twin finished",
            p_div, p_topk, decided_by=ENGINE_FAULT,
        )  # fmt: skip
    if not ev.status_ok:
        return Decision(ERROR, "a cell of this pair did not finish", p_div, p_topk)
    if ev.cascade_steps == 0 and ev.twin:
        why = f" ({ev.effect_why})" if ev.effect_why else ""
        return Decision(
            NOT_EXERCISED, f"{ev.twin} never took effect in this cell{why}: the comparison proves nothing",
            p_div, p_topk,
        )  # fmt: skip
    if ev.cascade_steps == 0:
        return Decision(
            NOT_EXERCISED, "cascade never fired in this cell: the comparison proves nothing", p_div, p_topk
        )
    shallow = depth(ev.cascade_steps, ev.cascade_decode_steps) == "prefill only"
    note = "; cascade ran on prefill steps only (the field bug lived in decode)" if shallow else ""
    d, b = ev.drift, ev.bias
    drift_ok = d is not None and d.measured
    bias_ok = b is not None and b.measured
    at_floor = d is not None and d.n > 0 and d.test <= d.floor
    bias_fired = fires["bias"]
    if ev.n_diverged == 0 and (at_floor or not drift_ok) and not bias_fired:
        why = f"all {ev.n} outputs token-identical"
        if at_floor:
            why += f", logprob drift {d.test:.3g} at the dtype's resolution ({d.floor:.3g})"
        return Decision(IDENTICAL, why + note, p_div, p_topk)
    if not has_noise and not drift_ok:
        return Decision(
            INCONCLUSIVE,
            f"no noise control measured (planner controls turned off): diverged {ev.n_diverged}/{ev.n}, "
            f"top-k violations {ev.topk_violations}; nothing to judge them against{note}",
            p_div,
            p_topk,
        )
    noise_txt = f"noise {ev.noise_n_diverged}/{ev.noise_n}" if has_noise else "no count control"
    fired: list[tuple[str, str]] = []
    if bias_fired:
        fired.append(("bias", _bias_text(b, th)))
    if fires["drift"]:
        fired.append(("drift", _drift_text(d)))
    if fires["divergence"]:
        fired.append(
            (
                "divergence",
                f"diverged {ev.n_diverged}/{ev.n} vs {noise_txt}, Fisher p={p_div:.3g} < {th.alpha}",
            )
        )
    if fires["top-k"]:
        fired.append(
            (
                "top-k",
                f"{ev.topk_violations} divergences outside top-k vs {ev.noise_topk_violations} in noise, "
                f"Fisher p={p_topk:.3g}",
            )
        )
    if fires["repetition"]:
        fired.append(
            (
                "repetition",
                f"seq-rep-4 up by {ev.d_rep_mean:+.3f} (CI {ev.d_rep_lo:+.3f}..{ev.d_rep_hi:+.3f} > {th.rep_delta})",
            )
        )
    if fired:
        return Decision(
            REGRESSION, "; ".join(t for _, t in fired) + note, p_div, p_topk, ",".join(k for k, _ in fired)
        )
    parts = [_drift_text(d) if drift_ok else "drift not measured (no agreeing positions or no drift control)"]
    if bias_ok:
        parts.append(_bias_text(b, th))
    if has_noise:
        parts.append(f"diverged {ev.n_diverged}/{ev.n} vs {noise_txt} (p={p_div:.3g})")
        parts.append(f"top-k violations {ev.topk_violations} vs {ev.noise_topk_violations} (p={p_topk:.3g})")
    else:
        parts.append(f"diverged {ev.n_diverged}/{ev.n} (no count control)")
    parts.append(f"Δseq-rep-4 {ev.d_rep_mean:+.3f} CI {ev.d_rep_lo:+.3f}..{ev.d_rep_hi:+.3f}")
    return Decision(WITHIN_NOISE, "; ".join(parts) + note, p_div, p_topk)
