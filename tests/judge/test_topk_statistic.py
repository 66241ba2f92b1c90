"""The top-k distribution error against the reference (judge/metrics/topk.py), its registry entry
(judge/statistics.py) and the combined verdict: the chosen-token and the top-k errors each at
alpha/2 (Bonferroni), either one flagging; a run without the arms' ids judged as before."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cascade_repro.judge import reference_verdict as refv
from cascade_repro.judge.metrics.reference import ArmError
from cascade_repro.judge.metrics.topk import topk_error, topk_pairs
from cascade_repro.judge.result import PairResult
from cascade_repro.judge.statistics import TOPK_REFERENCE, evidence_of, statistic
from cascade_repro.judge.verdicts import REGRESSION, WITHIN_NOISE, Decision, Thresholds
from cascade_repro.rundir.reference import RefRow

TH = Thresholds(bootstrap=200)
lps = st.floats(min_value=-30, max_value=0, allow_nan=False)


def _lists(ids_lps: list[list[tuple[int, float]]]) -> list[list[list[float]]]:
    return [[[i, v] for i, v in step] for step in ids_lps]


def test_topk_error_values():
    arm = _lists([[(5, -0.1), (7, -2.5)], [(9, -0.2), (5, -3.0)]])
    ref = [{5: -0.2, 7: -2.0, 11: -4.0}, {9: -0.2, 5: -2.0}]
    # step 0: (0.1 + 0.5) / 2 = 0.3; step 1: (0 + 1.0) / 2 = 0.5; the prompt: 0.4
    assert topk_error(arm, ref) == pytest.approx(0.4)
    # the float array scoring keeps ([steps, k, 2], ids as floats) reads the same
    assert topk_error(np.asarray(arm, dtype=np.float64), ref) == pytest.approx(0.4)


def test_ids_the_reference_lacks_and_unusable_values_are_left_out():
    arm = _lists([[(5, -0.1), (8, -2.0)], [(9, -math.inf)], []])
    ref = [{5: -0.3}, {9: -0.2}, {}]
    assert topk_pairs(arm, ref) == [[(-0.1, -0.3)], [], []]
    assert topk_error(arm, ref) == pytest.approx(0.2)
    assert math.isnan(topk_error([], ref)) and math.isnan(topk_error(None, ref))
    assert math.isnan(topk_error(_lists([[(1, -1.0)]]), [{2: -1.0}]))


@given(st.lists(st.lists(lps, min_size=1, max_size=5), min_size=1, max_size=12))
def test_zero_on_identical_inputs(steps):
    arm = [[[i, v] for i, v in enumerate(step)] for step in steps]
    ref = [dict(enumerate(step)) for step in steps]
    assert topk_error(arm, ref) == 0.0


@given(st.lists(st.lists(st.tuples(lps, lps), min_size=1, max_size=5), min_size=1, max_size=12))
def test_symmetric_in_arm_and_reference(steps):
    a = [[[i, x] for i, (x, _) in enumerate(step)] for step in steps]
    b = [[[i, y] for i, (_, y) in enumerate(step)] for step in steps]
    a_ids = [{i: x for i, (x, _) in enumerate(step)} for step in steps]
    b_ids = [{i: y for i, (_, y) in enumerate(step)} for step in steps]
    assert topk_error(a, b_ids) == pytest.approx(topk_error(b, a_ids))


@given(st.lists(st.lists(st.tuples(lps, st.floats(-1, 1)), min_size=1, max_size=5), min_size=1, max_size=12),
       st.floats(min_value=0.01, max_value=100))  # fmt: skip
def test_scales_with_the_difference(steps, k):
    ref = [{i: x for i, (x, _) in enumerate(step)} for step in steps]
    one = [[[i, x + d] for i, (x, d) in enumerate(step)] for step in steps]
    scaled = [[[i, x + k * d] for i, (x, d) in enumerate(step)] for step in steps]
    assert topk_error(scaled, ref) == pytest.approx(k * topk_error(one, ref), rel=1e-6, abs=1e-9)


def test_a_record_without_the_arms_ids_measures_nothing():
    measure = statistic(TOPK_REFERENCE).measure
    assert measure is not None
    old = RefRow([-0.1], [[3]], [[-0.1]])
    new = RefRow([-0.1], [[3]], [[-0.1]], [[3, 4]], [[-0.1, -2.0]])
    topk = [[[3, -0.1], [4, -2.5]]]
    assert math.isnan(measure([-0.1], topk, old))
    assert measure([-0.1], topk, new) == pytest.approx(0.25)


def test_paired_errors_zero_symmetric_and_scale_free():
    twin = [0.1, 0.2, 0.15, 0.3, 0.12, 0.25]
    same = refv.paired_errors(twin, twin, 1e-4, TH)
    assert same.ratio == 1.0 and same.up == same.down == 0 and same.p == 1.0
    worse = [2 * v for v in twin]
    a, b = refv.paired_errors(worse, twin, 1e-4, TH), refv.paired_errors(twin, worse, 1e-4, TH)
    assert (
        a.ratio == pytest.approx(2.0) and b.ratio == pytest.approx(0.5) and (a.up, a.down) == (b.down, b.up)
    )
    c = refv.paired_errors([10 * v for v in worse], [10 * v for v in twin], 1e-4, TH)
    assert c.ratio == pytest.approx(a.ratio) and c.p == a.p
    # NaN (a prompt whose records lacked the arms' ids) is left out, not counted as a tie
    assert refv.paired_errors([*worse, math.nan], [*twin, 0.1], 1e-4, TH).n == len(twin)


def _arms() -> Decision:
    return Decision(WITHIN_NOISE, "arms", 1.0, 1.0)


def _chosen(test, twin):
    return refv.reference_stats([ArmError(10, v) for v in test], [ArmError(10, v) for v in twin], 1e-4, TH)


# Twelve prompts, eleven worse under the test arm (the one better by the most): sign p 0.0032,
# Wilcoxon p 0.017, the decision's p their better doubled, 0.0063: under alpha 0.01, over alpha/2.
BORDERLINE = ([0.07] + [0.11 + 0.001 * i for i in range(1, 12)], [0.1] * 12)
MIXED = ([0.1, 0.12, 0.09, 0.1, 0.11, 0.1, 0.095, 0.1, 0.105, 0.1, 0.098, 0.1], [0.1] * 12)


def test_a_pair_flagged_by_the_top_k_error_alone():
    chosen = _chosen(*MIXED)
    topk = refv.paired_errors([0.5 + 0.01 * i for i in range(12)], [0.3] * 12, 1e-4, TH)
    also = [refv.RefMeasure(TOPK_REFERENCE, "top-k error", topk, 1.2, "c~b1")]
    d = refv.decide(_arms(), chosen, 1.05, "c~b1", TH, "float32", n_diverged=3, noise_text="", also=also)
    assert d.verdict == REGRESSION and d.decided_by == TOPK_REFERENCE
    ref, tk = (p for p in d.evidence if p.rule == "reference")
    assert (ref.fired, tk.fired, ref.level, tk.level) == (False, True, TH.alpha / 2, TH.alpha / 2)
    assert "test top-k error 1.85x its twin's" in d.reasons and "each at alpha/2" in d.reasons
    # the same pair without the top-k error (an older run's records): the chosen token alone, clean
    alone = refv.decide(_arms(), chosen, 1.05, "c~b1", TH, "float32", n_diverged=3, noise_text="")
    assert alone.verdict == WITHIN_NOISE and "alpha/2" not in alone.reasons


def test_the_correction_halves_each_level_only_where_both_were_measured():
    chosen = _chosen(*BORDERLINE)
    assert 0.005 < chosen.p < 0.01
    # Old records (no top-k measured): alpha, as before, and flagged.
    old = refv.decide(_arms(), chosen, 1.05, "c", TH, "f", n_diverged=3, noise_text="")
    assert old.verdict == REGRESSION and old.decided_by == "reference"
    unmeasured = [refv.RefMeasure(TOPK_REFERENCE, "top-k error", refv.RefStats(), 1.0, "")]
    assert (
        refv.decide(_arms(), chosen, 1.05, "c", TH, "f", n_diverged=3, noise_text="", also=unmeasured).verdict
        == REGRESSION
    )
    # Both measured: each at alpha/2, the chosen token's 0.0063 no longer enough, the top-k's clean.
    clean = [refv.RefMeasure(TOPK_REFERENCE, "top-k error", refv.paired_errors(*MIXED, 1e-4, TH), 1.0, "")]
    d = refv.decide(_arms(), chosen, 1.05, "c", TH, "f", n_diverged=3, noise_text="", also=clean)
    assert d.verdict == WITHIN_NOISE and "each at alpha/2" in d.reasons
    # Both fire: both named.
    strong = [refv.RefMeasure(TOPK_REFERENCE, "top-k error", refv.paired_errors([0.2] * 12, [0.1] * 12, 1e-4, TH), 1.0, "")]  # fmt: skip
    big = _chosen([0.2 + 0.001 * i for i in range(12)], [0.1] * 12)
    both = refv.decide(_arms(), big, 1.05, "c", TH, "f", n_diverged=3, noise_text="", also=strong)
    assert both.decided_by == f"reference,{TOPK_REFERENCE}"


def test_a_family_that_could_never_fire_leaves_the_chosen_token_alone_at_alpha():
    # Over 8 prompts no test gives p below 2 * 2**-8 = 0.0078 > alpha/2: the top-k error stays out
    # (decided from the prompt count, not the outcome), and a run this small is judged as before.
    assert refv.attainable(8) == pytest.approx(0.0078125) and refv.family(0.01, [8, 8]) == 1
    assert refv.family(0.01, [9, 9]) == 2 and refv.family(0.01, [64, 8]) == 1 and refv.family(0.01, [5]) == 1
    eight = _chosen([0.11 + 0.01 * i for i in range(8)], [0.1] * 8)
    topk = [
        refv.RefMeasure(
            TOPK_REFERENCE, "top-k error", refv.paired_errors([0.5] * 8, [0.3] * 8, 1e-4, TH), 1.0, ""
        )
    ]
    d = refv.decide(_arms(), eight, 1.05, "c", TH, "f", n_diverged=3, noise_text="", also=topk)
    assert d.verdict == REGRESSION and d.decided_by == "reference"
    assert "top-k error not tested: over 8 prompts" in d.reasons
    assert [p.name for p in d.evidence if p.rule == "reference"] == ["reference"]


def test_a_row_reads_back_the_pieces_at_the_level_it_was_judged():
    row = {"rule": "reference", "ref_n": 64, "ref_ratio": 1.3, "ref_min_effect": 1.1, "p_ref": 0.007}
    (ref,) = [p for p in evidence_of(row, 0.01, 0.02, 1) if p.rule == "reference"]
    assert ref.fired and ref.level == 0.01  # an older row: the chosen token alone, at alpha
    # over 8 prompts the top-k error was measured but not tested: read back so
    (ref,) = [p for p in evidence_of({**row, "ref_n": 8, "ref_topk_n": 8, "p_ref_topk": 0.5}, 0.01, 0.02, 1)
              if p.rule == "reference"]  # fmt: skip
    assert ref.fired and ref.level == 0.01
    row.update(ref_topk_n=64, ref_topk_ratio=1.05, ref_topk_min_effect=1.1, p_ref_topk=0.5)
    ref, tk = [p for p in evidence_of(row, 0.01, 0.02, 1) if p.rule == "reference"]
    assert not ref.fired and ref.level == tk.level == 0.005 and not tk.fired
    res = PairResult.from_row({**row, "verdict": "within noise"}, 0.01, 0.02, 1)
    assert [p.name for p in res.evidence][-2:] == ["reference", TOPK_REFERENCE]
    # an arm-vs-arm row shows no reference piece, whatever its columns hold
    assert all(p.rule != "reference" for p in evidence_of({**row, "rule": "arm-vs-arm"}, 0.01, 0.02, 1))
