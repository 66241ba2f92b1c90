"""vLLM's use_cascade_attention rule, reimplemented (vllm_surface/cascade_rule.py), the predictions
per cell (plan/predict.py, run/predictions.py) and the `explain` command (explain.py).

Hand-worked cases follow vLLM 0.26.0's flash_attn.py line by line. For a decode-only step of a GQA
model with at most 128 requests and no more query heads than SMs, the cost model reduces to

    cascade_time        = cdiv(q_heads * 1, sms) * tiles = tiles
    flash_decoding_time = cdiv(n * kv_heads * 1 * tiles, sms)

so cascade wins exactly when n * kv_heads > sms: from n = sms // kv_heads + 1 requests.
The embedded model (9 query heads, 3 KV heads) therefore switches at 45 requests on 132 SMs and
at 37 on 108 SMs (TP 1).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.cli import CliRunner

import cascade_repro.cli.explain_cmd  # noqa: F401 - registers the command until cli/__init__ imports it
from cascade_repro import explain
from cascade_repro.cli import app
from cascade_repro.errors import UsageError
from cascade_repro.explain import explain_spec, threshold_lines
from cascade_repro.plan.matrix import MatrixSpec
from cascade_repro.plan.predict import predict
from cascade_repro.run.predictions import predict_cells, predictions_for
from cascade_repro.rundir.manifest import Manifest
from cascade_repro.vllm_surface import ModelAttention
from cascade_repro.vllm_surface.cascade_rule import (
    GPU_SMS,
    cdiv,
    decide,
    decode_threshold,
    default_fa_for,
    gpu_sms,
    resolve_sms,
    use_cascade_attention,
    vllm_rule,
)

EMBEDDED = {"num_attention_heads": 9, "num_key_value_heads": 3, "model_type": "llama"}
PREFIX = 1584  # the ko system prompt's shared prefix with the embedded tokenizer, block-aligned (1597 -> 1584)


def rule(prefix=PREFIX, qlens=(1,) * 8, q=9, kv=3, alibi=False, sw=False, local=False, sms=132, dcp=1) -> bool:
    return use_cascade_attention(prefix, np.array(qlens, dtype=np.int32), q, kv, alibi, sw, local, sms, dcp)


# --- the rule, by hand -------------------------------------------------------------------------------


def test_cdiv():
    assert [cdiv(a, 128) for a in (1, 127, 128, 129, 256, 1584)] == [1, 1, 1, 2, 2, 13]


def test_hard_conditions():
    prefill = (5,) * 8
    assert rule(255, prefill) is False  # common_prefix_len < 256
    assert rule(256, prefill) is True
    assert rule(PREFIX, prefill, alibi=True) is False
    assert rule(PREFIX, prefill, sw=True) is False
    assert rule(PREFIX, prefill, local=True) is False
    assert rule(PREFIX, (5,) * 7) is False  # num_reqs < 8
    assert rule(PREFIX, prefill, dcp=2) is False  # dcp_world_size > 1


def test_no_flash_decoding_means_cascade():
    # Prefill tokens in the step: np.all(query_lens == 1) is False.
    assert rule(qlens=(1,) * 7 + (2,)) is True
    # MHA (1 query head per KV head): flash-decoding is off even for pure decode steps.
    assert rule(qlens=(1,) * 8, q=32, kv=32) is True


def test_cost_model_embedded_model_132_sms():
    # tiles = cdiv(1584, 128) = 13. n = 44: cascade 13, flash-decoding cdiv(44*3*13=1716, 132) = 13 -> no.
    assert rule(qlens=(1,) * 44) is False
    # n = 45: flash-decoding cdiv(1755, 132) = 14 > 13 -> cascade.
    assert rule(qlens=(1,) * 45) is True
    d = decide(PREFIX, [1] * 45, 9, 3, num_sms=132)
    assert (d.fires, d.cascade_time, d.flash_decoding_time) == (True, 13, 14)
    assert decide(PREFIX, [1] * 44, 9, 3, num_sms=132).reason == "cost model: cascade 13 >= flash-decoding 13"


def test_cost_model_embedded_model_108_sms():
    # n = 36: cdiv(36*3*13=1404, 108) = 13 -> no; n = 37: cdiv(1443, 108) = 14 -> cascade.
    assert rule(qlens=(1,) * 36, sms=108) is False
    assert rule(qlens=(1,) * 37, sms=108) is True


def test_cost_model_past_one_q_tile_and_more_waves():
    # 129 requests: cascade_ctas = 9 * cdiv(129, 128) = 18 -> 1 wave -> 13; flash-decoding cdiv(129*3*13, 132) = 39.
    assert decide(PREFIX, [1] * 129, 9, 3, num_sms=132).flash_decoding_time == 39
    # 64 query / 8 KV heads, prefix 2048 (16 tiles): n = 16 -> cdiv(2048, 132) = 16, not < 16; n = 17 -> 17.
    assert rule(2048, (1,) * 16, q=64, kv=8) is False
    assert rule(2048, (1,) * 17, q=64, kv=8) is True
    # 256 query heads on 108 SMs: cascade_ctas = 256 -> 3 waves; 8 requests x 8 KV heads x 2 tiles = 128 -> 2.
    d = decide(256, [1] * 8, 256, 8, num_sms=108)
    assert (d.cascade_time, d.flash_decoding_time, d.fires) == (cdiv(256, 108) * 2, cdiv(8 * 8 * 2, 108), False)


def test_decode_thresholds():
    assert decode_threshold(PREFIX, 9, 3, 132) == (45, True)
    assert decode_threshold(PREFIX, 9, 3, 108) == (37, True)
    assert decode_threshold(PREFIX, 3, 1, 132) == (133, True)  # TP 3: 3 query / 1 KV head per GPU
    assert decode_threshold(2048, 64, 8, 132) == (17, True)
    assert decode_threshold(PREFIX, 32, 32, 132) == (8, True)  # MHA: the 8-request minimum
    assert decode_threshold(255, 9, 3, 132) == (None, True)
    assert decode_threshold(PREFIX, 9, 3, 132, max_batch=44) == (None, True)
    # The closed form from the module docstring (query heads <= SMs), over GPUs of the table.
    for sms in set(GPU_SMS.values()):
        for kv in (1, 2, 3, 4, 8):
            assert decode_threshold(PREFIX, 2 * kv, kv, sms)[0] == max(8, sms // kv + 1), (sms, kv)
    # More query heads than SMs: 64 heads on an L4's 58 SMs take 2 waves, so cascade_time = 2 * 13 and
    # flash-decoding must exceed 26: cdiv(n * 8 * 13, 58) > 26 <=> n * 8 > 116 <=> n >= 15.
    assert decode_threshold(PREFIX, 64, 8, 58) == (15, True)


def test_decide_agrees_with_the_port_on_a_grid():
    for prefix in (0, 255, 256, 1000, 4096):
        for q, kv in ((9, 3), (32, 8), (8, 8), (64, 1)):
            for n in (1, 7, 8, 45, 128, 129, 500):
                for qlens in (np.ones(n, dtype=np.int32), np.full(n, 3, dtype=np.int32)):
                    for sms in (58, 108, 132):
                        for flags in ((False, False, False), (True, False, False), (False, True, False)):
                            args = (prefix, qlens, q, kv, *flags, sms, 1)
                            assert decide(*args).fires == use_cascade_attention(*args)


def test_vllm_function_agrees_over_a_grid():
    pytest.importorskip("vllm")
    fn, version = vllm_rule()
    if fn is None:
        pytest.skip(f"vLLM's flash_attn backend does not import here: {version}")
    for prefix in (0, 255, 256, 512, 1584, 4096):
        for q, kv in ((9, 3), (3, 1), (32, 8), (8, 8), (64, 8), (128, 1)):
            for n in (1, 7, 8, 9, 16, 36, 37, 44, 45, 64, 128, 129, 256, 1024):
                for qlens in (np.ones(n, dtype=np.int32), np.r_[np.ones(n - 1), [4]].astype(np.int32)):
                    for sms in (58, 108, 114, 132, 142):
                        for alibi, sw, local in ((False, False, False), (True, False, False), (False, True, False),
                                                 (False, False, True)):  # fmt: skip
                            for dcp in (1, 2):
                                kw = dict(
                                    common_prefix_len=prefix, query_lens=qlens, num_query_heads=q, num_kv_heads=kv,
                                    use_alibi=alibi, use_sliding_window=sw, use_local_attention=local,
                                    num_sms=sms, dcp_world_size=dcp,
                                )  # fmt: skip
                                assert bool(fn(**kw)) == use_cascade_attention(**kw), kw


# --- GPUs ---------------------------------------------------------------------------------------------


def test_gpu_table_and_names():
    assert GPU_SMS == {"H200": 132, "H100 SXM": 132, "H100 PCIe": 114, "A100": 108, "L40S": 142, "L4": 58,
                       "A10": 72, "RTX 4090": 128}  # fmt: skip
    assert gpu_sms("H200") == gpu_sms("h100") == gpu_sms("NVIDIA H100 SXM") == 132
    assert gpu_sms("h100-pcie") == 114 and gpu_sms("rtx4090") == 128 and gpu_sms("4090") == 128
    assert gpu_sms("l4") == 58 and gpu_sms("L40S") == 142
    with pytest.raises(UsageError, match="unknown GPU 'B300'"):
        gpu_sms("B300")


def test_resolve_sms_order():
    assert resolve_sms("A100", 100) == (100, "--sm-count 100")
    assert resolve_sms("A100") == (108, "--gpu A100 (table)")
    with pytest.raises(UsageError):
        resolve_sms(None, 0)


# --- model configs --------------------------------------------------------------------------------------


def test_model_attention_from_configs():
    a = ModelAttention.from_config(EMBEDDED)
    assert (a.num_attention_heads, a.num_kv_heads, a.notes) == (9, 3, ())
    assert a.per_gpu(1) == (9, 3) and a.per_gpu(3) == (3, 1) and a.per_gpu(9) == (1, 1)
    assert ModelAttention.from_config({"num_attention_heads": 8}).num_kv_heads == 8
    qwen = {"num_attention_heads": 28, "num_key_value_heads": 4, "sliding_window": 131072, "use_sliding_window": False}
    assert not ModelAttention.from_config(qwen).use_sliding_window
    assert ModelAttention.from_config({"num_attention_heads": 32, "num_key_value_heads": 8, "sliding_window": 4096}).use_sliding_window
    hybrid = {"num_attention_heads": 8, "num_key_value_heads": 4, "sliding_window": 512,
              "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}  # fmt: skip
    h = ModelAttention.from_config(hybrid)
    assert not h.use_sliding_window and "sliding window on 5/6 layers" in h.notes[0]
    assert ModelAttention.from_config({"num_attention_heads": 16, "architectures": ["BloomForCausalLM"]}).use_alibi
    assert ModelAttention.from_config({"num_attention_heads": 16, "attn_config": {"alibi": True}}).use_alibi
    assert ModelAttention.from_config({"num_attention_heads": 71, "multi_query": True}).num_kv_heads == 1
    assert ModelAttention.from_config({"num_attention_heads": 40, "attention_chunk_size": 8192}).use_local_attention
    nested = {"architectures": ["X"], "text_config": {"num_attention_heads": 16, "num_key_value_heads": 8}}
    assert ModelAttention.from_config(nested).num_kv_heads == 8
    assert ModelAttention.from_config({"num_attention_heads": 16, "kv_lora_rank": 512}).use_mla
    with pytest.raises(UsageError):
        ModelAttention.from_config({"hidden_size": 8})


# --- cells ----------------------------------------------------------------------------------------------


def _cells(*specs):
    return [{"cell_id": f"tp{tp}-b{b}-{arm}", "tp": tp, "batch": b, "arm": arm, "backend": be} for tp, b, arm, be in specs]


def test_predict_vllm_cells():
    a = ModelAttention.from_config(EMBEDDED)
    cells = _cells(
        (1, 1, "cascade", "FLASH_ATTN"),
        (1, 8, "cascade", "FLASH_ATTN"),
        (1, 45, "cascade", "FLASH_ATTN"),
        (1, 45, "flat", "FLASH_ATTN"),
        (3, 64, "cascade", "FLASH_ATTN"),
        (1, 64, "cascade", "FLASHINFER"),
    )
    preds, thresholds = predict(cells, a, shared_prefix_tokens=1597, num_sms=132)
    got = {p.cell_id: (p.prefill, p.decode, p.decode_from_batch) for p in preds}
    assert got == {
        "tp1-b1-cascade": (False, False, 45),
        "tp1-b8-cascade": (True, False, 45),
        "tp1-b45-cascade": (True, True, 45),
        "tp1-b45-flat": (False, False, 45),
        "tp3-b64-cascade": (True, False, 133),
        "tp1-b64-cascade": (False, False, 45),
    }
    assert preds[0].prefix_tokens == 1584
    assert "FLASHINFER never picks cascade" in preds[-1].decode_reason
    assert thresholds[1]["decode_from_batch"] == 45 and thresholds[3] == {
        "q_heads": 3, "kv_heads": 1, "decode_from_batch": 133, "monotone": True
    }  # fmt: skip
    # Unknown SM count: the decode cost model cannot be evaluated, the hard conditions still can.
    preds, _ = predict(cells[:3], a, shared_prefix_tokens=1597, num_sms=None)
    assert [(p.prefill, p.decode) for p in preds] == [(False, False), (True, None), (True, None)]
    # Suffixes of exactly one token make even the first step a decode-shaped step.
    preds, _ = predict(cells[1:2], a, shared_prefix_tokens=1597, suffix_lens=[1], num_sms=132)
    assert preds[0].prefill is False
    # Block alignment: 271 shared tokens -> 256 with block 16, 0 with block 512.
    assert predict(cells[1:2], a, shared_prefix_tokens=271, num_sms=132)[0][0].prefill is True
    assert predict(cells[1:2], a, shared_prefix_tokens=271, num_sms=132, block_size=512)[0][0].prefill is False


def test_predict_hf_is_hard_conditions_only():
    a = ModelAttention.from_config(EMBEDDED)
    cells = _cells((1, 1, "cascade", "FLASH_ATTN"), (1, 8, "cascade", "FLASH_ATTN"), (1, 8, "flat", "FLASH_ATTN"))
    preds, thresholds = predict(cells, a, engine="hf", shared_prefix_tokens=1597, num_sms=None)
    assert [(p.prefill, p.decode, p.decode_from_batch) for p in preds] == [
        (False, False, 8),
        (True, True, 8),
        (False, False, 8),
    ]
    preds, _ = predict(cells, a, engine="hf", shared_prefix_tokens=200, num_sms=None)
    assert [(p.prefill, p.decode_from_batch) for p in preds] == [(False, None)] * 3


def _model_dir(tmp_path: Path, cfg: dict = EMBEDDED) -> Path:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _run(model: Path, engine: str = "vllm", env: dict | None = None) -> dict:
    spec = MatrixSpec(engine=engine, model=str(model), batch=[8, 64])
    from cascade_repro.plan.matrix import plan

    return {
        "spec": spec.to_dict(),
        "model_path": str(model),
        "prompt_set": {"shared_prefix_tokens": 1597, "prompt_tokens_mean": 1700.0},
        "env": env if env is not None else {"gpu_name": "NVIDIA H200", "sm_count": "132"},
        "plan": {"cells": [c.to_json() for c in plan(spec).cells]},
    }


def test_predict_cells_and_predictions_for(tmp_path: Path):
    run = _run(_model_dir(tmp_path))
    expected = {
        # The cost model's numbers (13 prefix tiles): 1 wave x 13 tiles vs cdiv(B * 3 * 13, 132).
        "tp1-b8-cascade": {"prefill": True, "decode": False, "decode_from_batch": 45,
                           "decode_cost": {"cascade": 13, "flash_decoding": 3}},
        "tp1-b8-flat": {"prefill": False, "decode": False, "decode_from_batch": 45},
        "tp1-b64-cascade": {"prefill": True, "decode": True, "decode_from_batch": 45,
                            "decode_cost": {"cascade": 13, "flash_decoding": 19}},
        "tp1-b64-flat": {"prefill": False, "decode": False, "decode_from_batch": 45},
    }
    assert predict_cells(Manifest.from_json(run)) == expected
    stored = predictions_for(Manifest.from_json(run))
    assert stored["cells"] == expected and stored["num_sms"] == 132
    # SM count from the GPU name when torch recorded none; from the A100 table entry.
    assert predict_cells(Manifest.from_json({**run, "env": {"gpu_name": "NVIDIA A100-SXM4-80GB"}}))["tp1-b64-cascade"]["decode_from_batch"] == 37
    assert predict_cells(Manifest.from_json({**run, "env": {}}))["tp1-b64-cascade"]["decode"] is None
    # hf_overrides reshape the heads vLLM sees: 1 KV head -> 133 requests on 132 SMs.
    run["spec"]["hf_overrides"] = {"num_key_value_heads": 1}
    assert predict_cells(Manifest.from_json(run))["tp1-b64-cascade"]["decode_from_batch"] == 133
    hf = _run(_model_dir(tmp_path), engine="hf", env={})
    assert predict_cells(Manifest.from_json(hf))["tp1-b8-cascade"] == {"prefill": True, "decode": True, "decode_from_batch": 8}
    assert predictions_for(Manifest.from_json({"spec": {}})) == {}  # never raises
    # With the longest prompt and max_tokens recorded, FA2 cells say whether decode steps split.
    run["spec"]["hf_overrides"] = {}
    (Path(run["model_path"]) / "config.json").write_text(json.dumps({**EMBEDDED, "hidden_size": 576}))
    long = {**run, "prompt_set": {**run["prompt_set"], "prompt_tokens_max": 1800}}
    long["spec"] = {**run["spec"], "max_tokens": 1024}
    assert predict_cells(Manifest.from_json(long))["tp1-b64-cascade"]["fa2_split"] is False  # FA3, vLLM's default on an H200
    long["env"] = {"gpu_name": "NVIDIA A100-SXM4-80GB"}  # FA2 by default: 64 x 3 >= 0.8 x 2 x 108
    assert predict_cells(Manifest.from_json(long))["tp1-b64-cascade"] == {"prefill": True, "decode": True, "decode_from_batch": 37,
                                                       "fa2_split": False,  # 108 SMs: cdiv(64 * 3 * 13, 108)
                                                       "decode_cost": {"cascade": 13, "flash_decoding": 24}}  # fmt: skip


def test_explain_spec_and_threshold_lines(tmp_path: Path):
    spec = MatrixSpec(engine="vllm", model=str(_model_dir(tmp_path)), tp=[1, 3], batch=[8, 45])
    ex = explain_spec(spec, gpu="H200", prefix_tokens=1597, prefer_vllm=False)
    assert ex.prefix_tokens == 1584 and ex.num_sms == 132
    assert threshold_lines(ex) == [
        "TP 1 (9 query / 3 KV heads per GPU): decode steps choose cascade from ≈ 45 concurrent requests at TP 1 on 132 SMs",
        "TP 3 (3 query / 1 KV heads per GPU): decode steps choose cascade from ≈ 133 concurrent requests at TP 3 on 132 SMs",
    ]
    ex = explain_spec(spec, sm_count=108, prefix_tokens=1597, prefer_vllm=False)
    assert ex.thresholds[1]["decode_from_batch"] == 37
    short = explain_spec(spec, gpu="H200", prefix_tokens=200, prefer_vllm=False)
    assert "never choose cascade (shared prefix 192 < 256 tokens)" in threshold_lines(short)[0]
    with pytest.raises(UsageError):
        explain_spec(spec, gpu="H200", prefix_tokens=-1)


# --- the command ----------------------------------------------------------------------------------------


def test_explain_command(tmp_path: Path):
    model = str(_model_dir(tmp_path))
    runner = CliRunner()
    args = ["explain", "--model", model, "--gpu", "H200", "--prefix-tokens", "1597", "--batch", "8,45"]
    r = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "≈ 45 concurrent requests at TP 1 on 132 SMs" in r.output
    assert "2 flat cells: cascade disabled, never fires" in r.output
    r = runner.invoke(app, [*args, "--json", "--sm-count", "108"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["thresholds"]["1"]["decode_from_batch"] == 37
    assert {c["cell_id"]: c["decode"] for c in data["cells"]} == {
        "tp1-b8-cascade": False, "tp1-b8-flat": False, "tp1-b45-cascade": True, "tp1-b45-flat": False
    }  # fmt: skip
    r = runner.invoke(app, ["explain", "--model", model, "--gpu", "B300", "--prefix-tokens", "1597"])
    assert r.exit_code == 2 and "unknown GPU 'B300'" in r.output
    r = runner.invoke(app, ["explain", "--model", model, "--engine", "hf", "--prefix-tokens", "1597", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["thresholds"]["1"]["decode_from_batch"] == 8


# ---------------------------------------------------------------------------------------------
# FA2's split-KV band per cell (splitkv.py)
# ---------------------------------------------------------------------------------------------


def _band_cells(batches, fa=2, tp=1):
    return [
        {"cell_id": f"tp{tp}-b{b}-cascade", "tp": tp, "batch": b, "arm": "cascade", "backend": "FLASH_ATTN",
         "fa_version": fa}
        for b in batches
    ]  # fmt: skip


def test_fa2_split_per_cell_marks_the_band():
    att = ModelAttention(9, 3, head_dim=64)  # the embedded SmolLM2-135M
    preds, thr = predict(
        _band_cells([32, 48, 56, 64, 96]), att, shared_prefix_tokens=1597, suffix_lens=[150, 202],
        num_sms=132, max_tokens=1024,
    )  # fmt: skip
    got = {p.batch: p.fa2_split for p in preds}
    # 32: decode steps do not choose cascade; 48-64 split (3, 3 and 5 splits at 1226 own tokens);
    # 96 x 3 KV heads fill >= 80% of 2 x 132 SMs: one split.
    assert got == {32: False, 48: True, 56: True, 64: True, 96: False}
    why = {p.batch: p.fa2_split_reason for p in preds}
    assert why[48] == "3 KV splits once a request's own part passes 512 tokens (reaches 1226)"
    assert why[64] == "5 KV splits once a request's own part passes 768 tokens (reaches 1226)"
    assert why[32] == "decode steps do not choose cascade"
    assert thr[1]["fa2_band"] == "45-70" and thr[1]["fa2_band_suffix"] == 1226
    assert preds[1].summary()["fa2_split"] is True


def test_fa2_split_short_outputs_and_fa3_and_tp():
    att = ModelAttention(9, 3, head_dim=64)
    short, thr = predict(_band_cells([48]), att, shared_prefix_tokens=1597, suffix_lens=[100], num_sms=132,
                         max_tokens=64)  # fmt: skip
    assert short[0].fa2_split is False and short[0].fa2_split_reason == "1 split up to 164 own tokens (splits from 513)"
    assert thr[1]["fa2_band"] == "none"
    fa3, _ = predict(_band_cells([48], fa=3), att, shared_prefix_tokens=1597, suffix_lens=[100], num_sms=132,
                     max_tokens=1024)  # fmt: skip
    assert fa3[0].fa2_split is False and "FA3" in fa3[0].fa2_split_reason
    # Default FA version on an H200 is FA3; unknown GPU: predicted as if FA2 ran.
    on_h200, _ = predict(_band_cells([48], fa=None), att, shared_prefix_tokens=1597, suffix_lens=[100],
                         num_sms=132, max_tokens=1024, default_fa=default_fa_for("NVIDIA H200"))  # fmt: skip
    assert on_h200[0].fa2_split is False
    assert default_fa_for("NVIDIA A100-SXM4-80GB") is None
    # TP 3: one KV head per GPU, 3 query heads: decode steps never pick cascade at 48 requests.
    tp3, thr3 = predict(_band_cells([48], tp=3), att, shared_prefix_tokens=1597, suffix_lens=[100],
                        num_sms=132, max_tokens=1024)  # fmt: skip
    assert tp3[0].fa2_split is False and thr3[3]["fa2_band"] == "133-211"
    # Without a head dim, an SM count or max_tokens nothing is claimed.
    none, thr0 = predict(_band_cells([48]), ModelAttention(9, 3), shared_prefix_tokens=1597, suffix_lens=[100],
                         num_sms=132, max_tokens=1024)  # fmt: skip
    assert none[0].fa2_split is None and "fa2_band" not in thr0[1]


def test_head_dim_from_config():
    assert ModelAttention.from_config({"num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}).head_dim == 64
    assert ModelAttention.from_config({"num_attention_heads": 8, "head_dim": 128, "hidden_size": 4096}).head_dim == 128
    assert ModelAttention.from_config({"num_attention_heads": 7, "hidden_size": 100}).head_dim is None


def test_fa2_band_per_tp_moves_with_kv_heads_per_gpu():
    # 32 query / 8 KV heads, head dim 128 on an H200: TP 2 halves the KV heads per GPU and doubles the band.
    att = ModelAttention(32, 8, head_dim=128)
    cells = _band_cells([24], tp=1) + _band_cells([40], tp=2)
    preds, thr = predict(cells, att, shared_prefix_tokens=1597, suffix_lens=[100], num_sms=132, max_tokens=1948)
    assert (thr[1]["kv_heads"], thr[1]["fa2_band"]) == (8, "17-26")
    assert (thr[2]["kv_heads"], thr[2]["fa2_band"]) == (4, "34-52")
    assert [p.fa2_split for p in preds] == [True, True]
    ex = explain.Explanation("vllm", "m", att, 132, "t", 16, 1597, 1584, 1, "r", preds, thr)
    lines = threshold_lines(ex)
    assert lines[1].startswith("TP 1: with FA2, decode steps of 17-26 concurrent requests run cascade")
    assert lines[3].startswith("TP 2: with FA2, decode steps of 34-52 concurrent requests run cascade")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--block-size", "0"], "error: --block-size must be positive, got 0"),
        (["--hf-overrides", '{"num_key_value_heads": "x"}'],
         "error: --hf-overrides num_key_value_heads must be a positive integer, got 'x'"),
        (["--hf-overrides", '{"num_kv_heads": 0}'], "error: --hf-overrides num_kv_heads must be a positive integer, got 0"),
    ],
)  # fmt: skip
def test_explain_refuses_values_it_cannot_predict_with(args, message):
    """A zero block size divided by zero; a KV head count it could not read fell back to the query
    heads, predicting for another model."""
    res = CliRunner().invoke(app, ["explain", "--gpu", "H200", *args])
    assert res.exit_code == 2 and res.stderr == message + "\n"


def test_a_config_with_an_unreadable_kv_head_count_is_refused_not_read_as_mha():
    from cascade_repro.vllm_surface import ModelAttention

    with pytest.raises(UsageError, match=r"^model config: num_key_value_heads must be a positive integer, got 'x'$"):
        ModelAttention.from_config({"num_attention_heads": 9, "num_key_value_heads": "x"})
    assert ModelAttention.from_config({"num_attention_heads": 9, "num_key_value_heads": None}).num_kv_heads == 9
