"""Engine keys side by side: the GPU inventory, the memory arithmetic, the placement and the schedule,
on fake machines of 1, 2 and 8 GPUs of 24, 80 and 141 GiB (plan/gpus.py, plan/packing.py)."""

from __future__ import annotations

import pytest

from cascade_repro.errors import UsageError
from cascade_repro.plan import estimate, gpus, packing
from cascade_repro.plan.packing import GIB, ModelMemory

# The embedded model (SmolLM2-135M: 30 layers, 3 KV heads of 64, bf16) and a Llama-3-8B-shaped one.
SMOL = ModelMemory(weights_bytes=269_030_016, kv_heads=3, layers=30, head_dim=64, dtype_bytes=2)
LLAMA8B = ModelMemory(weights_bytes=16_060_522_496, kv_heads=8, layers=32, head_dim=128, dtype_bytes=2)
# The README's GPU matrix: 64 prompts of about 1,700 tokens, 128 new tokens, batch 64.
SEQ = 1_700 + 128 + 1


def machine(text: str) -> gpus.Inventory:
    return gpus.parse(text)


def pack(inv: str, tps=(1,), model=SMOL, batch=64, cap=None, **kw) -> packing.Packing:
    return packing.pack(list(tps), machine(inv), gpu_engine=True, model=model, tokens_per_seq=SEQ,
                        max_batch=batch, max_per_gpu=cap, **kw)  # fmt: skip


# --- inventory ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, n, gb",
    [("1x141", 1, 141), ("2x80", 2, 80), ("8x141", 8, 141), ("24", 1, 24), ("8 x 24GB", 8, 24)],
)
def test_the_override_fakes_n_gpus_of_a_size(text, n, gb):
    inv = gpus.parse(text)
    assert [g.index for g in inv.gpus] == list(range(n))
    assert {g.memory_bytes for g in inv.gpus} == {gb * 2**30}
    assert inv.source == f"CASCADE_REPRO_GPUS={text}"


def test_mixed_gpus_and_none():
    inv = gpus.parse("24,80,80")
    assert [g.memory_bytes // 2**30 for g in inv.gpus] == [24, 80, 80]
    assert inv.describe() == "1 x GPU (24 GiB) + 2 x GPU (80 GiB)"
    assert gpus.parse("none").gpus == ()


@pytest.mark.parametrize("text", ["x141", "8x", "0x80", "-1", "eight"])
def test_a_bad_override_is_one_line(text):
    with pytest.raises(UsageError, match="CASCADE_REPRO_GPUS"):
        gpus.parse(text)


def test_nvidia_smi_query_read_under_cuda_visible_devices():
    out = (
        "0, GPU-aaaa, NVIDIA H200, 143771\n"
        "1, GPU-bbbb, NVIDIA H200, 143771\n"
        "2, GPU-cccc, NVIDIA A100-SXM4-80GB, 81920\n"
    )
    every = gpus.from_query(out, None)
    assert [(g.index, g.cuda_id, g.name) for g in every.gpus] == [
        (0, "0", "NVIDIA H200"), (1, "1", "NVIDIA H200"), (2, "2", "NVIDIA A100-SXM4-80GB"),
    ]  # fmt: skip
    assert every.gpus[0].memory_bytes == 143771 * (1 << 20)
    # CUDA's order and numbering: the second visible is index 1, named to a worker by its own id.
    picked = gpus.from_query(out, "2,GPU-aaaa")
    assert [(g.index, g.cuda_id) for g in picked.gpus] == [(0, "2"), (1, "0")]
    assert gpus.from_query(out, "1,-1,2").gpus[0].cuda_id == "1" and len(gpus.from_query(out, "1,-1,2")) == 1
    assert gpus.from_query(out, "").gpus == ()


def test_detect_reads_the_override(monkeypatch):
    monkeypatch.setenv(gpus.ENV, "2x80")
    assert len(gpus.detect()) == 2


# --- the KV budget arithmetic ------------------------------------------------------------------


def test_kv_bytes_per_token_and_under_tp():
    assert SMOL.kv_bytes_per_token(1) == 2 * 30 * 3 * 64 * 2 == 23_040
    # 3 KV heads over 2 GPUs: 2 on the busier one (vLLM splits heads, replicates where fewer than GPUs).
    assert SMOL.kv_bytes_per_token(2) == 2 * 30 * 2 * 64 * 2
    assert SMOL.kv_bytes_per_token(8) == 2 * 30 * 1 * 64 * 2
    assert LLAMA8B.kv_bytes_per_token(2) == 2 * 32 * 4 * 128 * 2


def test_the_embedded_models_budget_is_what_the_evidence_passed_by_hand():
    mem = packing.engine_memory(SMOL, 1, SEQ, 64)
    # A whole wave: 64 sequences of 2,048 tokens (1,829 rounded up to 256, as vLLM's context is).
    assert mem.min_kv == 64 * 2048 * 23_040 == 3_019_898_880
    # Twice that, rounded up to 256 MiB: about the 6 GB the H200 evidence gave each engine.
    assert mem.kv == 23 * 256 * (1 << 20) == 6_174_015_488
    assert mem.weights == SMOL.weights_bytes
    assert mem.overhead == int(2.5 * GIB) + int(0.1 * SMOL.weights_bytes)
    assert mem.total == mem.weights + mem.kv + mem.overhead == 9_154_303_065


def test_a_long_max_model_len_needs_one_whole_sequence():
    # vLLM refuses to start without room for one --max-model-len sequence: 131,072 x 131,072 B.
    mem = packing.engine_memory(LLAMA8B, 1, SEQ, 1, max_model_len=131_072)
    assert mem.min_kv == 131_072 * LLAMA8B.kv_bytes_per_token(1) == 17_179_869_184


def test_a_small_wave_still_gets_the_floor():
    mem = packing.engine_memory(SMOL, 1, 100, 1)
    assert mem.min_kv == GIB and mem.kv == 2 * GIB


def test_the_share_passed_to_vllm_covers_the_engine():
    assert packing.share_fraction(9_154_303_065, 141 * 2**30) == 0.061
    assert packing.share_fraction(141 * 2**30, 141 * 2**30) == 1.0


# --- packing on fake machines ------------------------------------------------------------------


@pytest.mark.parametrize(
    "inv, model, per_gpu",
    [
        ("1x141", SMOL, 8),  # 13 would fit: the default cap
        ("1x80", SMOL, 8),  # 77.3 GB usable / 9.15 GB: 8, the cap
        ("1x24", SMOL, 2),
        ("1x141", LLAMA8B, 2),  # an 8B model: two engines on an H200
        ("1x80", LLAMA8B, 1),
    ],
)
def test_engines_per_gpu_follow_memory(inv, model, per_gpu):
    p = pack(inv, tps=[1] * 12, model=model)
    slots = packing.schedule(p, [(f"k{i}", 1) for i in range(12)])
    first = [s for s in slots if s.wave == 0]
    assert len(first) == per_gpu
    assert all(s.gpus == (0,) for s in slots)
    used = per_gpu * p.memory[1].total
    assert used <= 0.9 * machine(inv).gpus[0].memory_bytes  # never over-committed


def test_keys_spread_over_eight_gpus_then_pack():
    p = pack("8x141", tps=[1] * 10)
    slots = packing.schedule(p, [(f"k{i}", 1) for i in range(10)])
    assert [s.gpus for s in slots] == [(i,) for i in range(8)] + [(0,), (1,)]
    assert {s.wave for s in slots} == {0}  # ten fit at once


def test_two_gpus_of_80_run_two_8b_engines_at_once():
    p = pack("2x80", tps=[1, 1, 1], model=LLAMA8B)
    slots = packing.schedule(p, [("a", 1), ("b", 1), ("c", 1)])
    assert [(s.key, s.gpus, s.wave) for s in slots] == [("a", (0,), 0), ("b", (1,), 0), ("c", (0,), 1)]


def test_tp_groups_are_kept_whole():
    p = pack("8x80", tps=[2, 2, 1, 4], model=LLAMA8B)
    slots = packing.schedule(p, [("t2a", 2), ("t2b", 2), ("t1", 1), ("t4", 4)])
    by = {s.key: s for s in slots}
    assert by["t2a"].gpus == (0, 1) and by["t2b"].gpus == (2, 3) and by["t1"].gpus == (4,)
    # Four distinct GPUs: the three empty ones, then the one with the most memory left beside its engine.
    assert by["t4"].gpus == (0, 5, 6, 7) and by["t4"].wave == 0
    # The 8B model at tp 2: half the weights on each GPU.
    assert p.memory[2].weights == LLAMA8B.weights_bytes // 2


def test_no_key_overtakes_one_that_waits():
    p = pack("2x80", tps=[1, 2, 1], model=LLAMA8B)
    slots = packing.schedule(p, [("a", 1), ("wide", 2), ("c", 1)])
    assert [(s.key, s.wave) for s in slots] == [("a", 0), ("wide", 1), ("c", 2)]


def test_max_engines_per_gpu_caps_and_1_is_the_sequential_run():
    assert [s.wave for s in packing.schedule(pack("1x141", cap=3), [(f"k{i}", 1) for i in range(7)])] == [
        0, 0, 0, 1, 2, 3, 4,
    ]  # fmt: skip
    one = pack("1x141", cap=1)
    assert not one.concurrent
    slots = packing.schedule(one, [("a", 1), ("b", 1), ("c", 1)])
    assert [(s.key, s.wave) for s in slots] == [("a", 0), ("b", 1), ("c", 2)]
    assert one.env_for(1, (0,)) == {}  # nothing pinned, no budget: today's engine exactly
    # One per GPU on two GPUs: side by side, pinned, but each alone on its GPU: no budget.
    two = pack("2x80", cap=1)
    assert two.concurrent and not two.budget
    assert two.env_for(1, (1,)) == {"CUDA_VISIBLE_DEVICES": "1"}


def test_a_worker_gets_its_gpus_budget_and_share():
    p = pack("1x141")
    env = p.env_for(1, (0,))
    assert env == {
        "CUDA_VISIBLE_DEVICES": "0",
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0",
        packing.ENV_KV_BYTES: "6174015488",
        packing.ENV_GPU_UTIL: "0.061",
    }


def test_the_users_kv_budget_wins():
    p = pack("1x141", kv_given=8 * 2**30)
    assert p.memory[1].kv == 8 * 2**30 and p.memory[1].kv_given
    env = p.env_for(1, (0,))
    # (0.27 + 8.59 + 2.71) GB of 141 GiB's 151.4 GB
    assert packing.ENV_KV_BYTES not in env and env[packing.ENV_GPU_UTIL] == "0.077"
    assert any("kv_cache_memory_bytes=8589934592 is yours" in n for n in p.notes)


def test_the_users_memory_utilization_wins():
    p = pack("1x141", util_given=0.2)
    assert not p.budget
    assert p.env_for(1, (0,)) == {"CUDA_VISIBLE_DEVICES": "0"}
    # vLLM takes 0.2 of the GPU per engine: four fit in 90 %.
    assert [s.wave for s in packing.schedule(p, [(f"k{i}", 1) for i in range(5)])] == [0, 0, 0, 0, 1]


def test_a_budget_too_big_for_a_small_gpu_is_cut_to_what_fits():
    p = pack("2x24", tps=[2], model=LLAMA8B)
    mem = p.memory[2]
    assert mem.min_kv <= mem.kv < packing.engine_memory(LLAMA8B, 2, SEQ, 64).kv
    assert mem.total <= 0.9 * 24 * 2**30


def test_memory_unknown_counts_engines():
    p = packing.pack([1, 1], gpus.counted(1, "counted"), gpu_engine=True, model=SMOL, tokens_per_seq=SEQ,
                     max_batch=64, max_per_gpu=None)  # fmt: skip
    assert p.memory == {} and not p.budget and p.cap == 1  # no budget to give: one per GPU
    assert p.notes == ("the GPUs' memory is unknown: memory not checked, 1 engine per GPU",)
    unknown = pack("1x141", model=None, cap=3)
    assert unknown.cap == 3 and not unknown.budget
    assert unknown.notes == (
        "the model's size is unknown (not on disk yet): memory not checked, 3 engines per GPU",
    )


def test_engines_without_gpu_placement_run_n_at_once():
    p = packing.pack([1, 1, 1], gpus.Inventory((), "none"), gpu_engine=False, model=None, tokens_per_seq=0,
                     max_batch=1, max_per_gpu=None)  # fmt: skip
    assert p.mode == "slots" and p.cap == 1 and not p.concurrent
    p2 = packing.pack([1, 1, 1], gpus.Inventory((), "none"), gpu_engine=False, model=None, tokens_per_seq=0,
                      max_batch=1, max_per_gpu=2)  # fmt: skip
    assert p2.concurrent and p2.env_for(1, ()) == {}
    assert [s.wave for s in packing.schedule(p2, [("a", 1), ("b", 1), ("c", 1)])] == [0, 0, 1]


# --- refusals ----------------------------------------------------------------------------------


def test_a_tp_larger_than_the_gpus_is_refused_in_one_line():
    with pytest.raises(UsageError) as e:
        pack("1x141", tps=[1, 2])
    assert str(e.value).startswith("--tp 2 needs 2 GPUs, 1 visible (1 x GPU (141 GiB))")
    assert "\n" not in str(e.value)


def test_a_model_that_does_not_fit_one_gpu_is_refused_in_one_line():
    with pytest.raises(UsageError) as e:
        pack("1x24", model=LLAMA8B)
    msg = str(e.value)
    assert msg.startswith(
        "one engine at tp 1 needs 35.0 GiB per GPU (15.0 GiB weights, 16.0 GiB KV cache for a whole wave"
    )
    assert "more than the 21.6 GiB a 24.0 GiB GPU gives it" in msg and "\n" not in msg
    with pytest.raises(UsageError, match="KV cache \\(yours\\)"):
        pack("1x80", model=SMOL, kv_given=100 * 2**30)


def test_max_engines_per_gpu_below_one_is_refused():
    with pytest.raises(UsageError, match="--max-engines-per-gpu 0: must be 1 or more"):
        pack("1x141", cap=0)


# --- the estimate with engines side by side -----------------------------------------------------


def test_the_schedule_times_engines_sharing_a_gpu():
    p = pack("1x141", cap=2)
    slots = packing.schedule(
        p, [("a", 1), ("b", 1), ("c", 1)], {"a": (60.0, 10.0), "b": (60.0, 10.0), "c": (60.0, 10.0)}
    )
    # Two share the GPU: starts 6.5 % slower each, waves twice as long.
    assert [(s.key, s.wave, s.start_s, s.end_s) for s in slots] == [
        ("a", 0, 0.0, 83.9), ("b", 0, 0.0, 83.9), ("c", 1, 83.9, 167.8),
    ]  # fmt: skip


def test_the_estimate_accounts_for_engines_side_by_side():
    engines = {
        f"k{i}": {"cells": [{"cell_id": f"c{i}", "batch": 64}], "fa_version": None, "tp": 1} for i in range(4)
    }
    seq = estimate.estimate("vllm", "cuda", 64, 128, engines)
    side = estimate.estimate("vllm", "cuda", 64, 128, engines, packing=pack("1x141"))
    table = estimate.SPEEDS[("vllm", "cuda")]
    wave = 64 * 128 / table.rate(64)
    assert seq.seconds == pytest.approx(4 * (table.start_s + wave) + table.overhead_s)
    assert side.sequential_s == pytest.approx(seq.seconds)
    assert side.seconds == pytest.approx(
        table.start_s * (1 + 3 * 0.065) + 4 * wave + table.overhead_s, abs=0.2
    )
    assert len(side.slots) == 4 and "engines side by side; one after another: about" in side.line()
    assert seq.slots == () and "side by side" not in seq.line()
