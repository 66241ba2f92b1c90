"""Inline SVG plots drawn by hand, so the HTML report needs no plotting library and no script."""

from __future__ import annotations

import math
import statistics
from html import escape

from cascade_repro.report import content as c
from cascade_repro.report.load import RunData
from cascade_repro.report.text import as_int, is_missing

Series = dict[int, list[float]]  # x (batch size) -> values
COLORS = ("#d1242f", "#0969da", "#1a7f37", "#8250df", "#bf8700")
W, H = 640, 320
LEFT, RIGHT, TOP, BOTTOM = 64, 160, 34, 52


def _nice_step(span: float, target: int = 5) -> float:
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def _num(v: float) -> str:
    return f"{v:.1f}"


def _tick(v: float) -> str:
    return f"{v:g}" if abs(v) >= 1e-9 else "0"


def whisker_plot(title: str, xlabel: str, ylabel: str, series: dict[str, Series]) -> str:
    """Draw median dots with min–max whiskers per x and series, plus every value as a faint dot."""
    series = {k: v for k, v in series.items() if any(v.values())}
    if not series:
        return f'<p class="nodata">{escape(title)}: no data</p>'
    xs = sorted({x for s in series.values() for x, vals in s.items() if vals})
    values = [v for s in series.values() for vals in s.values() for v in vals]
    ymax = max(max(values), 0.0)
    step = _nice_step(ymax if ymax > 0 else 1.0)
    ytop = step * max(1, math.ceil(ymax / step))
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    band = pw / len(xs)
    spread = min(band / (len(series) + 1), 20.0)

    def y(v: float) -> float:
        return TOP + ph - (v / ytop) * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
        f'role="img" class="plot" font-family="sans-serif" font-size="11" fill="#1f2328"><title>{escape(title)}</title>',
        f'<text x="{W / 2 - RIGHT / 2:.1f}" y="18" text-anchor="middle" font-size="13" font-weight="600">{escape(title)}</text>',
    ]
    for i in range(int(round(ytop / step)) + 1):
        v = i * step
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
    for j, (name, s) in enumerate(series.items()):
        color = COLORS[j % len(COLORS)]
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
            out.append(f'<circle cx="{cx}" cy="{_num(y(med))}" r="5" fill="{color}"/></g>')
        ly = TOP + 10 + 20 * j
        out.append(f'<circle cx="{LEFT + pw + 20}" cy="{ly}" r="5" fill="{color}"/>')
        out.append(f'<text x="{LEFT + pw + 32}" y="{ly + 4}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _add(s: Series, x, v) -> None:
    xi = as_int(x)
    if xi is not None and not is_missing(v):
        s.setdefault(xi, []).append(float(v))


def first_divergence_plot(data: RunData) -> str:
    """Plot first-divergence positions of non-identical prompts by batch, cascade pairs vs controls."""
    kinds = {r["pair_id"]: r for r in data.pairs.to_dict("records")}
    cascade: Series = {}
    noise: Series = {}
    for r in data.comparisons.to_dict("records"):
        p = kinds.get(r["pair_id"])
        if p is None or (not is_missing(r["exact"]) and bool(r["exact"])):
            continue
        _add(cascade if p.get("kind") == "cascade" else noise, p.get("batch"), r["first_div"])
    return whisker_plot(
        "First divergence by batch size",
        "batch size",
        "first divergent token",
        {"cascade pairs": cascade, "noise controls": noise},
    )


def seq_rep_plot(data: RunData) -> str:
    """Plot seq-rep-4 of finished cells by batch, cascade arm vs flat arm."""
    arms: dict[str, Series] = {"cascade arm": {}, "flat arm": {}}
    for r in c.cells(data):
        if r.get("status") == "done" and f"{r.get('arm')} arm" in arms:
            _add(arms[f"{r['arm']} arm"], r.get("batch"), r.get("seq_rep_4"))
    return whisker_plot("seq-rep-4 by batch size", "batch size", "seq-rep-4 (mean per cell)", arms)
