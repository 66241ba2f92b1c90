"""benchmarks/topk_throughput.py on the fake engine: the plumbing, not the timings. Every wave runs
once per top-k in a rotating order, the engine returns the candidates asked for (the fake caps them
at 8), and the summary adds up the counted waves."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "topk_throughput.py"


@pytest.fixture()
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("topk_throughput", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "topk_throughput", mod)
    spec.loader.exec_module(mod)
    return mod


def test_fake_engine_runs_both_topk_values_on_the_same_waves(bench, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    out = tmp_path / "topk.json"
    rc = bench.main(["--engine", "fake", "--limit", "8", "--batch", "1,8", "--max-tokens", "6", "--rounds", "2",
                     "--topk", "5,20", "--out", str(out)])  # fmt: skip
    assert rc == 0
    data = json.loads(out.read_text(encoding="utf-8"))
    rows = data["rows"]
    assert len(rows) == 2 * (8 + 1)  # two rounds of 8 waves at b1 and 1 at b8
    assert {tuple(r["order"]) for r in rows} == {(5, 20), (20, 5)}  # the order rotates
    assert data["candidates_returned"] == {"5": 5, "20": 8}
    for r in rows:  # the same waves: the same tokens generated under either top-k
        assert r["arms"]["5"]["tokens"] == r["arms"]["20"]["tokens"]
    overall = data["summary"]["overall"]
    assert overall["5"]["waves"] == overall["20"]["waves"] == 9  # the warm-up round is not counted
    assert overall["5"]["tok_s_ratio"] == 1.0
    shown = capsys.readouterr().out
    assert "| overall | 20 | 9 |" in shown and "note: the fake engine keeps at most 8 candidates" in shown


def test_bad_flags_are_refused(bench) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--topk", "5"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--batch", "x"])
