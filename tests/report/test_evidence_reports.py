"""`report` on every run committed under docs/evidence/ (folders and tarballs) gives the verdicts,
headline and exit code its committed summary.json holds: a refactor of the loaders, the manifest or
the report must not change what a recorded GPU run says."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import jsonschema
import pytest
import xmlschema
from support import gfm
from support.cli import CliRunner

from cascade_repro.cli import app
from cascade_repro.report.json import summary_schema
from cascade_repro.report.summary import ISSUE_COLUMN_CHARS

EVIDENCE = Path(__file__).resolve().parents[2] / "docs" / "evidence"
JUNIT_XSD = Path(__file__).resolve().parents[1] / "data" / "junit-10.xsd"
SCORED = ("run.json", "pairs.parquet", "cells.parquet", "summary.json")


def evidence_runs() -> list[tuple[str, Path, str | None]]:
    runs: list[tuple[str, Path, str | None]] = []
    for run_json in sorted(EVIDENCE.glob("*/*/run.json")):
        if all((run_json.parent / f).exists() for f in SCORED):
            runs.append((str(run_json.parent.relative_to(EVIDENCE)), run_json.parent, None))
    for tgz in sorted(EVIDENCE.glob("*/*.tgz")):
        with tarfile.open(tgz) as tf:
            names = tf.getnames()
        for top in sorted({n.split("/")[0] for n in names if n.endswith("/run.json")}):
            if all(f"{top}/{f}" in names for f in SCORED):
                runs.append((f"{tgz.relative_to(EVIDENCE)}:{top}", tgz, top))
    return runs


def verdicts(summary: dict) -> dict:
    return {
        "headline": summary.get("headline"),
        "exit_code": summary.get("exit_code"),
        "pairs": {p["pair_id"]: (p.get("verdict"), p.get("decided_by")) for p in summary.get("pairs", [])},
    }


RUNS = evidence_runs()


def test_there_are_evidence_runs():
    assert len(RUNS) >= 8, [r[0] for r in RUNS]


@pytest.mark.parametrize(("name", "src", "top"), RUNS, ids=[r[0] for r in RUNS])
def test_report_gives_the_committed_verdicts(tmp_path: Path, name: str, src: Path, top: str | None):
    if top is None:
        run_dir = tmp_path / src.name
        shutil.copytree(src, run_dir)
    else:
        with tarfile.open(src) as tf:
            tf.extractall(tmp_path, members=[m for m in tf.getmembers() if m.name.startswith(f"{top}/")],
                          filter="data")  # fmt: skip
        run_dir = tmp_path / top
    committed = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    before = verdicts(committed)
    res = CliRunner().invoke(app, ["report", str(run_dir), "--fail-on", committed.get("fail_on") or "regression"])
    after = verdicts(json.loads((run_dir / "summary.json").read_text(encoding="utf-8")))
    assert after == before, name
    assert res.exit_code == before["exit_code"], res.output
    if "--force rewrites them" in res.output:  # no samples/ here: the committed richer report was kept
        forced = CliRunner().invoke(app, ["report", str(run_dir), "--force", "--fail-on", committed.get("fail_on") or "regression"])  # fmt: skip
        assert forced.exit_code == before["exit_code"], forced.output
    # The re-rendered report.md as GitHub shows it: nothing struck through (pair ids hold `~`),
    # the headline as summary.json says it, the tables shown open within the issue column.
    shown = gfm.render((run_dir / "report.md").read_text(encoding="utf-8"))
    assert shown.struck == [] and shown.headline == before["headline"], name
    assert max(shown.widths(folded=False), default=0) <= ISSUE_COLUMN_CHARS, shown.tables
    # The machine-readable files as produced now: junit.xml against junit-10.xsd, summary.json
    # against its shipped JSON Schema.
    xmlschema.XMLSchema(JUNIT_XSD).validate(str(run_dir / "junit.xml"))
    jsonschema.Draft202012Validator(summary_schema()).validate(
        json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    )
