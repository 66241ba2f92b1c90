"""benchmarks/bench_writer_contention.py: the plumbing (its timings mean nothing on a test box)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_writer_contention.py"


def test_every_mode_runs_every_wave_and_the_summary_says_so(tmp_path: Path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_writer_contention", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_writer_contention", mod)
    spec.loader.exec_module(mod)
    out = tmp_path / "c.json"
    res = mod.main(["--batch", "2", "--max-tokens", "4", "--waves", "2", "--steps", "3", "--gpu-ms", "1",
                    "--cpu-ms", "0.2", "--reset-rpcs", "2", "--out", str(out)])  # fmt: skip
    assert set(res["summary"]) == {"none", "nohold", "hold"}
    for mode in res["summary"].values():
        assert set(mode) == {"reset_ms", "generate_ms", "wave_ms", "left_ms"}
        assert mode["wave_ms"] >= mode["reset_ms"] + mode["generate_ms"] - 0.01
        assert mode["generate_ms"] >= 3 * 1.0  # three steps of 1 ms of server time each
    assert json.loads(out.read_text())["summary"] == res["summary"]
    recs = mod.records(3, 4, 5)
    assert len(recs) == 3 and len(recs[0].topk) == 4 and len(recs[0].topk[0]) == 5
