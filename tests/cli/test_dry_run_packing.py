"""`matrix --dry-run` shows where and when each engine key runs, the memory each gets and the time side
by side (cli/matrix_plan.py), as text and as JSON; CASCADE_REPRO_GPUS stands in for the machine."""

from __future__ import annotations

import json

import pytest
from support.cli import CliRunner

from cascade_repro.cli import app

WIDE = {"COLUMNS": "250"}


def invoke(*args: str, gpus: str):
    return CliRunner().invoke(app, list(args), env={**WIDE, "CASCADE_REPRO_GPUS": gpus})


def matrix(model, *extra: str) -> list[str]:
    return ["matrix", "--engine", "vllm", "--model", str(model), "--limit", "8", "--batch", "8",
            "--fa-version", "2,3", "--seed", "0,1", "--dry-run", *extra]  # fmt: skip


@pytest.mark.slow
def test_the_dry_run_shows_each_keys_gpu_turn_and_memory(cut_model):
    res = invoke(*matrix(cut_model), gpus="2x80")
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "GPUs: 2 x GPU (80 GiB) (CASCADE_REPRO_GPUS=2x80); at most 8 engines per GPU" in out
    assert "memory per engine at tp 1, per GPU: " in out and "(passed to vLLM; a wave needs 1.0 GiB)" in out
    rows = [ln.split("│")[1:4] for ln in out.splitlines() if ln.startswith("│ vllm-")]
    assert len(rows) == 4  # two seeds x two FA versions: spread over both GPUs, all at once
    assert [g.strip() for _, g, _ in rows] == ["0", "1", "0", "1"] and {t.strip() for *_, t in rows} == {"0"}
    assert "engines side by side; one after another: about" in out


@pytest.mark.slow
def test_the_dry_run_as_json(cut_model):
    res = invoke(*matrix(cut_model, "--json"), gpus="2x80")
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    engines = plan["engines"]
    assert [e["gpus"] for e in engines.values()] == [[0], [1], [0], [1]]
    assert {e["turn"] for e in engines.values()} == {0}
    mem = next(iter(engines.values()))["memory_bytes"]
    assert mem["total"] == mem["weights"] + mem["kv_cache"] + mem["overhead"]
    assert mem["kv_cache"] >= 2 * mem["kv_cache_minimum"] and not mem["kv_cache_yours"]
    assert plan["packing"]["side_by_side"] and plan["packing"]["kv_budget_passed"]
    assert [g["memory_bytes"] for g in plan["packing"]["gpus"]] == [80 * 2**30] * 2
    # The dry run's estimate from the speed table (this fresh run directory has no waves of its own
    # to refine it): arithmetic, not a time measured on this box.
    assert plan["estimate"]["seconds"] < plan["estimate"]["sequential_seconds"]
    # 2 keys x 2 FA versions x (cascade, flat at b8, the b1 flat control the planner adds)
    assert len(plan["cells"]) == 12 and plan["prompts"] == 8


@pytest.mark.slow
def test_one_engine_per_gpu_on_one_gpu_is_sequential(cut_model):
    res = invoke(*matrix(cut_model, "--max-engines-per-gpu", "1"), gpus="1x141")
    assert res.exit_code == 0, res.output
    assert "engines side by side" not in res.stdout and "GPUs:" not in res.stdout
    plan = json.loads(invoke(*matrix(cut_model, "--max-engines-per-gpu", "1", "--json"), gpus="1x141").stdout)
    assert [e["turn"] for e in plan["engines"].values()] == [0, 1, 2, 3]
    assert not plan["packing"]["side_by_side"] and not plan["packing"]["kv_budget_passed"]
    assert plan["estimate"]["seconds"] == plan["estimate"]["sequential_seconds"]


@pytest.mark.slow
def test_the_dry_run_warns_of_what_this_machine_would_refuse(cut_model):
    res = invoke(*matrix(cut_model, "--tp", "2"), gpus="1x141")
    assert res.exit_code == 0, res.output
    assert "warning: this machine would refuse the run: --tp 2 needs 2 GPUs, 1 visible" in " ".join(
        res.stderr.split()
    )
    res = invoke(*matrix(cut_model), gpus="1x1.5")
    assert "warning: this machine would refuse the run: one engine at tp 1 needs" in " ".join(
        res.stderr.split()
    )


def test_max_engines_per_gpu_below_one_is_one_line():
    res = CliRunner().invoke(app, ["matrix", "--engine", "fake", "--max-engines-per-gpu", "0", "--dry-run"])
    assert res.exit_code == 2
    assert res.stderr.strip() == "error: --max-engines-per-gpu 0: must be 1 or more"
