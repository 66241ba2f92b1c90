"""The decode speed table of vLLM runs: cascade's time per decode step against its flat twin,
and the cost model's view."""

from __future__ import annotations

from cascade_repro.judge import speed
from cascade_repro.report.load import RunData
from cascade_repro.report.text import (
    MISSING,
    Strong,
    as_int,
    fmt_float,
    fmt_int,
    fmt_ratio,
    is_missing,
    text_of,
)
from cascade_repro.report.view import Table, cascade_pairs, predictions, varying_axes


def has_speed(data: RunData) -> bool:
    """Whether any cascade pair carries decode step timing (vLLM runs with the probe's stamps)."""
    return any((as_int(r.get("speed_waves")) or 0) > 0 for r in cascade_pairs(data))


def fmt_speed_range(r: dict) -> str:
    """`21% slower (waves +12% to +30%, n=4)`: the median over waves and its spread."""
    med = speed.fmt_speed(r.get("speed_ratio"))
    n = as_int(r.get("speed_waves")) or 0
    lo, hi = r.get("speed_ratio_lo"), r.get("speed_ratio_hi")
    if med == MISSING or n < 2 or is_missing(lo) or is_missing(hi):
        return med
    return f"{med} (waves {(float(lo) - 1) * 100:+.0f}% to {(float(hi) - 1) * 100:+.0f}%, n={n})"


def fmt_prediction_speed(r: dict, pred: dict | None) -> str:
    """The cost model's decode-step view at this batch: `cascade 13 < flash-decoding 19 (1.46x)`."""
    cost = pred.get("decode_cost") if isinstance(pred, dict) else None
    x = r.get("predicted_speedup")
    if not isinstance(cost, dict) or is_missing(x):
        return MISSING
    ct, ft = as_int(cost.get("cascade")), as_int(cost.get("flash_decoding"))
    if ct is None or ft is None:
        return MISSING
    return f"cascade {ct} {'<' if ct < ft else '>='} flash-decoding {ft} ({float(x):.2f}x)"


SPEED_NOTE = (
    "Decode speed: wall time per decode step of the cascade cell over its flat twin's, wave by wave "
    "(the same prompts), from the probe's stamps on vLLM's per-step cascade decision; warm-up and "
    "prefill steps are left out. Whole wave: the wave's wall time as the client saw it, which also holds "
    "vLLM's output processing (top-k logprobs of every token): at large batches it overlaps the engine's "
    "steps and can hide them. The cost model's numbers are vLLM's own estimate for a decode step at this "
    "batch (cascade is chosen when its number is smaller; above 1x it expects cascade to win)."
)


def speed_table(data: RunData) -> Table:
    """Per cascade pair: decode ms per step of both cells, cascade's speed against flat, the heuristic's view."""
    pairs = [r for r in cascade_pairs(data) if (as_int(r.get("speed_waves")) or 0) > 0]
    axes = varying_axes(cascade_pairs(data))
    preds = predictions(data)
    by_cell = {text_of(r.get("cell_id")): r for r in data.rows("cells")}
    headers = ["pair", "tp", "batch", *axes, "verdict", "cascade decode steps", "ms/step cascade cell",
               "ms/step flat twin", "cascade vs flat (decode step)", "whole wave", "cost model (decode step)",
               "flag"]  # fmt: skip
    rows = []
    for r in pairs:
        test = by_cell.get(text_of(r.get("test_cell")), {})
        ref = by_cell.get(text_of(r.get("ref_cell")), {})
        flag = text_of(r.get("speed_flag"))
        rows.append(
            [
                text_of(r.get("pair_id")),
                fmt_int(r.get("tp")),
                fmt_int(r.get("batch")),
                *(text_of(r.get(a)) for a in axes),
                text_of(r.get("verdict")),
                fmt_ratio(r.get("cascade_decode_steps"), r.get("total_steps")),
                fmt_float(test.get("decode_step_ms"), ".2f"),
                fmt_float(ref.get("decode_step_ms"), ".2f"),
                fmt_speed_range(r),
                speed.fmt_speed(r.get("wall_ratio")),
                fmt_prediction_speed(r, preds.get(text_of(r.get("test_cell")))),
                Strong(flag) if flag else MISSING,
            ]
        )
    return Table(headers, rows)
