"""The README's worked example, run once (conftest's ``make_run``: the Makefile's RUN_ARGS through
`cascade-repro matrix` on the embedded model, the reference pass on, as `make run` runs it): its
quoted output and verdict table are a real run's, its verdicts are clean, its report re-renders
byte for byte and its run.json round-trips.

Every test that reads that run is in this module: under pytest-xdist the module runs on one worker
(conftest's SHARED_RUN_GROUPS), so no other worker waits minutes on the run's lock.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_args
from support.readme import MASKED, markdown_table, masked, worked_example

from cascade_repro.plan.matrix import spec_of
from cascade_repro.rundir import layout, manifest

pytestmark = pytest.mark.slow


def _pairs(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "pairs.parquet").set_index("pair_id")


def test_clean_run_has_no_regression(make_run):
    assert make_run.returncode == 0, make_run.stderr[-3000:]
    pairs = _pairs(make_run.run_dir)
    pair = pairs.loc["tp1-b8-cascade~flat"]
    assert pair["cascade_steps"] > 0
    assert pair["verdict"] in ("identical", "within noise")
    # fp32 on CPU: the reference cascade path agrees with flat attention to float rounding.
    assert pair["dlogprob_max"] < 1e-3
    # The float64 reference decided, and saw the fp32 arms equally close to it.
    assert pair["rule"] == "reference" and pair["reference"] == "float64"
    assert pair["ref_ratio"] == pytest.approx(1.0)
    # The planner added flat batch 1 as the noise control (flat b8 vs flat b1).
    assert pair["control_pair_id"] == "tp1-b8-flat~b1"
    noise = pairs[pairs["kind"] == "noise-batch"]
    assert set(noise.index) == {"tp1-b1-flat~b8", "tp1-b8-flat~b1"}
    assert (noise["verdict"] == "control").all()


def test_report_rerenders_identically_offline(make_run, tmp_path):
    from typer.testing import CliRunner

    from cascade_repro.cli import app

    run_dir = tmp_path / make_run.run_dir.name  # a copy: the shared run stays as it was written
    shutil.copytree(make_run.run_dir, run_dir, symlinks=True)
    before = (run_dir / "report.md").read_text()
    (run_dir / "report.md").unlink()
    res = CliRunner().invoke(app, ["report", str(run_dir)])
    assert res.exit_code == 0, res.output
    assert (run_dir / "report.md").read_text() == before


def test_the_manifest_round_trips_a_real_run_json_byte_for_byte(make_run, tmp_path):
    raw = (make_run.run_dir / layout.RUN_JSON).read_bytes()
    m = manifest.read_manifest(make_run.run_dir)
    assert m.to_json() == json.loads(raw) and list(m.to_json()) == list(json.loads(raw))
    args = run_args()
    assert m.invocations and m.plan.cells
    assert spec_of(m.spec_json).limit == int(args[args.index("--limit") + 1])
    assert spec_of(m.spec_json).max_tokens == int(args[args.index("--max-tokens") + 1])
    manifest.write_manifest(tmp_path, m)
    assert (tmp_path / layout.RUN_JSON).read_bytes() == raw


def test_the_worked_examples_quoted_output_is_a_real_runs(make_run):
    assert make_run.returncode == 0, make_run.stderr[-3000:]
    run_dir = make_run.run_dir
    example = worked_example()

    # The quoted console lines: the headline, the report's path, the cell and wave counts.
    quoted = example[example.index("$ make run\n") :].split("```", 1)[0]
    real = make_run.stderr.splitlines()
    headline = next(line for line in quoted.splitlines() if line.startswith("cascade-repro: "))
    assert headline in real
    report_line = next(line for line in quoted.splitlines() if line.startswith("report: "))
    assert (
        report_line == f"report: results/{run_dir.name}/report.md  (html: results/{run_dir.name}/report.html)"
    )
    assert report_line in real
    run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    n_prompts = len((run_dir / "prompts.jsonl").read_text(encoding="utf-8").splitlines())
    cells = run["plan"]["cells"]
    waves = sum(-(-n_prompts // c["batch"]) for c in cells)
    assert re.search(rf"^cells .* {len(cells)}/{len(cells)} ", quoted, re.M), quoted
    assert re.search(rf"^waves .* {waves}/{waves} ", quoted, re.M), quoted

    # The --dry-run estimate of this matrix exists and the run recorded its time. How close the two
    # are depends on the box's load, which no test can assert (benchmarks/ measure speed).
    from cascade_repro.plan import estimate
    from cascade_repro.rundir.manifest import Manifest

    est = estimate.for_run(Manifest.from_json(run)).seconds
    assert est is not None and est > 0 and run["timings"].get("total_s") is not None, est

    # The quoted verdict table: the real report's, column for column.
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    assert report.startswith(f"## {headline}\n")
    real_header, real_rows = markdown_table(report[report.index("\n| pair | verdict |") :])
    header, rows = markdown_table(example[example.index("its verdict table") :])
    assert header == real_header
    assert [r[0] for r in rows] == [r[0] for r in real_rows]
    for row, real_row in zip(rows, real_rows, strict=True):
        for column, value, real_value in zip(header, row, real_row, strict=True):
            if column in MASKED:
                value, real_value = masked(value), masked(real_value)
            assert value == real_value, (
                f"{row[0]}, column {column!r}: README {value!r}, real run {real_value!r}"
            )
