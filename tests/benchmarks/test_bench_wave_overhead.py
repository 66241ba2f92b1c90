"""benchmarks/bench_wave_overhead.py on CPU with few repetitions: it runs without vLLM, prints one
table row per batch size with non-negative numbers, and writes its JSON; its synthetic outputs go
through the engine's real conversion."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "bench_wave_overhead.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_wave_overhead", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


def test_runs_fast_and_prints_a_row_per_batch(tmp_path: Path, capsys):
    bench = _load()
    out = tmp_path / "wave.json"
    bench.main(["--reps", "3", "--min-reps", "1", "--budget-s", "0", "--out", str(out)])
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [int(r.split("|")[1]) for r in rows] == [1, 8, 32, 64]
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")[1:]]
        assert len(cells) == len(bench.HEADERS)
        nums = [float(x) for c in cells for x in c.split(" / ")]
        assert len(nums) == 2 * len(bench.HEADERS) and all(x >= 0 for x in nums), r
    assert "load average" in text
    res = json.loads(out.read_text())
    assert [r["batch"] for r in res["rows"]] == [1, 8, 32, 64]
    assert all(r[c]["n"] >= 1 for r in res["rows"] for c in bench.COLUMNS)
    assert len(res["loadavg_before"]) == 3


def test_conversion_matches_vllm_layout():
    """The synthetic outputs go through the engine's real conversion: top-k sorted, chosen logprob set."""
    bench = _load()
    outs = bench.make_outputs(2, 16, 5, extra_rate=0.5, seed=1)
    comps = bench.convert(5, outs)
    assert len(comps) == 2
    for o, c in zip(outs, comps, strict=True):
        steps = o.outputs[0].logprobs
        assert c.token_ids == o.outputs[0].token_ids and len(c.topk) == 16
        for d, tid, lp, top in zip(steps, c.token_ids, c.logprobs, c.topk, strict=True):
            assert lp == d[tid].logprob
            assert len(top) == 5 and [v for _, v in top] == sorted((v for _, v in top), reverse=True)
    assert any(len(d) == 6 for o in outs for d in o.outputs[0].logprobs)  # sampled token outside top-k
