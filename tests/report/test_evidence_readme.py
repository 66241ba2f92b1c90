"""The commands of docs/evidence/*/README.md that run on what this repository holds still work
(issue 31, part 4): each Python block that imports cascade_repro runs as written, in a folder where
the run it names is a synthetic run with samples; each `cascade-repro report docs/evidence/...`
line runs on a copy of that folder and exits with its committed summary's code."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
from support.cli import CliRunner

from cascade_repro.cli import app

ROOT = Path(__file__).resolve().parents[2]
READMES = sorted((ROOT / "docs" / "evidence").glob("*/README.md"))
BLOCK = re.compile(r"```(python|bash)\n(.*?)```", re.S)


def blocks(lang: str) -> list[tuple[str, str]]:
    out = []
    for readme in READMES:
        for i, m in enumerate(BLOCK.finditer(readme.read_text(encoding="utf-8"))):
            if m.group(1) == lang:
                out.append((f"{readme.parent.name}#{i}", m.group(2)))
    return out


PYTHON = [(name, code) for name, code in blocks("python") if "cascade_repro" in code]
REPORTS = [
    (name, line)
    for name, code in blocks("bash")
    for line in code.splitlines()
    if line.startswith("cascade-repro report docs/evidence/")
]


def test_there_are_commands_to_run():
    assert PYTHON and REPORTS


@pytest.mark.parametrize(("name", "code"), PYTHON, ids=[n for n, _ in PYTHON])
def test_python_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, code: str):
    from conftest import synthetic_run

    runs = sorted(set(re.findall(r'Path\("(results/[^"]+)"\)', code)))
    for run in runs:
        synthetic_run(tmp_path / run, prompts=8, batch="1,8")
        (tmp_path / run / "report.md").unlink(missing_ok=True)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, name, "exec"), {"__name__": "__readme__"})  # noqa: S102 - the README's own code
    for run in runs:
        assert (tmp_path / run / "report.md").is_file(), name  # rewritten by the block


@pytest.mark.parametrize(("name", "line"), REPORTS, ids=[n for n, _ in REPORTS])
def test_report_line_runs(tmp_path: Path, name: str, line: str):
    args = shlex.split(line)[1:]
    src = ROOT / args[1]
    run_dir = tmp_path / src.name
    shutil.copytree(src, run_dir)
    committed = json.loads((src / "summary.json").read_text(encoding="utf-8"))
    res = CliRunner().invoke(app, [args[0], str(run_dir), *args[2:]])
    assert res.exit_code == committed["exit_code"], res.output
    assert (run_dir / "report.md").read_bytes() == (src / "report.md").read_bytes()  # no samples: kept
