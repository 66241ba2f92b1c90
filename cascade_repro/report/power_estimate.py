"""Power without a ladder: per twin pair, the smallest error ratio the run could have flagged and the
prompts a 1.05x and a 1.02x fault need (``judge/power.py``), and where the run has a calibration
ladder of the same configuration, whether the ladder agrees.

Read from the tables alone (comparisons.parquet's per-prompt errors against the reference, the
pairs' minimum effect, the test cell's dtype for the floor), so any scored run with a reference
re-renders it, and ``matrix --dry-run`` reads it from the run it would resume.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from cascade_repro.judge import calibration
from cascade_repro.judge import power as pw
from cascade_repro.judge.metrics.drift import drift_floor
from cascade_repro.judge.outcome import EXERCISED, REGRESSION
from cascade_repro.judge.statistics import reference_level
from cascade_repro.report.load import RunData
from cascade_repro.report.text import MISSING, fmt_int, is_missing, text_of
from cascade_repro.report.view import Table, calibration_pairs, cascade_pairs, thresholds

NOTE = (
    f"Estimated from each pair's own per-prompt errors against the reference, not measured: a "
    f"{pw.APPROXIMATION}. Smallest ratio: the test arm's error over its twin's that this run flags "
    f"with {pw.POWER:.0%} power at its prompts and alpha, the minimum effect included. "
    "--calibrate measures it by injecting faults and stays the ground truth; where this run has a "
    "ladder, the last column says whether the two agree."
)


def _num(v: Any) -> float:
    try:
        return math.nan if is_missing(v) else float(v)
    except (TypeError, ValueError):
        return math.nan


def _errors(data: RunData) -> dict[str, tuple[list[float], list[float]]]:
    """Per pair id, the per-prompt errors of its test arm and its twin against the reference."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for r in data.rows("comparisons"):
        test, twin = _num(r.get("ref_err_test")), _num(r.get("ref_err_ref"))
        t, c = out.setdefault(text_of(r.get("pair_id")), ([], []))
        t.append(test)
        c.append(twin)
    return out


def _ladder_rungs(data: RunData, row: dict) -> list[tuple[float, bool]] | None:
    """The judged rungs (error ratio, flagged?) of the calibration ladder of ``row``'s configuration;
    None where the run has none."""
    key = tuple(str(row.get(a)) for a in calibration.GROUP_AXES)
    ratios = {text_of(r.get("pair_id")): _num(r.get("ref_ratio")) for r in calibration_pairs(data)}
    for entry in calibration.detection_power(calibration_pairs(data)):
        if tuple(str(entry.get(a)) for a in calibration.GROUP_AXES) != key:
            continue
        return [
            (ratios.get(text_of(s.get("pair_id")), math.nan), s.get("verdict") == REGRESSION)
            for s in entry["ladder"]
            if s.get("verdict") in EXERCISED
        ]
    return None


def _plain(x: float) -> float | None:
    return x if math.isfinite(x) else None


def estimates(data: RunData) -> list[dict]:
    """One entry per twin pair with errors against the reference, in the verdict table's order:
    ``pair_id, n, spread, alpha, min_effect, power, smallest_ratio`` (null: too few prompts for any),
    ``prompts_for`` ({"1.05": n, "1.02": n}), ``ladder`` (null without one: ``agree``,
    ``flagged_ratio``, ``missed_ratio``, ``why``), ``approximation``. [] where no reference ran."""
    errors = _errors(data)
    if not errors:
        return []
    alpha = float(thresholds(data)["alpha"])
    dtypes = {text_of(c.get("cell_id")): c.get("dtype_effective") for c in data.rows("cells")}
    out = []
    for row in cascade_pairs(data):
        if row.get("verdict") not in EXERCISED:  # a pair that never ran its setting has no power to state
            continue
        pid = text_of(row.get("pair_id"))
        test, twin = errors.get(pid, ([], []))
        floor = drift_floor(_dtype(dtypes.get(text_of(row.get("test_cell")))))
        min_effect = _num(row.get("ref_min_effect"))
        control = text_of(row.get("ref_min_effect_pair"))
        c_test, c_twin = errors.get(control, ([], [])) if control else ([], [])
        c_spread = pw.spread(pw.log_ratios(c_test, c_twin, floor)) if c_test else math.nan
        # The chosen token's test at the level the row was judged at: alpha/2 where the top-k error
        # was tested beside it (statistics.reference_level's Bonferroni).
        level = reference_level(row, alpha)
        est = pw.estimate(test, twin, floor, level, min_effect if min_effect == min_effect else 1.0,
                          control_spread=c_spread)  # fmt: skip
        if not est.measured:
            continue
        rungs = _ladder_rungs(data, row)
        agreed = pw.agreement(rungs, est) if rungs else None
        out.append(
            {
                "pair_id": pid,
                "n": est.n,
                "spread": est.spread,
                "alpha": level,
                "min_effect": est.min_effect,
                "power": est.power,
                "smallest_ratio": _plain(est.smallest),
                "prompts_for": {f"{t:g}": n for t, n in est.needed.items()},
                "ladder": None
                if agreed is None
                else {
                    "agree": agreed.agree,
                    "flagged_ratio": agreed.flagged_ratio,
                    "missed_ratio": agreed.missed_ratio,
                    "why": agreed.why,
                },
                "approximation": pw.APPROXIMATION,
            }
        )
    return out


def _dtype(v: Any) -> str | None:
    return None if is_missing(v) else str(v)


def has_estimate(data: RunData) -> bool:
    """Whether any twin pair has errors against the reference to estimate from."""
    return bool(estimates(data))


def fmt_prompts(n: Any) -> str:
    """A prompt count, or `never` where no count will do (a ratio at or below the floor of 1)."""
    return "never" if n is None else fmt_int(n)


def smallest_text(e: dict) -> str:
    """`1.036x`, or why no ratio is flagged at this count."""
    if e.get("smallest_ratio") is None:
        return f"none: under {pw.min_prompts(float(e['alpha']))} prompts"
    return f"{float(e['smallest_ratio']):.3f}x"


def ladder_text(e: dict) -> str:
    lad = e.get("ladder")
    if lad is None:
        return MISSING
    return f"{'agrees' if lad['agree'] else 'disagrees'}: {lad['why']}"


def estimate_table(entries: list[dict]) -> Table:
    """One row per twin pair: its spread, its smallest flagged ratio, the prompts two ratios need."""
    targets = [f"{t:g}" for t in pw.TARGETS]
    headers = [
        "pair", "prompts", "spread (log ratio)", "min effect", f"smallest ratio flagged ({pw.POWER:.0%} power)",
        *(f"prompts for {t}x" for t in targets), "calibration ladder",
    ]  # fmt: skip
    rows = [
        [
            e["pair_id"],
            fmt_int(e["n"]),
            f"{e['spread']:.3g}",
            f"{e['min_effect']:.3f}x",
            smallest_text(e),
            *(fmt_prompts(e["prompts_for"].get(t)) for t in targets),
            ladder_text(e),
        ]
        for e in entries
    ]
    return Table(headers, rows, wrap=frozenset({"calibration ladder"}))


def statement(e: dict) -> str:
    """One line for a pair, as ``matrix --dry-run`` prints it."""
    needs = ", ".join(f"{t}x needs {fmt_prompts(n)} prompts" for t, n in e["prompts_for"].items())
    return (
        f"{e['pair_id']}: flags {smallest_text(e)} with {e['power']:.0%} power at {fmt_int(e['n'])} prompts "
        f"(alpha {e['alpha']:g}, min effect {e['min_effect']:.3f}x); {needs}"
    )


def previous_run_lines(run_dir: Path, spec_hash: str | None = None) -> list[str]:
    """What ``matrix --dry-run`` says of the run it would resume: the run directory the same command
    writes to (``--results-dir``/``--run-id``, or the spec's default run id). A scored run there
    with errors against the reference gives one line per twin pair; none, an unscored or unreadable
    one gives no line (the dry run plans; it does not judge an old run). Where the run there holds
    another matrix (``spec_hash`` differs: the run itself would refuse to resume it), the lines say
    its spread is a guide only."""
    from cascade_repro.errors import UsageError
    from cascade_repro.report.load import load_run
    from cascade_repro.rundir import layout

    if not all((run_dir / name).is_file() for name in (layout.RUN_JSON, *layout.TABLES)):
        return []
    try:
        data = load_run(run_dir, n_examples=0)
        with data.settled():
            entries = estimates(data)
    except (UsageError, OSError, ValueError):
        return []
    if not entries:
        return []
    other = spec_hash is not None and data.manifest.stored("spec_hash") not in (None, spec_hash)
    whose = "a run of another matrix, a guide only" if other else "the previous run of this setup"
    return [
        f"power from {whose} ({run_dir.name}; {pw.POWER:.0%} power, estimated from its per-prompt spread, "
        "not measured):",
        *(f"  {statement(e)}" for e in entries),
    ]
