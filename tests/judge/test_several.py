"""A run of several twins on the fake engine, end to end: one prompt set, one run directory, each
twin judged as a run of it alone would be (pair ids prefixed by the twin), one headline naming the
twins that changed outputs, one exit code; its reports in four formats held to golden files; a cut
run resumed; a single twin's run.json untouched by any of it.

The golden files are regenerated with ``UPDATE_GOLDEN=1 pytest tests/judge/test_several.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from support.cli import CliRunner

from cascade_repro.cli import app
from cascade_repro.report import formatter_for, load_run
from cascade_repro.rundir import layout
from cascade_repro.rundir.manifest import Invocation, read_manifest, write_manifest

GOLDEN = Path(__file__).parents[1] / "golden" / "several-twins"
TWINS = "cascade,prefix-caching,chunked-prefill"
# The fault moves the logprobs on cascade's steps only: the cascade twin changes outputs, the others
# (whose test arms run no cascade step on the fake engine) stay identical.
ARGV = ["matrix", "--engine", "fake", "--twin", TWINS, "--inject", "lse-layout", "--limit", "8", "--batch", "8",
        "--max-tokens", "16", "--quiet"]  # fmt: skip


def _run(tmp_path: Path, run_id: str, env: dict[str, str] | None = None) -> tuple[int, Path, str]:
    res = CliRunner().invoke(app, [*ARGV, "--results-dir", str(tmp_path), "--run-id", run_id], env=env)
    return res.exit_code, tmp_path / run_id, res.stderr


@pytest.fixture(scope="module")
def several(tmp_path_factory: pytest.TempPathFactory) -> Path:
    code, run, err = _run(tmp_path_factory.mktemp("several"), "three")
    assert code == 1, err
    return run


def test_one_run_judges_each_twin_and_names_the_one_that_changed(several: Path):
    m = read_manifest(several)
    assert m.spec_json["twin"] == TWINS and [t.name for t in m.twins] == TWINS.split(",")
    pairs = pd.read_parquet(several / layout.PAIRS).set_index("pair_id")
    assert pairs.loc["cascade/tp1-b8-cascade~flat", "verdict"] == "regression"
    assert pairs.loc["prefix-caching/tp1-b8-prefix-on~prefix-off", "verdict"] == "identical"
    assert pairs.loc["chunked-prefill/tp1-b8-chunked~unchunked", "verdict"] == "identical"
    # Each twin's noise control is its own, read under its own arm names.
    assert pairs.loc["prefix-caching/tp1-b8-prefix-on~prefix-off", "noise_pair_id"] == (
        "prefix-caching/tp1-b8-prefix-off-r1~r0"
    )
    assert set(pairs["kind"]) == {
        "cascade",
        "prefix-caching",
        "chunked-prefill",
        "noise-batch",
        "noise-restart",
    }
    summary = json.loads((several / layout.SUMMARY_JSON).read_text())
    assert summary["headline"] == (
        "cascade-repro --twin cascade,prefix-caching,chunked-prefill: outputs changed under cascade (1 of 1 pair); "
        "no effect beyond noise under prefix-caching, chunked-prefill"
    )
    assert (summary["exit_code"], summary["exit_reason"]) == (1, "cascade: 1 regression (fail_on=regression)")
    assert [(t["name"], t["changed_outputs"], t["exit_code"]) for t in summary["twins"]] == [
        ("cascade", True, 1), ("prefix-caching", False, 0), ("chunked-prefill", False, 0),
    ]  # fmt: skip
    # One cells row per cell run, each run once.
    cells = pd.read_parquet(several / layout.CELLS)
    assert sorted(cells["cell_id"]) == sorted(c.cell_id for c in m.plan.cells) and cells["cell_id"].is_unique


def _pinned(run: Path, to: Path) -> Path:
    """A copy of ``run`` with what differs between two runs of it (times, speeds, the machine, the
    command's temporary folder) set to fixed values, so its reports can be held to golden files."""
    import shutil

    shutil.copytree(run, to)
    m = read_manifest(to)
    env = {"cascade_repro": "0.1.0", "python": "3.11.7", "platform": "Linux-x86_64", "vllm": "not installed"}
    command = " ".join(["cascade-repro", *ARGV, "--results-dir", "results"])
    m.update(created_at="2026-12-03T12:00:00+0000", command=command, env=env, tool_source=None)
    m.update(invocations=[Invocation(started_at="2026-12-03T12:00:00+0000", command=command, env=env,
                                     cells_kept=0, cells_run=len(m.plan.cells), total_s=4.0)])  # fmt: skip
    m.timings.update(total_s=4.0)
    for rec in m.engines.values():
        rec.update(start_s=0.01)
    write_manifest(to, m)
    cells = pd.read_parquet(to / layout.CELLS)
    cells["wall_s"], cells["tokens_per_s"] = 0.5, 256.0
    layout.write_parquet_atomic(cells, to / layout.CELLS)
    return to


@pytest.mark.parametrize(
    "fmt, golden",
    [("markdown", "report.md"), ("html", "report.html"), ("json", "summary.json"), ("junit", "junit.xml")],
)
def test_golden_reports_group_by_twin(several: Path, tmp_path: Path, fmt: str, golden: str):
    data = load_run(_pinned(several, tmp_path / "pinned"))
    text = formatter_for(fmt).render(data)
    path = GOLDEN / golden
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", newline="")
    assert text == path.read_text(encoding="utf-8"), (
        f"{golden} differs from golden (UPDATE_GOLDEN=1 to accept)"
    )


def test_reports_name_each_twin_once_and_the_run_wide_sections_once(several: Path):
    md = (several / layout.REPORT_MD).read_text()
    heads = [line for line in md.splitlines() if line.startswith("### ")]
    assert [h.split(":")[0] for h in heads] == [
        "### cascade", "### prefix-caching", "### chunked-prefill", "### The whole run", "### Reproduce",
    ]  # fmt: skip
    assert md.count("<summary>Environment</summary>") == 1 and md.count("<summary>Cells</summary>") == 1
    assert md.count("<summary>Evidence per pair</summary>") == 3
    junit = (several / layout.JUNIT_XML).read_text()
    assert junit.count("<testsuite ") == 3 and 'name="cascade-repro/prefix-caching"' in junit
    assert '<testsuites name="cascade-repro" tests="3" failures="1"' in junit


def test_a_cut_run_resumes_to_the_same_verdicts(several: Path, tmp_path: Path):
    code, run, _ = _run(tmp_path, "cut", env={"CASCADE_REPRO_FAULT": "exit:tp1-b8-prefix-on"})
    assert code != 0
    cells = pd.read_parquet(run / layout.CELLS).set_index("cell_id")
    assert cells.loc["tp1-b8-prefix-on", "status"] == "error"
    assert (cells.drop(index="tp1-b8-prefix-on")["status"] == "done").all()  # the other engines went on
    code, run, err = _run(tmp_path, "cut")
    assert code == 1, err
    inv = read_manifest(run).invocations or []
    assert [(i.cells_kept, i.cells_run) for i in inv][-1] == (8, 1)  # only the failed cell ran again
    got = pd.read_parquet(run / layout.PAIRS).set_index("pair_id")["verdict"]
    want = pd.read_parquet(several / layout.PAIRS).set_index("pair_id")["verdict"]
    pd.testing.assert_series_equal(got.sort_index(), want.sort_index())


def test_a_single_twin_writes_nothing_of_several(tmp_path: Path):
    res = CliRunner().invoke(app, ["matrix", "--engine", "fake", "--twin", "prefix-caching", "--limit", "4",
                                   "--batch", "8", "--max-tokens", "8", "--quiet", "--results-dir", str(tmp_path),
                                   "--run-id", "one"])  # fmt: skip
    assert res.exit_code == 0, res.stderr
    run = json.loads((tmp_path / "one" / layout.RUN_JSON).read_text())
    assert run["spec"]["twin"] == "prefix-caching"
    assert all("twins" not in c for c in run["plan"]["cells"])
    assert all("twin" not in e for e in run["plan"]["engines"].values())
    pairs = pd.read_parquet(tmp_path / "one" / layout.PAIRS)
    assert not pairs["pair_id"].str.contains("/").any()
    assert "twins" not in json.loads((tmp_path / "one" / layout.SUMMARY_JSON).read_text())


@pytest.mark.parametrize(
    "twin, message",
    [
        ("cascade,cuda-graph", "error: --twin must be one of"),
        ("cascade,cascade", "error: --twin names cascade twice"),
    ],
)
def test_a_bad_list_is_refused_in_one_line(tmp_path: Path, twin: str, message: str):
    res = CliRunner().invoke(app, ["matrix", "--engine", "fake", "--twin", twin, "--dry-run"])
    assert res.exit_code == 2
    assert res.stderr.startswith(message) and res.stderr.count("\n") == 1


def test_the_dry_run_lists_each_twins_cells(tmp_path: Path):
    res = CliRunner().invoke(
        app,
        [
            "matrix",
            "--engine",
            "fake",
            "--twin",
            "chunked-prefill,attention-backend=FLASH_ATTN:TRITON_ATTN",
            "--batch",
            "8",
            "--limit",
            "2",
            "--dry-run",
        ],  # fmt: skip
    )
    assert res.exit_code == 0, res.stderr
    assert (
        "cells per twin: chunked-prefill 3 (2 shared), attention-backend=FLASH_ATTN:TRITON_ATTN 3 (2 shared)"
        in (res.stdout.replace("\n", " "))
    )


def test_summary_json_and_junit_keep_their_schemas(several: Path):
    import jsonschema
    import xmlschema

    from cascade_repro.report.json import summary_schema

    jsonschema.Draft202012Validator(summary_schema()).validate(
        json.loads((several / layout.SUMMARY_JSON).read_text())
    )
    xsd = Path(__file__).parents[1] / "data" / "junit-10.xsd"
    xmlschema.XMLSchema(xsd).validate((several / layout.JUNIT_XML).read_text())


def test_shards_of_several_twins_merge_to_the_whole_run(several: Path, tmp_path: Path):
    for shard in ("1/2", "2/2"):
        res = CliRunner().invoke(app, [*ARGV, "--results-dir", str(tmp_path / "shards"), "--shard", shard])
        assert res.exit_code in (0, 1, 4), res.stderr  # a shard may hold one side of a twin's pairs only
    shards = sorted(str(p) for p in (tmp_path / "shards").iterdir())
    res = CliRunner().invoke(app, ["merge", str(tmp_path / "merged"), *shards])
    assert res.exit_code == 1, res.stderr
    got = pd.read_parquet(tmp_path / "merged" / layout.PAIRS).set_index("pair_id")["verdict"]
    want = pd.read_parquet(several / layout.PAIRS).set_index("pair_id")["verdict"]
    pd.testing.assert_series_equal(got.sort_index(), want.sort_index())


def test_minimize_takes_the_cascade_pair_of_a_run_of_several(several: Path, tmp_path: Path):
    out = tmp_path / "min"
    r = CliRunner().invoke(app, ["minimize", str(several), "--out", str(out), "--criterion", "any"])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "minimized.json").read_text())
    assert data["reproduced"] and data["pair_id"] == "cascade/tp1-b8-cascade~flat"


def test_all_says_in_one_line_what_it_left_out(tmp_path: Path):
    res = CliRunner().invoke(app, ["matrix", "--engine", "fake", "--twin", "all", "--batch", "8", "--limit", "2",
                                   "--dry-run"])  # fmt: skip
    assert res.exit_code == 0, res.stderr
    assert "note: --twin all leaves out tp=1:2 (the fake engine runs on one device)\n" in res.stderr
    assert "cells per twin: cascade 3, prefix-caching 3, chunked-prefill 3" in res.stdout.replace("\n", " ")
