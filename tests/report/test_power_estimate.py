"""Power without a ladder in the reports (report/power_estimate.py) and in `matrix --dry-run`, on a
committed H200 run with a calibration ladder (docs/evidence: prefix caching, --calibrate 0.01,0.1,1)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import jsonschema
import pytest
from support.cli import CliRunner

from cascade_repro.cli import app
from cascade_repro.judge import power as pw
from cascade_repro.judge.metrics.drift import drift_floor
from cascade_repro.report import power_estimate
from cascade_repro.report.json import JsonFormatter, summary_schema
from cascade_repro.report.load import load_run
from cascade_repro.report.markdown import MarkdownFormatter
from cascade_repro.report.sections import sections

EVIDENCE = Path(__file__).resolve().parents[2] / "docs" / "evidence" / "2026-12-03-h200-twins" / "prefix"
PAIR = "tp1-b64-prefix-on~prefix-off"


@pytest.fixture
def prefix_run(tmp_path: Path) -> Path:
    return Path(shutil.copytree(EVIDENCE, tmp_path / "prefix"))


def test_the_estimate_is_the_pairs_own_spread(prefix_run: Path) -> None:
    data = load_run(prefix_run, n_examples=0)
    [e] = power_estimate.estimates(data)
    rows = [r for r in data.rows("comparisons") if r["pair_id"] == PAIR]
    lr = pw.log_ratios([r["ref_err_test"] for r in rows], [r["ref_err_ref"] for r in rows], drift_floor("bfloat16"))
    assert e["pair_id"] == PAIR and e["n"] == 64 == lr.size
    assert e["spread"] == pytest.approx(pw.spread(lr))
    assert e["min_effect"] == 1.0  # --no-auto-controls: no flat-vs-flat control
    assert e["smallest_ratio"] == pytest.approx(pw.detectable_ratio(e["spread"], 64, 0.01))
    assert e["prompts_for"]["1.02"] > e["prompts_for"]["1.05"] > 64
    # The ladder's smallest rung (attention output x 1.01) read 1.27x and was flagged: above the
    # estimate's 80 % ratio, so the two agree.
    assert e["ladder"]["agree"] is True
    assert e["ladder"]["flagged_ratio"] == pytest.approx(1.271, abs=1e-3)
    assert e["smallest_ratio"] < e["ladder"]["flagged_ratio"]


def test_report_and_summary_carry_it(prefix_run: Path) -> None:
    data = load_run(prefix_run, n_examples=0)
    assert "power_estimate" in [s.id for s in sections(data)]
    md = MarkdownFormatter().render(data)
    assert "Power without a ladder" in md and "| tp1-b64-prefix-on\\~prefix-off | 64 |" in md
    assert "agrees: smallest flagged rung 1.27x" in md
    summary = json.loads(JsonFormatter().render(data))
    jsonschema.Draft202012Validator(summary_schema()).validate(summary)
    [e] = summary["power_estimate"]
    assert e["pair_id"] == PAIR and math.isclose(e["spread"], power_estimate.estimates(data)[0]["spread"])


def test_a_run_without_reference_has_no_estimate(tmp_path: Path) -> None:
    from conftest import synthetic_run

    data = load_run(synthetic_run(tmp_path / "syn", 4, "1,8"), n_examples=0)  # no reference pass
    assert power_estimate.estimates(data) == []
    assert "power_estimate" not in [s.id for s in sections(data)]


def test_dry_run_prints_it_from_the_run_it_would_resume(prefix_run: Path) -> None:
    args = ["matrix", "--engine", "fake", "--twin", "prefix-caching", "--batch", "64", "--limit", "64",
            "--dry-run", "--results-dir", str(prefix_run.parent), "--run-id", "prefix"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "power from a run of another matrix, a guide only (prefix; 80% power" in res.stdout
    assert f"{PAIR}: flags 1.126x with 80% power at 64 prompts" in res.stdout
    res = CliRunner().invoke(app, [*args[:-1], "nothing-here"])
    assert res.exit_code == 0 and "power from" not in res.stdout


REFERENCE_RUNS = Path(__file__).resolve().parents[2] / "docs" / "evidence" / "2026-12-02-h200-reference" / "tables"


def test_the_estimate_agrees_with_the_lse_shift_ladders_of_the_h200() -> None:
    # --calibrate default at b8/b64/b128 on FA3 and FA2, 64 prompts, flat-vs-flat controls: every
    # ladder's boundary lies where the estimate puts it.
    for name in ("fa3-cal", "fa2-cal"):
        entries = power_estimate.estimates(load_run(REFERENCE_RUNS / name, n_examples=0))
        assert [e["pair_id"] for e in entries] == [f"tp1-b{b}-cascade~flat" for b in (8, 64, 128)]
        for e in entries:
            assert e["ladder"]["agree"] is True, (name, e)
            assert e["min_effect"] > 1.0 and 1.05 < e["smallest_ratio"] < 1.15
            assert e["prompts_for"]["1.05"] > 64  # 64 prompts do not see a 1.05x fault 80 % of the time


def test_a_pair_that_never_ran_its_setting_states_no_power() -> None:
    data = load_run(REFERENCE_RUNS / "readme", n_examples=0)
    ids = [e["pair_id"] for e in power_estimate.estimates(data)]
    assert len(ids) == 8 and not any("-b1-" in i for i in ids)  # b1: cascade never fired
