"""The tables compare writes carry every column tables.py promises its readers."""

from __future__ import annotations

from conftest import synthetic_run

from cascade_repro.judge import compare, tables
from cascade_repro.rundir import manifest


def test_compare_writes_the_schema(tmp_path):
    run_dir = synthetic_run(tmp_path / "synth", prompts=8, batch="1,8", max_tokens=12)
    from cascade_repro.judge.verdicts import Thresholds

    cells, pairs, comparisons = compare.build_tables(manifest.read_manifest(run_dir), run_dir, Thresholds())
    assert list(pairs.columns) == tables.PAIR_COLUMNS
    assert set(tables.CELL_COLUMNS) <= set(cells.columns), set(tables.CELL_COLUMNS) - set(cells.columns)
    assert set(tables.COMPARISON_COLUMNS) <= set(comparisons.columns), (
        set(tables.COMPARISON_COLUMNS) - set(comparisons.columns)
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
    assert row["status"] == "error" and f"at line {k + 1}:" in row["error"] and "rerun the same command" in row["error"]
    assert pairs.set_index("pair_id").loc["tp1-b8-cascade~flat", "verdict"] == "error"
