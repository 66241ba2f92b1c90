"""Inline SVG plots drawn by hand, so the HTML report needs no plotting library and no script."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection
from html import escape

from cascade_repro.judge import outcome
from cascade_repro.report import view
from cascade_repro.report.load import RunData
from cascade_repro.report.text import as_int, fmt_x, fmt_x_ci, is_missing, text_of, truncate

Series = dict[int, list[float]]  # x (batch size) -> values
COLORS = ("#d1242f", "#0969da", "#1a7f37", "#8250df", "#bf8700")
W, H = 640, 320
LEFT, RIGHT, TOP, BOTTOM = 64, 160, 34, 52
# An axis starts at 0 only when the data come close to it; otherwise most of the plot would be empty.
ZERO_FRACTION = 0.25


def _nice_step(span: float, target: int = 5) -> float:
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def _num(v: float) -> str:
    return f"{v:.1f}"


def _tick(v: float) -> str:
    return f"{v:g}" if abs(v) >= 1e-9 else "0"


def y_range(values: list[float]) -> tuple[float, float, float]:
    """Return (bottom, top, step) of a linear axis fitted to values, on multiples of a nice step.

    The axis starts at 0 when the minimum is below ZERO_FRACTION of the maximum, else at the nice
    step at or below the minimum; the top is the nice step at or above the maximum.
    """
    vmin, vmax = min(values), max(values)
    if vmax <= 0 and vmin >= 0:  # all zero
        step = _nice_step(1.0)
        return 0.0, step, step
    if 0 <= vmin < ZERO_FRACTION * vmax:
        step = _nice_step(vmax)
        return 0.0, step * math.ceil(vmax / step - 1e-9), step
    # A single value (no spread) still gets a band around it.
    span = vmax - vmin if vmax > vmin else abs(vmax) * 0.2
    step = _nice_step(span)
    bottom, top = step * math.floor(vmin / step + 1e-9), step * math.ceil(vmax / step - 1e-9)
    if top - bottom < step / 2:
        bottom, top = bottom - step, top + step
    if vmin >= 0:
        bottom = max(bottom, 0.0)
    return bottom, top, step


def series_styles(names: list[str], reference: Collection[str] = frozenset()) -> dict[str, tuple[str, bool]]:
    """Colour and hollowness per series named `role config`: one colour per configuration, the
    reference side (the control, the flat arm) hollow beside its configuration's solid test side."""
    configs = list(dict.fromkeys(n.partition(" ")[2] for n in names))
    return {
        n: (
            COLORS[configs.index(n.partition(" ")[2]) % len(COLORS)],
            n.partition(" ")[0] in {CONTROL, *reference},
        )
        for n in names
    }


CONTROL = "control"  # the legend's name for a noise-control series


def reference_roles(data: RunData) -> frozenset[str]:
    """The reference side of a run's series: the control, and its twin's reference arm (``flat``,
    ``prefix-off``, ``tp2``...)."""
    return frozenset({CONTROL, data.twin.ref})


def whisker_plot(
    title: str,
    xlabel: str,
    ylabel: str,
    series: dict[str, Series],
    from_zero: bool = False,
    reference: Collection[str] = frozenset(),
) -> str:
    """Draw median dots with min–max whiskers per x and series, plus every value as a faint dot;
    nothing (no "no data" box) where no series has a value.

    Series are named `role config` (``series_styles``): a configuration keeps one colour, its
    reference side drawn hollow. The legend's column is as wide as its longest name, so no name is
    cut. ``from_zero``: the axis starts at 0 (a share: close values are not stretched apart)."""
    series = {k: v for k, v in series.items() if any(v.values())}
    if not series:
        return ""
    xs = sorted({x for s in series.values() for x, vals in s.items() if vals})
    values = [v for s in series.values() for vals in s.values() for v in vals]
    ybottom, ytop, step = y_range([*values, 0.0] if from_zero else values)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    width = max(W, int(LEFT + pw + 32 + CHAR_W * max(len(n) for n in series) + 8))
    band = pw / len(xs)
    spread = min(band / (len(series) + 1), 20.0)

    def y(v: float) -> float:
        return TOP + ph - ((v - ybottom) / (ytop - ybottom)) * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {H}" width="{width}" height="{H}" '
        f'role="img" class="plot" font-family="sans-serif" font-size="11" fill="#1f2328"><title>{escape(title)}</title>',
        f'<text x="{LEFT + pw / 2:.1f}" y="18" text-anchor="middle" font-size="13" font-weight="600">{escape(title)}</text>',
    ]
    for i in range(int(round((ytop - ybottom) / step)) + 1):
        v = ybottom + i * step
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{_num(y(v))}" y2="{_num(y(v))}" stroke="#eaeef2"/>'
        )
        out.append(f'<text x="{LEFT - 6}" y="{_num(y(v) + 4)}" text-anchor="end">{_tick(v)}</text>')
    out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{TOP + ph}" y2="{TOP + ph}" stroke="#59636e"/>')
    out.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + ph}" stroke="#59636e"/>')
    for i, x in enumerate(xs):
        cx = LEFT + band * (i + 0.5)
        out.append(f'<text x="{_num(cx)}" y="{TOP + ph + 18}" text-anchor="middle">{x}</text>')
    out.append(f'<text x="{LEFT + pw / 2:.1f}" y="{H - 10}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(
        f'<text transform="translate(16 {TOP + ph / 2:.1f}) rotate(-90)" text-anchor="middle">'
        f"{escape(ylabel)}</text>"
    )
    styles = series_styles(list(series), reference)
    for j, (name, s) in enumerate(series.items()):
        color, hollow = styles[name]
        fill = f'fill="#fff" stroke="{color}" stroke-width="2"' if hollow else f'fill="{color}"'
        offset = (j - (len(series) - 1) / 2) * spread
        for i, x in enumerate(xs):
            vals = sorted(s.get(x) or [])
            if not vals:
                continue
            cx = _num(LEFT + band * (i + 0.5) + offset)
            med = statistics.median(vals)
            tip = f"{name}, {xlabel} {x}: median {med:g}, min {vals[0]:g}, max {vals[-1]:g}, n={len(vals)}"
            out.append(f"<g><title>{escape(tip)}</title>")
            out.append(
                f'<line x1="{cx}" x2="{cx}" y1="{_num(y(vals[0]))}" y2="{_num(y(vals[-1]))}" '
                f'stroke="{color}" stroke-width="2"/>'
            )
            for v in (vals[0], vals[-1]):
                out.append(
                    f'<line x1="{_num(float(cx) - 5)}" x2="{_num(float(cx) + 5)}" y1="{_num(y(v))}" '
                    f'y2="{_num(y(v))}" stroke="{color}" stroke-width="2"/>'
                )
            out.extend(
                f'<circle cx="{cx}" cy="{_num(y(v))}" r="2" fill="{color}" fill-opacity="0.45"/>'
                for v in vals
            )
            out.append(f'<circle cx="{cx}" cy="{_num(y(med))}" r="5" {fill}/></g>')
        ly = TOP + 10 + 20 * j
        out.append(f'<circle cx="{LEFT + pw + 20}" cy="{ly}" r="5" {fill}/>')
        out.append(f'<text x="{LEFT + pw + 32}" y="{ly + 4}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _add(s: Series, x, v) -> None:
    xi = as_int(x)
    if xi is not None and not is_missing(v):
        s.setdefault(xi, []).append(float(v))


AXIS_NAMES = {"fa_version": "FA", "backend": "", "dtype": "", "seed": "seed "}


def config_label(r: dict, axes: list[str]) -> str:
    """A configuration's name in a legend: the values of the axes that vary, e.g. `FA2` or
    `FA3 FLASHINFER`; empty when the run has one configuration."""
    return " ".join(f"{AXIS_NAMES.get(a, a + ' ')}{text_of(r.get(a))}" for a in axes)


def _series_name(role: str, config: str) -> str:
    return f"{role} {config}" if config else role


def _plotted_axes(data: RunData) -> list[str]:
    """The axes besides tp and batch along which the pairs differ: one series per value."""
    return view.varying_axes([r for r in data.rows("pairs") if r.get("kind") != outcome.CALIBRATION])


def first_divergence_series(data: RunData) -> dict[str, Series]:
    """First-divergence positions of non-identical prompts by batch: one series per configuration of
    cascade pairs, one per configuration of noise controls (calibration pairs are neither)."""
    axes = _plotted_axes(data)
    pairs = {r["pair_id"]: r for r in data.rows("pairs")}
    out: dict[str, Series] = {}
    for r in data.rows("comparisons"):
        p = pairs.get(r["pair_id"])
        if (
            p is None
            or p.get("kind") == outcome.CALIBRATION
            or (not is_missing(r["exact"]) and bool(r["exact"]))
        ):
            continue
        role = data.twin.test if p.get("kind") in outcome.TWIN_KINDS else CONTROL
        _add(out.setdefault(_series_name(role, config_label(p, axes)), {}), p.get("batch"), r["first_div"])
    return dict(sorted(out.items(), key=lambda kv: _series_order(kv[0], reference_roles(data))))


def _series_order(name: str, reference: Collection[str]) -> tuple:
    # cascade series of a configuration next to its control, configurations in label order
    role, _, config = name.partition(" ")
    return (config, role in reference)


def first_divergence_plot(data: RunData) -> str:
    """Plot first-divergence positions of non-identical prompts by batch, per configuration."""
    return whisker_plot(
        "First divergence by batch size",
        "batch size",
        "first divergent token",
        first_divergence_series(data),
        reference=reference_roles(data),
    )


def first_divergence_caption(data: RunData) -> str:
    """What the first-divergence plot shows, from the series it draws."""
    series = first_divergence_series(data)
    if not any(any(s.values()) for s in series.values()):
        return ""
    n = {name: sum(len(v) for v in s.values()) for name, s in series.items()}
    counts = ", ".join(f"{name} {k}" for name, k in n.items() if k)
    axis = data.twin
    text = f"Prompts that diverged ({counts}): dot = median first divergent token, whiskers = min–max, small dots = each prompt."
    if any(name.partition(" ")[0] == CONTROL for name in n):
        text += (
            f" A {axis.test} series diverging far earlier than its configuration's control points at the "
            f"setting under test ({axis.name})."
        )
    return text


def seq_rep_series(data: RunData) -> dict[str, Series]:
    """seq-rep-4 of finished cells by batch: one series per arm and configuration."""
    axes = _plotted_axes(data)
    arms = data.twin.arms
    out: dict[str, Series] = {}
    for r in view.cells(data):
        if r.get("status") != "done" or r.get("arm") not in arms or r.get("origin") == outcome.CALIBRATION:
            continue
        name = _series_name(str(r["arm"]), config_label(r, axes))
        _add(out.setdefault(name, {}), r.get("batch"), r.get("seq_rep_4"))
    return dict(sorted(out.items(), key=lambda kv: _series_order(kv[0], reference_roles(data))))


def seq_rep_plot(data: RunData) -> str:
    """Plot seq-rep-4 of finished cells by batch, per arm and configuration."""
    return whisker_plot(
        "seq-rep-4 by batch size",
        "batch size",
        "seq-rep-4 (mean per cell)",
        seq_rep_series(data),
        from_zero=True,
        reference=reference_roles(data),
    )


def seq_rep_caption(data: RunData) -> str:
    """What the seq-rep-4 plot shows."""
    series = seq_rep_series(data)
    if not any(any(s.values()) for s in series.values()):
        return ""
    axis = data.twin
    return (
        f"One small dot per finished cell ({', '.join(series)}); a {axis.test} series above the {axis.ref} "
        "series of its configuration means more repeated 4-grams."
    )


def counts_series(data: RunData, column: str, control_column: str, per_n: bool) -> dict[str, Series]:
    """A count of every cascade pair by batch (as a fraction of its prompts where ``per_n``) and the
    same count of the control it was judged against: one series each per configuration."""
    axes = _plotted_axes(data)
    kind = data.twin.test
    out: dict[str, Series] = {}
    for r in view.cascade_pairs(data):
        config = config_label(r, axes)
        for role, col, n_col in ((kind, column, "n"), (CONTROL, control_column, "noise_n")):
            k, n = r.get(col), as_int(r.get(n_col))
            if is_missing(k) or (per_n and not n):
                continue
            _add(out.setdefault(_series_name(role, config), {}), r.get("batch"), float(k) / n if per_n else k)
    return dict(sorted(out.items(), key=lambda kv: _series_order(kv[0], reference_roles(data))))


def divergence_plot(data: RunData) -> str:
    """The divergence counts the verdicts test: per batch, the share of prompts each cascade pair's
    outputs diverged on, beside its control's."""
    series = counts_series(data, "n_diverged", "noise_n_diverged", per_n=True)
    axis = data.twin
    title = f"Prompts diverged, {axis.test} vs " + ("control" if _has_control(series) else axis.ref)
    return whisker_plot(
        title,
        "batch size",
        "share of prompts diverged",
        series,
        from_zero=True,
        reference=reference_roles(data),
    )


def _has_control(series: dict[str, Series]) -> bool:
    return any(name.partition(" ")[0] == CONTROL and any(s.values()) for name, s in series.items())


def topk_plot(data: RunData) -> str:
    """Divergences outside the reference arm's top-k, per cascade pair and its control; drawn only
    where one happened."""
    series = counts_series(data, "topk_violations", "noise_topk_violations", per_n=False)
    if not any(v for s in series.values() for vals in s.values() for v in vals):
        return ""
    return whisker_plot(
        "Divergences outside top-k",
        "batch size",
        "divergences outside top-k",
        series,
        reference=reference_roles(data),
    )


def counts_caption(data: RunData) -> str:
    """What the count plots show, with the test that turns them into a verdict."""
    series = counts_series(data, "n_diverged", "noise_n_diverged", per_n=True)
    if not series:
        return ""
    alpha = data.manifest.thresholds.get("alpha", 0.01)
    axis = data.twin
    if not _has_control(series):
        judged = (
            "these pairs were judged against the reference (the error ratios above), not by counts"
            if _reference_decided(data)
            else "no control pair's count was recorded for these pairs"
        )
        return (
            f"One dot per {axis.test}-vs-{axis.ref} pair ({', '.join(series)}): the share of its prompts whose "
            f"outputs differ. No noise control is drawn: {judged}."
        )
    return (
        f"One dot per {axis.test}-vs-{axis.ref} pair and per the control it was judged against "
        f"({', '.join(series)}). A {axis.test} dot above its control's is a regression when Fisher's exact "
        f"test gives p < {alpha:g}."
    )


# --- forest plot of drift ratios ------------------------------------------------------------------

FOREST_PW, FOREST_RIGHT, FOREST_TOP, FOREST_BOTTOM, ROW_H = 440, 24, 36, 44, 22
LABEL_CHARS, CHAR_W = 44, 6.4
# Mantissas of log-axis ticks, sparse to dense; the densest set giving at most MAX_TICKS ticks is used.
TICK_SETS = (
    (1.0,),
    (1.0, 2.0, 5.0),
    (1.0, 1.5, 2.0, 3.0, 5.0, 7.0),
    (1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0),
    tuple(round(1 + 0.1 * i, 1) for i in range(90)),
)
MAX_TICKS = 10
TICK_LABEL_GAP = 34.0  # px between two tick labels' centres: "0.95" is ~24 px wide at 11 px
MIN_DECADES = 0.1  # ratios all within a few percent still get a readable axis
RED, BLUE, GREY = "#d1242f", "#0969da", "#8c959f"


def _positive(v) -> float | None:
    """v as a float usable on a log axis, else None (missing, non-finite, <= 0)."""
    if is_missing(v):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and f > 0 else None


def log_domain(values: list[float], pad: float = 0.05) -> tuple[float, float]:
    """Fit a log axis to positive values, padded by `pad` of its width on each side."""
    a, b = math.log10(min(values)), math.log10(max(values))
    if b - a < MIN_DECADES:
        mid = (a + b) / 2
        a, b = mid - MIN_DECADES / 2, mid + MIN_DECADES / 2
    p = (b - a) * pad
    return 10 ** (a - p), 10 ** (b + p)


def log_ticks(lo: float, hi: float) -> list[float]:
    """Nice ticks (1, 2, 5, 10, ... or finer) between lo and hi: the densest set with <= MAX_TICKS."""
    e0, e1 = math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1

    def ticks(mantissas: tuple[float, ...]) -> list[float]:
        out = [float(f"{m:g}e{e}") for e in range(e0, e1 + 1) for m in mantissas]
        return [t for t in out if lo <= t <= hi]

    for mantissas in reversed(TICK_SETS):
        got = ticks(mantissas)
        if len(got) <= MAX_TICKS:
            return got
    decades = ticks((1.0,))  # over MAX_TICKS decades: every k-th power of ten
    k = math.ceil(len(decades) / MAX_TICKS)
    return decades[::k]


def _ratio_rows(data: RunData, ratio: str, threshold: str, tip: Callable[[dict, str], str]) -> list[dict]:
    """One row per twin pair, then calibration pair by shift, that has a positive ``ratio`` column:
    the ratio with its ``_lo``/``_hi`` CI, ``threshold``'s column as the red tick, and its tooltip
    (``tip(row, ci)``)."""
    out = []
    for r in [*view.cascade_pairs(data), *view.calibration_pairs(data)]:
        value = _positive(r.get(ratio))
        if value is None:
            continue
        ci = fmt_x_ci(r.get(ratio), r.get(f"{ratio}_lo"), r.get(f"{ratio}_hi"))
        out.append(
            {
                "label": text_of(r.get("pair_id")),
                "calibration": r.get("kind") == outcome.CALIBRATION,
                "ratio": value,
                "lo": _positive(r.get(f"{ratio}_lo")),
                "hi": _positive(r.get(f"{ratio}_hi")),
                "threshold": _positive(r.get(threshold)),
                "verdict": text_of(r.get("verdict")),
                "tip": tip(r, ci),
            }
        )
    return out


def forest_rows(data: RunData) -> list[dict]:
    """Rows of the forest plot: cascade pairs, then calibration pairs by shift; no ratio, no row."""
    return _ratio_rows(
        data,
        "drift_ratio",
        "drift_threshold",
        lambda r, ci: (
            f"{text_of(r.get('pair_id'))}: drift ratio {ci}, "
            f"threshold {fmt_x(r.get('drift_threshold'))}, {text_of(r.get('verdict'))}"
        ),
    )


def _reference_decided(data: RunData) -> bool:
    return any(text_of(r.get("rule")) == "reference" for r in view.cascade_pairs(data))


def forest_plot(data: RunData) -> str:
    """Draw one row per pair: drift ratio with its CI on a log axis, its threshold as a red tick;
    nothing where no pair has a ratio."""
    axis = data.twin
    return _forest(
        forest_rows(data),
        "Drift ratio per pair (log scale)",
        f"drift ratio: {axis.test} vs {axis.ref} over control",
        _positive(data.manifest.thresholds.get("drift_min")),
        "drift_min",
    )


def error_ratio_rows(data: RunData) -> list[dict]:
    """Rows of the error-ratio plot: each pair the reference scored (twin pairs, then calibration),
    its error ratio with the 95% CI and its minimum effect as the threshold."""
    return _ratio_rows(
        data,
        "ref_ratio",
        "ref_min_effect",
        lambda r, ci: (
            f"{text_of(r.get('pair_id'))}: error ratio {ci}, minimum effect "
            f"{fmt_x(r.get('ref_min_effect'))}, {text_of(r.get('verdict'))}"
        ),
    )


def error_ratio_plot(data: RunData) -> str:
    """The evidence the reference rule decides on, first: per pair, the test arm's error against the
    reference over its twin's, with its CI and the pair's minimum effect; nothing without a reference."""
    axis = data.twin
    return _forest(
        error_ratio_rows(data),
        "Error against the reference, test over twin (log scale)",
        f"error ratio: {axis.test} over {axis.ref}, each read against the reference",
        None,
        "",
    )


def error_ratio_caption(data: RunData) -> str:
    rows = error_ratio_rows(data)
    if not rows:
        return ""
    axis = data.twin
    alpha = data.manifest.thresholds.get("alpha", 0.01)
    text = (
        f"Dot = the pair's error ratio (the {axis.test} arm's mean |logprob - reference logprob| over the "
        f"{axis.ref} arm's; red: a regression), bar = its 95% CI, red tick = the minimum effect (the largest "
        "ratio this run's own flat-vs-flat controls show), grey line = 1 (both arms as far from the reference). "
        f"A pair is a regression when its ratio passes the minimum effect and its sign/Wilcoxon p < {alpha:g}"
    )
    if n_cal := sum(1 for r in rows if r["calibration"]):
        text += f". The {n_cal} grey italic rows are calibration pairs (a fault injected on purpose)"
    return text + "."


def _forest(rows: list[dict], title: str, xlabel: str, line_at: float | None, line_name: str) -> str:
    if not rows:
        return ""
    xs = [v for r in rows for v in (r["ratio"], r["lo"], r["hi"], r["threshold"]) if v is not None]
    lo, hi = log_domain([*xs, 1.0, *([line_at] if line_at else [])])
    left = 16 + CHAR_W * min(LABEL_CHARS, max(len(r["label"]) for r in rows))
    width, top = left + FOREST_PW + FOREST_RIGHT, FOREST_TOP
    height = top + ROW_H * len(rows) + FOREST_BOTTOM
    bottom = top + ROW_H * len(rows)

    def x(v: float) -> str:
        return _num(left + (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * FOREST_PW)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height}" width="{width:.0f}" '
        f'height="{height}" role="img" class="plot" font-family="sans-serif" font-size="11" fill="#1f2328">'
        f"<title>{escape(title)}</title>",
        f'<text x="{left + FOREST_PW / 2:.1f}" y="18" text-anchor="middle" font-size="13" font-weight="600">'
        f"{escape(title)}</text>",
    ]
    last = -math.inf
    for t in log_ticks(lo, hi):
        out.append(f'<line x1="{x(t)}" x2="{x(t)}" y1="{top}" y2="{bottom}" stroke="#eaeef2"/>')
        if float(x(t)) - last >= TICK_LABEL_GAP:  # a label only where it cannot touch the last one
            out.append(f'<text x="{x(t)}" y="{bottom + 16}" text-anchor="middle">{_tick(t)}</text>')
            last = float(x(t))
    out.append(f'<line x1="{left}" x2="{left + FOREST_PW}" y1="{bottom}" y2="{bottom}" stroke="#59636e"/>')
    out.append(
        f'<text x="{left + FOREST_PW / 2:.1f}" y="{height - 8}" text-anchor="middle">{escape(xlabel)}</text>'
    )
    out.append(f'<line x1="{x(1.0)}" x2="{x(1.0)}" y1="{top - 6}" y2="{bottom}" stroke="#59636e"/>')
    if line_at:
        out.append(
            f'<line x1="{x(line_at)}" x2="{x(line_at)}" y1="{top - 6}" y2="{bottom}" stroke="{RED}" '
            'stroke-dasharray="4 3" stroke-opacity="0.7"><title>'
            f"{escape(line_name)} {line_at:g}</title></line>"
        )
    for i, r in enumerate(rows):
        out.append(_forest_row(r, top + ROW_H * (i + 0.5), left, x))
    out.append("</svg>")
    return "\n".join(out)


def _forest_row(r: dict, cy: float, left: float, x) -> str:
    calib = r["calibration"]
    color = GREY if calib else RED if r["verdict"] == outcome.REGRESSION else BLUE
    style = ' font-style="italic" fill="#59636e"' if calib else ""
    label = escape(truncate(r["label"], LABEL_CHARS))
    out = [
        f'<g class="{"row calibration" if calib else "row"}"><title>{escape(r["tip"])}</title>',
        f'<text x="{left - 8:.1f}" y="{cy + 4:.1f}" text-anchor="end"{style}>{label}</text>',
    ]
    if r["lo"] is not None and r["hi"] is not None:
        out.append(
            f'<line x1="{x(min(r["lo"], r["hi"]))}" x2="{x(max(r["lo"], r["hi"]))}" y1="{cy:.1f}" y2="{cy:.1f}" '
            f'stroke="{color}" stroke-width="2"/>'
        )
    if r["threshold"] is not None:
        t = x(r["threshold"])
        out.append(
            f'<line class="threshold" x1="{t}" x2="{t}" y1="{cy - 6:.1f}" y2="{cy + 6:.1f}" stroke="{RED}" '
            'stroke-width="2"/>'
        )
    out.append(f'<circle cx="{x(r["ratio"])}" cy="{cy:.1f}" r="4" fill="{color}"/></g>')
    return "".join(out)


def forest_caption(data: RunData) -> str:
    """What the forest plot shows: its marks, and the calibration rows only where it draws some."""
    rows = forest_rows(data)
    if not rows:
        return ""
    drift_min = _positive(data.manifest.thresholds.get("drift_min"))
    axis = data.twin
    text = (
        "Dot = drift ratio (red: the pair is a regression), bar = its bootstrap 95% CI, red tick = the row's "
        f"drift threshold, grey line = ratio 1 ({axis.test} as noisy as the control)"
    )
    if drift_min:
        text += f", dashed red line = drift_min {drift_min:g}"
    n_cal = sum(1 for r in rows if r["calibration"])
    if n_cal:
        text += (
            f". The {n_cal} grey italic rows are calibration pairs (an LSE shift injected on purpose): they show "
            "what a real error looks like"
        )
    decided = [r for r in view.cascade_pairs(data) if "drift" in text_of(r.get("decided_by")).split(",")]
    regressions = [r for r in view.cascade_pairs(data) if r.get("verdict") == outcome.REGRESSION]
    if regressions and not decided:
        by_reference = any(text_of(r.get("rule")) == "reference" for r in regressions)
        text += ". Drift decided none of the regressions here: " + (
            "the reference did (the error ratios above)" if by_reference else "the counts above did"
        )
    return text + "."
