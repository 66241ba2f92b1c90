"""cascade_repro.judge.verdicts and compare.plan_pairs: who is compared with whom, and what counts as a bug.

The motivating numbers (module docstring of verdicts.py): on an H200, cascade vs flat at batch 64
differed on 37/64 prompts while flat batch 1 vs flat batch 64 differed on 36/64. That is noise, and
the harness must say so; 30/64 against a floor of 0/64 is not.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from cascade_repro.judge.compare import control_candidates, plan_pairs
from cascade_repro.judge.verdicts import (
    ENGINE_FAULT,
    ERROR,
    IDENTICAL,
    INCONCLUSIVE,
    NOT_EXERCISED,
    REGRESSION,
    WITHIN_NOISE,
    BiasStats,
    DriftStats,
    Evidence,
    Thresholds,
    bias_stats,
    decide,
    depth,
    drift_ratio_stats,
    fisher_greater,
    paired_bootstrap_ci,
    sign_test,
)
from cascade_repro.plan.matrix import MatrixSpec, plan

# --- fisher_greater --------------------------------------------------------------------------------


def test_fisher_hand_cases():
    # All 8 of A hit, none of B: only the most extreme table, 1 / C(16, 8).
    assert fisher_greater(8, 8, 0, 8) == pytest.approx(1 / 12870, rel=1e-9)
    # A no better than B: p = 1 (every table is at least as extreme).
    assert fisher_greater(0, 8, 8, 8) == pytest.approx(1.0)
    assert fisher_greater(0, 10, 0, 10) == pytest.approx(1.0)
    # Equal rates are nowhere near significant.
    assert fisher_greater(4, 8, 4, 8) > 0.5
    # Hypergeometric tail by hand: 2/2 vs 0/2 → P(X=2) = C(2,2)C(2,0)/C(4,2) = 1/6.
    assert fisher_greater(2, 2, 0, 2) == pytest.approx(1 / 6)


def test_fisher_degenerate_groups():
    assert fisher_greater(0, 0, 5, 10) == 1.0  # no evidence in A
    assert fisher_greater(3, 5, 0, 0) == pytest.approx(1.0)  # nothing to compare against


def test_fisher_matches_scipy_on_a_grid():
    stats = pytest.importorskip("scipy.stats")
    for a_n in (1, 2, 5, 8, 16, 64):
        for b_n in (1, 3, 8, 64):
            for a_hits in sorted({0, 1, a_n // 3, a_n // 2, a_n - 1, a_n}):
                for b_hits in sorted({0, 1, b_n // 2, b_n}):
                    if a_hits < 0 or b_hits > b_n:
                        continue
                    table = [[a_hits, a_n - a_hits], [b_hits, b_n - b_hits]]
                    expected = stats.fisher_exact(table, alternative="greater").pvalue
                    got = fisher_greater(a_hits, a_n, b_hits, b_n)
                    assert got == pytest.approx(expected, rel=1e-7, abs=1e-12), table


def test_fisher_is_monotone_in_a_hits():
    ps = [fisher_greater(k, 64, 10, 64) for k in range(65)]
    assert all(x >= y for x, y in zip(ps, ps[1:], strict=False))
    assert ps[10] > 0.4 and ps[40] < 1e-6


# --- paired_bootstrap_ci ----------------------------------------------------------------------------


def test_bootstrap_of_constant_deltas_collapses_to_the_constant():
    assert paired_bootstrap_ci([0.25] * 30) == (0.25, 0.25, 0.25)
    assert paired_bootstrap_ci([0.1]) == (0.1, 0.1, 0.1)
    assert paired_bootstrap_ci([]) == (0.0, 0.0, 0.0)


def test_bootstrap_is_deterministic_for_a_seed_and_contains_the_mean():
    rng = np.random.default_rng(7)
    deltas = list(rng.normal(0.05, 0.1, size=64))

    a = paired_bootstrap_ci(deltas, n_boot=2000, seed=3)
    b = paired_bootstrap_ci(deltas, n_boot=2000, seed=3)
    c = paired_bootstrap_ci(deltas, n_boot=2000, seed=4)
    mean, lo, hi = a
    assert a == b
    assert c != a  # a different resampling
    assert mean == pytest.approx(float(np.mean(deltas)))
    assert lo < mean < hi
    # Roughly mean ± 1.96 standard errors.
    se = float(np.std(deltas, ddof=1)) / math.sqrt(64)
    assert hi - lo == pytest.approx(2 * 1.96 * se, rel=0.2)


def test_a_wider_confidence_level_gives_a_wider_interval():
    deltas = [0.0, 0.1, -0.05, 0.2, 0.03, 0.07, -0.02, 0.15]
    _, lo90, hi90 = paired_bootstrap_ci(deltas, ci=0.90)
    _, lo99, hi99 = paired_bootstrap_ci(deltas, ci=0.99)
    assert lo99 <= lo90 and hi99 >= hi90


# --- decide() ------------------------------------------------------------------------------------

TH = Thresholds()


def evidence(**kw) -> Evidence:
    """Evidence of a pair that fired cascade on 64 prompts, with an equal noise floor; override per test."""
    base = dict(
        n=64, n_diverged=10, topk_violations=0, noise_n=64, noise_n_diverged=10, noise_topk_violations=0,
        d_rep_mean=0.0, d_rep_lo=-0.01, d_rep_hi=0.01, cascade_steps=100,
    )  # fmt: skip
    base.update(kw)
    return Evidence(**base)


def judge(ev: Evidence, th: Thresholds, has_noise: bool) -> tuple[str, str, float, float]:
    d = decide(ev, th, has_noise)
    return d.verdict, d.reasons, d.p_divergence, d.p_topk


def test_not_exercised_wins_over_any_divergence():
    verdict, reasons, p_div, _ = judge(
        evidence(cascade_steps=0, n_diverged=64, noise_n_diverged=0), TH, True
    )
    assert verdict == NOT_EXERCISED
    assert "cascade never fired" in reasons
    assert p_div < 1e-10  # the p-values are still reported


def test_error_wins_over_everything():
    verdict, reasons, _, _ = judge(evidence(status_ok=False, cascade_steps=0, n_diverged=0), TH, True)
    assert (verdict, reasons) == (ERROR, "a cell of this pair did not finish")


def test_a_kernel_fault_of_the_test_arm_alone_is_a_regression_decided_by_it():
    fault = "device-side assertion IndexKernelUtils.cu:16 `ind >=0 && ind < ind_dim_size`"
    d = decide(evidence(status_ok=False, n=0, n_diverged=0, test_fault=fault), TH, True)
    assert (d.verdict, d.decided_by) == (REGRESSION, ENGINE_FAULT)
    assert d.reasons == f"the test arm's engine died of a kernel fault ({fault}) on prompts its twin finished"
    # Without the fault named, an unfinished cell stays an error.
    assert decide(evidence(status_ok=False, n=0, n_diverged=0), TH, True).verdict == ERROR


def test_identical_when_nothing_diverged():
    verdict, reasons, _, _ = judge(evidence(n_diverged=0, noise_n_diverged=30), TH, True)
    assert (verdict, reasons) == (IDENTICAL, "all 64 outputs token-identical")


def test_the_h200_example_is_within_noise():
    ev = evidence(n_diverged=37, noise_n_diverged=36, topk_violations=2, noise_topk_violations=2)
    verdict, reasons, p_div, p_topk = judge(ev, TH, True)
    assert verdict == WITHIN_NOISE
    assert 0.3 < p_div < 0.7
    assert p_topk > 0.5
    assert "diverged 37/64 vs noise 36/64" in reasons


def test_regression_by_divergence_against_a_clean_floor():
    verdict, reasons, p_div, _ = judge(evidence(n_diverged=30, noise_n_diverged=0), TH, True)
    assert verdict == REGRESSION
    assert p_div < 1e-9
    assert reasons.startswith("diverged 30/64 vs noise 0/64, Fisher p=")
    assert "top-k" not in reasons and "seq-rep-4" not in reasons


def test_regression_by_topk_violations_when_divergence_counts_look_alike():
    ev = evidence(n_diverged=20, noise_n_diverged=18, topk_violations=15, noise_topk_violations=0)
    verdict, reasons, p_div, p_topk = judge(ev, TH, True)
    assert verdict == REGRESSION
    assert p_div > TH.alpha and p_topk < TH.alpha
    assert reasons.startswith("15 divergences outside top-k vs 0 in noise")


def test_topk_needs_the_minimum_count_as_well_as_significance():
    ev = evidence(n_diverged=20, noise_n_diverged=18, topk_violations=15, noise_topk_violations=0)
    verdict, _, _, _ = judge(ev, replace(TH, min_topk_violations=16), True)
    assert verdict == WITHIN_NOISE


def test_regression_by_repetition_when_the_ci_lower_bound_clears_the_minimum_effect():
    ev = evidence(n_diverged=5, noise_n_diverged=5, d_rep_mean=0.08, d_rep_lo=0.05, d_rep_hi=0.11)
    verdict, reasons, _, _ = judge(ev, TH, True)
    assert verdict == REGRESSION
    assert reasons == "seq-rep-4 up by +0.080 (CI +0.050..+0.110 > 0.02)"


def test_repetition_ci_touching_the_minimum_effect_is_not_enough():
    ev = evidence(n_diverged=5, noise_n_diverged=5, d_rep_mean=0.08, d_rep_lo=0.02, d_rep_hi=0.11)
    assert judge(ev, TH, True)[0] == WITHIN_NOISE


def test_without_any_noise_control_an_exercised_pair_is_inconclusive_not_a_regression():
    # vLLM --batch 64 alone on a clean H200 was called a regression against a floor "taken as 0".
    ev = evidence(n_diverged=32, noise_n=0, noise_n_diverged=0)
    verdict, reasons, _, _ = judge(ev, TH, has_noise=False)
    assert verdict == INCONCLUSIVE
    assert reasons.startswith("no noise control measured (planner controls turned off): diverged 32/64")


def test_several_signals_are_all_listed():
    ev = evidence(
        n_diverged=40, noise_n_diverged=0, topk_violations=20, d_rep_mean=0.2, d_rep_lo=0.1, d_rep_hi=0.3
    )
    verdict, reasons, _, _ = judge(ev, TH, True)
    assert verdict == REGRESSION
    assert len(reasons.split("; ")) == 3


# --- compare.plan_pairs -----------------------------------------------------------------------------


def cells_of(**spec) -> list[dict]:
    return [c.to_json() for c in plan(MatrixSpec(**spec)).cells]


def pairs_by_id(cells: list[dict]) -> dict[str, tuple[str, str, str]]:
    return {p.pair_id: (p.kind, p.test.cell_id, p.ref.cell_id) for p in plan_pairs(cells)}


def test_each_cascade_cell_pairs_with_its_flat_twin_and_flat_cells_with_the_smallest_batch():
    assert pairs_by_id(cells_of(batch=[1, 8, 16])) == {
        "tp1-b1-cascade~flat": ("cascade", "tp1-b1-cascade", "tp1-b1-flat"),
        "tp1-b8-cascade~flat": ("cascade", "tp1-b8-cascade", "tp1-b8-flat"),
        "tp1-b16-cascade~flat": ("cascade", "tp1-b16-cascade", "tp1-b16-flat"),
        "tp1-b8-flat~b1": ("noise-batch", "tp1-b8-flat", "tp1-b1-flat"),
        "tp1-b16-flat~b1": ("noise-batch", "tp1-b16-flat", "tp1-b1-flat"),
        # The smallest batch is the test side of one control too, so its cascade pair has a match.
        "tp1-b1-flat~b8": ("noise-batch", "tp1-b1-flat", "tp1-b8-flat"),
    }


def test_noise_batch_reference_is_the_smallest_batch_even_when_it_is_not_1():
    pairs = pairs_by_id(cells_of(batch=[16, 8, 64]))
    noise = {k: v for k, v in pairs.items() if v[0] == "noise-batch"}
    assert noise == {
        "tp1-b16-flat~b8": ("noise-batch", "tp1-b16-flat", "tp1-b8-flat"),
        "tp1-b64-flat~b8": ("noise-batch", "tp1-b64-flat", "tp1-b8-flat"),
        "tp1-b8-flat~b16": ("noise-batch", "tp1-b8-flat", "tp1-b16-flat"),
    }


def test_rerun_adds_noise_rerun_pairs_and_reruns_are_never_cascade_references():
    pairs = pairs_by_id(cells_of(batch=[1, 8], rerun=True))
    assert pairs["tp1-b1-flat-r1~r0"] == ("noise-rerun", "tp1-b1-flat-r1", "tp1-b1-flat")
    assert pairs["tp1-b8-flat-r1~r0"] == ("noise-rerun", "tp1-b8-flat-r1", "tp1-b8-flat")
    assert pairs["tp1-b8-cascade~flat"] == ("cascade", "tp1-b8-cascade", "tp1-b8-flat")
    assert sum(1 for k, *_ in pairs.values() if k == "noise-batch") == 2  # r1 cells are not batch controls
    assert len(pairs) == 2 + 2 + 2


def test_pairs_never_cross_tp_seed_dtype_fa_or_backend():
    cells = cells_of(
        engine="vllm", tp=[1, 2], batch=[1, 8], seeds=[0, 1], dtypes=["float16", "bfloat16"],
        fa_versions=[None, 3], backends=["FLASH_ATTN", "FLASHINFER"], rerun=True,
    )  # fmt: skip
    pairs = plan_pairs(cells)
    combos = 2 * 2 * 2 * 2 * 2
    kinds = [p.kind for p in pairs]
    assert kinds.count("cascade") == combos * 2  # one per cascade cell
    assert kinds.count("noise-batch") == combos * 2  # b8 vs b1 and b1 vs b8
    assert kinds.count("noise-rerun") == combos * 2
    for p in pairs:
        for axis in ("tp", "seed", "dtype", "fa_version", "backend"):
            assert getattr(p.test, axis) == getattr(p.ref, axis), (p.pair_id, axis)
        if p.kind == "cascade":
            assert (p.test.arm, p.ref.arm, p.test.batch) == ("cascade", "flat", p.ref.batch)
        else:
            assert p.test.arm == p.ref.arm == "flat"
    assert len({p.pair_id for p in pairs}) == len(pairs)


def test_tp2_cascade_is_compared_with_tp2_flat_not_tp1():
    pairs = pairs_by_id(cells_of(engine="vllm", tp=[1, 2], batch=[8], auto_controls=False))
    assert pairs["tp2-b8-cascade~flat"] == ("cascade", "tp2-b8-cascade", "tp2-b8-flat")
    assert pairs["tp1-b8-cascade~flat"] == ("cascade", "tp1-b8-cascade", "tp1-b8-flat")
    assert len(pairs) == 2  # a single batch size, controls off: no noise control, and nothing across tp


def test_cascade_only_matrix_has_no_pairs():
    assert plan_pairs(cells_of(batch=[1, 8], cascade=[True])) == []


# --- planner-added controls and matched controls -------------------------------------------------


def test_a_single_batch_gets_a_flat_control_a_factor_8_away_and_it_is_the_only_candidate():
    # vLLM --batch 64 alone on a clean H200 was a "regression" against a floor taken as 0.
    cells = cells_of(engine="vllm", batch=[64])
    added = [c for c in cells if c["origin"] == "control"]
    assert [(c["cell_id"], c["arm"], c["batch"]) for c in added] == [("tp1-b8-flat", "flat", 8)]
    pairs = plan_pairs(cells)
    ((ctrl, other),) = control_candidates(pairs)["tp1-b64-cascade~flat"]
    assert (ctrl.pair_id, ctrl.kind, other) == ("tp1-b64-flat~b8", "noise-batch", "tp1-b8-flat")


@pytest.mark.parametrize(("batch", "control"), [(1, 8), (4, 32), (8, 1), (64, 8), (128, 16)])
def test_control_batch_is_a_factor_8_away(batch, control):
    assert [c["batch"] for c in cells_of(batch=[batch]) if c["origin"] == "control"] == [control]


def test_no_control_is_added_when_the_matrix_has_two_batch_sizes_or_controls_are_off():
    assert not [c for c in cells_of(batch=[8, 64]) if c["origin"] == "control"]
    assert not [c for c in cells_of(batch=[64], auto_controls=False) if c["origin"] == "control"]
    assert not [c for c in cells_of(batch=[64], cascade=[False]) if c["origin"] == "control"]


def test_restart_twins_get_a_control_across_engine_starts():
    # Two engine starts differ on their own (flat b8: 51/64 identical on the H200), so a pair whose
    # twins come from two starts must be judged against a control that spans two starts as well.
    engines = plan(MatrixSpec(engine="vllm", batch=[8, 64], arm_switch="restart"))
    assert [k.rsplit("-", 2)[-2:] for k in engines.engines] == [["s0", "cascade"], ["s0", "flat"], ["flat", "r1"]]
    cells = [c.to_json() for c in engines.cells]
    pairs = plan_pairs(cells)
    kinds = {p.pair_id: p.kind for p in pairs}
    assert kinds["tp1-b8-flat-r1~r0"] == kinds["tp1-b64-flat-r1~r0"] == "noise-restart"
    cands = {c.pair_id: other for c, other in control_candidates(pairs)["tp1-b64-cascade~flat"]}
    assert cands == {"tp1-b64-flat-r1~r0": "tp1-b64-flat-r1", "tp1-b64-flat~b8": "tp1-b8-flat"}


def test_a_rerun_inside_one_engine_is_never_a_matched_control():
    pairs = plan_pairs(cells_of(batch=[8], rerun=True, auto_controls=False))
    assert {p.kind for p in pairs} == {"cascade", "noise-rerun"}
    assert control_candidates(pairs) == {}


def test_calibration_cells_pair_with_the_clean_twin_and_share_its_control():
    cells = cells_of(batch=[8, 16], calibrate=[0.1, 1.0])
    assert [c["cell_id"] for c in cells if c["origin"] == "calibration"] == [
        "tp1-b8-cascade-shift0.1", "tp1-b8-cascade-shift1", "tp1-b16-cascade-shift0.1", "tp1-b16-cascade-shift1",
    ]  # fmt: skip
    pairs = plan_pairs(cells)
    by_id = {p.pair_id: p for p in pairs}
    cal = by_id["tp1-b16-cascade-shift0.1~flat"]
    assert (cal.kind, cal.test.inject, cal.ref.cell_id) == ("calibration", "lse-shift=0.1", "tp1-b16-flat")
    m = control_candidates(pairs)
    assert m["tp1-b16-cascade-shift0.1~flat"] == m["tp1-b16-cascade~flat"]


# --- drift ratio ------------------------------------------------------------------------------------


def test_drift_ratio_of_equal_drifts_is_one_and_never_significant():
    d = drift_ratio_stats([0.03] * 40, [0.03] * 40, 0.004, TH)
    assert (d.ratio, d.lo, d.hi, d.up) == (1.0, 1.0, 1.0, 0)
    assert d.p == 1.0
    assert d.threshold >= TH.drift_min


def test_drift_ratio_is_scale_invariant_and_its_inverse_under_swapped_roles():
    rng = np.random.default_rng(3)
    c = rng.gamma(2.0, 0.02, 50)
    t = c * rng.lognormal(0.3, 0.2, 50)
    d = drift_ratio_stats(t, c, 1e-9, TH)
    d10 = drift_ratio_stats(t * 10, c * 10, 1e-8, TH)
    assert d.ratio == pytest.approx(d10.ratio) and d.p == pytest.approx(d10.p)
    assert drift_ratio_stats(c, t, 1e-9, TH).ratio == pytest.approx(1 / d.ratio)


def test_drift_below_the_floor_is_at_the_floor_not_infinitely_above_an_exact_control():
    # fp32 on CPU: flat vs flat is bitwise identical, cascade differs by ~1e-6.
    d = drift_ratio_stats([1e-6] * 16, [0.0] * 16, 1e-4, TH)
    assert d.ratio == 1.0 and d.p == 1.0


def test_a_constant_factor_of_extra_rounding_is_tolerated_a_gross_drift_is_not():
    # Clean FA2 cascade on the H200 drifted 1.2-1.5x its worst flat control, with no direction.
    rng = np.random.default_rng(7)
    base = rng.gamma(2.0, 0.02, 60)
    benign = drift_ratio_stats(base * 1.4 * rng.lognormal(0, 0.25, 60), base * rng.lognormal(0, 0.25, 60), 0.004, TH)
    gross = drift_ratio_stats(base * 3.0 * rng.lognormal(0, 0.25, 60), base * rng.lognormal(0, 0.25, 60), 0.004, TH)
    assert benign.p < TH.alpha / 2 and benign.ratio < benign.threshold == TH.drift_min  # significant, yet tolerated
    assert gross.ratio > gross.threshold and gross.lo > TH.drift_min


def test_small_samples_use_the_exact_permutation_distribution():
    d = drift_ratio_stats([0.2] * 7, [0.1] * 7, 1e-4, TH)
    assert d.p == pytest.approx(1 / 2**7)  # only the identity labelling is as extreme
    d6 = drift_ratio_stats([0.2] * 6, [0.1] * 6, 1e-4, TH)
    assert d6.p == pytest.approx(1 / 2**6) and not d6.ratio > d6.threshold  # 6 prompts cannot reach 1 %


def test_no_agreeing_prompt_means_no_drift_measured():
    d = drift_ratio_stats([math.nan], [0.1], 1e-4, TH)
    assert d.n == 0 and not d.measured


def test_sign_test_is_exact_and_two_sided():
    assert sign_test(0, 0) == 1.0
    assert sign_test(5, 5) == 1.0
    assert sign_test(0, 7) == pytest.approx(2 / 2**7)
    assert sign_test(9, 1) == pytest.approx(2 * 11 / 2**10) == sign_test(1, 9)


def test_bias_counts_prompts_that_moved_beyond_the_floor_and_ignores_the_others():
    # (signed mean, mean |Δ|) per prompt; the third moved only at fp32 rounding level: a tie.
    b = bias_stats([(-0.002, 0.01), (-0.001, 0.02), (1e-7, 1e-6), (0.003, 0.01)], [(0.001, 0.01)], 1e-4)
    assert (b.n, b.up, b.down) == (3, 1, 2)
    assert b.mean == pytest.approx((-0.002 - 0.001 + 1e-7 + 0.003) / 4)
    assert b.p == pytest.approx(1.0) and b.p_control == pytest.approx(1.0)
    fp32 = bias_stats([(1e-6, 2e-6)] * 30, [(0.0, 0.0)] * 30, 1e-4)  # a consistent but rounding-sized sign
    assert fp32.n == 0 and fp32.p == 1.0


def test_a_directional_shift_is_flagged_by_the_bias_test_even_when_the_magnitude_is_tolerated():
    # H200, FA3, b64: a 0.1-nat prefix-LSE shift lowered the chosen logprob on 41 of 59 prompts
    # (p=0.0038) with a drift ratio of 1.53, below drift_min; clean cascade: 34 up / 21 down.
    fault = decide(evidence(n_diverged=34, noise_n_diverged=27, drift=drift(1.53, threshold=2.0),
                            bias=BiasStats(n=59, up=18, down=41, mean=-0.0008, p=sign_test(18, 41), p_control=0.24)),
                   TH, True)  # fmt: skip
    assert (fault.verdict, fault.decided_by) == (REGRESSION, "bias")
    assert fault.reasons.startswith(
        "bias: chosen-token logprob lower under cascade on 41 of 59 prompts (mean -0.0008), sign test p=0.00379 vs 0.005"
    )
    clean = decide(evidence(n_diverged=31, noise_n_diverged=27, drift=drift(1.02, threshold=2.0),
                            bias=BiasStats(n=55, up=34, down=21, mean=0.001, p=sign_test(34, 21), p_control=0.36)),
                   TH, True)  # fmt: skip
    assert clean.verdict == WITHIN_NOISE
    assert "bias: chosen-token logprob higher under cascade on 34 of 55 prompts" in clean.reasons


def drift(ratio: float, threshold: float = 1.14, **kw) -> DriftStats:
    base = dict(n=60, test=0.04 * ratio, control=0.04, floor=0.0039, ratio=ratio, lo=ratio - 0.1,
                hi=ratio + 0.1, p=0.0005 if ratio > threshold else 0.4, null_q=threshold, threshold=threshold, up=50)  # fmt: skip
    base.update(kw)
    return DriftStats(**base)


def test_drift_alone_flags_what_output_counts_miss():
    # 30/64 vs a floor of 29/64 and 0 vs 0 top-k look like noise; the drift does not.
    ev = evidence(n_diverged=30, noise_n_diverged=29, drift=drift(1.35), cascade_decode_steps=90)
    d = decide(ev, TH, True)
    assert (d.verdict, d.decided_by) == (REGRESSION, "drift")
    assert d.reasons.startswith("drift ratio 1.35 (CI 1.25..1.45, test 0.054 vs control 0.04 over 60 prompts")
    assert "vs threshold 1.14, p=0.0005" in d.reasons


def test_within_noise_names_every_piece_of_evidence_with_numbers():
    d = decide(evidence(n_diverged=30, noise_n_diverged=29, drift=drift(1.02)), TH, True)
    assert d.verdict == WITHIN_NOISE and d.decided_by == ""
    assert [part.split(" ")[0] for part in d.reasons.split("; ")] == ["drift", "diverged", "top-k", "Δseq-rep-4"]


def test_identical_tokens_with_drift_beyond_noise_are_a_regression():
    d = decide(evidence(n_diverged=0, noise_n_diverged=5, drift=drift(3.0)), TH, True)
    assert d.verdict == REGRESSION


def test_identical_tokens_with_drift_at_the_floor_are_identical_even_without_a_control():
    ev = evidence(n_diverged=0, noise_n=0, noise_n_diverged=0, drift=drift(1.0, test=1e-6, floor=1e-4))
    d = decide(ev, TH, False)
    assert d.verdict == IDENTICAL
    assert d.reasons == "all 64 outputs token-identical, logprob drift 1e-06 at the dtype's resolution (0.0001)"


def test_a_pair_exercised_on_prefill_only_says_so():
    d = decide(evidence(n_diverged=10, drift=drift(1.0), cascade_decode_steps=0), TH, True)
    assert d.verdict == WITHIN_NOISE
    assert d.reasons.endswith("; cascade ran on prefill steps only (the field bug lived in decode)")
    assert depth(8, 0) == "prefill only" and depth(8, 3) == "decode" and depth(0, 0) == "none"
    assert depth(8, None) == "?"
