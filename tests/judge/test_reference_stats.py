"""The statistics against the reference: per-arm errors, the paired tests, the ratio and the verdict rule."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cascade_repro.judge import reference_verdict as refv
from cascade_repro.judge.metrics.reference import ArmError, arm_error, by_step_mean
from cascade_repro.judge.verdicts import (
    INCONCLUSIVE,
    NOT_EXERCISED,
    REGRESSION,
    WITHIN_NOISE,
    Decision,
    Thresholds,
    sign_test,
    sign_test_greater,
    wilcoxon_greater,
)

TH = Thresholds(bootstrap=200)
floats = st.floats(min_value=-20, max_value=0, allow_nan=False)


def test_arm_error_values():
    e = arm_error([-1.0, -2.0, -0.5], [-1.1, -2.0, -0.3], [-0.1, -2.0, -0.3])
    assert e.n == 3
    assert e.mean_abs == pytest.approx((0.1 + 0.0 + 0.2) / 3)
    assert e.mean_signed == pytest.approx((0.1 + 0.0 - 0.2) / 3)
    assert e.regret == pytest.approx(1.0)  # only the first choice was not the reference's argmax
    assert e.by_step == pytest.approx((0.1, 0.0, 0.2))


def test_arm_error_skips_missing_and_empty():
    e = arm_error([-1.0, math.nan], [-1.5, -1.0], [-0.5, -1.0])
    assert e.n == 1 and e.mean_abs == pytest.approx(0.5)
    assert math.isnan(e.by_step[1])
    assert arm_error([], [-1.0], [-1.0]) == ArmError()
    assert not ArmError().measured


@given(st.lists(floats, min_size=1, max_size=40))
def test_arm_error_is_zero_on_identical_inputs(lps):
    e = arm_error(lps, lps, lps)
    assert e.mean_abs == 0 and e.mean_signed == 0 and e.regret == 0


@given(st.lists(st.tuples(floats, floats), min_size=1, max_size=40), st.floats(min_value=0.1, max_value=10))
def test_arm_error_scales_with_the_difference(pairs, k):
    ref = [r for _, r in pairs]
    arm = [a for a, _ in pairs]
    scaled = [r + k * (a - r) for a, r in pairs]
    e1, ek = arm_error(arm, ref, ref), arm_error(scaled, ref, ref)
    assert ek.mean_abs == pytest.approx(k * e1.mean_abs, rel=1e-6, abs=1e-9)


def test_by_step_mean_over_prompts_that_reached_the_step():
    assert by_step_mean([[1.0, 3.0], [3.0]]) == [2.0, 3.0]
    assert by_step_mean([]) == []


def test_sign_tests():
    assert sign_test_greater(5, 0) == pytest.approx(1 / 32)
    assert sign_test_greater(0, 5) == 1.0
    assert sign_test_greater(0, 0) == 1.0
    # one-sided at the observed side is half the two-sided test (when that is below 1)
    assert sign_test_greater(9, 1) == pytest.approx(sign_test(9, 1) / 2)


def test_wilcoxon_exact_values():
    assert wilcoxon_greater([1, 2, 3, 4, 5]) == pytest.approx(1 / 32)
    assert wilcoxon_greater([-1, 2, 3, 4, 5]) == pytest.approx(2 / 32)  # W+=14: {all but 1}, {all}
    assert wilcoxon_greater([]) == 1.0
    assert wilcoxon_greater([0.0, 0.0]) == 1.0


@given(st.lists(st.floats(min_value=-5, max_value=5, allow_nan=False).filter(lambda x: x != 0), min_size=1,
                max_size=70))  # fmt: skip
def test_wilcoxon_is_a_valid_one_sided_test(d):
    p_up, p_down = wilcoxon_greater(d), wilcoxon_greater([-x for x in d])
    assert 0 <= p_up <= 1 and 0 <= p_down <= 1
    assert p_up + p_down >= 1 - 1e-9  # the two tails overlap at the observed value
    assert wilcoxon_greater([3 * x for x in d]) == pytest.approx(p_up)  # ranks only


def _errs(values):
    return [ArmError(10, v, -v, 0.0, (v,)) for v in values]


def test_reference_stats_identical_inputs_give_ratio_one_and_no_evidence():
    s = refv.reference_stats(_errs([0.1, 0.2, 0.3]), _errs([0.1, 0.2, 0.3]), 1e-4, TH)
    assert s.ratio == pytest.approx(1.0)
    assert (s.up, s.down) == (0, 0)
    assert s.p_sign == 1.0 and s.p_wilcoxon == 1.0 and s.p == 1.0


@given(st.lists(st.floats(min_value=0.01, max_value=1), min_size=2, max_size=30), st.floats(1.5, 5))
def test_reference_stats_scale(twin, k):
    s = refv.reference_stats(_errs([k * v for v in twin]), _errs(twin), 1e-4, TH)
    assert s.ratio == pytest.approx(k, rel=1e-6)
    assert s.up == len(twin) and s.down == 0
    assert s.lo <= s.ratio * (1 + 1e-12) and s.ratio <= s.hi * (1 + 1e-12)  # equal up to rounding


def test_reference_stats_floors_errors_at_the_dtype_resolution():
    # fp32 arms against fp64: 1e-6 vs 1e-7 is rounding either way, not a 10x worse arm.
    s = refv.reference_stats(_errs([1e-6] * 5), _errs([1e-7] * 5), 1e-4, TH)
    assert s.ratio == 1.0 and (s.up, s.down) == (0, 0)


def test_min_effect_takes_the_worst_control_either_way_round():
    a = refv.RefStats(n=5, ratio=0.9)
    b = refv.RefStats(n=5, ratio=1.05)
    assert refv.min_effect([("a", a), ("b", b)]) == (pytest.approx(1 / 0.9), "a")
    assert refv.min_effect([]) == (1.0, "")


def _arms(verdict: str, reasons: str = "arms") -> Decision:
    return Decision(verdict, reasons, 1.0, 1.0)


def _stats(test, twin):
    return refv.reference_stats(_errs(test), _errs(twin), 1e-4, TH)


def test_reference_decides_regression_and_says_the_arms_missed_it():
    s = _stats([0.2] * 12, [0.1] * 12)
    d = refv.decide(_arms(WITHIN_NOISE), s, 1.05, "c~b1", TH, "float32", n_diverged=3, noise_text="diverged 3/12")
    assert d.verdict == REGRESSION and d.rule == refv.RULE_REFERENCE and d.decided_by == "reference"
    assert d.reasons.startswith("vs float32 reference: test error 2x")
    assert "the arm-vs-arm statistics saw nothing" in d.reasons


def test_reference_clears_a_divergence_only_alarm_in_words():
    s = _stats([0.1, 0.11, 0.09, 0.1] * 3, [0.1, 0.1, 0.1, 0.1] * 3)
    d = refv.decide(_arms(REGRESSION), s, 1.05, "c~b1", TH, "float32", n_diverged=22, noise_text="diverged 22/64 vs 3/64 in the control")
    assert d.verdict == WITHIN_NOISE
    assert "yet the test arm's tokens are as close to the reference as its twin's" in d.reasons
    assert "a different summation order, not a wrong result" in d.reasons


def test_reference_needs_the_minimum_effect_too():
    s = _stats([0.11] * 20, [0.1] * 20)  # significant, ratio 1.1
    assert refv.decide(_arms(WITHIN_NOISE), s, 1.2, "c", TH, "f", n_diverged=0, noise_text="").verdict == WITHIN_NOISE
    assert refv.decide(_arms(WITHIN_NOISE), s, 1.05, "c", TH, "f", n_diverged=0, noise_text="").verdict == REGRESSION


def test_unjudgeable_pairs_keep_the_arms_verdict():
    s = _stats([0.2] * 12, [0.1] * 12)
    d = refv.decide(_arms(NOT_EXERCISED, "never fired"), s, 1.0, "", TH, "f", n_diverged=0, noise_text="")
    assert d.verdict == NOT_EXERCISED and d.rule == refv.RULE_ARMS
    d = refv.decide(_arms(INCONCLUSIVE), None, 1.0, "", TH, "f", n_diverged=0, noise_text="")
    assert d.verdict == INCONCLUSIVE and d.rule == refv.RULE_ARMS
    # without a control the tests alone decide, and the reasons say so
    d = refv.decide(_arms(INCONCLUSIVE), s, 1.0, "", TH, "f", n_diverged=0, noise_text="")
    assert d.verdict == REGRESSION and "no flat-vs-flat control measured" in d.reasons


def test_identical_outputs_equally_far_from_the_reference_are_identical():
    s = _stats([0.1] * 8, [0.1] * 8)
    d = refv.decide(_arms(WITHIN_NOISE), s, 1.0, "c", TH, "f", n_diverged=0, noise_text="")
    assert d.verdict == "identical"
