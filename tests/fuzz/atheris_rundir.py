"""Coverage-guided fuzzing (atheris) of a run directory read back by `cascade-repro report`.

A run directory travels (CI artifacts, tarballs attached to issues), so every file in it is input.
Each fuzz input damages one file of a small run of the fake engine (no model: its samples, wave,
engine and cell records are the worker's own) and runs ``report`` and ``report --rescore`` on it
through the command line. Every input must end in a verdict exit code, or in
a refusal: exit 2 with one line on stderr. Exit 70 (the internal-error path: an exception the tool
did not expect), a traceback, or a refusal of several lines is a crash: libFuzzer prints it, saves
the input as ``crash-*`` and exits non-zero.

Not a pytest module (no ``test_`` prefix): ``tests/fuzz/test_fuzz_rundir.py`` runs it in a subprocess
for a fixed number of inputs (``-runs=N``, not a time limit, so CI sees the same inputs each run).
By hand::

    python tests/fuzz/atheris_rundir.py -runs=20000 CORPUS_DIR

Input layout: byte 0 picks the file, byte 1 how it is damaged (replaced, spliced in at an offset,
cut at an offset, or every ``OLD`` replaced by ``NEW`` where the rest reads ``OLD\0NEW``: with OLD
a key such as ``"wall_s":`` that gives one field a wrong value in every record), bytes 2-3 the
offset in tenths of a per mille of the file, the rest the bytes.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for support/ (the runner below)

with atheris.instrument_imports(include=["cascade_repro"]):
    from support.cli import CliRunner

    from cascade_repro.cli import app
    from cascade_repro.rundir import layout

ROOT = Path(tempfile.mkdtemp(prefix="cascade-repro-fuzz-rundir-"))
PRISTINE = ROOT / "pristine"
WORK = ROOT / "work"
# Verdict codes a damaged run may honestly end with: 0 ok, 1 regression, 2 refused, 4 nothing
# exercised, 5 inconclusive (README's table).
ALLOWED = {0, 1, 2, 4, 5}
RUNNER = CliRunner()


def targets(run: Path) -> list[Path]:
    """The files a fuzz input can damage, in a fixed order (the first byte indexes it)."""
    files = [run / layout.RUN_JSON, run / "prompts.jsonl", *(run / t for t in sorted(layout.TABLES))]
    return files + sorted(p for p in run.rglob("*.jsonl") if p not in files)


def damage(path: Path, mode: int, at: int, data: bytes) -> None:
    old = path.read_bytes() if path.is_file() else b""
    cut = len(old) * at // 10000
    if mode % 4 == 0:
        new = data
    elif mode % 4 == 1:
        new = old[:cut] + data + old[cut:]
    elif mode % 4 == 2:
        new = old[:cut] + data
    else:
        find, _, put = data.partition(b"\0")
        new = old.replace(find, put) if find else old
    path.write_bytes(new)


def check(args: list[str]) -> None:
    res = RUNNER.invoke(app, args, env={"COLUMNS": "200", "CASCADE_REPRO_REFERENCE": "off"})
    err = res.stderr if res.stderr_bytes is not None else res.output
    if res.exit_code not in ALLOWED or "Traceback" in err:
        raise AssertionError(f"{args[:-1]} exit {res.exit_code}: {err[-1500:]}")
    if res.exit_code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if len(lines) != 1:
            raise AssertionError(f"{args[:-1]} refused in {len(lines)} lines: {err[-1500:]}")


def one_input(data: bytes) -> None:
    if len(data) < 4:
        return
    shutil.rmtree(WORK, ignore_errors=True)
    shutil.copytree(PRISTINE, WORK, symlinks=True)
    files = targets(WORK)
    damage(files[data[0] % len(files)], data[1], int.from_bytes(data[2:4], "little") % 10001, data[4:])
    check(["report", str(WORK)])  # first: it reads the tables as they are (a rescore rewrites them)
    check(["report", "--rescore", str(WORK)])


def main() -> None:
    res = RUNNER.invoke(
        app,
        ["matrix", "--engine", "fake", "--limit", "4", "--batch", "1,8", "--max-tokens", "16", "--quiet",
         "--results-dir", str(ROOT), "--run-id", PRISTINE.name],
        env={"CASCADE_REPRO_REFERENCE": "off"},
    )  # fmt: skip
    if res.exit_code not in ALLOWED:
        raise SystemExit(f"the pristine run failed (exit {res.exit_code}): {res.output[-2000:]}")
    atheris.Setup(sys.argv, one_input)
    try:
        atheris.Fuzz()
    finally:
        shutil.rmtree(ROOT, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("CASCADE_REPRO_REFERENCE", "off")
    main()
