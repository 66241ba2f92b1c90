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
from typer.testing import CliRunner

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
    res = invoke("matrix", "--help")
    assert res.exit_code == 0
    for panel in ("Matrix", "Prompts", "Engine", "Output", "Verdicts", "Debug"):
        assert f"╭─ {panel} ─" in res.stdout, panel
    for option in (
        "--batch",
        "--tp",
        "--cascade",
        "--dry-run",
        "--prompts",
        "--arm-switch",
        "--results-dir",
        "--alpha",
        "--inject",
    ):
        assert option in res.stdout
    assert (
        "Exit codes: 0 clean, 1 regression (per --fail-on) or every cascade pair errored, 2 usage error, "
        "4 nothing exercised (cascade never fired in any pair), 5 inconclusive (no noise control), "
        "6 the machine refused (a permission, a full disk, an I/O error: one line names the path), "
        "130 interrupted."
    ) in flat(res.stdout)


def test_run_id_help_explains_the_default_name():
    assert "hash" in invoke("matrix", "--help").stdout


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
    cfg.write_text('[matrix]\nbatch = [1, 8, 16]\ncascade = "on"\nlimit = 4\n')
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
        (["--engine", "foo"], ["engine must be one of hf, vllm, not 'foo'"]),
        (["--tp", "2"], ["the hf engine runs on one device: use --tp 1"]),
        (["--dtype", "fp8"], ["dtype must be one of auto, float32, float16, bfloat16, not 'fp8'"]),
        (["--cascade", "maybe"], ["--cascade: expected on/off, got 'maybe'"]),
        (["--fa-version", "9"], ["--fa-version: expected 2, 3, 4 or default, got '9'"]),
        (["--inject", "bitflip"], ["expected lse-layout or lse-shift=X"]),
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
    from cascade_repro import runstore

    (tmp_path / "run.json").write_text("{}", encoding="utf-8")
    with runstore.RunLock(tmp_path):  # what a running matrix holds
        res = invoke("report", "--rescore", str(tmp_path))
        assert_user_error(res, f"{tmp_path} is in use by another cascade-repro run (pid ")
        assert_user_error(invoke("report", str(tmp_path)), f"{tmp_path} is in use by another cascade-repro run")
    # Released: the usual answer, and no lock file left behind.
    assert_user_error(invoke("report", str(tmp_path)), f"{tmp_path} is not finished (no cells.parquet yet)")
    assert not (tmp_path / ".lock").exists()


def test_an_unwritable_results_dir_is_one_line_not_a_traceback(tmp_path):
    from cascade_repro import runstore
    from cascade_repro.errors import EnvironmentFailure

    # A results dir that cannot be created (a file stands in its path) fails like a read-only one
    # does for a non-root user, and this works as root too.
    (tmp_path / "f").write_text("x")
    with pytest.raises(EnvironmentFailure, match=f"cannot write in {tmp_path}/f/run: "):
        runstore.RunLock(tmp_path / "f" / "run").acquire()
    res = invoke("matrix", "--limit", "1", "--results-dir", str(tmp_path / "f"), "--run-id", "run")
    # (stderr may begin with the embedded model's one-time conversion progress)
    assert res.exit_code == 6 and "Traceback" not in res.output  # the machine's failure, not a usage error
    assert f"error: cannot write in {tmp_path}/f/run: " in flat(res.stderr)


def test_a_full_disk_while_scoring_is_one_line_naming_the_path_and_leaves_no_temp_file(tmp_path, monkeypatch):
    import errno

    import pandas as pd

    # A synthetic run, scored with --rescore while the disk is full.
    from conftest import synthetic_run

    from cascade_repro import runstore

    run_dir = synthetic_run(tmp_path / "synth", prompts=8, batch="1,8")

    def full(self, path, *a, **k):
        Path(path).write_bytes(b"PAR1")  # a partial file, as a write that ran out of space leaves
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    before = (run_dir / runstore.CELLS).read_bytes()  # the synthetic run's own tables
    monkeypatch.setattr(pd.DataFrame, "to_parquet", full)
    res = invoke("report", str(run_dir), "--rescore")
    assert res.exit_code == 6, res.output
    assert "No space left on device" in flat(res.stderr) and f"{run_dir}/.{runstore.CELLS}.tmp" in flat(res.stderr)
    assert "Traceback" not in res.output
    # No temp file left, and what was written before is still there and whole.
    assert not list(run_dir.glob(".*.tmp")) and (run_dir / runstore.CELLS).read_bytes() == before


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
    b = invoke("matrix", "--engine", "vllm", "--tp", "2", "--backend", "FLASH_ATTN", "--dtype", "float16", "--dry-run")
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    assert a.output == b.output and "float16" in a.output


def test_an_engine_argument_the_harness_owns_is_a_usage_error():
    res = invoke("matrix", "--engine", "vllm", "-E", "tensor_parallel_size=2", "--dry-run")
    assert res.exit_code == 2 and "engine argument 'tensor_parallel_size': use --tp" in res.output
    res = invoke("matrix", "--engine", "vllm", "--engine-args", '{"enable_prefix_caching": false}', "--dry-run")
    assert res.exit_code == 2 and "cascade attention needs prefix caching" in res.output


def test_a_vllm_without_cascade_is_said_in_one_line_and_exits_nothing_exercised(monkeypatch):
    from cascade_repro import vllm_surface

    monkeypatch.setattr(vllm_surface, "installed_version", lambda: "0.33.0")
    res = invoke("matrix", "--engine", "vllm", "--limit", "2")
    assert res.exit_code == 4, res.output
    assert "vLLM 0.33.0 has no cascade attention (removed in 0.32.0" in flat(res.output)
    res = invoke("explain", "--gpu", "H200", "--prefix-tokens", "1597")
    assert res.exit_code == 0 and "no pair can be exercised" in flat(res.output)


def test_a_vllm_with_cascade_off_by_default_says_the_harness_turns_it_on(monkeypatch):
    from cascade_repro import vllm_surface

    monkeypatch.setattr(vllm_surface, "installed_version", lambda: "0.26.0")
    res = invoke("matrix", "--engine", "vllm", "--dry-run")
    assert res.exit_code == 0
    assert "cascade attention is off by default from 0.18.0 (PR #36318); the harness turns it on" in flat(res.output)
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

    from cascade_repro.verdicts import Thresholds

    text = flat(invoke("matrix", "--help").stdout)
    th = Thresholds()
    for option, value in (("--alpha", th.alpha), ("--rep-delta", th.rep_delta),
                          ("--min-topk-violations", th.min_topk_violations), ("--drift-min", th.drift_min)):  # fmt: skip
        shown = re.search(re.escape(option) + r" .*?\[default: ([0-9.]+)\]", text)
        assert shown and float(shown.group(1)) == float(value), option
    assert "[default: regression]" in text and "[default: all of the set]" in text
