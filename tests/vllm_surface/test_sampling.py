"""--sampling: the penalties every arm's requests carry, parsed, checked and refused in one line where
no vLLM sampler applies them."""

from __future__ import annotations

import pytest
from support.cli import CliRunner

from cascade_repro.cli import app
from cascade_repro.errors import UsageError
from cascade_repro.plan.matrix import MatrixSpec
from cascade_repro.vllm_surface import sampling


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})


def test_pairs_parse_to_numbers_by_vllms_names():
    got = sampling.parse_pairs(["repetition_penalty=1.3", "presence-penalty=0.5"])
    assert got == {"repetition_penalty": 1.3, "presence_penalty": 0.5}
    with pytest.raises(ValueError, match="key=value"):
        sampling.parse_pairs(["repetition_penalty"])
    with pytest.raises(ValueError, match="expected a number, got 'high'"):
        sampling.parse_pairs(["repetition_penalty=high"])


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"temperature": 0.7}, "'temperature' is not a sampling penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty must be > 0"),
        ({"frequency_penalty": 2.5}, "frequency_penalty must be >= -2 and <= 2"),
        ({"presence_penalty": True}, "presence_penalty must be a number"),
        ({"repetition_penalty": float("nan")}, "must be a number"),
    ],
)
def test_values_vllm_would_refuse_are_named(table, message):
    assert message in (sampling.problem(table) or "")


def test_only_penalties_that_move_the_logits_are_active():
    assert sampling.active({"repetition_penalty": 1.0, "presence_penalty": 0.0}) == {}
    assert sampling.active({"repetition_penalty": 1.3}) == {"repetition_penalty": 1.3}
    assert sampling.describe({"frequency_penalty": 0.2}) == "frequency_penalty=0.2"
    assert sampling.describe({}) == "none"


def test_the_spec_keeps_them_for_vllm_and_refuses_them_elsewhere():
    spec = MatrixSpec(engine="vllm", sampling={"repetition_penalty": 1.3})
    spec.validate()
    assert spec.to_dict()["sampling"] == {"repetition_penalty": 1.3}
    with pytest.raises(UsageError, match="the fake engine has none to apply them"):
        MatrixSpec(engine="fake", sampling={"repetition_penalty": 1.3}).validate()


@pytest.mark.parametrize("engine", ["fake", "hf"])
def test_an_engine_without_vllms_sampler_refuses_in_one_line(engine):
    res = invoke("matrix", "--engine", engine, "--limit", "2", "--batch", "8", "--dry-run",
                 "--sampling", "repetition_penalty=1.3")  # fmt: skip
    assert res.exit_code == 2, res.output
    assert f"the {engine} engine has none to apply them" in " ".join(res.output.split())
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


def test_a_bad_pair_is_one_line_exit_2():
    res = invoke(
        "matrix", "--engine", "vllm", "--batch", "8", "--dry-run", "--sampling", "repetition_penalty=x"
    )
    assert res.exit_code == 2, res.output
    assert "--sampling repetition_penalty: expected a number" in res.output


def test_the_dry_run_says_what_every_arm_carries():
    res = invoke(
        "matrix", "--engine", "vllm", "--batch", "8", "--dry-run", "--sampling", "repetition_penalty=1.3"
    )
    assert res.exit_code == 0, res.output
    assert "sampling penalties, every arm: repetition_penalty=1.3" in " ".join(res.output.split())


@pytest.mark.parametrize("release", ["0.10.2", "0.26.0", "0.31.0", "0.33.0", "0.34.0"])
def test_every_recorded_release_takes_the_penalties_and_the_logprobs_mode(release):
    import json
    from pathlib import Path

    f = json.loads((Path(__file__).parents[1] / "data" / f"vllm-surface-{release}.json").read_text())
    assert set(sampling.PENALTIES) <= set(f["sampling_params_fields"])
    assert sampling.LOGPROBS_MODE[0] in f["engine_args"]
    assert {"num_gpu_blocks_override", "kv_cache_memory_bytes"} <= set(f["engine_args"])
