"""benchmarks/bench_writer_contention.py: the plumbing (its timings mean nothing on a test box)."""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_writer_contention.py"


def test_every_mode_runs_every_wave_and_the_summary_says_so(tmp_path: Path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_writer_contention", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_writer_contention", mod)
    spec.loader.exec_module(mod)
    out = tmp_path / "c.json"
    res = mod.main(["--batch", "2", "--max-tokens", "4", "--waves", "2", "--steps", "3", "--gpu-ms", "1",
                    "--cpu-ms", "0.2", "--reset-rpcs", "2", "--out", str(out)])  # fmt: skip
    assert set(res["summary"]) == set(res["waves"]) == {"none", "nohold", "hold"}
    for name, mode in res["summary"].items():
        waves = res["waves"][name]
        assert len(waves) == 2  # the warm-up round is not counted
        for w in waves:
            assert set(w) == {"reset_ms", "generate_ms", "wave_ms", "left_ms"}
            # A wave is its reset then its generate, timed on one clock. (The medians of the summary are not
            # additive, and each is rounded on its own: the summary cannot be checked this way.)
            assert w["wave_ms"] == pytest.approx(w["reset_ms"] + w["generate_ms"], rel=1e-9)
            assert w["generate_ms"] >= 3 * 1.0  # three steps of 1 ms of server time each
        assert mode == {k: round(statistics.median(w[k] for w in waves), 2) for k in mode}
    assert json.loads(out.read_text())["summary"] == res["summary"]
    recs = mod.records(3, 4, 5)
    assert len(recs) == 3 and len(recs[0].topk) == 4 and len(recs[0].topk[0]) == 5
