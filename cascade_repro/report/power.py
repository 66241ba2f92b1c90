"""Detection power: what the calibration pairs say this setup can flag, and each ladder's table."""

from __future__ import annotations

from collections.abc import Callable

from cascade_repro import twin as twins
from cascade_repro.judge import calibration
from cascade_repro.plan.matrix import calibration_fault, spec_of
from cascade_repro.report.load import RunData
from cascade_repro.report.text import fmt_int, fmt_ratio, fmt_x_ci, one_line, text_of
from cascade_repro.report.verdict_table import fmt_bias, fmt_drift, fmt_drift_rule
from cascade_repro.report.view import Table, calibration_pairs, spec_field

NOT_CALIBRATED = "Not calibrated: run with {flag} to measure the smallest {fault} this setup flags."


def not_calibrated(data: RunData, code: Callable[[str], str]) -> str:
    """The one sentence shown when the run has no calibration pairs: what --calibrate would inject for
    this run's twin (the planner's choice), named as the ladder's statement names it; code() formats
    the flag."""
    fault = calibration_fault(twins.of(spec_of(data.manifest.spec_json)))
    return NOT_CALIBRATED.format(flag=code("--calibrate"), fault=calibration.FAULT_WORDS[fault])


def power_statement(entry: dict, max_tokens) -> str:
    """`This setup flags an LSE error of 0.05 nats at 64 prompts x 128 tokens (tp 1, batch 64).`"""
    # calibration.statement formats what it is given with str(); missing values read as the marker.
    shown = {**entry, **{k: fmt_int(entry.get(k)) for k in ("n", "tp", "batch")}}
    return one_line(f"This setup {calibration.statement(shown, fmt_int(max_tokens))}.")


def detection_power(data: RunData) -> list[dict]:
    """Return calibration.detection_power's entries, each with its plain-words `statement`."""
    max_tokens = spec_field(data, "max_tokens")
    entries = calibration.detection_power(calibration_pairs(data))
    return [{**e, "statement": power_statement(e, max_tokens)} for e in entries]


def ladder_table(data: RunData, entry: dict) -> Table:
    """One row per shift of a calibration ladder: what the verdict rule made of each injected error."""
    by_id = {text_of(r.get("pair_id")): r for r in calibration_pairs(data)}
    rows = []
    for step in entry.get("ladder") or []:
        r = by_id.get(text_of(step.get("pair_id")), {})
        rows.append(
            [
                f"{step['nats']:g}",
                text_of(step.get("pair_id")),
                text_of(step.get("verdict")),
                fmt_x_ci(r.get("ref_ratio"), r.get("ref_ratio_lo"), r.get("ref_ratio_hi")),
                fmt_drift(r),
                fmt_drift_rule(r),
                fmt_bias(r),
                fmt_ratio(step.get("n_diverged"), step.get("n")),
            ]
        )
    headers = [
        "shift (nats)", "pair", "verdict", "error ratio vs reference [95% CI]", "drift ratio [95% CI]", "drift threshold / p", "bias (up/down, sign test)",
        "diverged",
    ]  # fmt: skip
    return Table(headers, rows)
