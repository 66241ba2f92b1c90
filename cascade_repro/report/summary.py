"""What a reader sees first, in report.md and report.html alike: the stack in one line (model,
dtype, vLLM, GPU, FA version and backend, the twin), and one row per cascade pair with the evidence
that decided its verdict next to its threshold. Every row fits a GitHub issue's column; the full
evidence of every pair stays in the verdict table."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from cascade_repro.judge.outcome import ERROR, IDENTICAL, INCONCLUSIVE, NOT_EXERCISED, REGRESSION
from cascade_repro.judge.result import PairResult
from cascade_repro.judge.statistics import statistic
from cascade_repro.judge.verdicts import ENGINE_FAULT, REFERENCE
from cascade_repro.plan.matrix import spec_of
from cascade_repro.report.load import RunData
from cascade_repro.report.text import (
    MISSING,
    Strong,
    as_int,
    fmt_float,
    fmt_int,
    fmt_p_eq,
    fmt_ratio,
    fmt_x,
    is_missing,
    one_line,
    portable_paths,
    text_of,
    truncate,
)
from cascade_repro.report.view import DEFAULTS as DEFAULTS
from cascade_repro.report.view import (
    Table,
    cascade_results,
    cells,
    pair_label,
    ran_vllm,
    result_of,
    shows_depth,
    spec_field,
    thresholds,
)
from cascade_repro.twin import CASCADE as TWIN
from cascade_repro.vllm_surface import faults

# The widest summary row, in characters of cell text: GitHub's issue column is about 830 px at
# desktop width, its 14 px text about 7 px a character, less each cell's 26 px of padding. report.md
# shows no other table open (wider ones sit in <details>, which GitHub scrolls sideways), and
# report.html shows the same rows, so a reader of either sees the same words.
ISSUE_COLUMN_CHARS = 100
SUMMARY_HEADERS = ("pair", "verdict", "decided by (vs threshold)", "depth")
# A fact is a version or a name; a longer value is a damaged or hostile run.json.
FACT_MAX = 120


def _values(items) -> list[str]:
    """Distinct non-empty texts in first-seen order."""
    out: list[str] = []
    for v in items:
        s = "" if v is None or is_missing(v) else str(v)
        if s and s not in out:
            out.append(s)
    return out


def stack_facts(data: RunData) -> list[tuple[str, str]]:
    """(label, value) of what a maintainer asks first, each only where the run recorded it. What
    the engines read back wins over what the spec asked for (``dtypes: auto`` ran as bfloat16)."""
    m = data.manifest
    env = m.stack_env or {}
    effective = [e.effective for _, e in sorted(m.engines.items()) if isinstance(e.effective, dict)]
    out: list[tuple[str, str]] = []
    # The model's recorded name ("SmolLM2-135M-Instruct (Q4_1 GGUF ...)") says more than the spec's "embedded".
    model = m.model_name if m.has("model_name") and m.model_name else spec_field(data, "model")
    if model:
        out.append(("model", str(model)))
    dtypes = _values(e.get("dtype") for e in effective) or _values(spec_field(data, "dtypes") or [])
    if dtypes:
        out.append(("dtype", ", ".join(dtypes)))
    spec = spec_of(m.spec_json)
    if ran_vllm(spec):
        vllm = _values([env.get("vllm")] + [e.get("vllm") for e in effective])
        out.append(("vLLM", ", ".join(vllm) or MISSING))
    else:
        out.append(("engine", text_of(spec.engine)))
    if gpu := env.get("gpu_name"):
        count, sms = as_int(env.get("gpu_count")), as_int(env.get("sm_count"))
        out.append(
            ("GPU", f"{gpu}{f' x{count}' if count and count > 1 else ''}{f' ({sms} SMs)' if sms else ''}")
        )
    elif device := env.get("device") or spec_field(data, "device"):
        out.append(("device", str(device)))
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
    axis = m.twin
    switch = m.arm_switch if m.has("arm_switch") and m.arm_switch else spec_field(data, "arm_switch")
    twin = f"{axis.test} vs {axis.ref}" if axis is TWIN else f"{axis.name}: {axis.test} vs {axis.ref}"
    # One engine switching the arms (cascade's toggle) or an engine start per arm.
    out.append(("twin", f"{twin} ({switch})" if switch and axis.toggle else twin))
    if m.several:
        out[-1] = ("twins", ", ".join(t.name for t in m.twins))
    # A model given as a local path would name the user's machine in a public issue.
    return [(k, truncate(one_line(portable_paths(v)), FACT_MAX)) for k, v in out]


def _num(v) -> float:
    """v as a float, NaN where missing or not a number."""
    try:
        return float("nan") if is_missing(v) else float(v)
    except (TypeError, ValueError):
        return float("nan")


def _over(value, bar) -> str:
    """` > 1.14x` or ` ≤ 1.14x`: where a ratio stands against its threshold (nothing where either is missing)."""
    v, b = _num(value), _num(bar)
    if v != v or b != b:
        return ""
    return f" {'>' if v > b else '≤'} {fmt_x(b)}x"


def _p_vs(p, bar: float) -> str:
    """`p=0.0012 < 0.005`: a p-value against the level it must get under."""
    if is_missing(p):
        return "p —"
    return f"{fmt_p_eq(p)} {'<' if _num(p) < bar else '≥'} {bar:g}"


class _Formats:
    """How a statistic's words write their numbers (``judge/statistics.Formats``): this report's."""

    int = staticmethod(fmt_int)
    x = staticmethod(fmt_x)
    ratio = staticmethod(fmt_ratio)
    float = staticmethod(fmt_float)
    p_vs = staticmethod(_p_vs)
    over = staticmethod(_over)
    missing = staticmethod(is_missing)


FORMATS = _Formats()


def evidence_text(res: PairResult, name: str, *, short: bool = False) -> str:
    """The named evidence piece of the pair in words, its numbers against its bar (the statistic's
    own words, ``judge/statistics.STATISTICS``; whether it fired, the piece says)."""
    stat = statistic(name)
    words = stat.short if short and stat.short is not None else stat.text
    return words(res, res.piece(name), FORMATS)


def _texts(res: PairResult, names: list[str], *, short: bool = False) -> list[tuple[str, str]]:
    """Each named evidence piece of the pair as (name, its numbers against its bar)."""
    return [(k, evidence_text(res, k, short=short)) for k in names]


def _pack_fitting(res: PairResult, names: list[str], width: int | None, *, name_rest: bool) -> str:
    """:func:`_pack` of the pieces' full texts, or of their short ones where the full first piece
    and the names after it do not fit ``width``."""
    text = _pack(_texts(res, names), width, name_rest=name_rest)
    if width is not None and len(text) > width:
        text = _pack(_texts(res, names, short=True), width, name_rest=name_rest)
    return text


def _pack(pieces: list[tuple[str, str]], width: int | None, *, name_rest: bool) -> str:
    """The pieces' texts joined while they fit ``width`` characters; the first is always shown.
    With ``name_rest``, pieces left out are named after them (`; +top-k, repetition`): a regression
    says everything that fired, its numbers where there is room."""
    text = pieces[0][1]
    for i, (_, piece) in enumerate(pieces[1:], 1):
        rest = [name for name, _ in pieces[i + 1 :]]
        longer = f"{text}; {piece}"
        if width is None or len(longer + (f"; +{', '.join(rest)}" if rest and name_rest else "")) <= width:
            text = longer
        elif name_rest:
            return f"{text}; +{', '.join(name for name, _ in pieces[i:])}"
        else:
            return text
    return text


def _unfinished(r: dict, status: dict[str, str]) -> str:
    """Which of the pair's cells did not finish, by id where the cell table says."""
    for side, key in (("test", "test_cell"), ("twin", "ref_cell")):
        cell = text_of(r.get(key))
        if status.get(cell) in ("error", "pending"):
            return f"{side} cell {cell} did not finish"
    return "a cell did not finish"


def deciding_evidence(
    r: Mapping[str, Any] | PairResult,
    th: dict,
    width: int | None = None,
    status: dict[str, str] | None = None,
) -> str:
    """The evidence that decided a cascade pair's verdict, each number against its threshold, in
    at most ``width`` characters where it can (the first piece is shown whatever its length).

    A regression shows what fired (``decided_by``; for a run that did not record it, whatever
    cleared its bar), as many with their numbers as fit and the rest by name; the reference rule its
    error ratio against the run's minimum effect; a clean pair the numbers that came nearest
    (divergence against its control, then drift). ``status``: each cell's status, to name a cell
    that did not finish.
    """
    res = r if isinstance(r, PairResult) else result_of(r, th)
    r = res.row
    verdict, c = res.verdict, res.counts
    diverged = f"diverged {fmt_ratio(c.n_diverged, c.n)}"
    if verdict == NOT_EXERCISED:
        return f"cascade never fired ({fmt_ratio(c.cascade_steps, c.total_steps)} steps)"
    if verdict == ERROR:
        return _unfinished(r, status or {})
    if verdict == REGRESSION and ENGINE_FAULT in res.decided_by:
        # Where it does not fit: the assertion by file and line (its condition is in the reasons).
        full = text_of(r.get("reasons")) or "the test arm's engine died of a kernel fault"
        if width is None or len(full) <= width:
            return full
        where = re.search(r"device-side assertion (\S+)", full)
        short = f"test arm's engine died: {where.group(1) if where else faults.KERNEL}; twin finished"
        return short if len(short) <= width else "test arm's engine died; twin finished"
    if verdict == IDENTICAL:
        return diverged
    if verdict == INCONCLUSIVE:
        return _pack([("", "no noise control measured"), ("", diverged)], width, name_rest=False)
    if res.rule == REFERENCE and not is_missing(res.piece(REFERENCE).value):
        # The reference rule's statistics: a regression's that fired, else every one it measured.
        judged = [p.name for p in res.evidence if p.rule == REFERENCE]
        names = [k for k in judged if res.piece(k).fired] if verdict == REGRESSION else judged
        if len(names := names or judged) == 1:
            full = evidence_text(res, names[0])
            return full if width is None or len(full) <= width else evidence_text(res, names[0], short=True)
        return _pack_fitting(res, names, width, name_rest=verdict == REGRESSION)
    if verdict == REGRESSION and (fired := res.fired()):
        return _pack_fitting(res, fired, width, name_rest=True)
    nearest = [
        k for k, v in (("divergence", c.noise_n), ("drift", res.piece("drift").value)) if not is_missing(v)
    ]
    return _pack(_texts(res, nearest or ["divergence"]), width, name_rest=False)


def summary_table(data: RunData, width: int | None = ISSUE_COLUMN_CHARS) -> Table:
    """One row per cascade pair: its id, verdict, the deciding evidence with its threshold, and
    where cascade ran (the cascade twin only); each row's evidence within ``width`` characters of
    cell text where it can."""
    th = thresholds(data)
    status = {text_of(c.get("cell_id")): text_of(c.get("status")) for c in cells(data)}
    with_depth = shows_depth(data.twin)
    rows = []
    for res in cascade_results(data):
        pair = pair_label(data, res.pair_id) or MISSING
        verdict, depth = res.verdict or MISSING, res.depth or MISSING
        room = None if width is None else width - len(pair) - len(verdict) - (len(depth) if with_depth else 0)
        rows.append(
            [
                pair,
                Strong(verdict) if verdict == REGRESSION else verdict,
                deciding_evidence(res, th, room, status),
                *([depth] if with_depth else []),
            ]
        )
    headers = list(SUMMARY_HEADERS if with_depth else SUMMARY_HEADERS[:-1])
    return Table(headers, rows, wrap=frozenset({SUMMARY_HEADERS[2]}))
