"""The verdict table: one row per cascade pair, and the formatting of its evidence columns."""

from __future__ import annotations

from cascade_repro.judge.outcome import ERROR, IDENTICAL, INCONCLUSIVE, NOT_EXERCISED, REGRESSION
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
    fmt_x,
    fmt_x_ci,
    is_missing,
    text_of,
    text_or_missing,
)
from cascade_repro.report.view import Table, cascade_pairs, has_if, predictions, varying_axes


def _vs(k: str, n_k: str, p) -> str:
    """`3/4 vs 1/4, p=0.0714`: a count next to its noise count and the test's p-value."""
    if k == MISSING:
        return MISSING
    return f"{k} vs {n_k}" + ("" if is_missing(p) else f", {fmt_p_eq(p)}")


def fmt_drift(r: dict) -> str:
    """The drift ratio with its bootstrap CI, e.g. `1.35 [1.25, 1.46]`."""
    return fmt_x_ci(r.get("drift_ratio"), r.get("drift_ratio_lo"), r.get("drift_ratio_hi"))


def fmt_drift_rule(r: dict) -> str:
    """The effective drift threshold and the permutation p-value, e.g. `> 1.14, p=0.0005`."""
    return fmt_threshold_p(r.get("drift_threshold"), r.get("p_drift"))


def fmt_bias(r: dict) -> str:
    """Prompts whose chosen-token logprob cascade raised / lowered, and the sign test, e.g. `18↑ 41↓, p=0.0038`."""
    up, down = as_int(r.get("bias_up")), as_int(r.get("bias_down"))
    if up is None or down is None or up + down == 0:
        return MISSING
    return f"{up}↑ {down}↓" + ("" if is_missing(r.get("p_bias")) else f", {fmt_p_eq(r.get('p_bias'))}")


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


def fmt_if_pair(r: dict) -> str:
    """Format IF strict accuracy of a pair: `test vs ref (Δ, McNemar p)`."""
    if (as_int(r.get("if_n")) or 0) <= 0:
        return MISSING
    return (
        f"{fmt_float(r.get('if_strict_test'))} vs {fmt_float(r.get('if_strict_ref'))} "
        f"({fmt_float(r.get('if_strict_delta'), '+.3f')}, p={fmt_p(r.get('p_if'))}, n={fmt_int(r.get('if_n'))})"
    )


def verdict_table(data: RunData) -> Table:
    """Build one row per cascade pair (calibration pairs have their own table)."""
    pairs = cascade_pairs(data)
    axes = varying_axes(pairs)
    preds = predictions(data)
    show_if = has_if(pairs)
    headers = [
        "pair",
        "tp",
        "batch",
        *axes,
        # The verdict sits next to the pair it judges: at the far right of a wide table it scrolled away.
        "verdict",
        "cascade steps",
        *(["predicted (prefill/decode)"] if preds else []),
        "depth",
        "drift ratio [95% CI]",
        "drift threshold / p",
        "bias (up/down, sign test)",
        "control",
        "diverged vs noise",
        "top-k viol. vs noise",
        "Δseq-rep-4 [95% CI]",
        *(["IF strict cascade vs flat"] if show_if else []),
        "reasons",
    ]
    rows = []
    for r in pairs:
        verdict = text_of(r.get("verdict"))
        rows.append(
            [
                text_of(r.get("pair_id")),
                fmt_int(r.get("tp")),
                fmt_int(r.get("batch")),
                *(text_of(r.get(a)) for a in axes),
                Strong(verdict) if verdict == REGRESSION else verdict,
                fmt_ratio(r.get("cascade_steps"), r.get("total_steps")),
                *([fmt_prediction(preds.get(text_of(r.get("test_cell"))))] if preds else []),
                text_or_missing(r.get("depth")),
                fmt_drift(r),
                fmt_drift_rule(r),
                fmt_bias(r),
                text_or_missing(r.get("control_pair_id")),
                _vs(
                    fmt_ratio(r.get("n_diverged"), r.get("n")),
                    fmt_ratio(r.get("noise_n_diverged"), r.get("noise_n")),
                    r.get("p_divergence"),
                ),
                _vs(
                    fmt_int(r.get("topk_violations")),
                    fmt_int(r.get("noise_topk_violations")),
                    r.get("p_topk"),
                ),
                fmt_ci(r.get("d_seq_rep_4_mean"), r.get("d_seq_rep_4_lo"), r.get("d_seq_rep_4_hi")),
                *([fmt_if_pair(r)] if show_if else []),
                text_of(r.get("reasons")),
            ]
        )
    return Table(headers, rows, wrap=frozenset({"reasons"}))


def _num(v) -> float:
    """v as a float, NaN where missing or not a number."""
    try:
        return float("nan") if is_missing(v) else float(v)
    except (TypeError, ValueError):
        return float("nan")


def _over(value, bar, unit: str = "x") -> str:
    """` > 1.14x` or ` ≤ 1.14x`: the comparison the numbers make (nothing where either is missing)."""
    v, b = _num(value), _num(bar)
    if v != v or b != b:
        return ""
    return f" {'>' if v > b else '≤'} {fmt_x(b) if unit == 'x' else f'{b:g}'}{unit}"


def _p_vs(p, bar: float) -> str:
    """`p=0.0012 < 0.005`: a p-value against the level it must get under."""
    if is_missing(p):
        return "p —"
    return f"{fmt_p_eq(p)} {'<' if _num(p) < bar else '≥'} {bar:g}"


def _divergence(r: dict, alpha: float, rep_delta: float) -> str:
    counts = f"{fmt_ratio(r.get('n_diverged'), r.get('n'))} vs {fmt_ratio(r.get('noise_n_diverged'), r.get('noise_n'))}"
    return f"diverged {counts}: {_p_vs(r.get('p_divergence'), alpha)}"


def _topk(r: dict, alpha: float, rep_delta: float) -> str:
    counts = f"{fmt_int(r.get('topk_violations'))} vs {fmt_int(r.get('noise_topk_violations'))}"
    return f"outside top-k {counts}: {_p_vs(r.get('p_topk'), alpha)}"


def _drift(r: dict, alpha: float, rep_delta: float) -> str:
    return f"drift {fmt_x(r.get('drift_ratio'))}x{_over(r.get('drift_ratio'), r.get('drift_threshold'))}"


def _bias(r: dict, alpha: float, rep_delta: float) -> str:
    counts = f"{fmt_int(r.get('bias_up'))}↑ {fmt_int(r.get('bias_down'))}↓"
    return f"bias {counts}: {_p_vs(r.get('p_bias'), alpha / 2)}"


def _repetition(r: dict, alpha: float, rep_delta: float) -> str:
    lo = r.get("d_seq_rep_4_lo")
    return f"Δseq-rep-4 CI low {fmt_float(lo, '+.3f')}{_over(lo, rep_delta, unit='')}"


# The evidence a regression can rest on (``verdicts.decide``'s order), each shown as its number
# against its bar, and whether its numbers cleared the bar (for runs that did not record ``decided_by``).
_EVIDENCE = {
    "bias": _bias,
    "drift": _drift,
    "divergence": _divergence,
    "top-k": _topk,
    "repetition": _repetition,
}
_FIRES = {
    "bias": lambda r, a, d: _num(r.get("p_bias")) < a / 2,
    "drift": lambda r, a, d: _num(r.get("drift_ratio")) > _num(r.get("drift_threshold")),
    "divergence": lambda r, a, d: _num(r.get("p_divergence")) < a,
    "top-k": lambda r, a, d: _num(r.get("p_topk")) < a and _num(r.get("topk_violations")) > 0,
    "repetition": lambda r, a, d: _num(r.get("d_seq_rep_4_lo")) > d,
}


def deciding_evidence(r: dict, alpha: float = 0.01, rep_delta: float = 0.02) -> str:
    """The one number that decided a pair's verdict, against its threshold, in a few words.

    A regression shows the first evidence that fired (``decided_by``; the others are named after
    it); a clean verdict shows the count that held (divergence against its control, else drift).
    """
    verdict = text_of(r.get("verdict"))
    if verdict == NOT_EXERCISED:
        return f"cascade steps {fmt_ratio(r.get('cascade_steps'), r.get('total_steps'))}"
    if verdict == ERROR:
        return "a cell did not finish"
    if verdict == INCONCLUSIVE:
        return "no noise control measured"
    if verdict == IDENTICAL:
        return f"diverged {fmt_ratio(r.get('n_diverged'), r.get('n'))}"
    if text_of(r.get("rule")) == "reference" and not is_missing(r.get("ref_ratio")):
        s = f"error vs reference {fmt_x(r.get('ref_ratio'))}x{_over(r.get('ref_ratio'), r.get('ref_min_effect'))}"
        return f"{s}, {_p_vs(r.get('p_ref'), alpha)}"
    fired = [k for k in str(r.get("decided_by") or "").split(",") if k in _EVIDENCE]
    if verdict == REGRESSION and not fired:
        fired = [k for k, fires in _FIRES.items() if fires(r, alpha, rep_delta)]
    if fired:
        key = fired[0]
    else:
        key = (
            "divergence" if not is_missing(r.get("noise_n")) or is_missing(r.get("drift_ratio")) else "drift"
        )
    s = _EVIDENCE[key](r, alpha, rep_delta)
    if len(fired) > 1:
        s += "; +" + ", ".join(fired[1:])
    return s


def compact_table(data: RunData) -> Table:
    """The verdicts in four columns: pair, verdict, the number that decided it, and where cascade ran."""
    th = data.manifest.thresholds
    alpha, rep_delta = _number(th.get("alpha"), 0.01), _number(th.get("rep_delta"), 0.02)
    rows = []
    for r in cascade_pairs(data):
        verdict = text_of(r.get("verdict"))
        rows.append(
            [
                text_of(r.get("pair_id")),
                Strong(verdict) if verdict == REGRESSION else verdict,
                deciding_evidence(r, alpha, rep_delta),
                text_or_missing(r.get("depth")),
            ]
        )
    return Table(["pair", "verdict", "decided by (vs threshold)", "depth"], rows)


def _number(v, default: float) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return default
    return f if f == f else default
