"""Messages that must be true and whole (issue 29, items 8 and 12): each row plants one thing, runs
one command and asserts its exit code and the one line it says on stderr (or, for a command that
goes on, what its output holds and what it never says)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest
from support.cli import CliRunner
from test_hostile import WIDE, damage_sample, run_copy, samples_file, shards

from cascade_repro.cli import app
from cascade_repro.rundir import jsonl, layout, manifest


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conftest import synthetic_run

    return synthetic_run(tmp_path_factory.mktemp("messages") / "synth", prompts=8, batch="1,8", tp="1,2")


@dataclass
class Case:
    id: str
    plant: Callable[[Path, Path], list[str]]  # (root, the synthetic run) -> argv
    code: int
    says: str = ""  # the one line on stderr (a refusal), after "error: "
    shows: list[str] = field(default_factory=list)  # what the output holds (a command that goes on)
    never: list[str] = field(default_factory=list)  # what the output must not say


DRY = ["matrix", "--dry-run", "--limit", "2"]


def _flags(*args: str) -> Callable[[Path, Path], list[str]]:
    return lambda root, synth: [*DRY, *args]


def _config(text: str, *args: str) -> Callable[[Path, Path], list[str]]:
    def plant(root: Path, synth: Path) -> list[str]:
        (root / "m.toml").write_text(text, encoding="utf-8")
        return [*DRY, "--config", str(root / "m.toml"), *args]

    return plant


def _results_dir_file(sub: str) -> Callable[[Path, Path], list[str]]:
    def plant(root: Path, synth: Path) -> list[str]:
        (root / "afile").write_text("not a folder\n", encoding="utf-8")
        return ["matrix", "--limit", "1", "--batch", "1", "--max-tokens", "2", "--quiet",
                "--results-dir", str(root / "afile" / sub if sub else root / "afile")]  # fmt: skip

    return plant


def _merge_into_file(root: Path, synth: Path) -> list[str]:
    s1, s2 = shards(root, synth)
    (root / "afile").write_text("x\n", encoding="utf-8")
    return ["merge", str(root / "afile" / "merged"), str(s1), str(s2)]


def _merge_edited_spec(root: Path, synth: Path) -> list[str]:
    """The spec edited by hand keeps its old hash: two equal hashes would say nothing."""
    s1, s2 = shards(root, synth)
    run = manifest.read_run_json(s2)
    run["spec"]["max_tokens"] = 32
    layout.write_json_atomic(s2 / layout.RUN_JSON, run)
    return ["merge", str(root / "merged"), str(s1), str(s2)]


def _merge_damaged_shard(root: Path, synth: Path) -> list[str]:
    s1, s2 = shards(root, synth)
    damage_sample(s1, lambda raw, rec: raw[: len(raw) // 2] + b"\n")
    return ["merge", str(root / "merged"), str(s1), str(s2)]


def _merge_unfinished_shard(root: Path, synth: Path) -> list[str]:
    """A shard cut before its last cell finished: the merge cannot finish it, its shard can."""
    s1, s2 = shards(root, synth)
    path = samples_file(s1)
    lines = path.read_bytes().splitlines(keepends=True)
    last_done = max(i for i, ln in enumerate(lines) if b'"type":"cell_done"' in ln)
    path.write_bytes(b"".join(lines[:last_done]))
    return ["merge", str(root / "merged"), str(s1), str(s2)]


def _merge_cut_before(root: Path, synth: Path) -> list[str]:
    """A merge killed mid-copy: half a samples file and the marker, no run.json."""
    s1, s2 = shards(root, synth)
    out = root / "merged"
    (out / layout.SAMPLES).mkdir(parents=True)
    src = samples_file(s1)
    (out / layout.SAMPLES / src.name).write_bytes(src.read_bytes()[:1000])
    (out / layout.MERGING).write_text(manifest.read_manifest(s1).spec_hash + "\n", encoding="utf-8")
    return ["merge", str(out), str(s1), str(s2)]


def _merge_cut_other_matrix(root: Path, synth: Path) -> list[str]:
    argv = _merge_cut_before(root, synth)
    (root / "merged" / layout.MERGING).write_text("0123456789ab\n", encoding="utf-8")
    return argv


def _merge_partial_without_marker(root: Path, synth: Path) -> list[str]:
    """A folder with files and no marker is not a cut merge: someone's folder, left alone."""
    s1, s2 = shards(root, synth)
    (root / "merged").mkdir()
    (root / "merged" / "notes.txt").write_text("mine\n", encoding="utf-8")
    return ["merge", str(root / "merged"), str(s1), str(s2)]


def _system_prompt(kind: str) -> Callable[[Path, Path], list[str]]:
    def plant(root: Path, synth: Path) -> list[str]:
        path = {"device": Path(os.devnull), "folder": root, "empty": root / "empty.txt"}[kind]
        (root / "empty.txt").write_text("\n", encoding="utf-8")
        return [*DRY, "--system-prompt", str(path)]

    return plant


def _prompts_device(root: Path, synth: Path) -> list[str]:
    return ["prompts", "show", os.devnull]


NEVER_RERUN_SAME = ["rerun the same command"]
# fmt: off
CASES = [
    # --results-dir that is a file: the command line's mistake (2), not the machine refusing (6)
    Case("results-dir-is-a-file", _results_dir_file(""), 2, "afile is a file, not a folder"),
    Case("results-dir-under-a-file", _results_dir_file("sub"), 2, "afile is a file, not a folder"),
    Case("merge-output-under-a-file", _merge_into_file, 2, "afile is a file, not a folder"),
    # list flags: an empty item is a value the user meant to type; absurd integers are refused
    Case("batch-empty-item", _flags("--batch", "8,,16"), 2, "--batch: empty item in '8,,16'"),
    Case("batch-trailing-comma", _flags("--batch", "8,16,"), 2, "--batch: empty item in '8,16,'"),
    Case("tp-empty-item", _flags("--tp", ",1"), 2, "--tp: empty item in ',1'"),
    Case("seed-empty-item", _flags("--seed", "0,,1"), 2, "--seed: empty item in '0,,1'"),
    Case("fa-version-empty-item", _flags("--fa-version", "2,,3"), 2, "--fa-version: empty item in '2,,3'"),
    Case("cascade-empty-item", _flags("--cascade", "on,,off"), 2, "--cascade: empty item in 'on,,off'"),
    Case("calibrate-empty-item", _flags("--calibrate", "0.1,,1"), 2, "--calibrate: empty item in '0.1,,1'"),
    Case("max-tokens-absurd", _flags("--max-tokens", "99999999999999999999999"), 2,
         "--max-tokens must be at most 1,048,576, got 99999999999999999999999"),
    Case("batch-absurd", _flags("--batch", "99999999999999999999"), 2, "--batch values must be at most 65,536"),
    Case("seed-absurd", _flags("--seed", "4294967296"), 2, "--seed values must be integers from 0 to 4294967295"),
    Case("max-tokens-absurd-in-config", _config("max_tokens = 99999999999999999999999\n"), 2,
         "m.toml: max_tokens must be at most 1,048,576, got 99999999999999999999999"),
    # --config: every run option by its name; tables outside [matrix] and one-off actions refused
    Case("config-other-table", _config("[matrix]\nbatch = [8]\n[other]\nx = 1\n"), 2,
         "m.toml: other outside [matrix]: put every setting in [matrix] or none there"),
    Case("config-other-table-alone", _config("batch = [8]\n[other]\nx = 1\n"), 2, "m.toml: unknown key(s) other"),
    Case("config-alpha-and-fail-on", _config('alpha = 0.05\nfail_on = "never"\ndrift_min = 3\n'), 0,
         # 2 prompts: batch 16 would repeat batch 8's one wave, and is dropped
         shows=["4 cells, 1 engine start", "--batch 16: at or above the 2 prompts"]),
    Case("config-alpha-is-read", _config("alpha = 2\n"), 2, "m.toml: alpha must be in (0, 1), got 2"),
    Case("config-alpha-type", _config('alpha = "small"\n'), 2, "m.toml: alpha must be a number, got 'small'"),
    Case("config-fail-on-is-read", _config('fail_on = "sometimes"\n'), 2,
         "m.toml: fail_on must be one of regression, error, never, expected, not 'sometimes'"),
    Case("config-flag-wins", _config('fail_on = "sometimes"\n', "--fail-on", "never"), 0),
    Case("config-shard-is-read", _config('shard = "x"\n'), 2, "m.toml: shard: expected i/n"),
    Case("config-fresh-refused", _config("fresh = true\n"), 2,
         "m.toml: fresh is a one-off action, not a setting: give --fresh on the command line"),
    Case("config-typo-hint", _config("alpah = 0.1\n"), 2, "m.toml: unknown key(s) alpah (did you mean alpha?)"),
    # files that exist but are no text file: said for what they are, never "not found"
    Case("system-prompt-device", _system_prompt("device"), 2,
         f"system prompt file {os.devnull} is not a regular file (a device, a pipe or a socket)"),
    Case("system-prompt-folder", _system_prompt("folder"), 2, "is a folder, not a file"),
    Case("system-prompt-empty", _system_prompt("empty"), 2, "is empty; use 'none' for no system prompt"),
    Case("prompts-device", _prompts_device, 2, f"prompt file {os.devnull} is not a regular file"),
    # merge: what differs, and what finishes a merged run (rerunning the merge cannot)
    Case("merge-edited-spec", _merge_edited_spec, 2, "is a different matrix from", shows=["spec differs: max_tokens 32 vs 64"]),
    Case("merge-damaged-shard", _merge_damaged_shard, 0,
         shows=["finish shard 1/2 (rerun its matrix command), then merge again, or merge without it (--allow-partial)"],
         never=NEVER_RERUN_SAME),
    Case("merge-unfinished-shard", _merge_unfinished_shard, 5,
         shows=["not finished (", "finish shard 1/2 (rerun its matrix command), then merge again"],
         never=NEVER_RERUN_SAME),
    Case("merge-cut-mid-copy-reruns", _merge_cut_before, 0),
    Case("merge-cut-of-another-matrix", _merge_cut_other_matrix, 2, "holds a cut merge of another matrix"),
    Case("merge-into-someones-folder", _merge_partial_without_marker, 2, "exists and is not empty"),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_messages_are_true_and_whole(case: Case, synth: Path, tmp_path: Path):
    argv = case.plant(tmp_path, synth)
    res = CliRunner().invoke(app, argv, env=WIDE)
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == case.code, res.output
    if case.says:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, res.stderr
        assert lines[0].startswith("error: ") and case.says in lines[0], lines[0]
    merged = tmp_path / "merged"
    report = ""
    if case.code != 2 and (merged / layout.REPORT_MD).is_file():
        report = (merged / layout.REPORT_MD).read_text(encoding="utf-8")
        assert not (merged / layout.MERGING).exists()  # a finished merge leaves no marker
    # What is said: on the terminal, or in the report it wrote (as Markdown escapes and wraps it).
    said = " ".join(res.output.split()) + " " + " ".join(report.replace("\\_", "_").split())
    for text in case.shows:
        assert text in said, (text, said)
    for text in case.never:
        assert text not in said, text
    if case.id == "merge-into-someones-folder":
        assert (merged / "notes.txt").read_text(encoding="utf-8") == "mine\n"


def _clean_merge_cells(root: Path, synth: Path) -> pd.DataFrame:
    s1, s2 = shards(root / "clean", synth)
    assert CliRunner().invoke(app, ["merge", str(root / "clean" / "merged"), str(s1), str(s2)]).exit_code == 0
    return pd.read_parquet(root / "clean" / "merged" / layout.CELLS)


def test_a_merge_killed_mid_copy_is_redone_by_the_same_command(
    synth: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from cascade_repro.run import merge as merge_mod

    s1, s2 = shards(tmp_path, synth)
    out = tmp_path / "merged"
    argv = ["merge", str(out), str(s1), str(s2)]
    real, calls = merge_mod._copy, []

    def cut(src: Path, dst: Path, link: bool) -> None:
        calls.append(src)
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C (or a kill) between two files
        real(src, dst, link)

    monkeypatch.setattr(merge_mod, "_copy", cut)
    res = CliRunner().invoke(app, argv, env=WIDE)
    assert res.exit_code == 130, res.output
    assert (out / layout.MERGING).is_file() and not (out / layout.RUN_JSON).exists()
    monkeypatch.setattr(merge_mod, "_copy", real)
    again = CliRunner().invoke(app, argv, env=WIDE)
    assert again.exit_code == 0, again.output
    assert not (out / layout.MERGING).exists()
    pd.testing.assert_frame_equal(pd.read_parquet(out / layout.CELLS), _clean_merge_cells(tmp_path, synth))


# --- a full disk names the file it could not write --------------------------------------------------


def _enospc(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a write, flush or fsync raises it: no name


def test_a_full_disk_names_the_report_it_could_not_write(
    synth: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    run = run_copy(synth, tmp_path / "run")
    monkeypatch.setattr(os, "fsync", _enospc)  # the reports are written durably: fsync before rename
    res = CliRunner().invoke(app, ["report", str(run)], env=WIDE)
    assert res.exit_code == 6, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {run}/"), res.stderr
    assert lines[0].endswith(f": {os.strerror(errno.ENOSPC)}")
    named = Path(lines[0].removeprefix("error: ").rsplit(": ", 1)[0])
    assert named.name in layout.REPORTS and named.parent == run
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]  # no temp file left behind


def test_a_full_disk_names_the_table_it_could_not_write(
    synth: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    run = run_copy(synth, tmp_path / "run")
    monkeypatch.setattr(pd.DataFrame, "to_parquet", _enospc)
    res = CliRunner().invoke(app, ["report", "--rescore", str(run)], env=WIDE)
    assert res.exit_code == 6, res.output
    assert res.stderr.strip() == f"error: {run / layout.CELLS}: {os.strerror(errno.ENOSPC)}", res.stderr


def test_a_full_disk_names_the_copy_a_merge_could_not_write(
    synth: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """shutil names a failed copy by its source first: a full disk refused the destination."""
    s1, s2 = shards(tmp_path, synth)

    def copy2(src: object, dst: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src), None, str(dst))

    monkeypatch.setattr(shutil, "copy2", copy2)
    res = CliRunner().invoke(app, ["merge", str(tmp_path / "merged"), str(s1), str(s2)], env=WIDE)
    assert res.exit_code == 6, res.output
    line = res.stderr.strip()
    assert line.startswith(f"error: {tmp_path / 'merged'}/") and str(s1) not in line, line


@pytest.mark.parametrize("background", [False, True])
def test_a_full_disk_names_the_samples_file(tmp_path: Path, background: bool):
    from cascade_repro.errors import EnvironmentFailure

    class Full:
        closed = False

        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        flush = fileno = close = write

    path = tmp_path / "samples" / "k.jsonl"
    writer = jsonl.JsonlWriter(path, background=background)
    real, writer._f = writer._f, Full()
    with pytest.raises(OSError) as exc:
        writer.write({"type": "cell_start", "cell_id": "a"})
        writer.wait()
    assert str(EnvironmentFailure.from_oserror(exc.value)) == f"{path}: {os.strerror(errno.ENOSPC)}"
    writer._f = real
    writer.close()


# --- a standard output closed before the command started ---------------------------------------------


@pytest.mark.parametrize(
    "argv", [["prompts", "list"], ["--version"], ["matrix", "--dry-run", "--limit", "2"]]
)
def test_a_closed_stdout_is_not_exit_0(argv: list[str], tmp_path: Path):
    """`cascade-repro prompts list >&-`: Python drops every print to a closed stdout without a word,
    so the command once exited 0 with its output lost. It ends as a closed pipe does: 141, quietly."""
    proc = subprocess.run([sys.executable, "-m", "cascade_repro", *argv], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1), cwd=tmp_path,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 141, proc.stderr.decode(errors="replace")
    assert proc.stderr == b""
    assert not list(tmp_path.iterdir())  # nothing took descriptor 1 for a file of its own


def test_a_closed_stdout_does_not_fail_a_command_that_prints_nothing_there(synth: Path, tmp_path: Path):
    run = run_copy(synth, tmp_path / "run")
    proc = subprocess.run([sys.executable, "-m", "cascade_repro", "report", str(run)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1), timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")  # its lines go to stderr
    assert b"wrote " in proc.stderr


# --- --fresh starts over, and says so ----------------------------------------------------------------


def test_fresh_refuses_a_folder_without_a_run_json(tmp_path: Path):
    """--fresh once cleared only a folder with a run.json, so samples left beside a lost one were
    resumed; then it cleared any folder, the user's own samples/ and reports too. A folder without
    run.json (the first file a run writes) is not a run: refused, nothing deleted, nothing resumed."""
    from cascade_repro.errors import UsageError
    from cascade_repro.run.runner import PreparedRun
    from cascade_repro.rundir.manifest import Manifest

    run_dir = tmp_path / "r"
    (run_dir / layout.SAMPLES).mkdir(parents=True)
    (run_dir / layout.SAMPLES / "k.jsonl").write_text('{"type":"cell_done","cell_id":"a"}\n')
    (run_dir / layout.REPORT_MD).write_text("old verdict\n")
    (run_dir / "notes.txt").write_text("mine\n")
    with pytest.raises(
        UsageError,
        match=r"is not a cascade-repro run \(no run.json\) and holds notes.txt, report.md and 1 more",
    ):
        PreparedRun(run_dir, Manifest.from_json({"run_id": "r", "spec_hash": "new"}), [], fresh=True).write()
    assert (run_dir / layout.SAMPLES / "k.jsonl").exists() and (run_dir / layout.REPORT_MD).exists()


def test_fresh_says_it_starts_over_and_never_that_it_resumes(tmp_path: Path):
    argv = ["matrix", "--engine", "fake", "--limit", "1", "--batch", "1", "--max-tokens", "2", "--no-auto-controls", "--quiet",
            "--reference", "off", "--results-dir", str(tmp_path / "results"), "--run-id", "r"]  # fmt: skip
    assert CliRunner().invoke(app, argv, env=WIDE).exit_code == 4  # batch 1: nothing exercised
    run = tmp_path / "results" / "r"
    res = CliRunner().invoke(app, [*argv, "--fresh"], env=WIDE)
    assert res.exit_code == 4, res.output
    assert "starting r over (--fresh): 2 cells to run" in res.output
    assert "resuming" not in res.output
    starts = [
        json.loads(ln)["cell_id"] for ln in samples_file(run).read_text().splitlines() if '"cell_start"' in ln
    ]
    assert sorted(starts) == ["tp1-b1-cascade", "tp1-b1-flat"]  # each ran once, in this invocation
