"""The verdict where the reference ran: is the test arm further from the truth than its twin?

Each prompt gives two numbers, the test arm's and its twin's mean error against the reference
(``metrics/reference.py``), each over all the tokens that arm generated. A pair is a
``regression`` when, over prompts,

1. the test arm's error is larger than its twin's beyond chance: the smaller of an exact one-sided
   sign test and a one-sided Wilcoxon signed-rank test, doubled (Bonferroni), is below ``alpha``;
2. and the ratio of their mean errors exceeds the *minimum effect*: the largest ratio (either way
   round) that this run's own flat-vs-flat controls of the same configuration show. No empirical
   constant: an equivalent recomputation in this very run is the null. Without such a control the
   minimum effect is 1 (the test alone decides), and the reasons say so.

Errors at or below the arms' dtype resolution (``drift.drift_floor``) are raised to it first, so
two arms both within rounding of the reference tie instead of one being "infinitely" worse.

The arm-vs-arm evidence (divergence counts, top-k violations, drift, bias, repetition) stays in
the reasons; where it disagrees with the reference, the reasons say so in words.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cascade_repro.judge.metrics.reference import ArmError
from cascade_repro.judge.verdicts import (
    ARM_VS_ARM,
    IDENTICAL,
    INCONCLUSIVE,
    REFERENCE,
    REGRESSION,
    WITHIN_NOISE,
    Decision,
    Thresholds,
    drift_ratio_stats,
    reference_piece,
    sign_test_greater,
    wilcoxon_greater,
)

RULE_REFERENCE, RULE_ARMS = REFERENCE, ARM_VS_ARM


@dataclass
class RefStats:
    """One pair's error ratio against the reference, with its tests."""

    n: int = 0  # prompts with a reference error on both sides
    test: float = math.nan  # mean per-prompt error of the test arm
    twin: float = math.nan
    floor: float = math.nan
    ratio: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    up: int = 0  # prompts where the test arm's error is the larger (ties are neither)
    down: int = 0
    p_sign: float = math.nan
    p_wilcoxon: float = math.nan
    regret_test: float = math.nan  # mean per-prompt regret (reference logprob given away)
    regret_twin: float = math.nan
    signed_test: float = math.nan
    signed_twin: float = math.nan

    @property
    def measured(self) -> bool:
        return self.n > 0 and math.isfinite(self.ratio)

    @property
    def p(self) -> float:
        """The decision's p-value: the better of the two tests, Bonferroni-corrected."""
        if not (math.isfinite(self.p_sign) and math.isfinite(self.p_wilcoxon)):
            return math.nan
        return min(1.0, 2 * min(self.p_sign, self.p_wilcoxon))

    @property
    def symmetric_ratio(self) -> float:
        """The ratio either way round (a control's sides are interchangeable)."""
        return max(self.ratio, 1 / self.ratio) if self.measured and self.ratio > 0 else math.nan


def reference_stats(
    test: Sequence[ArmError], twin: Sequence[ArmError], floor: float, th: Thresholds
) -> RefStats:
    """Paired statistics of per-prompt errors (``test[i]`` and ``twin[i]`` are one prompt's)."""
    pairs = [(a, b) for a, b in zip(test, twin, strict=True) if a.measured and b.measured]
    if not pairs:
        return RefStats(floor=floor)
    t = np.array([max(a.mean_abs, floor) for a, _ in pairs])
    c = np.array([max(b.mean_abs, floor) for _, b in pairs])
    ratio = drift_ratio_stats(t, c, floor, th)  # floored ratio of means with its bootstrap CI
    d = t - c
    up, down = int((d > 0).sum()), int((d < 0).sum())
    return RefStats(
        n=len(pairs),
        test=float(t.mean()),
        twin=float(c.mean()),
        floor=floor,
        ratio=ratio.ratio,
        lo=ratio.lo,
        hi=ratio.hi,
        up=up,
        down=down,
        p_sign=sign_test_greater(up, down),
        p_wilcoxon=wilcoxon_greater(d.tolist()),
        regret_test=float(np.mean([a.regret for a, _ in pairs])),
        regret_twin=float(np.mean([b.regret for _, b in pairs])),
        signed_test=float(np.mean([a.mean_signed for a, _ in pairs])),
        signed_twin=float(np.mean([b.mean_signed for _, b in pairs])),
    )


def min_effect(controls: Sequence[tuple[str, RefStats]]) -> tuple[float, str]:
    """The largest control ratio either way round, and its pair id; (1.0, "") without a control."""
    measured = [(s.symmetric_ratio, pid) for pid, s in controls if s.measured]
    return max(measured, default=(1.0, ""))


def _ref_text(r: RefStats, reference: str, floor_of: float, floor_id: str, th: Thresholds) -> str:
    control = (
        f"the largest flat-vs-flat ratio of this run, {floor_id}"
        if floor_id
        else "no flat-vs-flat control measured: the tests alone decide"
    )
    return (
        f"vs {reference} reference: test error {r.ratio:.3g}x its twin's (CI {r.lo:.3g}..{r.hi:.3g}; "
        f"{r.test:.3g} vs {r.twin:.3g} nats/token over {r.n} prompts, larger on {r.up}, smaller on "
        f"{r.down}; sign p={r.p_sign:.2g}, Wilcoxon p={r.p_wilcoxon:.2g}, p={r.p:.2g} vs {th.alpha:g}); "
        f"minimum effect {floor_of:.3g} ({control})"
    )


def decide(
    arms: Decision,
    r: RefStats | None,
    floor_of: float,
    floor_id: str,
    th: Thresholds,
    reference: str,
    *,
    n_diverged: int,
    noise_text: str,
) -> Decision:
    """The pair's verdict: the reference decides where it was measured, else the arm-vs-arm ``arms``.

    ``arms`` is the arm-vs-arm decision (``verdicts.decide``), whose ``error``/``not exercised``
    stand as they are: a cell that did not finish, or a setting that never took effect, proves
    nothing either way. ``noise_text``: the divergence counts against their control, for the words
    when the two rules disagree.
    """
    if arms.verdict not in (IDENTICAL, WITHIN_NOISE, REGRESSION, INCONCLUSIVE) or r is None or not r.measured:
        arms.rule = RULE_ARMS
        return arms
    text = _ref_text(r, reference, floor_of, floor_id, th)
    if n_diverged == 0 and r.up == 0 and r.down == 0:
        verdict, why = (
            IDENTICAL,
            f"all {r.n} outputs token-identical and equally far from the reference; {text}",
        )
    elif reference_piece(r.ratio, floor_of, r.p, th.alpha).fired:
        verdict, why = REGRESSION, text
        if arms.verdict != REGRESSION:
            why += (
                f"; the arm-vs-arm statistics saw nothing ({noise_text}): they stop at the first "
                "divergence, the reference reads every token"
            )
    else:
        verdict, why = WITHIN_NOISE, text
        if arms.verdict == REGRESSION:
            flagged = f" on {arms.decided_by.replace(',', ', ')}" if arms.decided_by else ""
            why += (
                f"; the arm-vs-arm rule flags it{flagged} ({noise_text}), yet the test arm's tokens are as "
                f"close to the reference as its twin's ({r.ratio:.2f}x): a different summation order, not a "
                "wrong result"
            )
    supporting = f"; arm-vs-arm: {arms.reasons}" if arms.reasons else ""
    return Decision(
        verdict,
        why + supporting,
        arms.p_divergence,
        arms.p_topk,
        RULE_REFERENCE if verdict == REGRESSION else "",
        rule=RULE_REFERENCE,
        evidence=(*arms.evidence, reference_piece(r.ratio, floor_of, r.p, th.alpha)),
    )
