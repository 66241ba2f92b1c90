"""The probe's two additions for the real-bug runs: requests the scheduler preempted under a fixed KV
cache (the async-scheduling + preemption bug needs them), and FlashInfer's own cascade path (vLLM
0.10.2's FlashInfer backend, which never calls FLASH_ATTN's cascade_attention)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from cascade_repro import twin as twins
from cascade_repro.plan import models as plan_models
from cascade_repro.plan.matrix import MatrixSpec, plan
from cascade_repro.vllm_surface import flashinfer_cascade, preemption, probe


class _Status:
    def __init__(self, name):
        self.name = name


def test_a_request_that_went_to_preempted_in_the_step_counts_once():
    reqs = {"a": types.SimpleNamespace(status=_Status("RUNNING")), "b": types.SimpleNamespace(status=_Status("RUNNING")),
            "c": types.SimpleNamespace(status=_Status("PREEMPTED"))}  # fmt: skip
    before = preemption.statuses(reqs)
    reqs["b"].status = _Status("PREEMPTED")  # preempted in this step
    assert preemption.preempted(before, reqs) == 1  # c was preempted before the step: not again
    assert preemption.status_name(types.SimpleNamespace(status="RequestStatus.PREEMPTED")) == "PREEMPTED"


def _wave(tmp_path: Path, twin: str, arm: str, engine_args: dict, sampling: dict | None = None):
    from cascade_repro.engines.vllm import VLLMEngine

    tw = twins.resolve(twin)
    spec = MatrixSpec(engine="vllm", twin=tw.name, batch=[8], max_tokens=6, topk=2, engine_args=engine_args,
                      sampling=sampling or {})  # fmt: skip
    plan_ = plan(spec)
    ep = next(e for e in plan_.engines.values() if e.arm == arm)
    eng = VLLMEngine("/models/m", spec, ep, run_dir=tmp_path / arm, models=plan_models)
    prompts = [[1] * 40 + [i] for i in range(8)]
    _, st = eng.run_wave(prompts, arm, 6, prefix_len=40)
    return eng, st


def test_a_fixed_kv_cache_preempts_and_the_wave_says_how_many(fake_vllm, tmp_path):
    pytest.importorskip("torch")
    # 8 requests of 41 prompt tokens growing by 6: 8 x 47 tokens do not fit 20 blocks of 16 (320).
    eng, st = _wave(tmp_path / "tight", "async-scheduling", "async", {"num_gpu_blocks_override": 20})
    assert st.extra["preempted_reqs"] > 0
    assert st.extra["effect"]["count"] > 0  # the AsyncScheduler ran the steps
    eng.close()
    eng, st = _wave(tmp_path / "roomy", "async-scheduling", "async", {"num_gpu_blocks_override": 400})
    assert "preempted_reqs" not in st.extra
    eng.close()


def test_penalties_reach_every_request_and_ask_for_the_penalized_logprobs(fake_vllm, tmp_path):
    pytest.importorskip("torch")
    eng, _ = _wave(tmp_path, "async-scheduling", "sync", {}, {"repetition_penalty": 1.3})
    assert eng.llm.kwargs["logprobs_mode"] == "processed_logprobs"
    assert {p.penalties for p in eng.llm.params_seen} == {(1.3, 0.0, 0.0)}  # the warm-up and the wave
    eng.close()
    eng, _ = _wave(tmp_path / "none", "async-scheduling", "sync", {})
    assert "logprobs_mode" not in eng.llm.kwargs
    assert {p.penalties for p in eng.llm.params_seen} == {(1.0, 0.0, 0.0)}
    eng.close()


class _Wrapper:
    """FlashInfer's MultiLevelCascadeAttentionWrapper as vLLM 0.10.2's builder and impl call it."""

    def __init__(self):
        self.ran = 0

    def plan(self, qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim, page_size, **kwargs):  # fmt: skip
        self.planned = (num_qo_heads, num_kv_heads)

    def run(self, q, paged_kv_cache):
        self.ran += 1
        return q


def test_flashinfer_cascade_runs_count_as_cascade_calls_and_decode_calls(tmp_path):
    torch = pytest.importorskip("torch")
    mod = types.ModuleType("vllm.v1.attention.backends.flashinfer")
    mod.MultiLevelCascadeAttentionWrapper = _Wrapper
    st = probe.ProbeState(tmp_path)
    assert flashinfer_cascade.patch(mod, st) == [
        "vllm.v1.attention.backends.flashinfer.MultiLevelCascadeAttentionWrapper.plan",
        "vllm.v1.attention.backends.flashinfer.MultiLevelCascadeAttentionWrapper.run",
    ]
    assert flashinfer_cascade.patch(mod, st) == []  # once
    st.apply({"wave": "w", "seq": 1})
    w = _Wrapper()
    reqs = 48
    shared = [torch.tensor([0, reqs]), torch.tensor([0, 6]), torch.arange(6), torch.tensor([16])]
    own_pages = torch.arange(0, 2 * reqs + 1, 2)  # 2 pages of 16 each
    for tokens in (reqs * 30, reqs, reqs):  # a prefill step, then two decode steps
        qo = torch.arange(0, tokens + 1, tokens // reqs)
        w.plan([shared[0], qo], [shared[1], own_pages], [shared[2], None], [shared[3], None], 9, 3, 64, 16)
        for _layer in range(2):
            w.run(torch.empty(tokens, 9, 64), None)
    c = st.sync("w")["waves"]["w"]
    assert (c["cascade_calls"], c["decode_cascade_calls"], c["max_decode_suffix"]) == (6, 4, 32)
    assert c["fa2_split_calls"] == 0 and w.ran == 6


def test_a_fixed_kv_cache_is_an_engine_argument_the_matrix_takes():
    from cascade_repro.plan import engine_args as eargs

    # Neither is owned by the harness nor breaks the experiment: both arms get the same cache.
    eargs.check({"num_gpu_blocks_override": 32}, 64)
    eargs.check({"kv_cache_memory_bytes": 294_912_000}, 64)
    assert "num_gpu_blocks_override" not in eargs.OWNED and "kv_cache_memory_bytes" not in eargs.OWNED
