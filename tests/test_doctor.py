"""`cascade-repro doctor` on CPU: the rules over monkeypatched facts, and the command's exit code."""

from __future__ import annotations

import json

import pytest
from support.cli import CliRunner

from cascade_repro import doctor
from cascade_repro.doctor import FAIL, OK, WARN, Facts

H200 = {"index": 0, "name": "NVIDIA H200", "sm_count": 132, "compute_capability": "9.0", "memory_gib": 139.8}
SMOLLM2 = {
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
}


def healthy(**over) -> Facts:
    f = Facts(
        tp=1,
        vllm_version="0.26.0",
        plugin_registered=True,
        probe_targets={"use_cascade_attention": True, "cascade_attention": True, "merge_attn_states": True},
        gpus=[dict(H200, index=i) for i in range(2)],
        fa_support={2: None, 3: None, 4: "FA4 is only supported on devices with compute capability 10.x"},
        fa_default=3,
        model_config=dict(SMOLLM2),
        shared_prefix=2096,
    )
    for k, v in over.items():
        setattr(f, k, v)
    return f


def by_name(checks):
    return {c.name: c for c in checks}


def test_healthy_machine_passes():
    checks = doctor.run_checks(healthy())
    assert doctor.exit_code(checks) == 0
    assert all(c.status == OK for c in checks), [c for c in checks if c.status != OK]
    assert "2 x NVIDIA H200 (132 SMs, sm 9.0)" in by_name(checks)["GPUs"].detail
    assert "FA2 yes, FA3 yes, FA4 no" in by_name(checks)["FlashAttention"].detail


def test_no_vllm_fails_with_install_hint(monkeypatch):
    def no_vllm():
        raise ModuleNotFoundError("No module named 'vllm'")

    monkeypatch.setattr(doctor, "import_vllm", no_vllm)
    monkeypatch.setattr(doctor, "gpus", lambda: [])
    monkeypatch.setattr(doctor, "plugin_registered", lambda: True)
    monkeypatch.setattr(doctor, "model_config", lambda model, ov=None: ("/m", dict(SMOLLM2)))
    monkeypatch.setattr(doctor, "shared_prefix", lambda *a, **k: 2096)
    checks, code = doctor.doctor(model="embedded", tp=1)
    c = by_name(checks)["vLLM"]
    assert c.status == FAIL and c.fix == 'pip install "vllm==0.26.0"'

    assert "No module named 'vllm'" in c.detail
    assert by_name(checks)["FlashAttention"].status == WARN  # skipped, not failed twice
    assert code == 69  # this box cannot run the GPU matrix: not 1, a regression


def test_tp2_on_a_9_head_model_fails():
    c = by_name(doctor.run_checks(healthy(tp=2)))["tensor parallel"]
    assert c.status == FAIL and "9 heads not divisible by 2" in c.detail
    assert "[1, 3]" in c.fix


def test_tp_checks_gpus_and_kv_heads():
    c = by_name(
        doctor.run_checks(healthy(tp=4, model_config={"num_attention_heads": 8, "num_key_value_heads": 2}))
    )
    assert c["tensor parallel"].status == FAIL and "needs 4 GPUs, 2 visible" in c["tensor parallel"].detail
    ok = by_name(
        doctor.run_checks(healthy(tp=2, model_config={"num_attention_heads": 8, "num_key_value_heads": 2}))
    )
    assert ok["tensor parallel"].status == OK
    # 2 KV heads over 4 GPUs: whole-head replication is fine; 3 KV heads over 2 GPUs is not.
    gpus4 = [dict(H200, index=i) for i in range(4)]
    rep = healthy(tp=4, gpus=gpus4, model_config={"num_attention_heads": 8, "num_key_value_heads": 2})
    assert by_name(doctor.run_checks(rep))["tensor parallel"].status == OK
    bad = healthy(tp=2, model_config={"num_attention_heads": 12, "num_key_value_heads": 3})
    assert "3 KV heads not divisible by 2" in by_name(doctor.run_checks(bad))["tensor parallel"].detail


def test_env_switches():
    c = by_name(
        doctor.run_checks(healthy(env={"VLLM_BATCH_INVARIANT": "1", "VLLM_USE_V2_MODEL_RUNNER": "1"}))
    )
    assert c["batch invariance"].status == FAIL and c["batch invariance"].fix == "unset VLLM_BATCH_INVARIANT"
    assert c["model runner"].status == WARN
    c = by_name(doctor.run_checks(healthy(env={"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_PLUGINS": "other"})))
    assert c["model runner"].status == OK
    assert c["probe plugin"].status == FAIL and "cascade_repro_probe" in c["probe plugin"].fix
    c = by_name(doctor.run_checks(healthy(env={"VLLM_ATTENTION_BACKEND": "FLASHINFER"})))
    assert c["attention backend"].status == WARN


def test_short_prefix_fails():
    c = by_name(doctor.run_checks(healthy(shared_prefix=250)))["shared prefix"]
    assert c.status == FAIL and "240 block-aligned" in c.detail and "--system-prompt" in c.fix
    assert (
        by_name(doctor.run_checks(healthy(shared_prefix=None, prefix_error="x")))["shared prefix"].status
        == WARN
    )


@pytest.mark.parametrize(
    ("cfg", "status"),
    [
        ({"sliding_window": 4096}, FAIL),
        ({"sliding_window": 32768, "use_sliding_window": False}, OK),
        ({"alibi": True}, FAIL),
        ({"model_type": "bloom"}, FAIL),
        ({"attention_chunk_size": 8192}, FAIL),
        ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 512}, WARN),
    ],
)
def test_attention_variants(cfg, status):
    c = by_name(doctor.run_checks(healthy(model_config={**SMOLLM2, **cfg})))["attention variant"]
    assert c.status == status, c


def test_missing_probe_targets_and_plugin():
    c = by_name(
        doctor.run_checks(healthy(probe_targets={"use_cascade_attention": False, "cascade_attention": True}))
    )
    assert c["probe targets"].status == FAIL and "use_cascade_attention" in c["probe targets"].detail
    assert by_name(doctor.run_checks(healthy(plugin_registered=False)))["probe plugin"].status == FAIL


def test_fa_on_hopper_without_fa3_warns():
    c = by_name(doctor.run_checks(healthy(fa_support={2: None, 3: "no _vllm_fa3_C", 4: "no"})))[
        "FlashAttention"
    ]
    assert c.status == WARN
    c = by_name(doctor.run_checks(healthy(fa_support={2: "x", 3: "y", 4: "z"})))["FlashAttention"]
    assert c.status == FAIL


def test_command_exit_codes(monkeypatch):
    import cascade_repro.cli.doctor_cmd  # noqa: F401 - registers the command on the shared app
    from cascade_repro.cli.app import app

    runner = CliRunner()
    monkeypatch.setattr(doctor, "gather_facts", lambda **kw: healthy(tp=kw["tp"]))
    res = runner.invoke(app, ["doctor", "--json"])
    assert res.exit_code == 0, res.output
    assert all(c["status"] == "ok" for c in json.loads(res.output)["checks"])
    res = runner.invoke(app, ["doctor", "--tp", "2", "--json"])
    assert res.exit_code == 69 and json.loads(res.output)["exit_code"] == 69
    tp = {c["name"]: c for c in json.loads(res.output)["checks"]}["tensor parallel"]
    assert tp["status"] == "fail" and "9 heads not divisible by 2" in tp["detail"]
    res = runner.invoke(app, ["doctor", "--tp", "2"])  # the table form exits the same way
    assert res.exit_code == 69 and "fail" in res.output
    res = runner.invoke(app, ["doctor", "--hf-overrides", "[1]"])
    assert res.exit_code == 2


@pytest.mark.parametrize(
    ("version", "status", "words"),
    [
        ("0.10.2", OK, ["a release the probe was written against", "cascade default on", "split-KV LSE bug"]),
        ("0.10.3", WARN, ["between known releases, read as 0.10.2", "split-KV LSE bug"]),
        ("0.11.0", OK, ["a release the probe was written against", "split-KV LSE bug"]),
        ("0.11.1", WARN, ["between known releases, read as 0.11.0"]),
        ("0.26.0", OK, ["cascade opt-in"]),
        ("0.28.1", WARN, ["between known releases, read as 0.26.0", "cascade opt-in"]),
        # No cascade, but every other twin runs: a warning, not a machine that cannot run.
        ("0.32.0", WARN, ["removed in 0.32.0", "no twin has run on a GPU with it yet (last GPU runs on 0.34.0)"]),
        ("0.34.0", WARN, ["removed in 0.32.0", "8 twins ran on a GPU with it"]),
        ("0.9.2", WARN, ["older than every release the probe knows"]),
    ],
)
def test_vllm_version_says_what_the_probe_knows(version, status, words):
    c = by_name(doctor.run_checks(healthy(vllm_version=version)))["vLLM"]
    assert c.status == status, c
    for w in words:
        assert w in c.detail, c.detail
    if version == "0.26.0":
        assert "LSE bug" not in c.detail


def test_doctor_reads_heads_and_variants_as_explain_does():
    from cascade_repro.vllm_surface import ModelAttention

    # Falcon's multi_query and a nested text_config: doctor once read these differently from explain.
    for cfg, detail in (
        ({"num_attention_heads": 71, "multi_query": True}, "tp 1: 71 heads, 1 KV heads"),
        ({"text_config": {"num_attention_heads": 32, "num_key_value_heads": 8}}, "tp 1: 32 heads, 8 KV heads"),
    ):
        c = by_name(doctor.run_checks(healthy(tp=1, model_config=cfg)))["tensor parallel"]
        a = ModelAttention.from_config(cfg)
        assert c.detail == detail == f"tp 1: {a.num_attention_heads} heads, {a.num_kv_heads} KV heads"
    hybrid = {"num_attention_heads": 8, "layer_types": ["sliding_attention", "full_attention"] * 2}
    c = by_name(doctor.run_checks(healthy(model_config=hybrid)))["attention variant"]
    assert c.status == WARN and "sliding window on 2/4 layers" in c.detail
    bloom = {"num_attention_heads": 16, "model_type": "bloom"}
    assert by_name(doctor.run_checks(healthy(model_config=bloom)))["attention variant"].status == FAIL
    assert ModelAttention.from_config(bloom).use_alibi


@pytest.mark.parametrize(
    ("version", "gpus", "status", "detail"),
    [
        ("0.26.0", 2, OK, "can test --twin cascade, prefix-caching, chunked-prefill, cuda-graphs, async-scheduling, "
         "kv-cache-dtype=..., attention-backend=..., tp=..., batch=..."),
        ("0.26.0", 1, OK, "can test --twin cascade, prefix-caching, chunked-prefill, cuda-graphs, async-scheduling, "
         "kv-cache-dtype=..., attention-backend=..., batch=...; tp needs 2 GPUs, 1 visible"),
        ("0.34.0", 1, OK, "can test --twin prefix-caching, chunked-prefill, cuda-graphs, async-scheduling, "
         "kv-cache-dtype=..., attention-backend=..., batch=...; tp needs 2 GPUs, 1 visible; --twin cascade cannot "
         "be tested on vLLM 0.34.0: cascade attention was removed in vLLM 0.32.0 (disable_cascade_attn is kept "
         "and does nothing)"),
    ],
)  # fmt: skip
def test_doctor_lists_the_twins_this_vllm_can_test(version, gpus, status, detail):
    f = healthy(vllm_version=version)
    f.gpus = f.gpus[:1] * gpus
    checks = by_name(doctor.run_checks(f))
    assert (checks["twins"].status, checks["twins"].detail) == (status, detail)
    if version == "0.34.0":
        assert checks["vLLM"].fix.startswith(
            'pip install "vllm==0.31.0" (or pip install "cascade-repro[cascade]") for --twin cascade'
        )
        assert doctor.exit_code(list(checks.values())) == 0  # the other twins run here


def test_doctor_says_where_each_testable_twin_last_ran_on_a_gpu():
    lines = {c.name: (c.status, c.detail) for c in doctor.run_checks(healthy(vllm_version="0.34.0"))}
    twin_rows = [n for n in lines if n.startswith("twin ")]
    assert twin_rows == ["twin prefix-caching", "twin chunked-prefill", "twin cuda-graphs", "twin async-scheduling",
                         "twin kv-cache-dtype", "twin attention-backend", "twin tp", "twin batch"]  # fmt: skip
    assert lines["twin prefix-caching"] == (
        OK, "ran on a GPU with vLLM 0.34.0 (2026-12-03), 0.26.0 (2026-12-04), 0.10.2 (2026-12-04)"
    )
    assert lines["twin attention-backend"][1] == (
        "ran on a GPU with vLLM 0.34.0 FLASH_ATTN:TRITON_ATTN (2026-12-03), 0.34.0 FLASH_ATTN:FLASHINFER "
        "(2026-12-03), 0.26.0 FLASH_ATTN:TRITON_ATTN (2026-12-04), 0.26.0 FLASH_ATTN:FLASHINFER (2026-12-03)"
    )
    # A release between two with GPU runs is "not yet" with itself.
    on_033 = {c.name: c.detail for c in doctor.run_checks(healthy(vllm_version="0.33.0"))}
    assert on_033["twin batch"] == "ran on a GPU with vLLM 0.34.0 (2026-12-03), 0.26.0 (2026-12-04); not yet with 0.33.0"
    assert lines["twin tp"] == (OK, "never run on a GPU")
    on_026 = {c.name: c.detail for c in doctor.run_checks(healthy(vllm_version="0.26.0"))}
    assert on_026["twin cascade"] == "ran on a GPU with vLLM 0.26.0 (2026-12-04), 0.10.2 (2026-12-04)"
    assert on_026["vLLM"].endswith("; 9 twins ran on a GPU with it")
    assert not [c for c in doctor.run_checks(healthy(vllm_error="ImportError: x")) if c.name.startswith("twin ")]


def test_the_model_runner_on_a_vllm_with_only_v2():
    c = by_name(doctor.run_checks(healthy(vllm_version="0.34.0")))["model runner"]
    assert (c.status, c.detail) == (OK, "V2 (the only model runner of this vLLM)")
    c = by_name(doctor.run_checks(healthy(vllm_version="0.34.0", env={"VLLM_USE_V2_MODEL_RUNNER": "0"})))
    assert c["model runner"].status == WARN and "refuses any other value at engine start" in c["model runner"].detail
    assert c["model runner"].fix == "unset VLLM_USE_V2_MODEL_RUNNER"
    ok = by_name(doctor.run_checks(healthy(vllm_version="0.34.0", env={"VLLM_USE_V2_MODEL_RUNNER": "1"})))
    assert ok["model runner"].status == OK


def test_doctor_checks_the_targets_of_the_installed_release(monkeypatch):
    """probe_targets imports each function, class and method vllm_surface.targets lists for the
    release: cascade's only where the release has it."""
    import importlib
    import types

    from cascade_repro.vllm_surface import targets

    seen = []

    def fake_import(name):
        seen.append(name)
        return types.SimpleNamespace()  # nothing found: every target reported missing

    monkeypatch.setattr(importlib, "import_module", fake_import)
    got = doctor.probe_targets("0.34.0")
    release = doctor.vllm_surface.release_for("0.34.0")[0]
    assert list(got) == [t.label for t in targets.importable(release)] and not any(got.values())
    assert not any("use_cascade_attention" in k for k in got)
    assert any(k.endswith("CudaGraphManager.run_fullgraph") for k in got)
    assert any("use_cascade_attention" in k for k in doctor.probe_targets("0.26.0"))
    c = by_name(doctor.run_checks(healthy(probe_targets=got)))["probe targets"]
    assert c.status == FAIL and "CudaGraphManager.run_fullgraph" in c.detail
