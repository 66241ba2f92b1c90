"""Hostile run directories and prompt records: a run directory is input from elsewhere (a CI
artifact, a tarball), so what it holds must never reach outside it.

Each table row plants one thing, runs one command and asserts its exit code, that a refusal is one
line on stderr, and that nothing outside the run directory changed (``outside/``: a victim file and a
victim folder, compared byte for byte and by mtime). Run directories come from
``benchmarks/make_synthetic_run.py`` (no model), copied for each row.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cascade_repro.cli import app
from cascade_repro.plan.models import embedded_available
from cascade_repro.run import runstore

WIDE = {"COLUMNS": "250"}
PAIR = "tp1-b8-cascade~flat"  # a cascade pair of the synthetic run (minimize takes any with --pair)


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One synthetic run (two engine keys, scored), copied by every row that needs a run."""
    from conftest import synthetic_run

    return synthetic_run(tmp_path_factory.mktemp("hostile") / "synth", prompts=8, batch="1,8", tp="1,2")


@dataclass
class Case:
    """One row: ``plant`` builds the directories under ``root`` and returns the command's arguments."""

    id: str
    plant: Callable[[Path, Path], list[str]]  # (root, the synthetic run) -> argv
    code: int
    says: str = ""  # what the one line of stderr holds (a refusal); "" for a command that goes on
    needs_model: bool = False


def run_copy(synth: Path, dest: Path) -> Path:
    shutil.copytree(synth, dest, symlinks=True)
    return dest


def victims(root: Path) -> tuple[Path, Path]:
    """``outside/victim.txt`` and ``outside/dir/`` (with a file): what a link in a run points at."""
    out = root / "outside"
    (out / "dir").mkdir(parents=True)
    (out / "victim.txt").write_text("precious\n", encoding="utf-8")
    (out / "dir" / "keep.jsonl").write_text('{"keep": 1}\n', encoding="utf-8")
    return out / "victim.txt", out / "dir"


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root/outside``: its bytes and mtime (what a truncation or append changes)."""
    out = {}
    for p in sorted((root / "outside").rglob("*")):
        st = os.lstat(p)
        out[str(p.relative_to(root))] = (p.read_bytes() if p.is_file() else b"", st.st_mtime_ns)
    return out


def link(path: Path, target: Path) -> None:
    """Replace ``path`` (a file or a folder of the run) with a symbolic link to ``target``."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def samples_file(run: Path) -> Path:
    return runstore.samples_files(run)[0]


def shards(root: Path, synth: Path) -> tuple[Path, Path]:
    """Two shard directories of the synthetic run's matrix (each holds every key: merge takes its own)."""
    out = []
    for i in (1, 2):
        d = run_copy(synth, root / f"shard{i}")
        run = runstore.read_run_json(d)
        run["shard"] = f"{i}/2"
        runstore.write_json_atomic(d / runstore.RUN_JSON, run)
        out.append(d)
    return out[0], out[1]


# --- 1. links planted in a run directory ------------------------------------------------------------


def _report_lock(root: Path, synth: Path) -> list[str]:
    run = run_copy(synth, root / "run")
    link(run / runstore.LOCK, victims(root)[0])
    return ["report", str(run)]


def _report_samples(root: Path, synth: Path) -> list[str]:
    run = run_copy(synth, root / "run")
    link(samples_file(run), victims(root)[0])
    return ["report", "--rescore", str(run)]


def _report_parquet_temp(root: Path, synth: Path) -> list[str]:
    """A link under a table's temp name is removed, not written through: the report goes on."""
    run = run_copy(synth, root / "run")
    link(run / f".{runstore.CELLS}.tmp", victims(root)[0])
    return ["report", "--rescore", str(run)]


def _merge_shard_samples(root: Path, synth: Path) -> list[str]:
    s1, s2 = shards(root, synth)
    link(samples_file(s1), victims(root)[0])  # samples/*.jsonl -> /etc/passwd, say
    return ["merge", str(root / "merged"), str(s1), str(s2)]


def _merge_shard_prompts(root: Path, synth: Path) -> list[str]:
    s1, s2 = shards(root, synth)
    link(s1 / runstore.PROMPTS, victims(root)[0])
    return ["merge", str(root / "merged"), str(s1), str(s2)]


def _merge_out_lock(root: Path, synth: Path) -> list[str]:
    s1, s2 = shards(root, synth)
    (root / "merged").mkdir()
    link(root / "merged" / runstore.LOCK, victims(root)[0])
    return ["merge", str(root / "merged"), str(s1), str(s2)]


def _merge_out_samples(root: Path, synth: Path) -> list[str]:
    """An earlier merge whose samples/ is a link: merging again would empty the folder it points at."""
    s1, s2 = shards(root, synth)
    assert CliRunner().invoke(app, ["merge", str(root / "merged"), str(s1), str(s2)]).exit_code == 0
    link(root / "merged" / runstore.SAMPLES, victims(root)[1])
    return ["merge", str(root / "merged"), str(s1), str(s2)]


def _merge_clean(root: Path, synth: Path) -> list[str]:
    victims(root)
    s1, s2 = shards(root, synth)
    return ["merge", str(root / "merged"), str(s1), str(s2)]


MATRIX = ["matrix", "--limit", "1", "--batch", "1", "--max-tokens", "2", "--no-auto-controls", "--quiet"]


def _matrix_lock(root: Path, synth: Path) -> list[str]:
    run = root / "results" / "r"
    run.mkdir(parents=True)
    link(run / runstore.LOCK, victims(root)[0])
    return [*MATRIX, "--results-dir", str(root / "results"), "--run-id", "r"]


def _matrix_fresh_samples(root: Path, synth: Path) -> list[str]:
    """--fresh once left a linked samples/ in place (rmtree failing quietly) and resumed the old run."""
    run = run_copy(synth, root / "results" / "r")
    link(run / runstore.SAMPLES, victims(root)[1])
    return [*MATRIX, "--results-dir", str(root / "results"), "--run-id", "r", "--fresh"]


def _minimize_dir(root: Path, synth: Path) -> list[str]:
    run = run_copy(synth, root / "run")
    link(run / runstore.MINIMIZE, victims(root)[1])
    return ["minimize", str(run), "--pair", PAIR]


def _minimize_output(root: Path, synth: Path) -> list[str]:
    run = run_copy(synth, root / "run")
    link(run / runstore.MINIMIZE / PAIR / "repro.py", victims(root)[0])
    return ["minimize", str(run), "--pair", PAIR]


LINK = "is a symbolic link"
CASES = [
    Case("report-lock", _report_lock, 2, f".lock {LINK}"),
    Case("report-rescore-samples", _report_samples, 2, LINK),
    Case("report-parquet-temp", _report_parquet_temp, 0),
    Case("merge-shard-samples", _merge_shard_samples, 2, LINK),
    Case("merge-shard-prompts", _merge_shard_prompts, 2, f"prompts.jsonl {LINK}"),
    Case("merge-out-lock", _merge_out_lock, 2, f".lock {LINK}"),
    Case("merge-out-samples", _merge_out_samples, 2, f"samples {LINK}"),
    Case("merge-clean", _merge_clean, 0),
    Case("matrix-lock", _matrix_lock, 2, f".lock {LINK}", needs_model=True),
    Case("matrix-fresh-linked-samples", _matrix_fresh_samples, 2, f"samples {LINK}", needs_model=True),
    Case("minimize-linked-dir", _minimize_dir, 2, f"minimize {LINK}"),
    Case("minimize-linked-output", _minimize_output, 2, f"repro.py {LINK}"),
]


@pytest.fixture(scope="module")
def model_ready() -> bool:
    """The embedded model converted before a matrix row runs, so its stderr is the refusal alone."""
    if not embedded_available():
        return False
    from cascade_repro.plan.models import resolve_model

    resolve_model("embedded")
    return True


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_hostile_run_directories(case: Case, synth: Path, tmp_path: Path, request: pytest.FixtureRequest):
    if case.needs_model and not request.getfixturevalue("model_ready"):
        pytest.skip("the embedded model is not installed")
    argv = case.plant(tmp_path, synth)
    before = snapshot(tmp_path)
    res = CliRunner().invoke(app, argv, env=WIDE)
    assert res.exit_code == case.code, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    if case.says:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, res.stderr
        assert lines[0].startswith("error: ") and case.says in lines[0], lines[0]
        assert "resuming" not in res.output
    assert snapshot(tmp_path) == before  # nothing outside the run directory changed
    merged = tmp_path / "merged"
    if case.code == 2 and case.id.startswith("merge-shard"):
        assert not merged.exists()  # refused before anything was written
    if merged.is_dir() and case.code == 0:
        assert all(not p.is_symlink() for p in merged.rglob("*"))
        assert "precious" not in "".join(p.read_text(errors="replace") for p in merged.rglob("*.jsonl"))


def test_refuse_links_names_a_linked_folder_on_the_way(tmp_path: Path):
    from cascade_repro.errors import UsageError

    run = tmp_path / "run"
    (tmp_path / "elsewhere").mkdir()
    run.mkdir()
    (run / "minimize").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UsageError, match=f"^{run}/minimize is a symbolic link \\(to {tmp_path}/elsewhere\\)"):
        runstore.refuse_links(run, [run / "minimize" / "pair" / "repro.py"])
    runstore.refuse_links(run, [run / "samples" / "k.jsonl"])  # not there yet: nothing to refuse
    os.mkfifo(run / runstore.LOCK)
    with pytest.raises(UsageError, match="is neither a file nor a folder"):
        runstore.refuse_run_links(run)


def test_a_run_directory_that_is_itself_a_link_is_the_users_choice(synth: Path, tmp_path: Path):
    real = run_copy(synth, tmp_path / "real")
    (tmp_path / "alias").symlink_to(real)
    res = CliRunner().invoke(app, ["report", str(tmp_path / "alias")], env=WIDE)
    assert res.exit_code == 0, res.output


def test_writers_in_a_run_directory_do_not_follow_a_link(tmp_path: Path):
    """Belt and braces under the directory check: the appending writers open with O_NOFOLLOW."""
    from cascade_repro.errors import UsageError

    victim, _ = victims(tmp_path)
    before = snapshot(tmp_path)
    planted = tmp_path / "k.jsonl"
    planted.symlink_to(victim)
    with pytest.raises(UsageError, match=LINK):
        runstore.JsonlWriter(planted)
    with pytest.raises(UsageError, match=LINK):
        runstore.truncate_torn_tail(planted)
    assert snapshot(tmp_path) == before and len(before) == 3  # the victim, its folder and the folder's file
