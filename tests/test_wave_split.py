"""benchmarks/wave_split.py on a recorded H200 run: per cell, the engine core's steps and the rest of
``LLM.generate`` (what the RESULTS.md 1h table quotes)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COLD = REPO / "docs" / "evidence" / "2026-12-01-h200-speed" / "cold.tgz"


@pytest.fixture(scope="module")
def ws():
    spec = importlib.util.spec_from_file_location("wave_split", REPO / "benchmarks" / "wave_split.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_cold_matrix_splits_as_recorded(ws):
    recs = ws.wave_records(COLD)
    assert len(recs) == 304  # every wave of the 20 cells
    rows = {r["cell"]: r for r in ws.split(recs)}
    assert len(rows) == 20
    b64 = rows["tp1-b64-flat-fa2"]
    assert (b64["waves"], b64["batch"], b64["cascade_decode_steps"]) == (1, 64, 0)
    assert b64["generate_s"] == pytest.approx(2.356, abs=5e-4) and b64["steps_s"] == pytest.approx(0.695, abs=5e-4)
    assert b64["rest_s"] == pytest.approx(b64["generate_s"] - b64["steps_s"])
    b1 = rows["tp1-b1-cascade-fa3"]
    assert b1["waves"] == 63 and b1["rest_share"] < 0.05  # 64 waves, the first left out
    assert rows["tp1-b64-cascade-fa2"]["cascade_decode_steps"] == 126


def test_cli_prints_a_row_per_cell_and_refuses_a_missing_path(ws, capsys, tmp_path: Path):
    assert ws.main([str(COLD)]) == 0
    out = capsys.readouterr().out
    assert "304 vLLM waves" in out and "| tp1-b64-flat-fa2 | 1 | 2.356 | 0.695 | 1.661 | 71 % | 0 |" in out
    assert ws.main([str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
