"""vllm_surface's release table, the probe and the cascade rule's port, against facts recorded from vLLM's source.

``tests/data/vllm-surface-<version>.json`` were written by ``scripts/old-vllm/record_surface.py``
from the released wheels (read with ``ast``, nothing imported), so these tests need neither vLLM
nor CUDA.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cascade_repro import vllm_surface
from cascade_repro.vllm_surface import cascade_rule, probe

DATA = Path(__file__).parents[1] / "data"
RECORDED = sorted(DATA.glob("vllm-surface-*.json"))


def facts(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_every_known_release_has_recorded_facts():
    recorded = {facts(p)["version"] for p in RECORDED}
    assert (
        {r.version for r in vllm_surface.RELEASES}
        == recorded
        == {"0.10.2", "0.11.0", "0.26.0", "0.31.0", "0.33.0", "0.34.0"}
    )


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_release_entry_matches_its_source(path):
    f = facts(path)
    rel, exact = vllm_surface.release_for(f["version"])
    assert exact and rel.version == f["version"]
    assert f["worker_wrapper_base_modules"] == [rel.worker_base_module]
    assert rel.worker_base_module in vllm_surface.WORKER_BASE_MODULES  # the probe hooks it
    assert rel.attention_via == ("attention_config" if "attention_config" in f["engine_args"] else "env")
    if rel.attention_via == "env":  # the engine's legacy path sets these two
        assert {"VLLM_ATTENTION_BACKEND", "VLLM_FLASH_ATTN_VERSION"} <= set(f["env_vars"])
    modules = f["modules"]
    runners = {
        "v1": "vllm.v1.worker.gpu_model_runner" in modules,
        "v2": "vllm.v1.worker.gpu.model_runner" in modules,
    }
    assert rel.model_runners == "+".join(k for k, has in runners.items() if has)
    # The variable picks the runner only where both exist; 0.34.0's platform refuses it unless it is 1.
    assert ("VLLM_USE_V2_MODEL_RUNNER" in f["env_vars"]) == (rel.model_runners == "v1+v2")
    assert ("VLLM_USE_V2_MODEL_RUNNER" in f["env_vars_validated"]) == (rel.model_runners == "v2")
    assert (rel.runner_env == "0") == (rel.model_runners == "v1+v2")
    params = f["flash_attn"]["use_cascade_attention_params"]
    assert rel.rule_takes_dcp == (None if params is None else "dcp_world_size" in params)
    assert rel.has_cascade == (vllm_surface.cascade_status(rel.version) != "removed")
    assert "disable_cascade_attn" in f["engine_args"]  # kept without effect after cascade went
    assert rel.reset_returns_bool == f["v1_reset_prefix_cache_returns"]


CASCADE_RECORDED = [p for p in RECORDED if facts(p)["flash_attn"]["use_cascade_attention_params"]]


@pytest.mark.parametrize("path", CASCADE_RECORDED, ids=lambda p: p.stem)
def test_probe_patch_points_exist_with_the_shapes_it_assumes(path):
    fa = facts(path)["flash_attn"]
    assert fa["module"] == vllm_surface.FLASH_ATTN_MODULE == probe.FLASH_ATTN_MODULE
    # wrap_decision reads common_prefix_len and query_lens as the first two positional arguments
    # (or by keyword, which is how the model runner passes them).
    assert fa["use_cascade_attention_params"][:2] == ["common_prefix_len", "query_lens"]
    assert {"common_prefix_len", "query_lens"} <= set(facts(path)["runner_use_cascade_call_kwargs"])
    # wrap_merge replaces the LSEs by position in cascade_attention's call.
    assert fa["merge_call_args"][probe.PREFIX_LSE_POS] == "prefix_lse"
    assert fa["merge_call_args"][probe.SUFFIX_LSE_POS] == "suffix_lse"
    # wrap_cascade records fa_version from the keyword FlashAttentionImpl passes.
    assert "fa_version" in fa["cascade_call_kwargs"]
    assert fa["impl_sets_vllm_flash_attn_version"] and fa["builder_has_use_cascade_attention"]


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_engine_calls_exist(path):
    f = facts(path)
    assert {"timeout", "args"} <= set(f["llm_methods"]["collective_rpc"])
    assert "reset_prefix_cache" in f["llm_methods"]
    assert {"ignore_eos", "logprobs", "max_tokens", "seed", "temperature"} <= set(f["sampling_params_fields"])
    # Every release takes detokenize; the engine asks for detokenize=False only where flat logprobs
    # exist too (0.11.1 on: 0.26.0 here, not 0.10.2 or 0.11.0), the releases whose output path was read for it.
    fields = set(f["sampling_params_fields"])
    assert vllm_surface.DETOKENIZE in fields
    old = f["version"] in ("0.10.2", "0.11.0")
    assert (vllm_surface.FLAT_LOGPROBS in fields) == (not old)
    want = {} if old else {vllm_surface.FLAT_LOGPROBS: True, vllm_surface.DETOKENIZE: False}
    assert vllm_surface.output_asks(fields) == want
    assert vllm_surface.output_asks({vllm_surface.FLAT_LOGPROBS}) == {vllm_surface.FLAT_LOGPROBS: True}


@pytest.mark.parametrize("path", CASCADE_RECORDED, ids=lambda p: p.stem)
def test_explain_port_decides_as_the_recorded_rule(path):
    fa = facts(path)["flash_attn"]
    ns: dict = {"np": np, "cdiv": cascade_rule.cdiv}
    exec(fa["use_cascade_attention_source"], ns)  # the released function's own text
    theirs = ns["use_cascade_attention"]
    grid = 0
    for prefix in (0, 255, 256, 1584, 4096):
        for n in (1, 7, 8, 44, 45, 64, 200):
            for q, kv in ((9, 3), (32, 8), (16, 16), (64, 1)):
                for qlen in (1, 3):
                    for sms in (108, 132):
                        args = dict(
                            common_prefix_len=prefix, query_lens=np.full(n, qlen, dtype=np.int32),
                            num_query_heads=q, num_kv_heads=kv, use_alibi=False, use_sliding_window=False,
                            use_local_attention=False, num_sms=sms, dcp_world_size=1,
                        )  # fmt: skip
                        assert cascade_rule.call_rule(theirs, **args) == cascade_rule.use_cascade_attention(
                            **args
                        ), args
                        grid += 1
    assert grid == 5 * 7 * 4 * 2 * 2


@pytest.mark.parametrize(
    ("version", "want", "exact"),
    [("0.10.2", "0.10.2", True), ("0.10.3", "0.10.2", False), ("0.11.0", "0.11.0", True),
     ("0.11.1", "0.11.0", False), ("0.26.0", "0.26.0", True),
     ("0.26.0+cu130", "0.26.0", True), ("0.31.1", "0.31.0", False), ("0.32.0", "0.31.0", False),
     ("0.34.0", "0.34.0", True), ("0.35.1", "0.34.0", False), ("0.9.0", "0.10.2", False),
     ("garbage", "0.34.0", False)],
)  # fmt: skip
def test_release_for(version, want, exact):
    rel, is_exact = vllm_surface.release_for(version)
    assert (rel.version, is_exact) == (want, exact)


@pytest.mark.parametrize(
    ("version", "status", "bug"),
    [("0.7.0", "default on", True), ("0.10.2", "default on", True), ("0.11.0", "default on", True),
     ("0.11.1", "default on", False), ("0.17.9", "default on", False), ("0.18.0", "opt-in", False),
     ("0.26.0", "opt-in", False), ("0.31.0", "opt-in", False), ("0.32.0", "removed", False),
     ("0.6.6", "default on", None), ("dev", "unknown", None)],
)  # fmt: skip
def test_cascade_status_and_fa2_bug(version, status, bug):
    assert vllm_surface.cascade_status(version) == status
    assert vllm_surface.has_fa2_lse_bug(version) is bug


def test_version_tuple():
    assert vllm_surface.version_tuple("0.10.2rc1+cu128") == (0, 10, 2)
    assert vllm_surface.version_tuple("v0.26.0") == (0, 26, 0)
    assert vllm_surface.version_tuple("unknown") is None
