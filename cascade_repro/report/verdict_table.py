"""The verdict table: one row per cascade pair, and the formatting of its evidence columns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cascade_repro.judge.outcome import REGRESSION
from cascade_repro.judge.result import PairResult
from cascade_repro.report.load import RunData
from cascade_repro.report.text import (
    MISSING,
    Strong,
    as_int,
    fmt_ci,
    fmt_float,
    fmt_int,
    fmt_p,
    fmt_p_eq,
    fmt_ratio,
    fmt_threshold_p,
    fmt_x_ci,
    is_missing,
    text_of,
)
from cascade_repro.report.view import (
    DEFAULTS,
    Table,
    cascade_pairs,
    has_if,
    if_column,
    predictions,
    result_of,
    shows_depth,
    thresholds,
    varying_axes,
)


def _typed(pair: PairResult | Mapping[str, Any]) -> PairResult:
    """A pair's typed result; a bare pairs.parquet row (the ladder's and JUnit's callers) is rebuilt at
    the verdict's default thresholds, which none of these columns' formats reads."""
    if isinstance(pair, PairResult):
        return pair
    return PairResult.from_row(
        pair, DEFAULTS["alpha"], DEFAULTS["rep_delta"], DEFAULTS["min_topk_violations"]
    )


def _vs(k: str, n_k: str, p) -> str:
    """`3/4 vs 1/4, p=0.0714`: a count next to its noise count and the test's p-value."""
    if k == MISSING:
        return MISSING
    return f"{k} vs {n_k}" + ("" if is_missing(p) else f", {fmt_p_eq(p)}")


def fmt_drift(pair: PairResult | Mapping[str, Any]) -> str:
    """The drift ratio with its bootstrap CI, e.g. `1.35 [1.25, 1.46]`."""
    res = _typed(pair)
    return fmt_x_ci(res.piece("drift").value, res.number("drift_ratio_lo"), res.number("drift_ratio_hi"))


def fmt_drift_rule(pair: PairResult | Mapping[str, Any]) -> str:
    """The effective drift threshold and the permutation p-value, e.g. `> 1.14, p=0.0005`."""
    res = _typed(pair)
    return fmt_threshold_p(res.piece("drift").threshold, res.number("p_drift"))


def fmt_bias(pair: PairResult | Mapping[str, Any]) -> str:
    """Prompts whose chosen-token logprob cascade raised / lowered, and the sign test, e.g. `18↑ 41↓, p=0.0038`."""
    res = _typed(pair)
    up, down = as_int(res.number("bias_up")), as_int(res.number("bias_down"))
    if up is None or down is None or up + down == 0:
        return MISSING
    p = res.piece("bias").value
    return f"{up}↑ {down}↓" + ("" if is_missing(p) else f", {fmt_p_eq(p)}")


def _yes_no(v) -> str:
    # None: the prediction depends on something not recorded (the decode cost model needs the SM count).
    if isinstance(v, bool):
        return "yes" if v else "no"
    return "?" if v is None else MISSING


def fmt_prediction(p: dict | None) -> str:
    """Format one cell's prediction as `prefill/decode`, e.g. `yes/no (decode from 45)`; `?` = unknown."""
    if not p:
        return MISSING
    s = f"{_yes_no(p.get('prefill'))}/{_yes_no(p.get('decode'))}"
    frm = as_int(p.get("decode_from_batch"))
    if p.get("decode") is not True and frm is not None:
        s += f" (decode from {frm})"
    if p.get("fa2_split") is True:  # decode steps in FA2's split-KV path: the field bug's band
        s += ", FA2 split-KV"
    return s


def fmt_if_pair(pair: PairResult | Mapping[str, Any]) -> str:
    """Format IF strict accuracy of a pair: `test vs ref (Δ, McNemar p)`."""
    res = _typed(pair)
    n = res.number
    if (as_int(n("if_n")) or 0) <= 0:
        return MISSING
    return (
        f"{fmt_float(n('if_strict_test'))} vs {fmt_float(n('if_strict_ref'))} "
        f"({fmt_float(n('if_strict_delta'), '+.3f')}, p={fmt_p(n('p_if'))}, n={fmt_int(n('if_n'))})"
    )


def verdict_table(data: RunData) -> Table:
    """Build one row per cascade pair (calibration pairs have their own table)."""
    pairs = cascade_pairs(data)
    axes = varying_axes(pairs)
    preds = predictions(data)
    show_if = has_if(pairs)
    with_depth = shows_depth(data.twin)
    headers = [
        "pair",
        "tp",
        "batch",
        *axes,
        # The verdict sits next to the pair it judges: at the far right of a wide table it scrolled away.
        "verdict",
        data.twin.effect_label,
        *(["predicted (prefill/decode)"] if preds else []),
        *(["depth"] if with_depth else []),
        "drift ratio [95% CI]",
        "drift threshold / p",
        "bias (up/down, sign test)",
        "control",
        "diverged vs noise",
        "top-k viol. vs noise",
        "Δseq-rep-4 [95% CI]",
        *([if_column(data)] if show_if else []),
        "reasons",
    ]
    rows = []
    th = thresholds(data)
    for r in pairs:
        res = result_of(r, th)
        c = res.counts
        verdict = res.verdict or MISSING
        rows.append(
            [
                res.pair_id or MISSING,
                fmt_int(res.number("tp")),
                fmt_int(res.number("batch")),
                *(text_of(r.get(a)) for a in axes),
                Strong(verdict) if verdict == REGRESSION else verdict,
                fmt_ratio(c.cascade_steps, c.total_steps),
                *([fmt_prediction(preds.get(res.text("test_cell") or MISSING))] if preds else []),
                *([res.depth or MISSING] if with_depth else []),
                fmt_drift(res),
                fmt_drift_rule(res),
                fmt_bias(res),
                res.text("control_pair_id") or MISSING,
                _vs(
                    fmt_ratio(c.n_diverged, c.n),
                    fmt_ratio(c.noise_n_diverged, c.noise_n),
                    res.piece("divergence").value,
                ),
                _vs(fmt_int(c.topk_violations), fmt_int(c.noise_topk_violations), res.piece("top-k").value),
                fmt_ci(
                    res.number("d_seq_rep_4_mean"),
                    res.piece("repetition").value,
                    res.number("d_seq_rep_4_hi"),
                ),
                *([fmt_if_pair(res)] if show_if else []),
                res.text("reasons") or MISSING,
            ]
        )
    return Table(headers, rows, wrap=frozenset({"reasons"}))
