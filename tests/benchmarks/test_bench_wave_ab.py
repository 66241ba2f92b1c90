"""benchmarks/bench_wave_ab.py on CPU against the fake vLLM: the plumbing, not the timings.

The fake's ``generate`` takes microseconds, so every ratio here is meaningless; what is checked is
that the script builds the harness's own engine from a real run directory, runs every arm of every
wave in a rotating order, compares their tokens, and writes a summary the table can print.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_wave_ab.py"


@pytest.fixture()
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_wave_ab", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_wave_ab", mod)  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _row(batch, rnd, raw, harness, nogc, warmup=False, decode_steps=120):
    return {"batch": batch, "round": rnd, "warmup": warmup, "identical": True,
            "same_as_twin": {"harness": True, "harness-nogc": False},
            "arms": {"raw": {"s": raw},
                     "harness": {"s": harness, "phases": {"sync_s": 0.004, "drain_s": 0.01},
                                 "cascade": {"steps": decode_steps + 1, "decode_steps": decode_steps, "total_steps": 128}},
                     "harness-nogc": {"s": nogc, "phases": {"sync_s": 0.002}}}}  # fmt: skip


def test_summary_pairs_each_wave_with_its_own_raw_and_drops_warmups(bench):
    rows = [_row(1, 0, 1.0, 9.0, 9.0, warmup=True, decode_steps=0), _row(1, 1, 0.5, 0.55, 0.5, decode_steps=40),
            _row(1, 2, 0.4, 0.42, 0.41, decode_steps=127), _row(8, 1, 2.0, 2.2, 2.0)]  # fmt: skip
    s = bench.summarize(rows)
    b1 = s["per_batch"]["1"]
    assert b1["harness"]["n"] == 2 and b1["harness"]["ratio_min"] == pytest.approx(1.05)
    assert b1["harness"]["ratio_max"] == pytest.approx(1.1)
    assert b1["harness"]["phases_ms"] == {"drain_s": pytest.approx(10.0), "sync_s": pytest.approx(4.0)}
    assert b1["raw"]["ratio_median"] is None and b1["raw"]["median_ms"] == pytest.approx(450.0)
    assert b1["harness"]["cascade_decode_steps"] == [40, 83.5, 127]  # the warm-up's 0 is not counted
    assert b1["raw"]["cascade_decode_steps"] is None and b1["harness-nogc"]["cascade_decode_steps"] is None
    o = s["overall"]
    assert o["raw_s"] == pytest.approx(2.9)
    assert o["harness"]["ratio"] == pytest.approx((0.55 + 0.42 + 2.2) / 2.9, abs=1e-4)
    assert o["harness-nogc"]["ratio"] == pytest.approx((0.5 + 0.41 + 2.0) / 2.9, abs=1e-4)
    assert o["harness"]["own_work"] == pytest.approx(3 * 0.004 / 2.9, abs=1e-4)  # sync only: drain is not own work
    assert o["harness"]["ratio_with_drain"] == pytest.approx((0.55 + 0.42 + 2.2 + 0.03) / 2.9, abs=1e-4)
    assert (o["harness"]["identical"], o["harness-nogc"]["identical"], o["harness"]["waves"]) == (3, 0, 3)
    lo, hi = o["harness"]["ci95"]
    assert 1.05 <= lo <= o["harness"]["ratio"] <= hi <= 1.1  # every resample lies between the waves' ratios
    assert s["identical"] == {"waves": 3, "identical": 3}
    text = bench.table(s)
    assert "| 8 | harness | 2200.0 | 1.100 [1.100, 1.100] | 120, 120, 120 | drain 10.0, sync 4.0 |" in text
    assert "| 1 | harness | 485.0 | 1.075 [1.050, 1.100] | 40, 83.5, 127 | drain 10.0, sync 4.0 |" in text
    assert "| 8 | raw | 2000.0 |  |  |  |" in text
    assert f"| harness | raw | **{o['harness']['ratio']:.3f}** | [{lo:.3f}, {hi:.3f}] | 0.4 % | 1.103 | 3/3 |" in text


def test_arm_orders_balance_positions_and_neighbours(bench):
    arms = ["raw", "harness", "harness-nohold"]
    orders = bench.arm_orders(arms)
    assert len(orders) == 6 and len({tuple(o) for o in orders}) == 6  # all six permutations
    for a in arms:
        assert sorted(o.index(a) for o in orders) == [0, 0, 1, 1, 2, 2]  # each position twice
    follows = [(o[i], o[i + 1]) for o in orders for i in range(2)]
    assert all(follows.count((x, y)) == 2 for x in arms for y in arms if x != y)  # each neighbour twice
    assert len(bench.arm_orders(["a", "b"])) == 2  # reversing two arms is a rotation: no duplicates


def test_bootstrap_ci_is_seeded_and_needs_two_waves(bench):
    pairs = [(1.0, 1.0), (1.2, 1.0), (0.9, 1.0), (1.1, 1.0)]
    assert bench.bootstrap_ci(pairs) == bench.bootstrap_ci(pairs)
    lo, hi = bench.bootstrap_ci(pairs)
    assert 0.9 <= lo < 1.05 < hi <= 1.2
    assert bench.bootstrap_ci(pairs[:1]) is None


def test_arms_are_checked(bench, tmp_path, capsys):
    out = str(tmp_path / "x.json")
    for arms, msg in (("raw,bogus", "unknown arm 'bogus'"), ("harness", "missing: raw"),
                      ("raw,harness,harness-nested", "missing: raw-nested"), ("raw,raw-nested", "missing: harness"),
                      ("raw,harness,harness-hold", "'harness-hold' no longer runs")):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            bench.parse_args(["--arms", arms, "--out", out])
        assert e.value.code == 2 and msg in capsys.readouterr().err
    assert bench.parse_args(["--out", out]).arm_names == bench.DEFAULT_ARMS


def test_from_json_pools_the_counted_waves_of_several_runs(bench, tmp_path, capsys):
    rows_a = [_row(1, 0, 1.0, 9.0, 9.0, warmup=True), _row(1, 1, 0.5, 0.55, 0.5)]
    rows_b = [_row(8, 0, 3.0, 9.0, 9.0, warmup=True), _row(8, 1, 2.0, 2.0, 2.1), _row(8, 2, 2.0, 2.02, 2.0)]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"rows": rows_a}))
    b.write_text(json.dumps({"rows": rows_b}))
    summary, n = bench.pooled([a, b])
    assert n == 2 and summary == bench.summarize(rows_a + rows_b)
    assert summary["overall"]["harness"]["waves"] == 3  # the warm-ups of both runs are left out
    assert summary["overall"]["harness"]["ratio"] == pytest.approx((0.55 + 2.0 + 2.02) / 4.5, abs=1e-4)
    # 1.016 <= 1.03: exit 0, and the table is the pooled one.
    assert bench.main(["--from-json", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 run(s) pooled\n") and "| harness | raw | **1.016** |" in out
    # Over the target: 1; a file that is not a run: 2, one line on stderr, no traceback.
    c = tmp_path / "c.json"
    c.write_text(json.dumps({"rows": [_row(1, 1, 1.0, 1.2, 1.0)]}))
    assert bench.main(["--from-json", str(c)]) == 1
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert bench.main(["--from-json", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot read the runs: KeyError") and "Traceback" not in err


def runstore_lines(run_dir: Path) -> list[str]:
    from cascade_repro.rundir import layout

    (path,) = layout.samples_files(run_dir)
    return path.read_text().splitlines()


@pytest.mark.slow
def test_runs_every_arm_of_every_wave_against_the_fake_vllm(bench, fake_vllm, cut_model, tmp_path, monkeypatch):
    from cascade_repro.run import preparation

    monkeypatch.setattr(preparation, "visible_gpus", lambda: 1)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    out = tmp_path / "ab.json"
    arms = ["raw", "harness", "harness-nohold", "harness-fg", "raw-nested", "harness-nested",
            "harness-loop", "raw-detok", "harness-detok"]
    # The fake vLLM reads only the model's tokenizer: conftest's two-layer cut has the embedded one's.
    rc = bench.main(["--model", str(cut_model), "--limit", "8", "--batch", "1,8", "--waves", "2", "--rounds", "3", "--max-tokens", "4",
                     "--ignore-eos", "--gc-freeze", "--arms", ",".join(arms), "--out", str(out)])  # fmt: skip
    import gc

    gc.unfreeze()  # the script froze this test process's heap
    data = json.loads(out.read_text())
    assert data["complete"] is True and rc in (0, 1)
    rows = data["rows"]
    # b1: 2 waves x 3 rounds; b8: 1 wave (8 prompts) x 3 rounds; each arm once per wave, rotating.
    assert [(r["batch"], r["round"], r["wave"]) for r in rows] == [
        (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1), (1, 2, 0), (1, 2, 1), (8, 0, 0), (8, 1, 0), (8, 2, 0)]
    # The order walks through the rotations of the arms and of their reverse, by round + wave.
    orders = bench.arm_orders(arms)
    assert len(orders) == 18 and all(r["order"] == orders[(r["round"] + r["wave"]) % 18] for r in rows)
    assert len({tuple(r["order"]) for r in rows}) == 4
    # Same engine, same heuristic: same tokens, nested or flat logprobs, text from vLLM or decoded here.
    assert all(r["identical"] and all(r["same_as_twin"].values()) for r in rows)
    assert data["gc_frozen"] > 0 and data["args"]["ignore_eos"] == "True"
    assert data["summary"]["per_batch"]["1"]["harness"]["n"] == 4  # round 0 is warm-up
    b8 = data["summary"]["per_batch"]["8"]
    assert {"sync_s", "records_s", "drain_s", "replay_left_s"} <= set(b8["harness"]["phases_ms"])
    assert data["flat_logprobs_available"] is True and data["engine_decodes_text"] is True
    # Each harness wave says what the engine computed: the fake fires cascade on every step of a b8
    # wave (8 requests, the minimum), never with one request.
    want = {1: {"steps": 0, "decode_steps": 0, "total_steps": 4}, 8: {"steps": 4, "decode_steps": 4, "total_steps": 4}}
    casc = [(r["batch"], v["cascade"]) for r in rows for v in r["arms"].values() if "cascade" in v]
    assert len(casc) == 9 * 6 and all(c == want[b] for b, c in casc)  # 9 waves x 6 harness arms
    # The background arms replay their previous wave's records: the replay file holds each one's
    # predecessor (all but each arm's very first wave), the foreground file the fg and nested arms'
    # records (two arms x 9 waves x (samples + 1 wave record)).
    run_dir = next((tmp_path).glob("wave-ab-*/wave-ab"))
    fg = (run_dir / "ab-foreground.jsonl").read_text().splitlines()
    assert sum('"type":"wave"' in line for line in fg) == 2 * 9
    replay = (run_dir / "ab-replay.jsonl").read_text().splitlines()
    assert sum('"type":"wave"' in line for line in replay) == 4 * (9 - 1)
    # The samples file: the four background arms' own records, 9 waves each of 1 (b1) or 8 (b8) real prompts.
    own = runstore_lines(run_dir)
    assert sum('"type":"wave"' in line for line in own) == 4 * 9
    samples = [json.loads(line) for line in own if '"type":"sample"' in line]
    assert len(samples) == 4 * (6 * 1 + 3 * 8)
    assert all(len(x["token_ids"]) == 4 and len(x["topk"]) == 4 for x in samples)
    groups: dict = {}
    for x in samples:  # b1: 2 waves of 1 prompt, b8: 1 of 8; each once per arm and round, converted alike
        groups.setdefault((x["cell_id"], x["wave"], x["prompt_index"]), []).append(x)
    # harness-loop's lists, converted position by position, are the whole-list arms' lists, and
    # harness-detok's text, vLLM's, is the text the others decoded.
    assert len(groups) == 2 + 8 and all(len(g) == 4 * 3 and all(y == g[0] for y in g) for g in groups.values())
    assert {x["text"] for x in samples if x["prompt_index"] == 7} == {"!!!!"}  # 17 x 4; ids 10-16 are special
    from cascade_repro.engines import vllm_logprobs

    assert vllm_logprobs.uniform_topk.__name__ == "uniform_topk"  # the loop arm put it back
