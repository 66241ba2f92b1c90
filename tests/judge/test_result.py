"""A pair's typed result: the evidence pieces decide() weighs are the ones a report rebuilds from a row
(the pieces live in judge/verdicts.py, the statistics' registry in judge/statistics.py, the result in
judge/result.py)."""

from __future__ import annotations

import math

from cascade_repro.judge.result import PairResult
from cascade_repro.judge.statistics import ARM_NAMES, evidence_of
from cascade_repro.judge.verdicts import Evidence, Thresholds, decide, topk_piece

TH = Thresholds()


def _from_row(row: dict) -> PairResult:
    return PairResult.from_row(row, TH.alpha, TH.rep_delta, TH.min_topk_violations)


def test_pieces_come_in_decides_order_with_value_threshold_and_rule():
    row = {"p_bias": 0.001, "drift_ratio": 3.0, "drift_threshold": 2.5, "p_divergence": 0.5, "p_topk": 0.5,
           "topk_violations": 0, "d_seq_rep_4_lo": 0.0}  # fmt: skip
    pieces = evidence_of(row, TH.alpha, TH.rep_delta, TH.min_topk_violations)
    assert tuple(p.name for p in pieces) == ARM_NAMES
    bias, drift = pieces[0], pieces[1]
    assert (bias.value, bias.threshold, bias.fired, bias.rule) == (0.001, TH.alpha / 2, True, "arm-vs-arm")
    assert (drift.value, drift.threshold, drift.fired) == (3.0, 2.5, True)
    assert [p.fired for p in pieces[2:]] == [False, False, False]


def test_missing_columns_never_fire():
    # An old run's row lacks the drift and bias columns; a None or NaN cell is no evidence.
    pieces = evidence_of({"p_bias": None, "drift_ratio": math.nan}, TH.alpha, TH.rep_delta, 1)
    assert not any(p.fired for p in pieces)


def test_topk_needs_its_minimum_count_as_well_as_its_p_value():
    assert not topk_piece(0.001, 0, TH.alpha, 1).fired
    assert topk_piece(0.001, 1, TH.alpha, 1).fired


def test_recorded_decided_by_wins_and_a_row_without_it_falls_back_to_the_pieces():
    row = {"pair_id": "c~flat", "verdict": "regression", "decided_by": "top-k", "p_divergence": 1e-6}
    assert _from_row(row).fired() == ["top-k"]
    assert _from_row({**row, "decided_by": None}).fired() == ["divergence"]


def test_a_row_rebuilt_from_decides_numbers_fires_what_decide_recorded():
    ev = Evidence(n=64, n_diverged=40, topk_violations=12, noise_n=64, noise_n_diverged=2,
                  noise_topk_violations=0, d_rep_mean=0.1, d_rep_lo=0.05, d_rep_hi=0.15, cascade_steps=100)  # fmt: skip
    dec = decide(ev, TH, has_noise=True)
    row = {"verdict": dec.verdict, "p_divergence": dec.p_divergence, "p_topk": dec.p_topk,
           "topk_violations": ev.topk_violations, "d_seq_rep_4_lo": ev.d_rep_lo}  # fmt: skip
    assert _from_row(row).fired() == dec.decided_by.split(",") == ["divergence", "top-k", "repetition"]


def test_decide_returns_its_pieces_and_decided_by_names_those_that_fired():
    ev = Evidence(n=64, n_diverged=40, topk_violations=0, noise_n=64, noise_n_diverged=2,
                  noise_topk_violations=0, d_rep_mean=0.0, d_rep_lo=-0.01, d_rep_hi=0.01, cascade_steps=100)  # fmt: skip
    dec = decide(ev, TH, has_noise=True)
    assert tuple(p.name for p in dec.evidence) == ARM_NAMES
    assert [p.name for p in dec.evidence if p.fired] == dec.decided_by.split(",") == ["divergence"]
    # Without a noise control the count tests weigh nothing, whatever their p-values.
    assert not any(p.fired for p in decide(ev, TH, has_noise=False).evidence)
