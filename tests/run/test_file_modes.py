"""Every file of a run directory gets the mode any ``open`` would give it: 0666 less the umask.

A teammate, or a CI job re-rendering an artifact as another user, reads what the umask lets them
(022: everyone reads; 077: the owner alone). ``mkstemp``'s fixed 0600 once made the tables,
run.json and prompts.jsonl private whatever the umask said.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from support.cli import CliRunner

from cascade_repro.atomic import write_atomic
from cascade_repro.cli import app


@pytest.fixture
def umask():
    """Set the process's umask for one test (the engine workers inherit it), restored after."""
    old = os.umask(0o022)
    os.umask(old)
    yield os.umask
    os.umask(old)


def modes(run_dir: Path) -> dict[str, int]:
    return {
        str(p.relative_to(run_dir)): stat.S_IMODE(p.stat().st_mode)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_write_atomic_gives_0666_less_the_umask(tmp_path, umask, mask):
    umask(mask)
    write_atomic(tmp_path / "text", "x")
    write_atomic(tmp_path / "table", lambda tmp: Path(tmp).write_bytes(b"PAR1"))  # a writer given a path
    assert modes(tmp_path) == {"table": 0o666 & ~mask, "text": 0o666 & ~mask}
    write_atomic(tmp_path / "text", "y", mode=0o600)  # a caller's own mode still wins
    assert modes(tmp_path)["text"] == 0o600


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_a_runs_files_follow_the_umask(tmp_path, umask, mask):
    umask(mask)
    res = CliRunner().invoke(
        app,
        ["matrix", "--engine", "fake", "--limit", "2", "--batch", "8", "--max-tokens", "4", "--quiet",
         "--results-dir", str(tmp_path), "--run-id", "run"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    found = modes(tmp_path / "run")
    for name in ("run.json", "prompts.jsonl", "cells.parquet", "pairs.parquet", "report.md", "report.html"):
        assert name in found
    assert {name: oct(m) for name, m in found.items() if m != 0o666 & ~mask} == {}
