"""The report's view of the reference: each arm's error against it, pair by pair, and by decode step.

Read from the pairs table's ``ref_*`` columns (``judge/compare.py``); a run without a reference pass
(``--reference off``, or an older run) has none, and the report then says the arm-vs-arm rule decided.
"""

from __future__ import annotations

import json
import math
from html import escape

from cascade_repro.judge.result import PairResult
from cascade_repro.judge.verdicts import REFERENCE
from cascade_repro.report import view
from cascade_repro.report.load import RunData
from cascade_repro.report.text import MISSING, fmt_int, fmt_p, fmt_sig_pair, fmt_x_ci, is_missing, truncate

W, H = 300, 150
LEFT, RIGHT, TOP, BOTTOM = 46, 10, 24, 30
TEST_COLOR, TWIN_COLOR = "#d1242f", "#0969da"


def _judged(data: RunData) -> list[PairResult]:
    """The cascade pairs' typed results, then the calibration pairs'."""
    return view.cascade_results(data) + view.calibration_results(data)


def has_reference(data: RunData) -> bool:
    return any(res.rule == REFERENCE for res in _judged(data))


def has_topk(data: RunData) -> bool:
    """Whether any pair measured the top-k distribution error (a run whose records carry the arms' ids)."""
    return any(
        math.isfinite(res.number("ref_topk_ratio")) for res in _judged(data) + view.control_results(data)
    )


def rule_note(data: RunData) -> str:
    """Which rule decided the verdicts, in one sentence."""
    ran = data.manifest.reference if isinstance(data.manifest.reference, dict) else {}
    if has_reference(data):
        dtype = next(
            (res.text("reference") for res in view.cascade_results(data) if res.text("reference")), ""
        )
        note = (
            f"Verdicts decided against a {dtype} reference: every token each arm generated was read again, "
            "teacher-forced, by the same weights at more precision; a pair is a regression when the test arm's "
            "mean error exceeds its twin's beyond chance (sign and Wilcoxon tests, the better doubled, below alpha) "
            "and beyond the largest ratio this run's own flat-vs-flat controls show."
        )
        if has_topk(data):
            note += (
                " Two errors are tested, the chosen token's and the top-k distribution's (every token id the arm "
                "listed), each at alpha/2 (Bonferroni): either one flags the pair; over 8 prompts or fewer no test "
                "can reach alpha/2, and the chosen token's is tested alone at alpha."
            )
        return note
    status = str(ran.get("status") or "")
    why = {
        "off": "the reference pass was turned off (--reference off)",
        "no weights": "the engine has no weights to teacher-force (the fake engine)",
        "done": "the reference pass ran, but no pair was exercised for it to judge",
        "": "this run has no reference pass",
    }.get(status, f"the reference pass did not finish ({status})")
    return f"Verdicts decided by the arm-vs-arm rule (drift, bias, divergence counts): {why}."


def _num(v: object, spec: str = ".3g") -> str:
    return "—" if is_missing(v) else format(float(v), spec)


def reference_table(data: RunData) -> view.Table:
    """One row per pair the reference scored: cascade pairs, calibration pairs, then the controls (the null)."""
    rows = []
    topk = has_topk(data)
    for control, res in [(False, r) for r in _judged(data)] + [(True, r) for r in view.control_results(data)]:
        n = res.number
        if not math.isfinite(n("ref_ratio")):
            continue
        rows.append(
            [
                res.pair_id or MISSING,
                "control" if control else res.verdict or MISSING,
                fmt_x_ci(n("ref_ratio"), n("ref_ratio_lo"), n("ref_ratio_hi")),
                " vs ".join(fmt_sig_pair(n("ref_err_test"), n("ref_err_twin"))),
                f"{fmt_int(n('ref_up'))}/{fmt_int(n('ref_down'))}",
                f"{fmt_p(n('p_ref_sign'))} / {fmt_p(n('p_ref_wilcoxon'))}",
                "—" if control else _num(n("ref_min_effect")),
                " vs ".join(fmt_sig_pair(n("ref_regret_test"), n("ref_regret_twin"))),
                *(_topk_cells(res, control) if topk else []),
            ]
        )
    headers = [
        "pair", "verdict", "error ratio [95% CI]", "error test vs twin (nats/token)", "larger/smaller",
        "p sign / Wilcoxon", "min effect", "regret test vs twin",
        *(["top-k error ratio [95% CI]", "top-k error test vs twin", "top-k p sign / Wilcoxon", "top-k min effect"]
          if topk else []),
    ]  # fmt: skip
    return view.Table(headers, rows)


def _topk_cells(res: PairResult, control: bool) -> list[str]:
    """The top-k distribution error's cells of a pair (``judge/metrics/topk.py``)."""
    n = res.number
    return [
        fmt_x_ci(n("ref_topk_ratio"), n("ref_topk_ratio_lo"), n("ref_topk_ratio_hi")),
        " vs ".join(fmt_sig_pair(n("ref_topk_test"), n("ref_topk_twin"))),
        f"{fmt_p(n('p_ref_topk_sign'))} / {fmt_p(n('p_ref_topk_wilcoxon'))}",
        "—" if control else _num(n("ref_topk_min_effect")),
    ]


REFERENCE_NOTE = (
    "error: per prompt, the mean |logprob(arm) - logprob(reference)| of the tokens that arm generated, all of "
    "them, past any divergence, each arm on its own path; the ratio is the test arm's mean over its twin's, "
    "with a bootstrap CI over prompts. larger/smaller: prompts where the test arm's error is the larger / the "
    "smaller (ties at the dtype's resolution are neither). min effect: the largest ratio, either way round, of "
    "this run's flat-vs-flat controls of the same configuration (the rows marked control): what an equivalent "
    "recomputation does. regret: per prompt, the reference's logprob of its own argmax minus that of the arm's "
    "choice, summed over the answer."
)
TOPK_NOTE = (
    "top-k error: per prompt, the mean over generated positions of the mean |logprob(arm) - logprob(reference)| "
    "over every token id in the arm's own top-k list (the reference's exact logprob of each, from its full "
    "distribution), tested like the error above with its own minimum effect; with both measured each is tested "
    "at alpha/2 (Bonferroni) and either flags the pair."
)


def reference_note(data: RunData) -> str:
    """The reference table's note: what each column is (the top-k error's where the run measured it)."""
    return f"{REFERENCE_NOTE} {TOPK_NOTE}" if has_topk(data) else REFERENCE_NOTE


def _curve(v: object) -> list[float]:
    if not isinstance(v, str) or not v:
        return []
    try:
        vals = json.loads(v)
    except ValueError:
        return []
    return (
        [float(x) if isinstance(x, int | float) else math.nan for x in vals] if isinstance(vals, list) else []
    )


def binned(curve: list[float], bins: int = 8) -> list[float]:
    """The curve's means over ``bins`` equal spans of decode steps (for one line of text)."""
    if not curve:
        return []
    size = max(1, math.ceil(len(curve) / bins))
    out = []
    for i in range(0, len(curve), size):
        vals = [v for v in curve[i : i + size] if v == v]
        out.append(sum(vals) / len(vals) if vals else math.nan)
    return out


def by_step_lines(data: RunData) -> list[str]:
    """Per cascade pair, the binned error by decode step of both arms, one line each (report.md)."""
    out = []
    for res in _judged(data):
        t, w = _curve(res.text("ref_by_step_test")), _curve(res.text("ref_by_step_twin"))
        if not t or not w:
            continue
        size = max(1, math.ceil(len(t) / 8))
        fmt = ", ".join
        out.append(
            f"{res.pair_id or MISSING} (steps in spans of {size}): test {fmt(_num(v, '.2g') for v in binned(t))}"
            f" | twin {fmt(_num(v, '.2g') for v in binned(w))}"
        )
    return out


def by_step_plots(data: RunData) -> str:
    """Small multiples: per cascade pair, the error against the reference by decode step, test and twin."""
    plots = []
    for res in _judged(data):
        t, w = _curve(res.text("ref_by_step_test")), _curve(res.text("ref_by_step_twin"))
        if t and w:
            plots.append(_plot(res.pair_id or MISSING, res.verdict or MISSING, t, w))
    if not plots:
        return '<p class="nodata">error by decode step: no reference</p>'
    return '<div class="multiples">' + "".join(plots) + "</div>"


def _plot(title: str, verdict: str, test: list[float], twin: list[float]) -> str:
    vals = [v for v in test + twin if v == v]
    top = max(vals, default=1.0) or 1.0
    n = max(len(test), len(twin))
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def pt(i: int, v: float) -> str:
        x = LEFT + (pw * i / max(n - 1, 1))
        y = TOP + ph - ph * (v / top)
        return f"{x:.1f},{y:.1f}"

    def line(curve: list[float], color: str) -> str:
        pts = " ".join(pt(i, v) for i, v in enumerate(curve) if v == v)
        return f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"/>'

    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" '
        f'aria-label="{escape(title)}: error against the reference by decode step">'
        f"<title>{escape(title)} ({escape(verdict)})</title>"
        # cut to the plot's width (~6 px a character at 11 px), the whole name in the tooltip
        f'<text x="{LEFT}" y="14" font-size="11">{escape(truncate(f"{title} ({verdict})", (W - LEFT) // 6))}</text>'
        f'<line x1="{LEFT}" y1="{TOP + ph}" x2="{LEFT + pw}" y2="{TOP + ph}" stroke="#888"/>'
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + ph}" stroke="#888"/>'
        f'<text x="{LEFT - 4}" y="{TOP + 4}" font-size="9" text-anchor="end">{top:.2g}</text>'
        f'<text x="{LEFT - 4}" y="{TOP + ph}" font-size="9" text-anchor="end">0</text>'
        f'<text x="{LEFT + pw}" y="{TOP + ph + 12}" font-size="9" text-anchor="end">step {n - 1}</text>'
        f'<text x="{LEFT}" y="{TOP + ph + 12}" font-size="9">0</text>'
        f"{line(twin, TWIN_COLOR)}{line(test, TEST_COLOR)}"
        # The legend sits on the axis line's row, between its ends: the title above has the width to itself.
        f'<text x="{LEFT + pw / 2 + 4:.1f}" y="{TOP + ph + 12}" font-size="9" fill="{TEST_COLOR}">test</text>'
        f'<text x="{LEFT + pw / 2 - 4:.1f}" y="{TOP + ph + 12}" font-size="9" text-anchor="end" fill="{TWIN_COLOR}">twin</text>'
        "</svg>"
    )


BY_STEP_NOTE = (
    "Mean |logprob(arm) - logprob(reference)| at each generated-token index over the prompts that reached it: "
    "red the test arm, blue its twin. A fault that begins mid-answer shows as a step where the red line leaves "
    "the blue one."
)
