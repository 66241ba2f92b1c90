"""The tables compare writes carry every column tables.py promises its readers."""

from __future__ import annotations

from conftest import synthetic_run

from cascade_repro.judge import compare, tables
from cascade_repro.rundir import manifest

# pairs.parquet's columns, in order, as every run so far wrote them: derived from the statistics'
# registry now, they must not move (old runs load; golden reports stay byte-identical); a new
# statistic's columns are appended (the reference's top-k distribution error).
PAIR_COLUMNS_ON_DISK = [
    "pair_id", "kind", "inject", "test_cell", "ref_cell", "tp", "batch", "ref_batch", "seed", "dtype", "fa_version",
    "backend", "n", "n_identical", "n_diverged", "first_div_median", "common_prefix_ratio_mean",
    "edit_distance_mean", "topk_violations", "dlogprob_mean", "dlogprob_max", "d_seq_rep_4_mean", "d_seq_rep_4_lo",
    "d_seq_rep_4_hi", "noise_pair_id", "noise_n", "noise_n_diverged", "noise_topk_violations", "p_divergence",
    "p_topk", "control_pair_id", "drift_n", "drift_tokens", "drift_test", "drift_control", "drift_floor",
    "drift_ratio", "drift_ratio_lo", "drift_ratio_hi", "drift_threshold", "drift_null_q", "p_drift", "drift_up",
    "bias_n", "bias_up", "bias_down", "bias_mean", "p_bias", "p_bias_control", "topk_drift_ratio",
    "topk_drift_ratio_lo", "topk_drift_ratio_hi", "cascade_steps", "cascade_decode_steps", "total_steps", "depth",
    "verdict", "decided_by", "reasons", "if_n", "if_strict_test", "if_strict_ref", "if_strict_delta",
    "if_loose_delta", "if_gained", "if_lost", "p_if", "speed_ratio", "speed_ratio_lo", "speed_ratio_hi",
    "speed_waves", "wall_ratio", "predicted_speedup", "speed_flag", "rule", "reference", "ref_n", "ref_err_test",
    "ref_err_twin", "ref_ratio", "ref_ratio_lo", "ref_ratio_hi", "ref_up", "ref_down", "p_ref_sign",
    "p_ref_wilcoxon", "p_ref", "ref_min_effect", "ref_min_effect_pair", "ref_regret_test", "ref_regret_twin",
    "ref_signed_test", "ref_signed_twin", "ref_by_step_test", "ref_by_step_twin",
    "ref_topk_n", "ref_topk_test", "ref_topk_twin", "ref_topk_ratio", "ref_topk_ratio_lo", "ref_topk_ratio_hi",
    "ref_topk_up", "ref_topk_down", "p_ref_topk_sign", "p_ref_topk_wilcoxon", "p_ref_topk", "ref_topk_min_effect",
    "ref_topk_min_effect_pair",
]  # fmt: skip


def test_pair_columns_derived_from_the_statistics_are_the_ones_on_disk():
    assert tables.PAIR_COLUMNS == PAIR_COLUMNS_ON_DISK


def test_a_statistic_registered_brings_its_columns_after_the_one_it_names():
    from dataclasses import replace

    from cascade_repro.judge.statistics import STATISTICS

    extra = replace(STATISTICS[0], name="new", columns=("new_x", "p_new"), after="p_bias_control")
    cols = tables.pair_columns(tables._PAIR_BASE, (*STATISTICS, extra))
    at = cols.index("p_bias_control")
    assert cols[at + 1 : at + 3] == ["new_x", "p_new"] and len(cols) == len(PAIR_COLUMNS_ON_DISK) + 2


def test_compare_writes_the_schema(tmp_path):
    run_dir = synthetic_run(tmp_path / "synth", prompts=8, batch="1,8", max_tokens=12)
    from cascade_repro.judge.verdicts import Thresholds

    cells, pairs, comparisons = compare.build_tables(manifest.read_manifest(run_dir), run_dir, Thresholds())
    assert list(pairs.columns) == tables.PAIR_COLUMNS
    assert set(tables.CELL_COLUMNS) <= set(cells.columns), set(tables.CELL_COLUMNS) - set(cells.columns)
    assert set(tables.COMPARISON_COLUMNS) <= set(comparisons.columns), set(tables.COMPARISON_COLUMNS) - set(
        comparisons.columns
    )
    assert len(pairs) and len(comparisons) == 8 * len(pairs)


def test_speed_columns_on_a_synthetic_run(tmp_path):
    # make_synthetic_run times cascade's decode steps at 1.2 x flat's from batch 8 on.
    run_dir = synthetic_run(tmp_path / "synth", prompts=16, batch="1,8")
    from cascade_repro.judge.verdicts import Thresholds

    cells, pairs, _ = compare.build_tables(manifest.read_manifest(run_dir), run_dir, Thresholds())
    casc = pairs[(pairs["kind"] == "cascade") & (pairs["batch"] == 8)].iloc[0]
    assert casc["speed_waves"] == 2
    assert abs(casc["speed_ratio"] - 1.2) < 1e-3 and casc["speed_ratio_lo"] > 1.19
    assert casc["speed_flag"] == "heuristic chose cascade; it was slower"
    b1 = pairs[(pairs["kind"] == "cascade") & (pairs["batch"] == 1)].iloc[0]
    assert abs(b1["speed_ratio"] - 1.0) < 1e-3 and b1["speed_flag"] == ""  # no cascade at batch 1
    flat8 = cells[(cells["batch"] == 8) & (cells["arm"] == "flat")].iloc[0]
    assert flat8["cascade_step_ms"] != flat8["cascade_step_ms"]  # NaN: a flat cell has no cascade step
    assert 2.0 < flat8["flat_step_ms"] < 2.2 and flat8["decode_tok_s"] > 0


def test_a_cell_with_an_unreadable_record_is_an_error_naming_the_line(tmp_path):
    run_dir = synthetic_run(tmp_path / "synth", prompts=8, batch="1,8")
    from cascade_repro.judge.verdicts import Thresholds

    (path,) = (run_dir / "samples").glob("*.jsonl")
    lines = path.read_bytes().split(b"\n")
    k = next(i for i, ln in enumerate(lines) if b'"type":"cell_done","cell_id":"tp1-b8-cascade"' in ln)
    lines[k] = b'{"type":"cell_do\xff\xfe'  # the cell_done record of tp1-b8-cascade, garbled
    path.write_bytes(b"\n".join(lines))
    cells, pairs, _ = compare.build_tables(manifest.read_manifest(run_dir), run_dir, Thresholds())
    row = cells.set_index("cell_id").loc["tp1-b8-cascade"]
    assert (
        row["status"] == "error"
        and f"at line {k + 1}:" in row["error"]
        and "rerun the same command" in row["error"]
    )
    assert pairs.set_index("pair_id").loc["tp1-b8-cascade~flat", "verdict"] == "error"
