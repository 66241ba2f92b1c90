"""Engine keys side by side in the local executor (run/pool.py), on the fake engine on CPU: the same
samples as one after another, a crash or a hang of one engine leaves the others running, a cut
run resumes, and one engine at a time is the sequential run in plan order."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cascade_repro import exit_codes, pipeline
from cascade_repro.plan.matrix import MatrixSpec
from cascade_repro.rundir import layout, sample_scan

KEYS = [f"fake-tp1-auto-s{s}" for s in range(3)]
SPEC = {"engine": "fake", "limit": 6, "batch": [1, 2], "seeds": [0, 1, 2], "max_tokens": 4,
        "auto_controls": False}  # fmt: skip


def run(tmp: Path, run_id: str, per_gpu: int | None, **spec: object) -> pipeline.RunOutcome:
    s = MatrixSpec.from_dict({**SPEC, **spec}, source="test")
    opts = pipeline.RunOptions(results_dir=tmp, run_id=run_id, fresh=True, fail_on="error", command="test",
                               progress=False, max_engines_per_gpu=per_gpu)  # fmt: skip
    return pipeline.run_matrix(s, opts)


def samples(run_dir: Path) -> dict[str, list[dict]]:
    """Every key's sample records as written (the fields a judge reads; no clock in them)."""
    out = {}
    for key in KEYS:
        recs = [json.loads(x) for x in layout.samples_path(run_dir, key).read_text().splitlines()]
        out[key] = [r for r in recs if r["type"] == "sample"]
    return out


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ("CASCADE_REPRO_FAULT", "CASCADE_REPRO_FAULT_ONCE", "CASCADE_REPRO_GPUS"):
        monkeypatch.delenv(k, raising=False)


def test_side_by_side_gives_the_samples_of_one_after_another(tmp_path):
    seq = run(tmp_path, "seq", 1)
    side = run(tmp_path, "side", 3)
    assert seq.exit_code == side.exit_code
    a, b = samples(seq.run_dir), samples(side.run_dir)
    assert sum(map(len, a.values())) == 3 * 4 * 6  # 3 keys x 4 cells x 6 prompts
    assert a == b
    for key in KEYS:
        prog = sample_scan.read_progress(layout.samples_path(side.run_dir, key), samples=False)
        assert len(prog.done) == 4 and not prog.errors


def test_a_crashed_engine_leaves_the_others_running(tmp_path, monkeypatch):
    monkeypatch.setenv("CASCADE_REPRO_FAULT", "exit:tp1-b1-cascade-s1:0")
    side = run(tmp_path, "side", 3)
    seq = run(tmp_path, "seq", 1)
    assert side.exit_code == seq.exit_code == exit_codes.REGRESSION  # --fail-on error: a failed cell
    for out in (side, seq):
        progs = {
            k: sample_scan.read_progress(layout.samples_path(out.run_dir, k), samples=False) for k in KEYS
        }
        assert [len(progs[k].done) for k in KEYS] == [4, 0, 4]
        assert sorted(progs["fake-tp1-auto-s1"].errors) == sorted(
            ["tp1-b1-cascade-s1", "tp1-b1-flat-s1", "tp1-b2-cascade-s1", "tp1-b2-flat-s1"]
        )
    assert side.errors == seq.errors  # the same error lines, in plan order
    assert samples(side.run_dir)["fake-tp1-auto-s0"] == samples(seq.run_dir)["fake-tp1-auto-s0"]


def test_a_hung_engine_is_killed_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("CASCADE_REPRO_FAULT", "hang:tp1-b2-flat-s0:0")
    side = run(tmp_path, "side", 3, engine_timeout=3.0)
    progs = {k: sample_scan.read_progress(layout.samples_path(side.run_dir, k), samples=False) for k in KEYS}
    assert [len(progs[k].done) for k in KEYS] == [3, 4, 4]
    assert progs["fake-tp1-auto-s0"].errors["tp1-b2-flat-s0"].startswith("timeout: no progress for 3s")
    assert side.exit_code == exit_codes.REGRESSION


def test_one_engine_at_a_time_runs_the_keys_in_plan_order(tmp_path, monkeypatch):
    from cascade_repro.run import pool, runner

    called: list[str] = []
    real = runner._run_worker

    def spy(run_dir, key, *a, **k):
        called.append(key)
        return real(run_dir, key, *a, **k)

    monkeypatch.setattr(runner, "_run_worker", spy)
    monkeypatch.setattr(pool, "run_side_by_side", lambda *a, **k: pytest.fail("ran side by side"))
    run(tmp_path, "seq", 1)
    assert called == KEYS  # today's loop, key after key


def test_side_by_side_starts_keys_in_plan_order(tmp_path, monkeypatch):
    from cascade_repro.run import pool

    order: list[str] = []
    real = pool.worker_argv

    def argv(run_dir, key):
        order.append(key)
        return real(run_dir, key)

    monkeypatch.setattr(pool, "worker_argv", argv)
    run(tmp_path, "side", 2)
    assert order == KEYS


CLI = "import sys; from cascade_repro.cli import main; sys.argv[0] = 'cascade-repro'; main()"


def _cli(tmp: Path, *extra: str, **env: str) -> subprocess.Popen:
    args = ["matrix", "--engine", "fake", "--limit", "6", "--batch", "1,2", "--seed", "0,1,2", "--max-tokens",
            "4", "--no-auto-controls", "--quiet", "--results-dir", str(tmp), "--run-id", "cut", *extra]  # fmt: skip
    e = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CASCADE_REPRO_") or k == "CASCADE_REPRO_CACHE"
    }
    return subprocess.Popen([sys.executable, "-c", CLI, *args], env={**e, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_a_cut_side_by_side_run_resumes_to_the_same_samples(tmp_path):
    run_dir = tmp_path / "cut"
    # s1 hangs in its second cell: s0 and s2 finish, then SIGTERM cuts the run (as `timeout` would).
    proc = _cli(tmp_path, "--max-engines-per-gpu", "3", CASCADE_REPRO_FAULT="hang:tp1-b1-flat-s1:0")
    deadline = time.monotonic() + 120
    while True:
        progs = {
            k: sample_scan.read_progress(layout.samples_path(run_dir, k), samples=False)
            for k in KEYS
            if layout.samples_path(run_dir, k).exists()
        }
        if len(progs) == 3 and [len(progs[k].done) for k in KEYS] == [4, 1, 4]:
            break
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never reached its cut"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == exit_codes.INTERRUPTED, err
    # The same command again: the finished cells are kept, s1's other three run.
    again = _cli(tmp_path, "--max-engines-per-gpu", "3")
    out, err = again.communicate(timeout=120)
    assert "resuming cut: 9 of 12 cells already done" in err
    progs = {k: sample_scan.read_progress(layout.samples_path(run_dir, k), samples=False) for k in KEYS}
    assert [len(progs[k].done) for k in KEYS] == [4, 4, 4] and not any(p.errors for p in progs.values())
    whole = run(tmp_path, "whole", 1)
    assert again.returncode == whole.exit_code
    for k in KEYS:  # each finished cell's samples, from the attempt that finished it: the uncut run's
        assert _cell_samples(run_dir, k) == _cell_samples(whole.run_dir, k)


def _cell_samples(run_dir: Path, key: str) -> list[tuple[str, int, list[int]]]:
    return sorted(
        (s["cell_id"], int(s["prompt_index"]), list(s["token_ids"]))
        for s in sample_scan.iter_samples(layout.samples_path(run_dir, key))
    )
