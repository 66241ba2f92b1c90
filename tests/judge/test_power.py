"""Power without a ladder (judge/power.py): the analytic cases, monotonicity, and a check of the
normal approximation against the verdict's own tests on simulated prompts."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from cascade_repro.judge import power as pw
from cascade_repro.judge.verdicts import sign_test_greater, wilcoxon_greater


def test_min_prompts_is_where_the_exact_tests_can_reach_alpha() -> None:
    # Every prompt the same way: p = 2 * 2^-n (Bonferroni over two tests), flagged when below alpha.
    assert pw.min_prompts(0.01) == 8  # 2 * 2^-8 = 0.0078 < 0.01 <= 2 * 2^-7
    assert pw.min_prompts(0.25) == 4  # 2 * 2^-3 = 0.25 is not below 0.25
    assert pw.min_prompts(0.01, tests=1) == 7


def test_detectable_ratio_matches_the_closed_form() -> None:
    s, n, alpha = 0.1, 100, 0.01
    z = NormalDist()
    expected = math.exp((z.inv_cdf(1 - alpha / 2) + z.inv_cdf(0.8)) * s / math.sqrt(n * 3 / math.pi))
    assert pw.detectable_ratio(s, n, alpha) == pytest.approx(expected)
    assert pw.detectable_ratio(s, n, alpha) == pytest.approx(1.0356, abs=1e-4)


def test_no_spread_flags_any_ratio_above_the_minimum_effect_once_enough_prompts() -> None:
    assert pw.detectable_ratio(0.0, 64, 0.01) == 1.0
    assert pw.detectable_ratio(0.0, 64, 0.01, min_effect=1.04) == pytest.approx(1.04)
    assert pw.detectable_ratio(0.0, 7, 0.01) == math.inf  # under min_prompts nothing is flagged
    assert pw.prompts_needed(1.05, 0.0, 64, 0.01) == 8


def test_monotone_in_prompts_and_in_spread() -> None:
    ns = [8, 16, 64, 256, 1024]
    by_n = [pw.detectable_ratio(0.2, n, 0.01, 1.03) for n in ns]
    assert by_n == sorted(by_n, reverse=True) and len(set(by_n)) == len(by_n)
    by_s = [pw.detectable_ratio(s, 64, 0.01, 1.03) for s in (0.0, 0.05, 0.1, 0.3)]
    assert by_s == sorted(by_s) and len(set(by_s)) == len(by_s)
    need = [pw.prompts_needed(1.05, s, 64, 0.01) for s in (0.05, 0.1, 0.3)]
    assert need == sorted(need)
    assert pw.prompts_needed(1.02, 0.2, 64, 0.01) > pw.prompts_needed(1.05, 0.2, 64, 0.01)


def test_prompts_needed_inverts_detectable_ratio() -> None:
    # Without a minimum effect both bars are c / sqrt(n): at the count needed for R, R is detectable.
    s, alpha = 0.15, 0.01
    n = pw.prompts_needed(1.05, s, 64, alpha)
    assert pw.detectable_ratio(s, n, alpha) <= 1.05 < pw.detectable_ratio(s, n - 1, alpha)


def test_the_minimum_effect_binds_where_it_is_above_the_tests_bar() -> None:
    s, n = 0.05, 64
    free = pw.detectable_ratio(s, n, 0.01)
    bound = pw.detectable_ratio(s, n, 0.01, min_effect=1.10)
    assert free < 1.10 < bound  # the ratio must clear the minimum effect with the same power
    assert bound == pytest.approx(math.exp(math.log(1.10) + NormalDist().inv_cdf(0.8) * s / 8))
    assert pw.prompts_needed(1.0, s, n, 0.01) is None  # no count flags a ratio of 1


def test_spread_is_robust_to_one_prompt_gone_another_way() -> None:
    x = np.array([-0.1, -0.05, 0.0, 0.05, 0.1] * 10)
    assert pw.spread(x) == pytest.approx(pw.spread(np.append(x, 25.0)), rel=0.1)
    assert pw.spread(np.array([0.0, 0.0, 0.0, 0.3])) == pytest.approx(np.std([0, 0, 0, 0.3], ddof=1))
    assert math.isnan(pw.spread([0.5]))


def test_log_ratios_floor_both_sides_and_drop_missing() -> None:
    lr = pw.log_ratios([2e-3, 1e-9, float("nan")], [1e-3, 1e-9, 1e-3], floor=1e-6)
    assert lr.tolist() == pytest.approx([math.log(2), 0.0])


def test_estimate_of_a_pair() -> None:
    rng = np.random.default_rng(1)
    twin = np.exp(rng.normal(-4, 0.5, 64))
    test = twin * np.exp(rng.normal(0, 0.2, 64))
    est = pw.estimate(test, twin, floor=1e-6, alpha=0.01, min_effect=1.03)
    assert est.n == 64 and est.spread == pytest.approx(pw.spread(np.log(test / twin)))
    assert est.smallest == pw.detectable_ratio(est.spread, 64, 0.01, 1.03)
    assert est.needed[1.02] > est.needed[1.05] > 0
    identical = pw.estimate(twin, twin, floor=1e-6, alpha=0.01)
    assert identical.spread == 0.0 and identical.smallest == 1.0


def test_the_approximation_holds_against_the_verdicts_own_tests() -> None:
    # Simulated prompts at the estimated ratio: the verdict's sign/Wilcoxon rule (Bonferroni) flags
    # them about 80 % of the time. Seeded: the same draws every run.
    rng = np.random.default_rng(0)
    n, s, alpha = 64, 0.2, 0.01
    r = pw.detectable_ratio(s, n, alpha)
    hits = 0
    for _ in range(200):
        c = np.exp(rng.normal(-4, 0.5, n))
        d = c * np.exp(rng.normal(math.log(r), s, n)) - c
        p = 2 * min(sign_test_greater(int((d > 0).sum()), int((d < 0).sum())), wilcoxon_greater(d.tolist()))
        hits += p < alpha
    assert 0.65 <= hits / 200 <= 0.95


def _est(s: float = 0.2, n: int = 64, m: float = 1.0) -> pw.PowerEstimate:
    return pw.PowerEstimate(n, s, 0.01, m, pw.detectable_ratio(s, n, 0.01, m))


def test_agreement_with_a_ladder() -> None:
    est = _est()
    low = pw.detectable_ratio(0.2, 64, 0.01, power=0.2)
    assert low < est.smallest
    # The boundary between a missed and a flagged rung inside the band: agree.
    ok = pw.agreement([(1.01, False), (est.smallest * 1.01, True), (3.0, True)], est)
    assert ok is not None and ok.agree and ok.flagged_ratio == pytest.approx(est.smallest * 1.01)
    assert ok.missed_ratio == 1.01
    # A rung flagged well below what the estimate sees 20 % of the time: conservative estimate.
    low_hit = pw.agreement([(1.001, True)], est)
    assert low_hit is not None and not low_hit.agree and "conservative" in low_hit.why
    # A rung missed above the 80 % ratio: optimistic estimate.
    missed = pw.agreement([(est.smallest * 1.5, False), (5.0, True)], est)
    assert missed is not None and not missed.agree and "optimistic" in missed.why
    assert pw.agreement([], est) is None


def test_the_controls_spread_stands_in_where_the_pairs_is_smaller() -> None:
    twin = np.exp(np.linspace(-5, -3, 32))
    identical = pw.estimate(twin, twin, floor=1e-6, alpha=0.01, min_effect=1.04, control_spread=0.2)
    assert identical.spread == 0.2  # token-identical outputs do not claim to see any ratio
    assert identical.smallest == pw.detectable_ratio(0.2, 32, 0.01, 1.04)
    noisy = twin * np.exp(np.tile([-0.5, 0.5], 16))
    own = pw.spread(np.log(noisy / twin))
    assert pw.estimate(noisy, twin, floor=1e-6, alpha=0.01, control_spread=0.2).spread == own > 0.2
