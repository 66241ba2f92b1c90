"""SVG drawn by hand, so the HTML report needs no plotting library and no script: axes fitted to
values (linear, and log for ratios), the whisker plot of series by batch size and the forest plot of
ratios with their CIs. It draws the series and rows it is handed; which rows of a run each plot
shows, and its caption, are ``svg.py``'s.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection
from html import escape

from cascade_repro.judge import outcome
from cascade_repro.report.text import is_missing, truncate

Series = dict[int, list[float]]  # x (batch size) -> values
CONTROL = "control"  # the legend's name for a noise-control series
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


def positive(v) -> float | None:
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


def forest(rows: list[dict], title: str, xlabel: str, line_at: float | None, line_name: str) -> str:
    """Draw one row per dict (``label``, ``ratio`` with its ``lo``/``hi`` CI, ``threshold`` as a red
    tick, ``verdict``, ``calibration``, ``tip``) on a log axis, with a grey line at 1 and a dashed
    red one at ``line_at``; nothing for no rows."""
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
