"""Machine-readable summary.json for CI: stable keys, NaN as null.

Schema 2 added the drift evidence per pair, `detection_power`, `warnings` and `schema_version`;
schema 3 the decode speed per pair (`speed_*`, `wall_ratio`, `predicted_speedup`, `speed_flag`) and
per cell (`*_step_ms`, `decode_tok_s`), `invocations` and `mixed_stack`; schema 4 the verdict against
the reference per pair (`rule`, `reference`, `ref_*`, `p_ref*`), its pass (`reference`) and
`controls` (every flat-vs-flat pair's error ratio: the run's measured null); schema 5 the top-k
distribution error against the reference per pair (`ref_topk_*`, `p_ref_topk*`). Every key is described in
docs/summary-json.md; `summary.schema.json` beside this module (shipped in the package) is its JSON
Schema, whose ``schema_version`` constant moves with ``SCHEMA_VERSION``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from cascade_repro.judge import outcome
from cascade_repro.judge.result import PairResult
from cascade_repro.judge.statistics import STATISTICS
from cascade_repro.report import headline, power, power_estimate, prose, view
from cascade_repro.report.base import ReportFormatter
from cascade_repro.report.load import RunData
from cascade_repro.report.text import as_int, json_text, portable_json
from cascade_repro.rundir import layout

# The pair fields no statistic owns; each statistic's own (its ``summary`` fields in
# judge/statistics.py) follow, so a statistic added there reaches summary.json.
_PAIR_BASE_FIELDS = (
    "pair_id",
    "tp",
    "batch",
    "verdict",
    "n_diverged",
    "n",
    "noise_n_diverged",
    "cascade_steps",
    "reasons",
    "if_n",
    "if_strict_test",
    "if_strict_ref",
    "if_strict_delta",
    "if_loose_delta",
    "p_if",
    "control_pair_id",
    "depth",
    "cascade_decode_steps",
    "decided_by",
    "topk_violations",
    "noise_n",
    "noise_topk_violations",
    # Decode speed against the flat twin (schema 3).
    "speed_ratio",
    "speed_ratio_lo",
    "speed_ratio_hi",
    "speed_waves",
    "wall_ratio",
    "predicted_speedup",
    "speed_flag",
    # Against the reference (schema 4): which rule decided, and the numbers it decided on.
    "rule",
    "reference",
    "ref_n",
    "ref_err_test",
    "ref_err_twin",
    "ref_ratio",
    "ref_ratio_lo",
    "ref_ratio_hi",
    "ref_up",
    "ref_down",
    "p_ref_sign",
    "p_ref_wilcoxon",
    "p_ref",
    "ref_min_effect",
    "ref_min_effect_pair",
    "ref_regret_test",
    "ref_regret_twin",
)
PAIR_FIELDS = _PAIR_BASE_FIELDS + tuple(f for s in STATISTICS for f in s.summary)
CONTROL_FIELDS = ("pair_id", "kind", "tp", "batch", "ref_batch", "n_diverged", "n", "ref_n", "ref_err_test",
                  "ref_err_twin", "ref_ratio", "ref_ratio_lo", "ref_ratio_hi", "p_ref")  # fmt: skip
REFERENCE_FIELDS = ("precision", "device", "status", "sequences")
SCHEMA_VERSION = 5
SCHEMA_FILE = "summary.schema.json"
CELL_FIELDS = (
    "cell_id",
    "status",
    "tp",
    "batch",
    "arm",
    "tokens_per_s",
    "seq_rep_4",
    "cascade_steps",
    "error",
    "if_strict",
    "if_loose",
    "inject",
    "origin",
    "cascade_decode_steps",
    "decode_step_ms",
    "cascade_step_ms",
    "flat_step_ms",
    "decode_tok_s",
)

# Parquet stores an integer column holding a null as float; counts should still read 3, not 3.0.
INT_FIELDS = {
    "tp", "batch", "n", "n_diverged", "noise_n_diverged", "cascade_steps", "if_n", "drift_n",
    "cascade_decode_steps", "speed_waves", "topk_violations", "noise_n", "noise_topk_violations", "bias_up", "bias_down",
    "ref_n", "ref_up", "ref_down", "ref_batch", "ref_topk_n", "ref_topk_up", "ref_topk_down",
}  # fmt: skip


def summary_schema() -> dict:
    """summary.json's JSON Schema (draft 2020-12), as the package ships it."""
    return json.loads(resources.files(__package__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))


def _row(r: Mapping[str, Any], fields: tuple[str, ...]) -> dict:
    return {k: as_int(r.get(k)) if k in INT_FIELDS else r.get(k) for k in fields}


def _pair(res: PairResult) -> dict:
    """A pair's entry: its counts as the typed result holds them, every other field as its row has it
    (a field an older run lacks is null)."""
    c = res.counts
    counts = {
        "n": c.n, "n_diverged": c.n_diverged, "noise_n": c.noise_n, "noise_n_diverged": c.noise_n_diverged,
        "topk_violations": c.topk_violations, "noise_topk_violations": c.noise_topk_violations,
        "cascade_steps": c.cascade_steps,
    }  # fmt: skip
    return {**_row(res.row, PAIR_FIELDS), **{k: as_int(v) for k, v in counts.items()}}


class JsonFormatter(ReportFormatter):
    """Render summary.json."""

    name = "json"
    filename = layout.SUMMARY_JSON

    def render(self, data: RunData) -> str:
        """Return the summary as sorted, indented JSON."""
        m = data.manifest
        fail_on = str(m.fail_on or "regression")
        code, reason = outcome.exit_status(data, outcome.run_fail_on(m))
        summary = {
            "schema_version": SCHEMA_VERSION,
            "run_id": m.stored("run_id"),
            "headline": headline.headline(data),
            "counts": view.verdict_counts(data),
            "fail_on": fail_on,
            "exit_code": code,
            "exit_reason": reason,
            "pairs": [_pair(res) for res in view.cascade_results(data)],
            # The flat-vs-flat controls' error ratios against the reference: this run's measured null.
            "controls": [_row(r, CONTROL_FIELDS) for r in view.control_pairs(data)],
            # What the reference pass was, not what it cost (run.json has its seconds): a resumed run's
            # summary is the uninterrupted one's.
            "reference": {k: v for k, v in m.reference.items() if k in REFERENCE_FIELDS}
            if isinstance(m.reference, dict)
            else None,
            "cells": [_row(r, CELL_FIELDS) for r in view.cells(data)],
            "warnings": prose.warnings(data),
            # Calibration: the smallest injected LSE error this setup flags ([] when not calibrated).
            "detection_power": power.detection_power(data),
            # Power without a ladder: per twin pair, estimated from its own per-prompt spread.
            "power_estimate": power_estimate.estimates(data),
            # Informational: neither changes a verdict or the exit code.
            "predictions": view.predictions(data),
            "if_note": prose.if_note(data),
            "env": portable_json(m.stack_env),
            # Every invocation of the run (the first, each resume) and the stack keys that changed.
            "invocations": [
                {
                    "started_at": i.stored("started_at"),
                    "command": portable_json(i.stored("command")),
                    "cells_kept": i.cells_kept,
                    "cells_run": i.cells_run,
                    "total_s": i.total_s,
                }
                for i in view.invocations(data)
            ],
            "mixed_stack": m.mixed_stack or [],
        }
        if m.several:
            # A run of several twins: each one's own outcome, as a run of it alone would give it.
            summary["twins"] = [_twin(data.for_twin(tw), tw) for tw in data.twins]
        return json_text(summary)


def _twin(v: RunData, tw: Any) -> dict:
    """One twin's entry of summary.json's ``twins`` (a run of several twins only)."""
    code, reason = outcome.exit_status(v, outcome.run_fail_on(v.manifest))
    counts = view.verdict_counts(v)
    return {
        "name": tw.name,
        "family": tw.family,
        "line": headline.twin_line(v),
        "counts": counts,
        "changed_outputs": bool(counts.get(outcome.REGRESSION)),
        "expected_change": tw.expected_change,
        "exit_code": code,
        "exit_reason": reason,
    }
