"""The one-line outcome of a scored run, shared by `matrix`, `merge` and `report`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Outcome:
    """Exit code, why, the report's headline and the cascade verdict counts (calibration excluded)."""

    exit_code: int
    reason: str
    headline: str
    counts: dict[str, int] = field(default_factory=dict)


def outcome_of(data: Any, fail_on: str) -> Outcome:
    """Judge a loaded run (``report.load.RunData``) under ``fail_on``."""
    from cascade_repro.judge.outcome import exit_status
    from cascade_repro.report.headline import headline
    from cascade_repro.report.view import verdict_counts

    with data.settled():  # the exit policy, headline and counts read the same tables: converted once
        code, reason = exit_status(data, fail_on)
        return Outcome(code, reason, headline(data), {k: v for k, v in verdict_counts(data).items() if v})
