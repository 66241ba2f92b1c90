"""The tables compare writes carry every column tables.py promises its readers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cascade_repro import compare, runstore, tables

ROOT = Path(__file__).resolve().parents[1]


def test_compare_writes_the_schema(tmp_path):
    run_dir = tmp_path / "synth"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "make_synthetic_run.py"), str(run_dir), "--prompts", "8",
         "--max-tokens", "12", "--tp", "1", "--batch", "1,8", "--procs", "1"],
        check=True, capture_output=True,
    )  # fmt: skip
    from cascade_repro.verdicts import Thresholds

    cells, pairs, comparisons = compare.build_tables(runstore.read_run_json(run_dir), run_dir, Thresholds())
    assert list(pairs.columns) == tables.PAIR_COLUMNS
    assert set(tables.CELL_COLUMNS) <= set(cells.columns), set(tables.CELL_COLUMNS) - set(cells.columns)
    assert set(tables.COMPARISON_COLUMNS) <= set(comparisons.columns), (
        set(tables.COMPARISON_COLUMNS) - set(comparisons.columns)
    )
    assert len(pairs) and len(comparisons) == 8 * len(pairs)
