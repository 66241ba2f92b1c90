"""cascade_repro.verdicts and compare.plan_pairs: who is compared with whom, and what counts as a bug.

The motivating numbers (module docstring of verdicts.py): on an H200, cascade vs flat at batch 64
differed on 37/64 prompts while flat batch 1 vs flat batch 64 differed on 36/64. That is noise, and
the harness must say so; 30/64 against a floor of 0/64 is not.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from cascade_repro.compare import plan_pairs
from cascade_repro.matrix import MatrixSpec, all_cells, plan
from cascade_repro.verdicts import (
    ERROR,
    IDENTICAL,
    NOT_EXERCISED,
    REGRESSION,
    WITHIN_NOISE,
    Evidence,
    Thresholds,
    decide,
    fisher_greater,
    paired_bootstrap_ci,
)

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


def test_not_exercised_wins_over_any_divergence():
    verdict, reasons, p_div, _ = decide(
        evidence(cascade_steps=0, n_diverged=64, noise_n_diverged=0), TH, True
    )
    assert verdict == NOT_EXERCISED
    assert "cascade never fired" in reasons
    assert p_div < 1e-10  # the p-values are still reported


def test_error_wins_over_everything():
    verdict, reasons, _, _ = decide(evidence(status_ok=False, cascade_steps=0, n_diverged=0), TH, True)
    assert (verdict, reasons) == (ERROR, "a cell of this pair did not finish")


def test_identical_when_nothing_diverged():
    verdict, reasons, _, _ = decide(evidence(n_diverged=0, noise_n_diverged=30), TH, True)
    assert (verdict, reasons) == (IDENTICAL, "all 64 outputs token-identical")


def test_the_h200_example_is_within_noise():
    ev = evidence(n_diverged=37, noise_n_diverged=36, topk_violations=2, noise_topk_violations=2)
    verdict, reasons, p_div, p_topk = decide(ev, TH, True)
    assert verdict == WITHIN_NOISE
    assert 0.3 < p_div < 0.7
    assert p_topk > 0.5
    assert "diverged 37/64 vs noise 36/64" in reasons


def test_regression_by_divergence_against_a_clean_floor():
    verdict, reasons, p_div, _ = decide(evidence(n_diverged=30, noise_n_diverged=0), TH, True)
    assert verdict == REGRESSION
    assert p_div < 1e-9
    assert reasons.startswith("diverged 30/64 vs noise 0/64, Fisher p=")
    assert "top-k" not in reasons and "seq-rep-4" not in reasons


def test_regression_by_topk_violations_when_divergence_counts_look_alike():
    ev = evidence(n_diverged=20, noise_n_diverged=18, topk_violations=15, noise_topk_violations=0)
    verdict, reasons, p_div, p_topk = decide(ev, TH, True)
    assert verdict == REGRESSION
    assert p_div > TH.alpha and p_topk < TH.alpha
    assert reasons.startswith("15 divergences outside top-k vs 0 in noise")


def test_topk_needs_the_minimum_count_as_well_as_significance():
    ev = evidence(n_diverged=20, noise_n_diverged=18, topk_violations=15, noise_topk_violations=0)
    verdict, _, _, _ = decide(ev, replace(TH, min_topk_violations=16), True)
    assert verdict == WITHIN_NOISE


def test_regression_by_repetition_when_the_ci_lower_bound_clears_the_minimum_effect():
    ev = evidence(n_diverged=5, noise_n_diverged=5, d_rep_mean=0.08, d_rep_lo=0.05, d_rep_hi=0.11)
    verdict, reasons, _, _ = decide(ev, TH, True)
    assert verdict == REGRESSION
    assert reasons == "seq-rep-4 up by +0.080 (CI +0.050..+0.110 > 0.02)"


def test_repetition_ci_touching_the_minimum_effect_is_not_enough():
    ev = evidence(n_diverged=5, noise_n_diverged=5, d_rep_mean=0.08, d_rep_lo=0.02, d_rep_hi=0.11)
    assert decide(ev, TH, True)[0] == WITHIN_NOISE


def test_without_a_noise_control_the_floor_is_zero_and_says_so():
    ev = evidence(n_diverged=30, noise_n=0, noise_n_diverged=0)
    verdict, reasons, _, _ = decide(ev, TH, has_noise=False)
    assert verdict == REGRESSION
    assert "no noise control measured (floor taken as 0)" in reasons
    # One stray divergence in 64 is not significant even against a zero floor.
    assert (
        decide(evidence(n_diverged=1, noise_n=0, noise_n_diverged=0), TH, has_noise=False)[0] == WITHIN_NOISE
    )


def test_several_signals_are_all_listed():
    ev = evidence(
        n_diverged=40, noise_n_diverged=0, topk_violations=20, d_rep_mean=0.2, d_rep_lo=0.1, d_rep_hi=0.3
    )
    verdict, reasons, _, _ = decide(ev, TH, True)
    assert verdict == REGRESSION
    assert len(reasons.split("; ")) == 3


# --- compare.plan_pairs -----------------------------------------------------------------------------


def cells_of(**spec) -> list[dict]:
    return [c.to_dict() for c in all_cells(plan(MatrixSpec(**spec)))]


def pairs_by_id(cells: list[dict]) -> dict[str, tuple[str, str, str]]:
    return {p.pair_id: (p.kind, p.test["cell_id"], p.ref["cell_id"]) for p in plan_pairs(cells)}


def test_each_cascade_cell_pairs_with_its_flat_twin_and_flat_cells_with_the_smallest_batch():
    assert pairs_by_id(cells_of(batch=[1, 8, 16])) == {
        "tp1-b1-cascade~flat": ("cascade", "tp1-b1-cascade", "tp1-b1-flat"),
        "tp1-b8-cascade~flat": ("cascade", "tp1-b8-cascade", "tp1-b8-flat"),
        "tp1-b16-cascade~flat": ("cascade", "tp1-b16-cascade", "tp1-b16-flat"),
        "tp1-b8-flat~b1": ("noise-batch", "tp1-b8-flat", "tp1-b1-flat"),
        "tp1-b16-flat~b1": ("noise-batch", "tp1-b16-flat", "tp1-b1-flat"),
    }


def test_noise_batch_reference_is_the_smallest_batch_even_when_it_is_not_1():
    pairs = pairs_by_id(cells_of(batch=[16, 8, 64]))
    noise = {k: v for k, v in pairs.items() if v[0] == "noise-batch"}
    assert noise == {
        "tp1-b16-flat~b8": ("noise-batch", "tp1-b16-flat", "tp1-b8-flat"),
        "tp1-b64-flat~b8": ("noise-batch", "tp1-b64-flat", "tp1-b8-flat"),
    }


def test_rerun_adds_noise_rerun_pairs_and_reruns_are_never_cascade_references():
    pairs = pairs_by_id(cells_of(batch=[1, 8], rerun=True))
    assert pairs["tp1-b1-flat-r1~r0"] == ("noise-rerun", "tp1-b1-flat-r1", "tp1-b1-flat")
    assert pairs["tp1-b8-flat-r1~r0"] == ("noise-rerun", "tp1-b8-flat-r1", "tp1-b8-flat")
    assert pairs["tp1-b8-cascade~flat"] == ("cascade", "tp1-b8-cascade", "tp1-b8-flat")
    assert sum(1 for k, *_ in pairs.values() if k == "noise-batch") == 1  # r1 cells are not batch controls
    assert len(pairs) == 2 + 1 + 2


def test_pairs_never_cross_tp_seed_dtype_fa_or_backend():
    cells = cells_of(
        engine="vllm", tp=[1, 2], batch=[1, 8], seeds=[0, 1], dtypes=["float16", "bfloat16"],
        fa_versions=[None, 3], backends=["FLASH_ATTN", "FLASHINFER"], rerun=True,
    )  # fmt: skip
    pairs = plan_pairs(cells)
    combos = 2 * 2 * 2 * 2 * 2
    kinds = [p.kind for p in pairs]
    assert kinds.count("cascade") == combos * 2  # one per cascade cell
    assert kinds.count("noise-batch") == combos * 1  # b8 vs b1
    assert kinds.count("noise-rerun") == combos * 2
    for p in pairs:
        for axis in ("tp", "seed", "dtype", "fa_version", "backend"):
            assert p.test[axis] == p.ref[axis], (p.pair_id, axis)
        if p.kind == "cascade":
            assert (p.test["arm"], p.ref["arm"], p.test["batch"]) == ("cascade", "flat", p.ref["batch"])
        else:
            assert p.test["arm"] == p.ref["arm"] == "flat"
    assert len({p.pair_id for p in pairs}) == len(pairs)


def test_tp2_cascade_is_compared_with_tp2_flat_not_tp1():
    pairs = pairs_by_id(cells_of(engine="vllm", tp=[1, 2], batch=[8]))
    assert pairs["tp2-b8-cascade~flat"] == ("cascade", "tp2-b8-cascade", "tp2-b8-flat")
    assert pairs["tp1-b8-cascade~flat"] == ("cascade", "tp1-b8-cascade", "tp1-b8-flat")
    assert len(pairs) == 2  # a single batch size: no batch noise control, and nothing across tp


def test_cascade_only_matrix_has_no_pairs():
    assert plan_pairs(cells_of(batch=[1, 8], cascade=[True])) == []
