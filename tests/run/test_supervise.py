"""The worker supervisor shared by the matrix runner and `cascade-repro kernel`, on plain Python children."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from cascade_repro.run import supervise

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="needs process groups")


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def gone(pid: int, within: float = 10.0) -> bool:
    """Whether ``pid`` ends within ``within`` seconds (a zombie waiting for its reaper counts as ended)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (OSError, IndexError):
            pass
        time.sleep(0.02)
    return False


def wait_for(path: Path, within: float = 20.0) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.02)
    raise AssertionError(f"{path} was not written")


# A worker whose work runs in a child of its own (vLLM's engine core): it writes the child's pid.
GRANDCHILD = (
    "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
    "open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(300)"
)


def test_kill_group_kills_the_grandchild_too(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    with supervise.Worker([*py(GRANDCHILD), str(pidfile)]) as w:
        grandchild = int(wait_for(pidfile))
        assert os.getpgid(grandchild) == w.pid  # the worker leads its own group
        assert w.poll() is None
    assert w.returncode == -signal.SIGKILL
    assert gone(grandchild)


def test_an_exception_while_watching_kills_the_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"

    def check() -> None:
        if pidfile.exists() and pidfile.read_text():
            raise KeyboardInterrupt  # Ctrl-C, or SIGTERM turned into one by the runner

    with pytest.raises(KeyboardInterrupt):
        with supervise.Worker([*py(GRANDCHILD), str(pidfile)]) as w:
            supervise.watch(w, check, 0.02)
    assert gone(int(pidfile.read_text()))


def test_an_exited_worker_leaves_nothing_behind(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    code = GRANDCHILD.rsplit("; time.sleep(300)", 1)[0]  # the worker exits at once, its child stays
    with supervise.Worker([*py(code), str(pidfile)]) as w:
        assert supervise.watch(w, lambda: None, 0.02) is None
    assert w.returncode == 0
    assert gone(int(pidfile.read_text()))


def test_inactivity_timeout_counts_log_growth_as_progress(tmp_path):
    log = tmp_path / "worker.log"
    # Busy (a line every 0.25 s) for 4 s, twice the idle limit, then silent: a clock that did not
    # count the log's growth would kill it half-way through its lines. The limit is 8 of the gaps
    # between lines, so a loaded machine's scheduling delays do not reach it; the clock is read once
    # the first line is out (a loaded machine may take seconds to start Python).
    code = "import time\nfor i in range(16):\n    print(i, flush=True); time.sleep(0.25)\ntime.sleep(300)"
    with supervise.Worker(py(code), log_path=log) as w:
        started = lambda: log.exists() and log.stat().st_size > 0  # noqa: E731
        stopped = supervise.watch(w, lambda: "idle" if started() and w.idle_s() > 2.0 else None, 0.05)
    assert stopped == "idle" and w.returncode == -signal.SIGKILL
    assert log.read_text().split() == [str(i) for i in range(16)]  # not killed while it logged


def test_mark_active_resets_the_idle_clock_and_age_does_not():
    with supervise.Worker(py("import time; time.sleep(300)")) as w:
        time.sleep(0.2)
        assert w.idle_s() >= 0.2
        w.mark_active()
        # Read in this order, the two differ by at least the sleep however long the box stalls between
        # the calls (a bound such as idle < 0.2 s fails on a loaded machine).
        idle = w.idle_s()
        assert w.age_s() - idle >= 0.2


def test_exit_codes_and_the_last_check_after_the_exit(tmp_path):
    out = tmp_path / "out"
    seen = []

    def check() -> None:
        seen.append(out.read_text() if out.exists() else "")

    with supervise.Worker(py(f"open({str(out)!r}, 'w').write('last words'); raise SystemExit(7)")) as w:
        assert supervise.watch(w, check, 0.02) is None
    assert w.returncode == 7 and supervise.exit_text(w.returncode) == "exit code 7"
    assert seen[-1] == "last words"  # what the worker wrote just before it exited is read
    with supervise.Worker(py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")) as w:
        supervise.watch(w, lambda: None, 0.02)
    assert supervise.exit_text(w.returncode) == "killed by SIGKILL"
    assert supervise.exit_text(-200) == "killed by signal 200"
    assert supervise.exit_text(0) == "exit code 0" and supervise.exit_text(None) == "still running"


def test_last_error_line(tmp_path):
    log = tmp_path / "worker.log"
    log.write_text("loading\nValueError: first\nRuntimeError: CUDA error: out of memory " + "x" * 400 + "\ndone\n")
    line = supervise.last_error_line(log)
    assert line.startswith("RuntimeError: CUDA error") and len(line) == 300
    assert supervise.last_error_line(tmp_path / "absent.log") == ""
    log.write_text("all fine\n")
    assert supervise.last_error_line(log) == ""
