"""What a maintainer reads first, format-neutral: the stack in one line (model, dtype, vLLM, GPU,
FA version and backend, the twin), and one row per cascade pair with the number that decided it
next to its threshold. The full evidence of every pair stays in the verdict table."""

from __future__ import annotations

from cascade_repro.judge.outcome import (
    ERROR,
    IDENTICAL,
    INCONCLUSIVE,
    NOT_EXERCISED,
    REGRESSION,
)
from cascade_repro.report.load import RunData
from cascade_repro.report.text import (
    MISSING,
    Strong,
    as_int,
    fmt_ci,
    fmt_ratio,
    fmt_x,
    fmt_x_ci,
    is_missing,
    text_of,
    text_or_missing,
)
from cascade_repro.report.view import Table, cascade_pairs, ran_vllm, spec_field
from cascade_repro.twin import CASCADE as TWIN

SUMMARY_HEADERS = ("pair", "verdict", "deciding evidence (vs threshold)", "depth")
DEFAULT_ALPHA, DEFAULT_DRIFT_MIN, DEFAULT_REP_DELTA = 0.01, 2.0, 0.02


def _values(items) -> list[str]:
    """Distinct non-empty texts in first-seen order."""
    out: list[str] = []
    for v in items:
        s = "" if v is None or is_missing(v) else str(v)
        if s and s not in out:
            out.append(s)
    return out


def stack_facts(data: RunData) -> list[tuple[str, str]]:
    """(label, value) of what a maintainer asks first, each only where the run recorded it."""
    m = data.manifest
    env = m.stack_env or {}
    effective = [e.effective for _, e in sorted(m.engines.items())]
    out: list[tuple[str, str]] = []
    model = str(m.model_name) if m.has("model_name") and m.model_name else spec_field(data, "model")
    if model:
        out.append(("model", str(model)))
    dtypes = _values(e.get("dtype") for e in effective) or _values(spec_field(data, "dtypes") or [])
    if dtypes:
        out.append(("dtype", ", ".join(dtypes)))
    spec = m.spec
    if ran_vllm(spec):
        vllm = _values([env.get("vllm")] + [e.get("vllm") for e in effective])
        out.append(("vLLM", ", ".join(vllm) or MISSING))
    else:
        out.append(("engine", text_of(spec.engine)))
    gpu = env.get("gpu_name")
    if gpu:
        count = as_int(env.get("gpu_count"))
        sms = as_int(env.get("sm_count"))
        out.append(
            ("GPU", f"{gpu}{f' x{count}' if count and count > 1 else ''}{f' ({sms} SMs)' if sms else ''}")
        )
    elif env.get("device") or spec_field(data, "device"):
        out.append(("device", str(env.get("device") or spec_field(data, "device"))))
    if ran_vllm(spec):
        fa = _values(e.get("flash_attn_version") for e in effective) or _values(
            spec_field(data, "fa_versions") or []
        )
        backends = _values(e.get("attention_backend") for e in effective) or _values(
            spec_field(data, "backends") or []
        )
        if fa:
            out.append(("FA", ", ".join(fa)))
        if backends:
            out.append(("backend", ", ".join(backends)))
    switch = m.arm_switch if m.has("arm_switch") and m.arm_switch else spec_field(data, "arm_switch")
    twin = f"{TWIN.test} vs {TWIN.ref}"
    out.append(("twin", f"{twin} ({switch})" if switch else twin))
    return out


def _below(p, bar: float) -> str:
    """`p=0.0031 < 0.01` or `p=0.43 ≥ 0.01`: a p-value against its bar, the comparison spelled out."""
    if is_missing(p):
        return "p —"
    return f"p={float(p):.2g} {'<' if float(p) < bar else '≥'} {bar:g}"


def _than(v, bar) -> str:
    """`> 2.00` or `≤ 2.00`: where a ratio stands against its threshold (`vs` where either is missing)."""
    if is_missing(v) or is_missing(bar):
        return f"vs {fmt_x(bar)}"
    return f"{'>' if float(v) > float(bar) else '≤'} {fmt_x(bar)}"


def _above(v, bar) -> str:
    """`1.18 ≤ 2.00` or `2.90 > 2.00`: a ratio against its threshold."""
    return f"{fmt_x(v)} {_than(v, bar)}"


def _alpha(th: dict) -> float:
    v = th.get("alpha")
    return float(v) if isinstance(v, int | float) else DEFAULT_ALPHA


def _evidence(r: dict, kind: str, th: dict) -> str:
    """One piece of arm-vs-arm evidence as its number next to its threshold."""
    alpha = _alpha(th)
    if kind == "divergence":
        return (
            f"diverged {fmt_ratio(r.get('n_diverged'), r.get('n'))} vs "
            f"{fmt_ratio(r.get('noise_n_diverged'), r.get('noise_n'))} in control, "
            f"{_below(r.get('p_divergence'), alpha)}"
        )
    if kind == "top-k":
        return (
            f"{text_of(as_int(r.get('topk_violations')))} vs {text_of(as_int(r.get('noise_topk_violations')))} "
            f"outside top-k, {_below(r.get('p_topk'), alpha)}"
        )
    if kind == "drift":
        ci = fmt_x_ci(r.get("drift_ratio"), r.get("drift_ratio_lo"), r.get("drift_ratio_hi"))
        return f"drift ratio {ci} {_than(r.get('drift_ratio'), r.get('drift_threshold'))}"
    if kind == "bias":
        return (
            f"bias {text_of(as_int(r.get('bias_up')))}↑ {text_of(as_int(r.get('bias_down')))}↓, "
            f"sign test {_below(r.get('p_bias'), alpha / 2)}"
        )
    if kind == "repetition":
        rep = th.get("rep_delta", DEFAULT_REP_DELTA)
        return f"Δseq-rep-4 {fmt_ci(r.get('d_seq_rep_4_mean'), r.get('d_seq_rep_4_lo'), r.get('d_seq_rep_4_hi'))} > {rep:g}"
    return kind


def _reference(r: dict, th: dict) -> str:
    """The reference rule's number: the test arm's error over its twin's, against the run's controls."""
    ratio = fmt_x_ci(r.get("ref_ratio"), r.get("ref_ratio_lo"), r.get("ref_ratio_hi"))
    return (
        f"error vs {text_or_missing(r.get('reference'))} reference {ratio} x twin's "
        f"({_above(r.get('ref_ratio'), r.get('ref_min_effect'))} control), {_below(r.get('p_ref'), _alpha(th))}"
    )


def _clean_evidence(r: dict, th: dict) -> str:
    """A pair below every threshold: the two numbers that came nearest, against their thresholds."""
    parts = []
    if not is_missing(r.get("drift_ratio")):
        parts.append(f"drift ratio {_above(r.get('drift_ratio'), r.get('drift_threshold'))}")
    if not is_missing(r.get("n_diverged")) and not is_missing(r.get("noise_n")):
        parts.append(
            f"diverged {fmt_ratio(r.get('n_diverged'), r.get('n'))} vs "
            f"{fmt_ratio(r.get('noise_n_diverged'), r.get('noise_n'))} in control, "
            f"{_below(r.get('p_divergence'), _alpha(th))}"
        )
    return "; ".join(parts) or MISSING


def deciding_evidence(r: dict, th: dict) -> str:
    """The number (or numbers) that decided a cascade pair's verdict, each beside its threshold."""
    verdict = text_of(r.get("verdict"))
    if verdict in (ERROR, NOT_EXERCISED, INCONCLUSIVE):
        reason = text_of(r.get("reasons"))
        return reason.split(";")[0] if reason != MISSING else verdict
    if text_of(r.get("rule")) == "reference" and not is_missing(r.get("ref_ratio")):
        return _reference(r, th)
    if verdict == IDENTICAL:
        return f"all {text_of(as_int(r.get('n')))} outputs token-identical"
    fired = [k for k in text_of(r.get("decided_by")).split(",") if k and k != MISSING]
    if verdict == REGRESSION and fired:
        return "; ".join(_evidence(r, k, th) for k in fired)
    return _clean_evidence(r, th)


def summary_table(data: RunData) -> Table:
    """One row per cascade pair: its id, verdict, the deciding number with its threshold, depth."""
    th = data.manifest.thresholds or {}
    rows = []
    for r in cascade_pairs(data):
        verdict = text_of(r.get("verdict"))
        rows.append(
            [
                text_of(r.get("pair_id")),
                Strong(verdict) if verdict == REGRESSION else verdict,
                deciding_evidence(r, th),
                text_or_missing(r.get("depth")),
            ]
        )
    return Table(list(SUMMARY_HEADERS), rows, wrap=frozenset({SUMMARY_HEADERS[2]}))
