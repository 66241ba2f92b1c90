"""`cascade-repro kernel` on a CPU: grid, paged inputs, float64 reference, injection, reports, CLI.

The vLLM calls themselves need a GPU; ``run_case`` and the worker are driven here through the fake
of ``vllm.v1.attention.backends.flash_attn`` in tests/fake_vllm (shared with the probe's and the
engine's tests), whose ``cascade_attention`` has the same structure as vLLM 0.26's (two
``flash_attn_varlen_func`` calls, then the module-global ``merge_attn_states``), backed by the
PyTorch kernels of ``kernel/reference.py``. The real thing runs in the tests marked ``gpu`` and
``vllm`` at the end, skipped here.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest
import torch
from conftest import FAKE_VLLM_ROOT
from support.cli import CliRunner

from cascade_repro.engines import cascade_attention as engines_ca
from cascade_repro.errors import UsageError
from cascade_repro.kernel import grid as kgrid
from cascade_repro.kernel import report as kreport
from cascade_repro.kernel import run as krun
from cascade_repro.kernel.grid import KernelCase, build_grid, estimate_seconds
from cascade_repro.kernel.reference import (
    build_inputs,
    cascade_reference,
    error_stats,
    exact_attention,
    gather_kv,
    naive_attention,
    paged_partial_attention,
)
from cascade_repro.vllm_surface.probe import misread_lse


def small_case(kind: str = "decode", **kw) -> KernelCase:
    base = dict(
        case_id=f"{kind}-small",
        kind=kind,
        num_seqs=8,
        prefix_len=32,
        suffix_max=21,
        num_q_heads=6,
        num_kv_heads=2,
        head_dim=16,
        dtype="bf16",
        fa_version=2,
        max_num_splits=0,
        seed=1234,
        prefill_frac=0.25 if kind == "mixed" else 0.0,
        prefill_max=20,
    )
    base.update(kw)
    return KernelCase(**base)


# --- grid -----------------------------------------------------------------------------------------


def test_grid_sizes_and_estimates():
    full, quick = build_grid(False), build_grid(True)
    assert len(full) == 138 and len(quick) == 11
    assert len(build_grid(False, fa_versions=(2,))) == 50  # 25 shapes x 2 dtypes x splits {0}
    # splits {0, 32}, 32 only for the 19 shapes of at most 512 tokens (16 decode, 3 mixed)
    assert len(build_grid(False, fa_versions=(3,))) == 88
    assert len(build_grid(False, dtypes=("bf16",))) == 69
    assert estimate_seconds(quick) < 120
    assert estimate_seconds(full) < 600


def test_quick_is_a_subset_of_full_and_ids_are_unique():
    full = build_grid(False)
    ids = [c.case_id for c in full]
    assert len(ids) == len(set(ids))
    by_id = {c.case_id: c for c in full}
    for c in build_grid(True):
        assert by_id[c.case_id] == c
        assert by_id[c.case_id].lengths == c.lengths
    # With one dtype the quick grid still picks a case of the full grid for every quick shape.
    fp16 = {c.case_id for c in build_grid(False, dtypes=("fp16",))}
    quick16 = build_grid(True, dtypes=("fp16",))
    assert len(quick16) == 11 and {c.case_id for c in quick16} <= fp16


@pytest.mark.parametrize("quick", [False, True])
def test_grid_covers_every_required_dimension(quick):
    cases = build_grid(quick)
    assert {c.kind for c in cases} == {"decode", "mixed"}
    assert {c.head_dim for c in cases} == {64, 128}
    assert {c.dtype for c in cases} == {"bf16", "fp16"}
    assert {c.fa_version for c in cases} == {2, 3}
    decode_gqa = [c for c in cases if c.kind == "decode" and c.gqa]
    assert {c.max_num_splits for c in decode_gqa if c.fa_version == 3} == {0, 32}
    # vLLM's builder passes max_num_splits > 0 only to steps within the CUDA-graph capture size.
    assert all(c.num_tokens <= kgrid.CUDAGRAPH_MAX_TOKENS for c in cases if c.max_num_splits > 0)
    assert any(c.kind == "mixed" and c.max_num_splits == 32 for c in cases)
    assert any(c.kind == "mixed" and c.num_tokens > kgrid.CUDAGRAPH_MAX_TOKENS for c in cases)
    assert all(c.max_num_splits == 0 for c in cases if c.fa_version == 2)  # FA2 refuses num_splits > 1
    assert all(c.block_size == 16 and c.prefix_len % 16 == 0 for c in cases)
    if not quick:
        assert min(c.prefix_len for c in cases) == 256 and max(c.prefix_len for c in cases) == 8192
        assert min(c.num_seqs for c in cases) == 8 and max(c.num_seqs for c in cases) == 256
        assert {c.prefix_len for c in decode_gqa} == {256, 1024, 4096, 8192}
        assert {c.num_seqs for c in decode_gqa} == {8, 32, 128, 256}
        assert any(c.num_kv_heads == 1 for c in decode_gqa)  # MQA
        assert any(c.kind == "mixed" and not c.gqa for c in cases)  # plain multi-head
        assert {c.suffix_max for c in decode_gqa} == {64, 1024}


def test_case_lengths():
    for c in build_grid(False):
        q, s = c.lengths
        assert len(q) == len(s) == c.num_seqs
        assert all(sl >= ql >= 1 for ql, sl in zip(q, s, strict=True))
        if c.kind == "decode":
            assert set(q) == {1}
            assert c.num_kv_heads < c.num_q_heads
            assert max(s) <= c.suffix_max
        else:
            assert max(q) > 1 and min(q) == 1  # prefill chunks and decodes in one step
    a, b = build_grid(False)[0], build_grid(False)[0]
    assert a.lengths == b.lengths and a is not b


def test_seed_depends_on_the_shape_only():
    full = build_grid(False)
    by_shape: dict[str, set[int]] = {}
    for c in full:
        by_shape.setdefault(c.shape_id, set()).add(c.seed)
    assert all(len(s) == 1 for s in by_shape.values())
    assert len({next(iter(s)) for s in by_shape.values()}) == len(by_shape)
    assert {c.seed for c in build_grid(False, seed=1)}.isdisjoint({c.seed for c in full})


def test_grid_option_parsing():
    assert kgrid.parse_fa_versions("3, 2,3") == (3, 2)
    assert kgrid.parse_dtypes("bfloat16,half") == ("bf16", "fp16")
    for bad in ("4", "x", ""):
        with pytest.raises(UsageError):
            kgrid.parse_fa_versions(bad)
    with pytest.raises(UsageError):
        kgrid.parse_dtypes("fp8")
    with pytest.raises(ValueError):
        small_case(prefix_len=30)
    with pytest.raises(ValueError):
        small_case(num_q_heads=5)


# --- paged inputs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["decode", "mixed"])
def test_paged_cache_shares_prefix_blocks_and_gathers_the_logical_kv(kind):
    case = small_case(kind)
    x = build_inputs(case, keep_logical=True)
    n_pre = case.prefix_len // case.block_size
    table = x.block_table
    assert table.dtype == torch.int32
    assert (table[:, :n_pre] == table[0, :n_pre]).all()  # one physical copy of the prefix
    own = [set(table[i, n_pre : -(-sl // 16)].tolist()) for i, sl in enumerate(x.seq_lens)]
    assert all(a.isdisjoint(b) for i, a in enumerate(own) for b in own[i + 1 :])
    assert all(set(table[0, :n_pre].tolist()).isdisjoint(o) for o in own)
    used = [table[i, : -(-sl // 16)] for i, sl in enumerate(x.seq_lens)]
    assert all((u > 0).all() for u in used)  # block 0 is the null block
    for i, sl in enumerate(x.seq_lens):
        assert (table[i, -(-sl // 16) :] == 0).all()  # padding
        k, v = gather_kv(x.key_cache, x.value_cache, table[i], 0, sl)
        assert torch.equal(k, torch.cat([x.prefix_k, x.suffix_k[i]]))
        assert torch.equal(v, torch.cat([x.prefix_v, x.suffix_v[i]]))
        k2, _ = gather_kv(x.key_cache, x.value_cache, table[i], 5, sl - 3)  # unaligned window
        assert torch.equal(k2, k[5 : sl - 3])
    assert x.cu_query_lens.tolist()[-1] == x.num_tokens == sum(case.query_lens)


def test_paged_cache_has_vllm_layout_and_no_zeros():
    case = small_case()
    x = build_inputs(case)
    nb, bs, kvh, two_d = x.kv_cache.shape
    d = case.head_dim
    assert (bs, kvh, two_d) == (16, case.num_kv_heads, 2 * d)
    # forward's kv_cache.transpose(1, 2).split(head_size, dim=-1) of the NHD memory layout
    assert x.key_cache.stride() == x.value_cache.stride() == (bs * kvh * 2 * d, kvh * 2 * d, 2 * d, 1)
    assert x.value_cache.data_ptr() - x.key_cache.data_ptr() == d * x.kv_cache.element_size()
    assert x.query.dtype == x.kv_cache.dtype == torch.bfloat16
    assert (x.kv_cache == 0).float().mean() < 1e-3 and (x.query == 0).float().mean() < 1e-3
    # Deterministic per seed, different for another seed.
    y = build_inputs(case)
    assert torch.equal(x.kv_cache, y.kv_cache) and torch.equal(x.query, y.query)
    assert torch.equal(x.block_table, y.block_table)
    z = build_inputs(replace(case, seed=99))
    assert not torch.equal(x.query, z.query)


def test_fp16_and_bf16_round_the_same_draws():
    a = build_inputs(small_case(dtype="bf16"))
    b = build_inputs(small_case(dtype="fp16"))
    assert torch.equal(a.block_table, b.block_table)
    assert torch.allclose(a.query.float(), b.query.float(), rtol=1e-2, atol=1e-2)


# --- float64 reference -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["decode", "mixed"])
@pytest.mark.parametrize("heads", [(6, 2), (4, 4), (4, 1)])
def test_exact_attention_matches_naive_softmax(kind, heads):
    case = small_case(kind, num_seqs=4, prefix_len=16, suffix_max=9, prefill_max=6, head_dim=4,
                      num_q_heads=heads[0], num_kv_heads=heads[1])  # fmt: skip
    x = build_inputs(case, keep_logical=True)
    ref = exact_attention(x)
    assert ref.dtype == torch.float64 and ref.shape == x.query.shape
    torch.testing.assert_close(ref, naive_attention(x), rtol=0, atol=1e-12)


def test_exact_attention_chunking_changes_nothing():
    x = build_inputs(small_case("mixed"))
    torch.testing.assert_close(exact_attention(x, chunk_elems=64), exact_attention(x), rtol=0, atol=1e-13)


def _padded(x):
    """The inputs in engines/cascade_attention's layout: q [B,H,Q,D], k/v [B,KVH,L,D], mask [B,1,Q,L]."""
    b, qmax, lmax = x.num_seqs, max(x.query_lens), max(x.seq_lens)
    h, kvh, d = x.num_q_heads, x.num_kv_heads, x.head_dim
    q = torch.zeros(b, h, qmax, d, dtype=torch.float64)
    k = torch.zeros(b, kvh, lmax, d, dtype=torch.float64)
    v = torch.zeros_like(k)
    mask = torch.zeros(b, 1, qmax, lmax, dtype=torch.bool)
    for i, (s, ql, sl) in enumerate(zip(x.query_starts, x.query_lens, x.seq_lens, strict=True)):
        q[i, :, :ql] = x.query[s : s + ql].double().transpose(0, 1)
        ki, vi = gather_kv(x.key_cache, x.value_cache, x.block_table[i], 0, sl)
        k[i, :, :sl], v[i, :, :sl] = ki.double().transpose(0, 1), vi.double().transpose(0, 1)
        for j in range(ql):
            mask[i, 0, j, : sl - ql + j + 1] = True
    return q, k, v, mask


def _unpad(out, x):
    return torch.cat([out[i, :, :ql].transpose(0, 1) for i, ql in enumerate(x.query_lens)])


@pytest.mark.parametrize("kind", ["decode", "mixed"])
def test_exact_attention_matches_the_engines_cascade_math(kind):
    x = build_inputs(small_case(kind))
    ref = exact_attention(x)
    q, k, v, mask = _padded(x)
    casc = _unpad(engines_ca.cascade_attention(q, k, v, mask, x.scale, x.prefix_len), x)
    torch.testing.assert_close(casc, ref, rtol=0, atol=1e-5)  # float32 compute
    flat = _unpad(engines_ca.flat_attention(q, k, v, mask, x.scale), x)
    torch.testing.assert_close(flat, ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", ["decode", "mixed"])
def test_paged_cascade_reference_agrees_within_dtype_rounding(kind):
    x = build_inputs(small_case(kind))
    ref = exact_attention(x)
    stats = error_stats(cascade_reference(x), ref, x.cu_query_lens.tolist())
    assert stats["finite"] and stats["rel"] < 1e-2  # bf16 outputs
    assert stats["seq_rel_max"] >= stats["rel"] * 0.5
    out, lse = paged_partial_attention(
        x.query, x.key_cache, x.value_cache, x.cu_query_lens, x.seq_lens_t, x.block_table, x.scale, True
    )
    assert lse.shape == (x.num_q_heads, x.num_tokens)  # FlashAttention's [H, T]
    assert error_stats(out, ref)["rel"] < 1e-2


def test_error_stats_and_verdict():
    ref = torch.ones(4, 2, 3, dtype=torch.float64)
    s = error_stats(ref.float() * 1.01, ref, [0, 1, 4])
    assert s["rel"] == pytest.approx(0.01, rel=1e-5) and s["max_abs"] == pytest.approx(0.01, rel=1e-5)
    bad = ref.clone()
    bad[0, 0, 0] = float("nan")
    assert math.isnan(error_stats(bad, ref)["rel"]) and not error_stats(bad, ref)["finite"]
    assert krun.verdict(3e-3, 1e-3, 4.0)[0] == "ok"
    status, ratio, reason = krun.verdict(5e-3, 1e-3, 4.0)
    assert status == "mismatch" and ratio == pytest.approx(5.0) and "ratio 5" in reason
    assert krun.verdict(1e-7, 0.0, 4.0)[0] == "ok"  # eps guards a zero flat error
    assert krun.verdict(math.nan, 1e-3, 4.0)[0] == "mismatch"
    assert krun.verdict(1e-3, math.nan, 4.0)[0] == "error"


# --- injection ------------------------------------------------------------------------------------


def test_probe_misread_is_the_engines_transposed_layout_for_decode():
    lse = torch.randn(9, 8, dtype=torch.float64)  # [H, T], T = 8 decode tokens
    as_bhq = lse.t().unsqueeze(-1)  # [B, H, Q=1]
    expected = engines_ca.transpose_lse_layout(as_bhq)[:, :, 0].t()
    assert torch.equal(misread_lse(lse), expected)
    assert not torch.equal(misread_lse(lse), lse)


@pytest.mark.parametrize("heads", [(6, 2), (9, 3), (8, 1)])
def test_injected_lse_layout_breaks_decode_gqa(heads):
    x = build_inputs(small_case(num_q_heads=heads[0], num_kv_heads=heads[1]))
    ref = exact_attention(x)
    clean = error_stats(cascade_reference(x), ref)["rel"]
    flat = error_stats(paged_partial_attention(x.query, x.key_cache, x.value_cache, x.cu_query_lens,
                                               x.seq_lens_t, x.block_table, x.scale, True)[0], ref)["rel"]  # fmt: skip
    bad = error_stats(cascade_reference(x, inject="lse-layout"), ref)["rel"]
    assert krun.verdict(clean, flat, 4.0)[0] == "ok"
    assert krun.verdict(bad, flat, 4.0)[0] == "mismatch"
    assert bad > 0.05 and bad > 20 * clean


# --- run_case / run_one through a stand-in for vLLM's flash_attn module ----------------------------

# The one fake of vLLM's FlashAttention backend (tests/fake_vllm), loaded afresh for each test.
FAKE_FLASH_ATTN = FAKE_VLLM_ROOT / "vllm" / "v1" / "attention" / "backends" / "flash_attn.py"


@pytest.fixture
def fake_api():
    from cascade_repro.kernel.worker import load_api

    return load_api(str(FAKE_FLASH_ATTN))


@pytest.mark.parametrize("kind", ["decode", "mixed"])
@pytest.mark.parametrize("fa", [2, 3])
def test_run_case_through_the_stand_in(fake_api, kind, fa):
    case = small_case(kind, fa_version=fa, max_num_splits=32 if fa == 3 else 0)
    res = krun.run_case(fake_api, case, device="cpu")
    assert res.status == "ok", res.reason
    assert res.cascade["rel"] < 1e-2 and res.flat["rel"] < 1e-2 and res.inject_calls == 0
    calls = fake_api.module.CALLS
    kernels = [c for c in calls if "causal" in c]
    assert [c["causal"] for c in kernels] == [True, False, True]  # flat, prefix, suffix
    assert kernels[1]["rows"] == 1 and kernels[1]["max_seqlen_q"] == case.num_tokens
    assert kernels[1]["max_seqlen_k"] == case.prefix_len
    assert kernels[2]["max_seqlen_k"] == max(case.seq_lens) - case.prefix_len
    assert {c["num_splits"] for c in kernels} == {case.max_num_splits}
    schedules = [c["schedule"] for c in calls if "schedule" in c]
    if fa == 3:
        assert [s["causal"] for s in schedules] == [True, False, True]
        assert schedules[1]["batch_size"] == 1 and schedules[1]["max_seqlen_k"] == case.prefix_len
        assert all(s["num_splits"] == 32 and s["page_size"] == 16 for s in schedules)
    else:
        assert schedules == []


def test_run_case_with_injection_is_a_mismatch_and_restores_merge(fake_api):
    orig = fake_api.module.merge_attn_states
    res = krun.run_case(fake_api, small_case(), device="cpu", inject="lse-layout")
    assert res.status == "mismatch" and res.inject_calls == 1
    assert res.ratio > 4 and "cascade rel" in res.reason
    assert fake_api.module.merge_attn_states is orig
    assert krun.run_case(fake_api, small_case(), device="cpu").status == "ok"


def test_run_one_isolates_failures_and_skips_unsupported(fake_api):
    """What the worker process runs per case: a case that raises is an error row, an unsupported FA
    version a skipped one, and the next case runs as if nothing happened."""
    unsupported = {2: None, 3: "FA3 is only supported on devices with compute capability 9.x"}
    cases = [small_case(case_id="a"), small_case(case_id="b", fa_version=3, max_num_splits=0),
             small_case(case_id="c", fa_version=2, max_num_splits=32), small_case("mixed", case_id="d")]  # fmt: skip
    results = [krun.run_one(fake_api, c, inject=None, factor=krun.DEFAULT_FACTOR, eps=krun.DEFAULT_EPS,
                            device="cpu", num_sms=None, unsupported=unsupported) for c in cases]  # fmt: skip
    assert [r.status for r in results] == ["ok", "skipped", "error", "ok"]
    assert "compute capability" in results[1].reason and "num_splits > 1" in results[2].reason


# --- the worker process: crashes, lost CUDA contexts, hangs and the time limit ---------------------

# The fake again, with its faults keyed by the number of requests: 3 kills the process (as a segfault
# would), 4 hangs, 5 raises what PyTorch raises after an illegal memory access; FA3 is unsupported.
@pytest.fixture
def faulty_module(monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_FAULTS", "1")  # read where the file is loaded: in the worker process
    return str(FAKE_FLASH_ATTN)


def test_worker_isolates_crashes_and_hangs(faulty_module, fake_api):
    from cascade_repro.kernel import worker

    cases = [
        small_case(case_id="ok-1"),
        small_case(case_id="crash", num_seqs=3),
        small_case("mixed", case_id="ok-2"),
        small_case(case_id="hang", num_seqs=4),
        small_case(case_id="raises", num_seqs=5),
        small_case(case_id="fa3-unsupported", fa_version=3),
        small_case(case_id="ok-3", seed=7),
    ]
    seen = []
    env: dict = {}
    # Each case here takes under 0.5 s from its start to its result (worker start not counted), so the
    # hang is the only case near the 3 s limit, which it waits out once.
    results, env_back = worker.run_grid_isolated(
        cases, device="cpu", fake_module=faulty_module, case_timeout=3, env=env,
        on_result=lambda r, k, n: seen.append((r.case.case_id, k, n)),
    )  # fmt: skip
    assert env_back is env and env["vllm"] == "fake" and env["device"] == "cpu"
    by_id = {r.case.case_id: r for r in results}
    assert [r.case.case_id for r in results] == [c.case_id for c in cases]
    assert [r.status for r in results] == ["ok", "error", "ok", "error", "error", "skipped", "ok"]
    assert by_id["crash"].reason == "the worker process died (killed by SIGKILL) while running this case"
    assert by_id["hang"].reason == "timed out after 3 s (worker killed)"
    assert by_id["raises"].reason == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert "compute capability" in by_id["fa3-unsupported"].reason
    assert seen == [(c.case_id, k, len(cases)) for k, c in enumerate(cases)]
    # The worker's numbers are the in-process numbers.
    same = krun.run_case(fake_api, cases[0], device="cpu")
    assert by_id["ok-1"].cascade == same.cascade and by_id["ok-1"].ratio == same.ratio


def test_worker_time_limit_skips_the_rest(faulty_module):
    from cascade_repro.kernel import worker

    cases = [small_case(case_id="hang", num_seqs=4), small_case(case_id="ok")]
    results, _ = worker.run_grid_isolated(cases, device="cpu", fake_module=faulty_module, max_seconds=3)
    assert [r.status for r in results] == ["skipped", "skipped"]
    assert all("--max-seconds 3" in r.reason for r in results)


def test_worker_that_cannot_load_vllm_is_a_missing_requirement(tmp_path):
    from cascade_repro.kernel import worker

    with pytest.raises(krun.MissingRequirement, match="starting failed"):
        worker.run_grid_isolated([small_case()], device="cpu", fake_module=str(tmp_path / "absent.py"))
    with pytest.raises(UsageError, match="unknown --inject"):
        worker.run_grid_isolated([small_case()], device="cpu", inject="bogus")


def test_worker_stops_when_the_cuda_context_is_lost(faulty_module, tmp_path, monkeypatch):
    from dataclasses import asdict

    from cascade_repro.kernel import worker

    monkeypatch.setattr(worker, "cuda_usable", lambda device: False)
    cases = [small_case(case_id="raises", num_seqs=5), small_case(case_id="ok")]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"cases": [asdict(c) for c in cases], "index": [0, 1], "inject": None,
                                "factor": 4.0, "eps": 1e-6, "device": "cpu", "fake_module": faulty_module}))  # fmt: skip
    events = tmp_path / "events.jsonl"
    assert worker.worker_main(str(spec), str(events)) == worker.EXIT_CUDA_LOST
    evs = [json.loads(line) for line in events.read_text().splitlines()]
    assert [e["event"] for e in evs] == ["ready", "start", "result"]
    assert evs[2]["result"]["status"] == "error"


def test_cli_runs_through_the_worker_and_writes_three_files(faulty_module, tmp_path, monkeypatch):
    import functools

    from cascade_repro.kernel import worker

    cases = [small_case(case_id="a"), small_case(case_id="b", num_seqs=5), small_case("mixed", case_id="c")]
    monkeypatch.setattr(kgrid, "build_grid", lambda **kw: cases)
    monkeypatch.setattr(krun, "require_gpu_and_vllm", lambda: None)
    monkeypatch.setattr(
        worker, "run_grid_isolated",
        functools.partial(worker.run_grid_isolated, device="cpu", fake_module=faulty_module),
    )  # fmt: skip
    out = tmp_path / "out"
    res = invoke("--fa-version", "2", "--max-seconds", "300", "--out", str(out))
    assert res.exit_code == 1, res.output
    assert sorted(p.name for p in out.iterdir()) == ["junit.xml", "report.md", "summary.json"]
    data = json.loads((out / "summary.json").read_text())
    assert "partial" not in data and data["counts"] == {"ok": 2, "mismatch": 0, "error": 1, "skipped": 0}
    assert data["env"]["vllm"] == "fake" and data["settings"]["max_seconds"] == 300
    assert "--max-seconds 300" in data["command"]
    assert "[2/3] b: error (ratio —" in res.stderr and "illegal memory access" in res.stderr
    for name in ("report.md", "summary.json", "junit.xml"):
        assert f"wrote {out / name}" in res.stderr


def test_partial_summary_says_so():
    results = [krun.CaseResult(small_case(case_id="x"), "skipped", "FA3 unsupported")]
    data = kreport.summary(results, {"factor": 4.0}, {}, "t", 0.1, total=3)
    assert data["partial"] == {"done": 1, "total": 3}
    assert data["exit_code"] == 1 and "1 of 3" in data["exit_reason"]
    assert data["headline"].endswith("(in progress: 1 of 3 cases done)")
    assert "partial" not in kreport.summary(results, {"factor": 4.0}, {}, "t", 0.1, total=1)


def test_vllm_would_cascade_is_reported(fake_api):
    res = krun.run_case(fake_api, small_case(prefix_len=256), device="cpu", num_sms=132)
    assert res.vllm_would_cascade is True
    assert krun.run_case(fake_api, small_case(), device="cpu").vllm_would_cascade is None


# --- reports --------------------------------------------------------------------------------------


def _results(inject=None):
    from cascade_repro.kernel import worker

    cases = [small_case(case_id="decode-a"), small_case("mixed", case_id="mixed-b|x")]
    results, env = worker.run_grid_isolated(cases, device="cpu", fake_module=str(FAKE_FLASH_ATTN), inject=inject)
    settings = {"quick": False, "fa_versions": [2], "dtypes": ["bf16"], "inject": inject, "factor": 4.0,
                "eps": 1e-6, "seed": 0, "n_cases": 2}  # fmt: skip
    return kreport.summary(
        results, settings, env, "2026-11-30T00:00:00+00:00", 1.5, "cascade-repro kernel --fa-version 2"
    )


def test_markdown_report_rows():
    data = _results()
    md = kreport.MarkdownKernel().render(data)
    assert md.startswith("## cascade-repro kernel: no mismatch in 2 cases\n")
    header = ("| case | kind | seqs | prefix | heads q/kv | head dim | dtype | FA | splits | cascade rel | flat rel "
              "| ratio | cascade max abs | flat max abs | vLLM picks cascade | verdict |")  # fmt: skip
    assert header in md
    rows = [line for line in md.splitlines() if line.startswith("| decode-a ")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[:9] == ["decode-a", "decode", "8", "32", "6/2", "16", "bf16", "2", "0"]
    assert cells[-2:] == ["—", "ok"]  # no SM count on a CPU: vLLM's decision unknown
    c0 = data["cases"][0]
    assert cells[9] == f"{c0['cascade']['rel']:.2e}" and cells[11] == f"{c0['ratio']:.2f}"
    assert "| mixed-b\\|x |" in md  # the pipe is escaped inside the cell
    assert "| 2 | 0 | bf16 | decode | 1 | 0 |" in md  # group table
    assert "```bash\ncascade-repro kernel --fa-version 2\n```" in md
    assert "vllm: fake" in md


def test_reports_with_injection(tmp_path):
    data = _results(inject="lse-layout")
    assert data["exit_code"] == 1 and data["counts"]["mismatch"] == 2
    assert data["headline"] == "cascade-repro kernel: 2 mismatches in 2 cases (injected: lse-layout)"
    assert data["positive_control"] == {"decode_gqa_cases": 1, "decode_gqa_mismatches": 1, "all_caught": True}
    md = kreport.MarkdownKernel().render(data)
    assert (
        "| **mismatch** |" in md
        and "Positive control: 1/1 decode-GQA cases are mismatches (all caught)" in md
    )
    paths = kreport.write_reports(data, tmp_path / "out")
    assert sorted(p.name for p in paths) == ["junit.xml", "report.md", "summary.json"]
    back = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert back["exit_code"] == 1 and back["cases"][0]["inject_calls"] == 1
    assert kreport.MarkdownKernel().render(back) == md  # re-rendered from summary.json alone
    root = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    assert root.get("tests") == "2" and root.get("failures") == "2" and root.get("errors") == "0"
    fail = root.find("testsuite/testcase/failure")
    assert fail is not None and fail.get("type") == "mismatch" and "cascade: rel" in fail.text


def test_report_escapes_reasons_and_counts_errors():
    case = small_case(case_id="x")
    results = [krun.CaseResult(case, "error", "RuntimeError: <script>alert(1)</script> | bad\x1b[31m")]
    data = kreport.summary(results, {"factor": 4.0}, {}, "t", 0.1)
    md = kreport.MarkdownKernel().render(data)
    assert "<script>" not in md and "&lt;script>" in md and "\x1b" not in md
    assert data["exit_code"] == 1 and data["exit_reason"] == "1 error"
    xml = kreport.JunitKernel().render(data)
    assert ET.fromstring(xml.split("\n", 1)[1]).get("errors") == "1"
    assert kreport.summary([], {"factor": 4.0}, {}, "t", 0.0)["exit_reason"] == "no case ran"


# --- CLI --------------------------------------------------------------------------------------------


def invoke(*args: str):
    from cascade_repro.cli import kernel_cmd  # noqa: F401 - registers the command
    from cascade_repro.cli.app import app

    return CliRunner().invoke(app, ["kernel", *args], env={"COLUMNS": "250"})


@pytest.mark.skipif(torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None,
                    reason="CUDA and vLLM are both here")  # fmt: skip
def test_cli_without_cuda_or_vllm_is_one_line_exit_2():
    res = invoke("--quick")
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in res.output
    assert err.startswith("error: cascade-repro kernel needs a CUDA GPU and vLLM:")
    if not torch.cuda.is_available():
        assert "no CUDA GPU" in err
    if importlib.util.find_spec("vllm") is None:
        assert "vLLM is not installed" in err


def test_cli_dry_run_and_bad_options():
    res = invoke("--quick", "--dry-run")
    assert res.exit_code == 0, res.output
    assert "11 cases" in res.stdout and "decode-p8192-b256-h28x4-d128-s64-bf16-fa3-sp32" in res.stdout
    assert "mixed-p2048-b8-h9x3-d64-s512-fp16-fa3-sp32" in res.stdout
    res = invoke("--dry-run", "--fa-version", "2", "--dtype", "fp16")
    assert res.exit_code == 0 and "25 cases" in res.stdout
    for args, msg in ((["--fa-version", "4"], "--fa-version"), (["--dtype", "fp8"], "unknown dtype"),
                      (["--inject", "nope"], "unknown --inject"), (["--factor", "0"], "--factor"),
                      (["--max-seconds", "0"], "--max-seconds"), (["--case-timeout", "-1"], "--case-timeout")):  # fmt: skip
        res = invoke(*args)
        assert res.exit_code == 2 and msg in res.stderr, (args, res.output)


def test_cli_help_imports_no_torch():
    code = (
        "import sys; from cascade_repro.cli import kernel_cmd; from cascade_repro.cli.app import app\n"
        "try:\n    app(['kernel', '--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "--inject" in res.stdout


# --- the real kernels (GPU with vLLM) ---------------------------------------------------------------


def _gpu_cases():
    quick = build_grid(True)
    return [c for c in quick if c.kind == "decode" and c.num_seqs == 8] + [
        c for c in quick if c.kind == "mixed" and c.num_seqs == 8
    ]


@pytest.mark.parametrize("case", _gpu_cases(), ids=lambda c: c.case_id)
@pytest.mark.gpu
@pytest.mark.vllm
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")
def test_vllm_cascade_within_flat_and_injection_caught(case):
    api = krun.load_vllm()
    reason = api.unsupported_reason(case.fa_version)
    if reason:
        pytest.skip(reason)
    orig = api.module.merge_attn_states
    with torch.inference_mode():
        clean = krun.run_case(api, case, device="cuda")
        bad = krun.run_case(api, case, device="cuda", inject="lse-layout")
    assert clean.status == "ok", clean.reason
    assert bad.status == "mismatch" and bad.inject_calls == 1
    assert api.module.merge_attn_states is orig  # the injection is undone after the case


def test_worker_env_keeps_compiled_kernels_unless_the_user_set_a_cache_size(monkeypatch):
    from cascade_repro.kernel.worker import _child_env

    monkeypatch.delenv("CUDA_CACHE_MAXSIZE", raising=False)
    assert _child_env()["CUDA_CACHE_MAXSIZE"] == str(4 << 30)
    monkeypatch.setenv("CUDA_CACHE_MAXSIZE", "123")
    assert _child_env()["CUDA_CACHE_MAXSIZE"] == "123"


def test_execution_order_runs_fa3_first_and_groups_fa2_compilations():
    from cascade_repro.kernel.grid import build_grid
    from cascade_repro.kernel.session import execution_order

    cases = build_grid(quick=False, fa_versions=(2, 3), dtypes=("bf16", "fp16"))
    ordered = execution_order(cases)
    assert sorted(c.case_id for c in ordered) == sorted(c.case_id for c in cases)
    fas = [c.fa_version for c in ordered]
    assert fas == sorted(fas, key=lambda v: v == 2)  # every FA3 case before any FA2 case
    groups = [(c.dtype, c.head_dim) for c in ordered if c.fa_version == 2]
    changes = sum(1 for a, b in zip(groups, groups[1:], strict=False) if a != b)
    assert changes == len(set(groups)) - 1  # each FA2 configuration's cases back to back
