"""The HTML report's plots: which rows of a run each one draws (series by batch size, or one forest
row per pair), and its caption, which says what the plot draws. The drawing is ``svg_draw.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from cascade_repro.judge import outcome
from cascade_repro.report import view
from cascade_repro.report.load import RunData
from cascade_repro.report.svg_draw import CONTROL, Series, forest, positive, whisker_plot
from cascade_repro.report.text import as_int, fmt_x, fmt_x_ci, is_missing, text_of


def reference_roles(data: RunData) -> frozenset[str]:
    """The reference side of a run's series: the control, and its twin's reference arm (``flat``,
    ``prefix-off``, ``tp2``...)."""
    return frozenset({CONTROL, data.twin.ref})


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


def _ratio_rows(
    data: RunData, ratio: str, threshold: str, tip: Callable[[dict, str, str], str]
) -> list[dict]:
    """One row per twin pair, then calibration pair by shift, that has a positive ``ratio`` column:
    the ratio with its ``_lo``/``_hi`` CI, ``threshold``'s column as the red tick, and its tooltip
    (``tip(row, ci, label)``, ``label`` the pair as the report shows it: ``view.pair_label``)."""
    out = []
    for r in [*view.cascade_pairs(data), *view.calibration_pairs(data)]:
        value = positive(r.get(ratio))
        if value is None:
            continue
        ci = fmt_x_ci(r.get(ratio), r.get(f"{ratio}_lo"), r.get(f"{ratio}_hi"))
        label = view.pair_label(data, text_of(r.get("pair_id")))
        out.append(
            {
                "label": label,
                "calibration": r.get("kind") == outcome.CALIBRATION,
                "ratio": value,
                "lo": positive(r.get(f"{ratio}_lo")),
                "hi": positive(r.get(f"{ratio}_hi")),
                "threshold": positive(r.get(threshold)),
                "verdict": text_of(r.get("verdict")),
                "tip": tip(r, ci, label),
            }
        )
    return out


def forest_rows(data: RunData) -> list[dict]:
    """Rows of the forest plot: cascade pairs, then calibration pairs by shift; no ratio, no row."""
    return _ratio_rows(
        data,
        "drift_ratio",
        "drift_threshold",
        lambda r, ci, label: (
            f"{label}: drift ratio {ci}, "
            f"threshold {fmt_x(r.get('drift_threshold'))}, {text_of(r.get('verdict'))}"
        ),
    )


def _reference_decided(data: RunData) -> bool:
    return any(text_of(r.get("rule")) == "reference" for r in view.cascade_pairs(data))


def forest_plot(data: RunData) -> str:
    """Draw one row per pair: drift ratio with its CI on a log axis, its threshold as a red tick;
    nothing where no pair has a ratio."""
    axis = data.twin
    return forest(
        forest_rows(data),
        "Drift ratio per pair (log scale)",
        f"drift ratio: {axis.test} vs {axis.ref} over control",
        positive(data.manifest.thresholds.get("drift_min")),
        "drift_min",
    )


def error_ratio_rows(data: RunData) -> list[dict]:
    """Rows of the error-ratio plot: each pair the reference scored (twin pairs, then calibration),
    its error ratio with the 95% CI and its minimum effect as the threshold."""
    return _ratio_rows(
        data,
        "ref_ratio",
        "ref_min_effect",
        lambda r, ci, label: (
            f"{label}: error ratio {ci}, minimum effect "
            f"{fmt_x(r.get('ref_min_effect'))}, {text_of(r.get('verdict'))}"
        ),
    )


def error_ratio_plot(data: RunData) -> str:
    """The evidence the reference rule decides on, first: per pair, the test arm's error against the
    reference over its twin's, with its CI and the pair's minimum effect; nothing without a reference."""
    axis = data.twin
    return forest(
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


def forest_caption(data: RunData) -> str:
    """What the forest plot shows: its marks, and the calibration rows only where it draws some."""
    rows = forest_rows(data)
    if not rows:
        return ""
    drift_min = positive(data.manifest.thresholds.get("drift_min"))
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
