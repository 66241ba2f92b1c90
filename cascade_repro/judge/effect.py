"""Did the twin's setting take effect? Its proof, summed over a cell's waves.

Each wave record of a run with a twin other than cascade carries ``extra["effect"]``
(``twin.effect_record``: the count of steps, or prefix-cache hit tokens, on which the setting took
effect, what the engine read, and why the count is 0). A test cell whose count is 0 on every wave
never had the setting: its pair is ``not exercised``, with the first reason a wave gave. And the
other way round: every twin but cascade keeps cascade off in both arms, so cascade steps counted in
either arm's cell mean an engine ran it anyway, its effect mixed into the comparison
(:func:`cascade_mixed_in`). Pure functions over the wave records (what ``sample_scan.SampleScan``
gives back) and the cells table's rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cascade_repro.judge.verdicts import number


@dataclass(frozen=True)
class Effect:
    """A cell's proof of effect: the summed count, the waves that reported one, and why it is 0."""

    count: int
    waves: int
    why: str = ""


def cell_effect(waves: Iterable[dict[str, Any]]) -> Effect:
    """Sum the effect records of a cell's waves; a wave without one counts as not reported."""
    count = n = 0
    why = ""
    for w in waves:
        rec = (w.get("extra") or {}).get("effect")
        if not isinstance(rec, dict):
            continue
        n += 1
        c = rec.get("count")
        count += c if isinstance(c, int) and not isinstance(c, bool) and c > 0 else 0
        if not why and isinstance(rec.get("why"), str):
            why = rec["why"]
    if n == 0:
        why = "no wave reported it"
    return Effect(count, n, "" if count else why)


def cascade_mixed_in(twin: str, arms: Iterable[tuple[str, dict[str, Any]]]) -> str:
    """The note a pair of ``twin`` (not cascade) takes where cascade ran in an arm's cell anyway
    (``arms``: each arm's name and cells-table row; their ``cascade_steps``), else ''."""
    ran = [f"{n} steps of the {arm} arm" for arm, row in arms if (n := _count(row.get("cascade_steps"))) > 0]
    if not ran:
        return ""
    return (
        f"; cascade attention ran on {' and '.join(ran)}, though {twin} keeps it off in both arms: "
        "its effect is mixed into this comparison"
    )


def _count(value: Any) -> int:
    """A cells-table count as an int; 0 where it is missing or not a number (NaN)."""
    n = number(value)
    return max(int(n), 0) if math.isfinite(n) else 0
