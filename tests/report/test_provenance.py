"""Provenance across invocations: a resume keeps the first invocation's identity, appends its own,
and refuses to mix two stacks unless asked (issue: failures that explain themselves)."""

from __future__ import annotations

import pytest

from cascade_repro.errors import UsageError
from cascade_repro.run.runner import resumed_run
from cascade_repro.rundir.manifest import Manifest

ENV1 = {"vllm": "0.26.0", "torch": "2.11.0+cu130", "transformers": "5.17.0", "gpu_name": "NVIDIA H200",
        "driver": "580.159.04", "VLLM_USE_V2_MODEL_RUNNER": "0"}  # fmt: skip


def _run(created: str, env: dict, command: str) -> Manifest:
    run = {"run_id": "r1", "created_at": created, "command": command, "env": env, "timings": {"total_s": 12.0}}
    run["invocations"] = [Manifest.from_json(run).own_invocation().to_json()]  # as runner.prepare records it
    return Manifest.from_json(run)


def test_a_resume_keeps_the_first_invocation_and_appends_its_own():
    old = _run("2026-12-01T10:00:00+0000", ENV1, "cascade-repro matrix --engine vllm")
    old.invocations[0].update(cells_kept=0, cells_run=10, total_s=12.0)
    env2 = {**ENV1, "VLLM_USE_V2_MODEL_RUNNER": "1"}  # not part of the stack: allowed, but recorded
    new = resumed_run(old, _run("2026-12-01T11:00:00+0000", env2, "cascade-repro matrix --engine vllm"), False)
    new = new.to_json()
    assert new["created_at"] == "2026-12-01T10:00:00+0000" and new["env"] == ENV1
    assert [i["started_at"] for i in new["invocations"]] == ["2026-12-01T10:00:00+0000", "2026-12-01T11:00:00+0000"]
    assert new["invocations"][1]["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "1"  # the second one's own
    assert new["timings"] == {"total_s": 12.0} and "mixed_stack" not in new


def test_an_old_run_json_without_invocations_becomes_the_first():
    old = Manifest.from_json({"run_id": "r1", "created_at": "2026-11-30T09:00:00+0000", "command": "c0", "env": ENV1})
    new = resumed_run(old, _run("2026-12-01T11:00:00+0000", ENV1, "c1"), False).to_json()
    assert [i["command"] for i in new["invocations"]] == ["c0", "c1"]


@pytest.mark.parametrize("key,value", [("vllm", "0.27.0"), ("torch", "2.12.0"), ("gpu_name", "NVIDIA H100"),
                                       ("transformers", "5.18.0")])  # fmt: skip
def test_a_resume_under_another_stack_is_refused_unless_allowed(key, value):
    old = _run("2026-12-01T10:00:00+0000", ENV1, "c0")
    other = _run("2026-12-01T11:00:00+0000", {**ENV1, key: value}, "c1")
    import re

    with pytest.raises(UsageError, match=f"{re.escape(f'{key} {ENV1[key]} -> {value}')}.*--allow-mixed"):
        resumed_run(old, other, False)
    mixed = resumed_run(old, other, True)
    assert mixed.mixed_stack == [key] and len(mixed.invocations) == 2
    # A third invocation under the first stack keeps the mark: the run holds two stacks' cells.
    third = resumed_run(mixed, _run("2026-12-01T12:00:00+0000", ENV1, "c2"), False)
    assert third.mixed_stack == [key]


def test_the_report_lists_invocations_and_the_headline_says_mixed(tmp_path):
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    tr = importlib.import_module("test_report")
    run = {**tr.RUN, "mixed_stack": ["vllm"], "invocations": [
        {"started_at": "2026-12-01T10:00:00+0000", "command": "cascade-repro matrix --engine vllm", "env": ENV1,
         "cells_kept": 0, "cells_run": 7, "total_s": 300.0},
        {"started_at": "2026-12-01T11:00:00+0000", "command": "cascade-repro matrix --engine vllm --allow-mixed",
         "env": {**ENV1, "vllm": "0.27.0"}, "cells_kept": 7, "cells_run": 3, "total_s": 90.5},
    ]}  # fmt: skip
    run_dir = tr.build_run(tmp_path / "run", run)
    from cascade_repro.report.load import load_run
    from cascade_repro.report.markdown import MarkdownFormatter

    md = MarkdownFormatter().render(load_run(run_dir))
    assert md.splitlines()[0].endswith("\\[mixed stacks: vllm changed between invocations\\]")  # md-escaped
    assert "<details><summary>Invocations</summary>" in md
    assert "| 2 | matrix | 2026-12-01T11:00:00+0000 | 7 | 3 | 90.5 | vllm 0.27.0, torch 2.11.0+cu130, gpu\\_name NVIDIA H200 |" in md  # md-escaped


def test_rescore_is_an_invocation_too(tmp_path):
    import json

    from conftest import synthetic_run
    from support.cli import CliRunner

    from cascade_repro.cli import app

    run_dir = synthetic_run(tmp_path / "synth", prompts=8, batch="1,8")
    res = CliRunner().invoke(app, ["report", str(run_dir), "--rescore"])
    assert res.exit_code in (0, 1, 4, 5), res.output
    invs = json.loads((run_dir / "run.json").read_text())["invocations"]
    assert [i.get("kind", "matrix") for i in invs] == ["matrix", "rescore"]
    assert invs[1]["command"].startswith("cascade-repro") and "python" in invs[1]["env"]
    assert "<details><summary>Invocations</summary>" in (run_dir / "report.md").read_text()
