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

More reference statistics than the chosen token's may be measured (the top-k distribution error,
``metrics/topk.py``; each declared in ``judge/statistics.py``): each is tested the same way, with its
own minimum effect from the same controls, and the pair is a regression when any of them fires
after a Bonferroni correction over those measured: each at ``alpha / m`` for ``m`` statistics (two:
``alpha / 2`` each). A run whose records carry only the chosen token (an older run) has ``m = 1``
and is judged exactly as before. The family is fixed by the number of prompts alone, never by the
outcome: a test over ``n`` prompts cannot give a p below ``2 * 2**-n`` (sign and Wilcoxon both at
``2**-n``, the better doubled), so where a member could not reach ``alpha / m`` even with every
prompt against it (8 prompts: 0.0078 > 0.005), the further statistics stay out and the chosen
token's is tested alone at ``alpha``, as before (the reasons say so).

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


def paired_errors(test: Sequence[float], twin: Sequence[float], floor: float, th: Thresholds) -> RefStats:
    """Paired statistics of per-prompt errors against the reference (``test[i]`` and ``twin[i]`` are
    one prompt's; a prompt where either is not finite is left out): each raised to ``floor``, the
    ratio of their means with its bootstrap CI, and the one-sided sign and Wilcoxon tests."""
    pairs = [(a, b) for a, b in zip(test, twin, strict=True) if math.isfinite(a) and math.isfinite(b)]
    if not pairs:
        return RefStats(floor=floor)
    t = np.array([max(a, floor) for a, _ in pairs])
    c = np.array([max(b, floor) for _, b in pairs])
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
    )


def reference_stats(
    test: Sequence[ArmError], twin: Sequence[ArmError], floor: float, th: Thresholds
) -> RefStats:
    """Paired statistics of per-prompt chosen-token errors, with the arms' regret and signed error."""
    pairs = [(a, b) for a, b in zip(test, twin, strict=True) if a.measured and b.measured]
    if not pairs:
        return RefStats(floor=floor)
    stats = paired_errors([a.mean_abs for a, _ in pairs], [b.mean_abs for _, b in pairs], floor, th)
    stats.regret_test = float(np.mean([a.regret for a, _ in pairs]))
    stats.regret_twin = float(np.mean([b.regret for _, b in pairs]))
    stats.signed_test = float(np.mean([a.mean_signed for a, _ in pairs]))
    stats.signed_twin = float(np.mean([b.mean_signed for _, b in pairs]))
    return stats


@dataclass(frozen=True)
class RefMeasure:
    """One more reference statistic of a pair, beside the chosen token's: its evidence name, its
    words, its paired statistics and its minimum effect from the same controls (and their pair id)."""

    name: str
    label: str
    stats: RefStats
    min_effect: float
    min_effect_pair: str


def level(alpha: float, measured: int) -> float:
    """Each reference statistic's level: Bonferroni over the ``measured`` ones (at least one)."""
    return alpha / max(1, measured)


def attainable(n: int) -> float:
    """The smallest p the decision's test can give over ``n`` prompts: every prompt leaning one way
    (sign test and exact Wilcoxon both ``2**-n``), the better of the two doubled."""
    return min(1.0, 2 * 0.5 ** max(0, n))


def family(alpha: float, ns: Sequence[int]) -> int:
    """How many of the measured reference statistics (their prompt counts ``ns``, the chosen token's
    first) are tested together: all of them when each could reach ``alpha / len(ns)``, else the chosen
    token's alone (a family that could never fire would silence the rule)."""
    m = len(ns)
    return m if m > 1 and all(attainable(n) <= alpha / m for n in ns) else min(m, 1)


def min_effect(controls: Sequence[tuple[str, RefStats]]) -> tuple[float, str]:
    """The largest control ratio either way round, and its pair id; (1.0, "") without a control."""
    measured = [(s.symmetric_ratio, pid) for pid, s in controls if s.measured]
    return max(measured, default=(1.0, ""))


def _ref_text(
    r: RefStats, reference: str, floor_of: float, floor_id: str, at: float, what: str = "error"
) -> str:
    control = (
        f"the largest flat-vs-flat ratio of this run, {floor_id}"
        if floor_id
        else "no flat-vs-flat control measured: the tests alone decide"
    )
    return (
        f"vs {reference} reference: test {what} {r.ratio:.3g}x its twin's (CI {r.lo:.3g}..{r.hi:.3g}; "
        f"{r.test:.3g} vs {r.twin:.3g} nats/token over {r.n} prompts, larger on {r.up}, smaller on "
        f"{r.down}; sign p={r.p_sign:.2g}, Wilcoxon p={r.p_wilcoxon:.2g}, p={r.p:.2g} vs {at:g}); "
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
    also: Sequence[RefMeasure] = (),
) -> Decision:
    """The pair's verdict: the reference decides where it was measured, else the arm-vs-arm ``arms``.

    ``arms`` is the arm-vs-arm decision (``verdicts.decide``), whose ``error``/``not exercised``
    stand as they are: a cell that did not finish, or a setting that never took effect, proves
    nothing either way. ``noise_text``: the divergence counts against their control, for the words
    when the two rules disagree. ``also``: the pair's other reference statistics; those measured
    share alpha with the chosen token's (Bonferroni, :func:`level`), and any that fires flags the pair.
    """
    if arms.verdict not in (IDENTICAL, WITHIN_NOISE, REGRESSION, INCONCLUSIVE) or r is None or not r.measured:
        arms.rule = RULE_ARMS
        return arms
    measured = [m for m in also if m.stats.measured]
    extra = measured if family(th.alpha, [r.n, *(m.stats.n for m in measured)]) > 1 else []
    at = level(th.alpha, 1 + len(extra))
    pieces = (
        reference_piece(r.ratio, floor_of, r.p, at),
        *(reference_piece(m.stats.ratio, m.min_effect, m.stats.p, at, name=m.name) for m in extra),
    )
    text = "; ".join(
        [
            _ref_text(r, reference, floor_of, floor_id, at),
            *(_ref_text(m.stats, reference, m.min_effect, m.min_effect_pair, at, m.label) for m in extra),
        ]
    )
    if extra:
        text += (
            f" (Bonferroni over the {1 + len(extra)} reference statistics: each at alpha/{1 + len(extra)})"
        )
    elif measured:
        text += (
            f" ({', '.join(m.label for m in measured)} not tested: over {r.n} prompts no test could reach "
            f"alpha/{1 + len(measured)}, so the chosen token's is tested alone at alpha)"
        )
    fired = [p.name for p in pieces if p.fired]
    if n_diverged == 0 and r.up == 0 and r.down == 0:
        verdict, why = (
            IDENTICAL,
            f"all {r.n} outputs token-identical and equally far from the reference; {text}",
        )
    elif fired:
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
        ",".join(fired) if verdict == REGRESSION else "",
        rule=RULE_REFERENCE,
        evidence=(*arms.evidence, *pieces),
    )
