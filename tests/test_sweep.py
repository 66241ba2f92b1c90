"""sweep.py (explain --measure): the sweep's plan, and its table read from a finished run."""

from __future__ import annotations

import math

import pytest

from cascade_repro import sweep
from cascade_repro.plan.matrix import MatrixSpec


def test_batches_around_the_threshold():
    # The embedded model on an H200: decode steps go to cascade from 45 requests.
    assert sweep.sweep_batches(45) == [22, 34, 45, 56, 68, 90, 135]
    assert sweep.sweep_batches(10) == [8, 10, 12, 15, 20, 30]  # none below vLLM's 8-request limit
    assert sweep.sweep_batches(None) == sweep.sweep_batches(sweep.FALLBACK_THRESHOLD)


def test_the_users_values_stand_and_the_rest_is_the_sweeps():
    vals = sweep.sweep_values({"model": "m", "batch": [64], "limit": 8}, 45, given={"batch"})
    assert vals["batch"] == [64] and vals["limit"] == 8 and vals["fa_versions"] == [2, 3]
    assert vals["force_cascade"] and vals["ignore_eos"] and vals["graphs_for_batches"] and vals["max_tokens"] == 128
    assert vals["cascade"] == [True, False] and vals["engine"] == "vllm"
    spec = MatrixSpec.from_dict(vals)  # a valid matrix
    assert spec.force_cascade is True


def _pair(batch, fa, ratio, lo, hi, waves=3, dec=100):
    return {"kind": "cascade", "tp": 1, "batch": batch, "fa_version": fa, "test_cell": f"tp1-b{batch}-fa{fa}-cascade",
            "speed_ratio": ratio, "speed_ratio_lo": lo, "speed_ratio_hi": hi, "speed_waves": waves,
            "cascade_decode_steps": dec, "total_steps": 128}  # fmt: skip


def _pred(batch, ct, ft):
    return {"decode": ct < ft, "decode_cost": {"cascade": ct, "flash_decoding": ft}}


def test_rows_crossover_and_markdown():
    pairs = [
        _pair(22, "2", 1.10, 1.05, 1.15), _pair(22, "3", 1.20, 1.1, 1.3),
        _pair(45, "2", 0.97, 0.95, 0.99), _pair(45, "3", 1.15, 1.1, 1.2),
        _pair(90, "2", 0.90, 0.88, 0.93), _pair(90, "3", 0.98, 0.96, 1.01),  # FA3 b90: one wave slower
        {"kind": "noise-batch", "tp": 1, "batch": 90, "fa_version": "2"},
    ]  # fmt: skip
    preds = {}
    for b, ct, ft in ((22, 13, 7), (45, 13, 14), (90, 13, 27)):
        for fa in ("2", "3"):
            preds[f"tp1-b{b}-fa{fa}-cascade"] = _pred(b, ct, ft)
    rows = sweep.sweep_rows(pairs, preds)
    assert [(r.batch, r.heuristic, r.cascade_cost, r.flash_decoding_cost) for r in rows] == [
        (22, False, 13, 7), (45, True, 13, 14), (90, True, 13, 27)]  # fmt: skip
    assert sweep.heuristic_switch(rows, 1) == 45
    assert sweep.crossover(rows, "2", 1) == 45
    assert sweep.crossover(rows, "3", 1) is None  # not faster in every wave anywhere
    lines = sweep.summary_lines(rows)
    assert lines == [
        "TP 1: the heuristic gives decode steps to cascade from 45 requests; FA2 cascade measured faster than "
        "flat from 45 requests; FA3 cascade never measured faster (up to 90)"
    ]
    md = sweep.markdown(rows, ["GPU X"])
    assert md.splitlines()[0] == (
        "| tp | batch | heuristic (decode step) | cost model: cascade / flash-decoding | FA2 cascade vs flat | "
        "FA3 cascade vs flat |"
    )
    assert "| 1 | 22 | flat | 13 / 7 | 10% slower (+5% to +15%) | 20% slower (+10% to +30%) |" in md
    assert md.rstrip().endswith("- GPU X")


def test_a_pair_whose_cascade_never_ran_says_so():
    rows = sweep.sweep_rows([_pair(8, "3", 1.0, 1.0, 1.0, dec=0)], {})
    assert rows[0].heuristic is None and rows[0].cascade_cost is None
    assert sweep.table(rows)[1][0][-1] == "same (+0% to +0%), cascade never ran"
    assert sweep.crossover(rows, "3", 1) is None
    assert sweep.pays(sweep.Measured()) is None and math.isnan(sweep.Measured().ratio)


def test_rows_from_a_finished_run(tmp_path):
    from conftest import synthetic_run

    run_dir = synthetic_run(tmp_path / "synth", prompts=16, batch="1,8")
    from cascade_repro.judge import compare
    from cascade_repro.judge.verdicts import Thresholds
    from cascade_repro.report.load import load_run
    from cascade_repro.report.view import predictions
    from cascade_repro.rundir import layout, manifest

    cells, pairs, comps = compare.build_tables(manifest.read_manifest(run_dir), run_dir, Thresholds())
    for name, df in ((layout.CELLS, cells), (layout.PAIRS, pairs), (layout.COMPARISONS, comps)):
        df.to_parquet(run_dir / name)
    data = load_run(run_dir)
    rows = sweep.sweep_rows(data.pairs.to_dict("records"), predictions(data))
    assert [r.batch for r in rows] == [1, 8]
    (m8,) = rows[1].by_fa.values()
    assert abs(m8.ratio - 1.2) < 1e-3 and m8.waves == 2  # the synthetic run's cascade: 20 % slower
    assert "facts" not in sweep.facts(data.manifest)[0]


def test_measure_without_vllm_is_a_one_line_error(tmp_path):
    pytest.importorskip("typer")
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    from support.cli import CliRunner

    from cascade_repro.cli import app

    res = CliRunner().invoke(app, ["explain", "--measure", "--gpu", "H200", "--prefix-tokens", "1597",
                                   "--results-dir", str(tmp_path)])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "explain --measure runs vLLM on this machine's GPU" in res.output
    assert "Traceback" not in res.output and not list(tmp_path.iterdir())
