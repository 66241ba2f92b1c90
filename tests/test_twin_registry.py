"""A new twin is one registry entry: registered here, a fake-engine run of it plans, runs, proves its
effect (the entry's own reader and prediction) and renders, with nothing else in the package told."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade_repro import twin as twins

# A throw-away setting: its own names, labels, reader and prediction.
TOY = twins.TwinAxis(
    name="toy-setting",
    family="toy-setting",
    test="toy-on",
    ref="toy-off",
    test_label="toy on (test)",
    ref_label="toy off (ref)",
    summary="the toy setting on vs off",
    test_args=(("toy_setting", True),),
    ref_args=(("toy_setting", False),),
    effect="config",
    effect_doc="decode tokens generated with the toy setting read back on",
    reader=lambda tw, f: twins.effect_record(
        tw, f.tokens if f.readback.get("toy_setting") else 0, {"toy_setting": f.readback.get("toy_setting")}
    ),
    predictor=lambda tw, c: ("yes", f"batch {c.batch} runs the toy setting"),
)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch):
    """TOY registered in this process and, through the environment, in the run's workers."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    monkeypatch.setenv(twins.PLUGINS_ENV, f"{Path(__file__).stem}:TOY")
    twins.register(TOY)
    yield TOY
    twins.unregister(TOY.name)


def test_the_entry_reads_and_predicts_its_own_effect(toy):
    assert twins.resolve("toy-setting") is toy and "toy-setting" in twins.PAIR_KINDS
    assert "`toy-setting`" in twins.help_text()
    on = twins.WaveFacts(arm=toy.test, readback={"toy_setting": True}, counters={}, tokens=12, batch=4)
    assert toy.wave_effect(on)["count"] == 12
    off = twins.WaveFacts(arm=toy.test, readback={"toy_setting": False}, counters={}, tokens=12, batch=4)
    assert toy.wave_effect(off)["count"] == 0
    assert toy.predict_effect(twins.CellFacts(8, 100, [50], 16, None)) == ("yes", "batch 8 runs the toy setting")


def test_a_registered_entry_plans_runs_proves_and_renders_on_the_fake_engine(toy, tmp_path):
    import pandas as pd
    from support.cli import CliRunner

    from cascade_repro.cli import app

    argv = ["matrix", "--engine", "fake", "--twin", "toy-setting", "--limit", "8", "--batch", "8",
            "--max-tokens", "16", "--results-dir", str(tmp_path), "--run-id", "toy", "--quiet"]  # fmt: skip
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.stderr
    run = tmp_path / "toy"
    assert json.loads((run / "run.json").read_text())["spec"]["twin"] == "toy-setting"
    pairs = pd.read_parquet(run / "pairs.parquet")
    row = pairs[pairs["kind"] == "toy-setting"].iloc[0]
    assert row["pair_id"] == "tp1-b8-toy-on~toy-off" and row["verdict"] == "identical"
    assert row["cascade_steps"] > 0  # the fake engine proved the setting took effect on the test arm
    report = (run / "report.md").read_text()
    assert "**twin** `toy-setting: toy-on vs toy-off`" in report

    # A fault on the test arm: the pair is flagged and the examples are headed with this twin's labels.
    res = CliRunner().invoke(app, [*argv[:-2], "toy-scaled", "--quiet", "--inject", "out-scale=0.5"])
    assert res.exit_code == 1, res.stderr
    row = pd.read_parquet(tmp_path / "toy-scaled" / "pairs.parquet").iloc[0]
    assert (row["kind"], row["verdict"]) == ("toy-setting", "regression")
    html = (tmp_path / "toy-scaled" / "report.html").read_text()
    assert "<h4>toy on (test) <code>" in html and "<h4>toy off (ref) <code>" in html
    assert "cascade (test)" not in html and "flat (ref)" not in html
