"""Power without a ladder: what error ratio a run could have flagged, from its own per-prompt spread.

The reference verdict (``reference_verdict.py``) flags a pair when the smaller of a one-sided sign
test and a one-sided Wilcoxon signed-rank test over prompts, doubled (Bonferroni over the
``TESTS`` p-values), is below ``alpha``, *and* the ratio of mean errors exceeds the minimum effect
(the largest flat-vs-flat control ratio). ``--calibrate`` measures what that rule flags by
injecting faults; this module estimates it without one, by a normal approximation:

- Per prompt, the log of the test arm's error over its twin's (both raised to the dtype floor, as
  the verdict does) is taken as normal with spread ``s``. ``s`` is robust (1.4826 x the median
  absolute deviation), since the sign and Wilcoxon tests are: one prompt whose answer went another
  way does not blind them, and must not blind the estimate either. It is the larger of the pair's
  own and that of the flat-vs-flat control the minimum effect came from (``estimate``).
- A fault that multiplies the test arm's error by ``R`` shifts that mean by ``log R``. The tests are
  stood in for by a one-sided z-test at ``alpha / TESTS`` on the mean, with the Wilcoxon test's
  efficiency against it under normal spread (3/pi): ``log R = (z_alpha + z_power) s / sqrt(n 3/pi)``.
- The minimum effect is the controls' noise: it shrinks with the prompts as ``1/sqrt(n)``, and the
  observed ratio must clear it with the same power: ``log R = log m sqrt(n0/n) + z_power s / sqrt(n)``.
- Exact tests over ``n`` prompts cannot go below ``2^-n``: under ``min_prompts(alpha)`` prompts no
  ratio is flagged, whatever its size.

Both bars fall as ``1/sqrt(n)``, so the prompts needed for a ratio ``R`` are the larger bar's
``(c / log R)^2``. An approximation, stated as one wherever it is shown; the ladder stays the
ground truth (``agreement`` compares the two).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

POWER = 0.8  # the power every estimate is stated at
TARGETS = (1.05, 1.02)  # the ratios whose prompt counts are stated
TESTS = 2  # the verdict's Bonferroni: the smaller of the sign and Wilcoxon p-values, doubled (RefStats.p)
WILCOXON_ARE = 3 / math.pi  # Wilcoxon's asymptotic efficiency against the z-test under normal spread
MAD_TO_SD = 1.4826  # a normal's standard deviation over its median absolute deviation
APPROXIMATION = (
    "normal approximation on the per-prompt log error ratio (robust spread, 1.4826 x MAD, the larger of "
    "the pair's and its minimum-effect control's), the "
    f"verdict's tests as a one-sided z-test at alpha/{TESTS} with the Wilcoxon test's efficiency 3/pi, "
    "the minimum effect taken as noise that shrinks as 1/sqrt(prompts)"
)


def log_ratios(test: Sequence[float], twin: Sequence[float], floor: float) -> np.ndarray:
    """Per prompt, log(test error / twin error), both raised to ``floor`` first (as the verdict
    does); prompts where either side is missing (NaN) are left out."""
    t = np.asarray(test, dtype=float)
    c = np.asarray(twin, dtype=float)
    keep = np.isfinite(t) & np.isfinite(c)
    lo = max(float(floor), np.finfo(float).tiny) if math.isfinite(floor) else np.finfo(float).tiny
    return np.log(np.maximum(t[keep], lo) / np.maximum(c[keep], lo))


def spread(values: Sequence[float] | np.ndarray) -> float:
    """The robust spread of per-prompt log ratios: 1.4826 x their median absolute deviation; their
    standard deviation where more than half are equal (MAD 0); NaN under two values."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 2:
        return math.nan
    mad = float(np.median(np.abs(x - np.median(x))))
    return MAD_TO_SD * mad if mad > 0 else float(np.std(x, ddof=1))


def min_prompts(alpha: float, tests: int = TESTS) -> int:
    """The fewest prompts whose exact tests can reach ``alpha`` at all: every prompt the same way
    gives p = 2^-n, doubled by the Bonferroni."""
    return max(1, math.floor(math.log2(tests / alpha)) + 1)


def _bar(s: float, alpha: float, min_effect: float, n_control: int, power: float, tests: int) -> float:
    """``c`` in log R = c / sqrt(n): the larger of what the tests need and what the minimum effect
    needs at ``n`` prompts."""
    z = NormalDist()
    z_a, z_b = z.inv_cdf(1 - alpha / tests), z.inv_cdf(power)
    m = max(float(min_effect), 1.0) if math.isfinite(min_effect) else 1.0
    test_bar = (z_a + z_b) * s / math.sqrt(WILCOXON_ARE)
    effect_bar = math.log(m) * math.sqrt(n_control) + z_b * s
    return max(test_bar, effect_bar)


def detectable_ratio(
    s: float,
    n: int,
    alpha: float,
    min_effect: float = 1.0,
    *,
    power: float = POWER,
    tests: int = TESTS,
) -> float:
    """The smallest error ratio flagged with ``power`` at ``n`` prompts (the minimum effect measured
    at those same prompts); inf under ``min_prompts``, NaN for an unknown spread."""
    if not math.isfinite(s) or s < 0 or n <= 0:
        return math.nan
    if n < min_prompts(alpha, tests):
        return math.inf
    return math.exp(_bar(s, alpha, min_effect, n, power, tests) / math.sqrt(n))


def prompts_needed(
    ratio: float,
    s: float,
    n: int,
    alpha: float,
    min_effect: float = 1.0,
    *,
    power: float = POWER,
    tests: int = TESTS,
) -> int | None:
    """Prompts needed to flag an error ratio ``ratio`` with ``power``, given the spread ``s`` and the
    minimum effect measured at ``n`` prompts; None where no count will (a ratio at or below 1, an
    unknown spread)."""
    if not (math.isfinite(s) and s >= 0 and ratio > 1 and n > 0):
        return None
    c = _bar(s, alpha, min_effect, n, power, tests)
    return max(min_prompts(alpha, tests), math.ceil((c / math.log(ratio)) ** 2))


@dataclass(frozen=True)
class PowerEstimate:
    """One pair's power without a ladder."""

    n: int  # prompts with an error on both sides
    spread: float  # robust spread of the per-prompt log error ratio
    alpha: float
    min_effect: float  # the run's minimum effect for this pair (1 without a control)
    smallest: float  # the smallest ratio flagged with POWER at n prompts (inf: too few prompts)
    needed: dict[float, int | None] = field(default_factory=dict)  # TARGETS -> prompts
    power: float = POWER

    @property
    def measured(self) -> bool:
        return self.n > 0 and math.isfinite(self.spread)


def estimate(
    test: Sequence[float],
    twin: Sequence[float],
    floor: float,
    alpha: float,
    min_effect: float = 1.0,
    targets: Sequence[float] = TARGETS,
    control_spread: float = math.nan,
) -> PowerEstimate:
    """A pair's power from its per-prompt errors against the reference (``test[i]``, ``twin[i]``: one
    prompt's, as comparisons.parquet holds them).

    ``control_spread``: the spread of the flat-vs-flat control the minimum effect came from. The
    larger of the two is used: a pair whose outputs barely moved (token-identical on most prompts:
    spread near 0) would otherwise claim to see any ratio, while a recomputation that moves its tokens
    as the control's did spreads its errors as widely."""
    lr = log_ratios(test, twin, floor)
    n, s = int(lr.size), spread(lr)
    if math.isfinite(control_spread) and (not math.isfinite(s) or control_spread > s):
        s = control_spread if n else s
    m = min_effect if math.isfinite(min_effect) else 1.0
    return PowerEstimate(
        n=n,
        spread=s,
        alpha=alpha,
        min_effect=m,
        smallest=detectable_ratio(s, n, alpha, m),
        needed={t: prompts_needed(t, s, n, alpha, m) for t in targets},
    )


@dataclass(frozen=True)
class Agreement:
    """The estimate against a calibration ladder: whether the ladder's boundary (the error ratio of
    its largest missed rung and of its smallest flagged one) lies where the estimate puts it."""

    agree: bool
    flagged_ratio: float | None  # error ratio of the smallest flagged rung (None: none flagged)
    missed_ratio: float | None  # error ratio of the largest unflagged rung below it (None: none)
    low: float  # the ratio flagged with 1 - POWER at the ladder's prompts
    high: float  # ... with POWER (the estimate)
    why: str


def agreement(rungs: Sequence[tuple[float, bool]], est: PowerEstimate) -> Agreement | None:
    """Compare a ladder's judged rungs (measured error ratio, flagged?) with the estimate.

    One ladder is one draw: a rung just above the estimate may miss, one just below may be flagged.
    So they agree when the ladder's boundary overlaps the band from the ratio flagged with 20 %
    power to the one flagged with 80 %: the smallest flagged rung is not below the 20 % ratio, and
    no rung above the 80 % ratio was missed. None without a measured rung or estimate.
    """
    rungs = sorted((r, f) for r, f in rungs if r is not None and math.isfinite(r))
    if not rungs or not est.measured or not math.isfinite(est.smallest):
        return None
    low = detectable_ratio(est.spread, est.n, est.alpha, est.min_effect, power=1 - est.power)
    high = est.smallest
    flagged = next((r for r, f in rungs if f), None)
    missed = max((r for r, f in rungs if not f and (flagged is None or r < flagged)), default=None)
    missed_above = [r for r, f in rungs if not f and r > high]
    if flagged is not None and flagged < low:
        return Agreement(False, flagged, missed, low, high,
                         f"the ladder flagged {flagged:.3g}x, below the {low:.3g}x the estimate flags 20 % of the time: "
                         "the estimate is conservative")  # fmt: skip
    if missed_above:
        worst = max(missed_above)
        return Agreement(False, flagged, missed, low, high,
                         f"the ladder missed {worst:.3g}x, above the {high:.3g}x the estimate flags 80 % of the time: "
                         "the estimate is optimistic")  # fmt: skip
    seen = f"smallest flagged rung {flagged:.3g}x" if flagged is not None else "no rung flagged"
    below = f", largest missed {missed:.3g}x" if missed is not None else ""
    return Agreement(True, flagged, missed, low, high,
                     f"{seen}{below}; the estimate flags {low:.3g}x 20 % and {high:.3g}x 80 % of the time")  # fmt: skip
