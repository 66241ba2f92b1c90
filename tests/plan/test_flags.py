"""plan/flags.py: the command line's values -> MatrixSpec and run settings, without the CLI."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cascade_repro.errors import UsageError
from cascade_repro.judge.verdicts import Thresholds
from cascade_repro.pipeline import RunOptions
from cascade_repro.plan.flags import MatrixOptions, RunSettings, VllmCheck, spec_from_cli, spec_values
from cascade_repro.plan.matrix import RUN_KEYS
from cascade_repro.run.runner import Executor

# matrix's run options as the command line leaves them when none is given
TH = Thresholds()
RUN_DEFAULTS = {
    "fail_on": "regression", "alpha": TH.alpha, "rep_delta": TH.rep_delta,
    "min_topk_violations": TH.min_topk_violations, "drift_min": TH.drift_min, "reference": "auto", "reference_device": "auto", "results_dir": Path("results"), "run_id": None, "shard": None,
    "allow_mixed": False, "quiet": False, "executor": "local", "ray_address": None, "retries": 1,
    "max_engines_per_gpu": None,
}  # fmt: skip


def test_flag_values_are_parsed_into_spec_fields():
    values = spec_values(
        {
            "tp": "1,2",
            "batch": "8",
            "cascade": "on",
            "seed": "0,1",
            "dtype": "half,bf16",
            "fa_version": "default,2",
            "backend": "flash_attn",
            "engine_args": '{"block_size": 16, "seed_x": 1}',
            "engine_arg": ["block_size=32"],
            "max_tokens": 64,
            "limit": None,  # not given
            "gpu": "H200",  # not a spec flag: ignored
        }
    )
    assert values == {
        "tp": [1, 2],
        "batch": [8],
        "cascade": [True],
        "seeds": [0, 1],
        "dtypes": ["float16", "bfloat16"],
        "fa_versions": [None, 2],
        "backends": ["FLASH_ATTN"],
        "engine_args": {"block_size": 32, "seed_x": 1},  # -E wins over --engine-args
        "max_tokens": 64,
    }


def test_a_bad_flag_is_one_line_naming_it():
    with pytest.raises(UsageError, match="^--seed: expected integers, got 'x'$"):
        spec_values({"seed": "x"})


def test_flags_win_over_the_file_and_the_files_run_settings_are_taken_out(tmp_path):
    config = tmp_path / "m.toml"
    config.write_text(
        'batch = [4]\nmax_tokens = 16\nalpha = 0.01\nresults_dir = "elsewhere"\n', encoding="utf-8"
    )
    asked = spec_from_cli({"max_tokens": 32}, config)
    assert (asked.spec.batch, asked.spec.max_tokens) == ([4], 32)
    assert asked.file_keys == {"batch", "max_tokens"}
    assert asked.settings == {"alpha": 0.01, "results_dir": "elsewhere"}
    # the file's setting where the flag was left at its default, the flag's where it was given
    s = asked.run_settings({**RUN_DEFAULTS, "alpha": 0.2}, defaulted=lambda name: name != "alpha")
    assert (s.alpha, s.results_dir, s.from_file) == (0.2, Path("elsewhere"), {"results_dir"})


def test_a_refused_setting_from_the_file_is_named_by_the_file_and_its_key(tmp_path):
    config = tmp_path / "m.toml"
    config.write_text("alpha = 2.0\n", encoding="utf-8")
    s = spec_from_cli({}, config).run_settings(RUN_DEFAULTS, defaulted=lambda name: True)
    with pytest.raises(UsageError, match=f"^{config}: alpha must be"):
        RunOptions.from_settings(s)
    flag_given = spec_from_cli({}, config).run_settings(
        {**RUN_DEFAULTS, "alpha": 3.0}, defaulted=lambda n: n != "alpha"
    )
    with pytest.raises(UsageError, match="^--alpha must be"):
        RunOptions.from_settings(flag_given)


def test_run_options_from_settings():
    s = RunSettings(**{**RUN_DEFAULTS, "shard": "1/2", "quiet": True, "drift_min": 3.0})
    opts = RunOptions.from_settings(s, fresh=True, command="cascade-repro matrix")
    assert (opts.shard.index, opts.shard.count, opts.bar, opts.fresh, opts.thresholds.drift_min) == (
        1,
        2,
        False,
        True,
        3.0,
    )
    assert opts.command == "cascade-repro matrix"
    assert opts.executor == Executor("local", None, 1)  # the default: workers on this machine
    ray = RunOptions.from_settings(RunSettings(**{**RUN_DEFAULTS, "executor": "ray", "retries": 0}))
    assert (ray.executor.name, ray.executor.ray_address, ray.executor.retries) == ("ray", None, 0)
    for bad, line in (
        ({"executor": "slurm"}, "^--executor 'slurm': choose from local, ray$"),
        ({"executor": "ray", "retries": -1}, "^--retries -1: must be 0 or more$"),
        ({"ray_address": "auto"}, "^--ray-address names a Ray cluster: give it with --executor ray$"),
    ):
        with pytest.raises(UsageError, match=line):
            RunOptions.from_settings(RunSettings(**{**RUN_DEFAULTS, **bad}))
    with pytest.raises(UsageError, match="^--fail-on must be one of"):
        RunOptions.from_settings(RunSettings(**{**RUN_DEFAULTS, "fail_on": "sometimes"}))


def test_run_settings_are_the_config_files_run_keys():
    fields = {f.name for f in dataclasses.fields(RunSettings)} - {"config", "from_file"}
    assert fields == set(RUN_KEYS) == set(RUN_DEFAULTS)


def test_a_command_reads_only_its_fields_of_the_file_and_names_its_own_default_engine(tmp_path):
    config = tmp_path / "m.toml"
    config.write_text('batch = [8]\ninject = "lse-layout"\nfail_on = "never"\n', encoding="utf-8")
    asked = spec_from_cli({}, config, engine="vllm", fields=("batch",))
    assert (asked.spec.engine, asked.spec.batch, asked.spec.inject, asked.settings) == ("vllm", [8], None, {})
    assert spec_from_cli({"engine": "hf"}, engine="vllm").spec.engine == "hf"
    with pytest.raises(UsageError, match="^--engine"):  # the command's default is named as its flag
        spec_from_cli({}, engine="nonesuch")


def test_matrix_options_from_cli_are_the_spec_the_settings_and_the_call():
    notes: list[str] = []
    given = {**RUN_DEFAULTS, "engine": "vllm", "batch": "8", "dry_run": True, "config": None, "twin": None}
    request = MatrixOptions.from_cli(
        given, defaulted=lambda name: True, extra=["--log_samples"], on_note=notes.append
    )
    assert (request.spec.engine, request.spec.batch, request.dry_run, request.json_out) == (
        "vllm",
        [8],
        True,
        False,
    )
    assert request.settings.fail_on == RUN_DEFAULTS["fail_on"] and not request.twin_named
    assert notes == ["--log_samples: every sample is kept anyway (samples/ in the run directory)"]


def test_what_this_box_refuses_of_a_vllm_matrix_is_decided_without_a_console():
    given = {**RUN_DEFAULTS, "engine": "vllm", "config": None, "twin": None}
    request = MatrixOptions.from_cli(given, defaulted=lambda name: True)
    check = request.check_vllm(None, 1, "cascade-repro matrix --engine vllm")
    assert check.refusal is not None and check.refusal.startswith(
        "--engine vllm needs vLLM, which is not installed"
    )
    assert not check.setting_missing
    assert request.check_vllm("0.10.2", 0, "c").refusal.endswith("--dry-run plans anywhere")
    assert request.check_vllm("0.10.2", 1, "c") == VllmCheck()  # nothing to say
    gone = request.check_vllm("0.34.0", 1, "cascade-repro matrix --engine vllm")
    assert gone.refusal is not None and gone.setting_missing  # no cascade in this vLLM: exit 4
    planned = dataclasses.replace(request, dry_run=True).check_vllm("0.34.0", 0, "c")
    assert planned.refusal is None and planned.warnings and planned.notes  # a plan for another machine
