"""Flags a vLLM or lm-eval user types (issue 33): vLLM's engine flags by vLLM's spelling, derived
from EngineArgs (recorded 0.10.2 and 0.26.0 fields where vLLM is not importable), values checked by
kind, vLLM's YAML config, lm-eval's spellings, and help and tables at 80 columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import CliRunner

from cascade_repro.cli import app
from cascade_repro.errors import UsageError
from cascade_repro.plan import engine_args as ea
from cascade_repro.plan.flags import read_foreign
from cascade_repro.vllm_surface.fields import FIELDS, KINDS

DATA = Path(__file__).parents[1] / "data"
NARROW = {"COLUMNS": "80"}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=NARROW)


@pytest.mark.parametrize("release", sorted(FIELDS))
def test_recorded_fields_are_the_wheels_each_with_a_kind(release):
    recorded = json.loads((DATA / f"vllm-surface-{release}.json").read_text())["engine_args"]
    assert set(FIELDS[release]) == {n for n in recorded if not n.startswith("_")}
    assert set(FIELDS[release].values()) <= set(KINDS)
    kinds = FIELDS[release]
    assert (kinds["block_size"], kinds["max_num_seqs"], kinds["gpu_memory_utilization"]) == (
        "int",
        "int",
        "float",
    )
    assert (kinds["enable_prefix_caching"], kinds["kv_cache_dtype"], kinds["compilation_config"]) == (
        "bool",
        "str",
        "object",
    )


def test_0_26_0_kinds_are_the_ones_recorded_from_its_source():
    recorded = json.loads((DATA / "vllm-surface-0.26.0.json").read_text())["engine_args_kinds"]
    assert FIELDS["0.26.0"] == {n: k for n, k in recorded.items() if not n.startswith("_")}
    # Only the unions vLLM itself reads as one of two kinds stay undecided.
    assert sorted(n for n, k in FIELDS["0.26.0"].items() if k == "any") == [
        "hf_overrides",
        "hf_token",
        "pt_load_map_location",
    ]
    assert (recorded["max_lora_rank"], recorded["optimization_level"], recorded["quantization_config"]) == (
        "int",
        "int",
        "object",
    )


# Each flag the issue names, as `vllm serve` takes it, and the engine argument it becomes.
ISSUE_FLAGS = [
    (["--block-size", "32"], {"block_size": 32}),
    (["--kv-cache-dtype", "fp8"], {"kv_cache_dtype": "fp8"}),
    (["-pp", "2"], {"pipeline_parallel_size": 2}),
    (["--pipeline-parallel-size=2"], {"pipeline_parallel_size": 2}),
    (["--max-num-seqs", "64"], {"max_num_seqs": 64}),
    (["--max-num-batched-tokens", "8192"], {"max_num_batched_tokens": 8192}),
    (["--enable-prefix-caching"], {"enable_prefix_caching": True}),
    (["--no-enable-chunked-prefill"], {"enable_chunked_prefill": False}),
    (["--quantization", "fp8"], {"quantization": "fp8"}),
    (["--revision", "0123"], {"revision": "0123"}),
    (["--tokenizer", "org/tok"], {"tokenizer": "org/tok"}),
    (["--download-dir", "/d"], {"download_dir": "/d"}),
    (["--compilation-config", '{"level": 0}'], {"compilation_config": {"level": 0}}),
    (["--data-parallel-size", "1"], {"data_parallel_size": 1}),
    (["--max-logprobs", "20"], {"max_logprobs": 20}),
]


@pytest.mark.parametrize("release", ["0.10.2", "0.26.0"])
@pytest.mark.parametrize(("tokens", "want"), ISSUE_FLAGS)
def test_vllm_flags_become_engine_arguments_in_both_releases(release, tokens, want):
    got, rest = ea.parse_flags(tokens, ea.recorded(release))
    assert (got, rest) == (want, [])


def test_optimization_level_by_release():
    assert ea.parse_flags(["-O0"], ea.recorded("0.26.0"))[0] == {"optimization_level": 0}
    assert ea.parse_flags(["-O", "3"], ea.recorded("0.10.2"))[0] == {"compilation_config": {"level": 3}}
    with pytest.raises(UsageError, match="expected an optimization level"):
        ea.parse_flags(["-Ofast"], ea.recorded("0.26.0"))


def test_values_are_checked_against_the_kind():
    with pytest.raises(UsageError, match="block_size takes an integer"):
        ea.parse_flags(["--block-size", "abc"], ea.recorded("0.26.0"))
    with pytest.raises(UsageError, match="needs a value"):
        ea.parse_flags(["--block-size"], ea.recorded("0.26.0"))
    with pytest.raises(UsageError, match="gpu_memory_utilization=.*takes a number"):
        ea.check_kind("gpu_memory_utilization", "high", "float", "m.yaml")
    assert ea.parse_pairs(["block_size=32,kv_cache_dtype=fp8"]) == {"block_size": 32, "kv_cache_dtype": "fp8"}
    assert ea.parse_pairs(['hf_overrides={"a": 1, "b": 2}']) == {"hf_overrides": {"a": 1, "b": 2}}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-E", "block_size=abc"], "-E block_size='abc': block_size takes an integer"),
        (["--block-size", "abc"], "--block-size block_size='abc': block_size takes an integer"),
        (["--no-enable-prefix-caching"], "needs prefix caching"),
        (["--max-num-seq", "64"], "did you mean --max-num-seqs (vLLM's)?"),
        (["--max-tokns", "5"], "did you mean --max-tokens (this tool's)?"),
        (["--output_pth", "x"], "did you mean --output_path, --output-path (lm-eval's)?"),
        (["--model_args", "pretrained=x"], "--model_args pretrained=...: use --model"),
        (["--limit", "0.5"], "--limit 0.5: lm-eval reads a fraction of the set"),
        (["--gen_kwargs", "temperature=0.7"], "decodes greedily"),
    ],
)
def test_refusals_are_one_line_exit_2(args, message):
    res = invoke("matrix", "--engine", "vllm", "--batch", "8", "--dry-run", *args)
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split())
    assert "Traceback" not in res.output


def test_every_named_flag_reaches_the_dry_run():
    args = [t for tokens, _ in ISSUE_FLAGS for t in tokens if t != "--no-enable-chunked-prefill"]
    res = invoke("matrix", "--engine", "vllm", "--batch", "8,64", "--limit", "2", "--dry-run", *args, "-O0")
    assert res.exit_code == 0, res.output
    line = " ".join(res.output.split())
    for want in ("block_size=32", "kv_cache_dtype='fp8'", "pipeline_parallel_size=2", "max_num_seqs=64",
                 "revision='0123'", "compilation_config={'level': 0}", "max_logprobs=20"):  # fmt: skip
        assert want in line


def test_lm_eval_spellings():
    got = read_foreign(["--model_args", "block_size=16,max_num_seqs=64", "-o", "out", "--log_samples",
                        "--gen_kwargs", "max_gen_toks=32,temperature=0"])  # fmt: skip
    assert got.engine_args == {"block_size": 16, "max_num_seqs": 64}
    assert (got.results_dir, got.max_tokens) == ("out", 32)
    assert "kept anyway" in got.notes[0]


def test_output_path_is_the_results_dir(tmp_path):
    res = invoke("matrix", "--engine", "fake", "--limit", "2", "--batch", "8", "--dry-run",
                 "--output-path", str(tmp_path / "o"))  # fmt: skip
    assert res.exit_code == 0, res.output
    both = invoke("matrix", "--engine", "fake", "--dry-run", "--results-dir", "a", "--output_path", "b")
    assert both.exit_code == 2 and "give one" in both.output


def test_vllm_yaml_config(tmp_path):
    p = tmp_path / "serve.yaml"
    p.write_text(
        "engine: vllm\ntensor-parallel-size: 2\nblock-size: 32\nkv_cache_dtype: fp8\nbatch: [8, 64]\n"
    )
    res = invoke("matrix", "--config", str(p), "--limit", "2", "--dry-run")
    assert res.exit_code == 0, res.output
    assert "tp2-b8-cascade" in res.output and "block_size=32, kv_cache_dtype='fp8'" in " ".join(
        res.output.split()
    )
    p.write_text("engine: vllm\nblock-size: abc\n")
    res = invoke("matrix", "--config", str(p), "--dry-run")
    assert res.exit_code == 2 and "block_size takes an integer" in res.output
    p.write_text("engine: [\n")
    res = invoke("matrix", "--config", str(p), "--dry-run")
    assert res.exit_code == 2 and "invalid YAML" in res.output and len(res.output.strip().splitlines()) == 1


def test_matrix_help_is_short_and_whole_at_80_columns():
    short, full = invoke("matrix", "--help"), invoke("matrix", "--help-all")
    assert short.exit_code == full.exit_code == 0
    for res in (short, full):
        assert "…" not in res.output
        assert max(len(line) for line in res.output.splitlines()) <= 80
    assert len(short.output.splitlines()) < 200 < len(full.output.splitlines())
    assert "--alpha" not in short.output and "--alpha" in full.output
    assert "--block-size" in short.output and "--kv-cache-dtype-skip-layers" in full.output


def test_dry_run_and_explain_tables_fold_at_80_columns():
    res = invoke("matrix", "--engine", "vllm", "--tp", "1,2", "--batch", "8,64", "--calibrate", "default",
                 "--limit", "64", "--dry-run")  # fmt: skip
    assert res.exit_code == 0 and "…" not in res.output
    assert "tp2-b64-cascade-shift0.01" in res.output
    res = invoke("explain", "--gpu", "A100", "--batch", "16,32,64")
    assert res.exit_code == 0, res.output
    assert "…" not in res.output and "of none concurrent" not in res.output
    assert "no batch size here runs cascade decode steps through FA2's split-KV path" in res.output


# lm-eval's and vLLM's spellings a user brings, and what each gets: the knob it means here, said in
# one line (exit 2), or a note where it changes nothing. One row per spelling.
SPELLINGS = [
    (["--batch_size", "8"], 2, "no such option: --batch_size; lm-eval's batch size is the requests per step: here it is --batch SIZES"),
    (["--batch-size", "8"], 2, "here it is --batch SIZES, the concurrent requests per wave"),
    (["--model", "vllm"], 2, "--model vllm: lm-eval's model type; here --engine vllm picks the engine"),
    (["--model", "hf"], 2, "--model hf: lm-eval's model type; here --engine hf picks the engine"),
    (["--tasks", "ifeval"], 2, "no such option: --tasks; lm-eval's tasks are benchmarks: here the prompts are a prompt set, --prompts SET"),
    (["--num_fewshot", "0"], 2, "no few-shot examples here"),
    (["--apply_chat_template"], 0, "note: --apply_chat_template: every prompt is already rendered with the model's chat template"),
    (["--log_samples"], 0, "note: --log_samples: every sample is kept anyway"),
    (["--swap-space", "4"], 2, "--swap-space: 'swap_space' is not an engine argument of vLLM 0.26.0's EngineArgs as recorded"),
    (["-E", "swap_space=4"], 2, "'swap_space' is not an engine argument of vLLM 0.26.0's EngineArgs as recorded"),
    (["-E", "gpu_memory_utilization=0.4", "--gpu-memory-utilization", "0.3"], 2,
     "engine argument gpu_memory_utilization=0.4 and --gpu-memory-utilization 0.3 set the same thing: give one"),
    (["--model_args", "max_length=2048"], 2, "--model_args max_length=...: use --max-model-len"),
    (["--ubatch-size", "8"], 0, "ubatch_size=8"),  # vLLM's own micro-batch: taken, as vLLM takes it
]  # fmt: skip


@pytest.mark.parametrize(("args", "code", "said"), SPELLINGS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_spellings_point_at_the_knob_they_mean(args, code, said):
    res = invoke("matrix", "--engine", "vllm", "--batch", "8", "--limit", "2", "--dry-run", *args)
    assert res.exit_code == code, res.output
    assert said in " ".join(res.output.split()) and "Traceback" not in res.output
    if code == 2:
        assert len(res.stderr.strip().splitlines()) == 1


def test_an_engine_argument_that_is_an_option_becomes_the_option():
    """-E gpu_memory_utilization=0.4 alone (or lm-eval's model_args) is --gpu-memory-utilization 0.4:
    one value, the one run.json records and the engine gets; the same value both ways is fine."""
    from cascade_repro.plan.flags import spec_from_cli

    for extra, given in ((["--model_args", "gpu_memory_utilization=0.4"], {}),
                         ([], {"engine_arg": ["gpu_memory_utilization=0.4", "block_size=32"]}),
                         ([], {"engine_arg": ["gpu_memory_utilization=0.4"], "gpu_memory_utilization": 0.4})):  # fmt: skip
        spec = spec_from_cli({"engine": "vllm", **given}, extra=extra).spec
        assert spec.gpu_memory_utilization == 0.4
        assert "gpu_memory_utilization" not in spec.engine_args
