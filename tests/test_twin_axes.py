"""--twin: the registry of twin axes, each twin's cells and engine keys, its pairs, the versions
that can test it, its proof of effect (fake engine and fake vLLM, taking effect and not) and the
exit policy of a setting that changes results by design."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade_repro import twin as twins
from cascade_repro import vllm_surface
from cascade_repro.errors import UsageError
from cascade_repro.judge.compare import plan_pairs
from cascade_repro.judge.effect import cascade_mixed_in, cell_effect
from cascade_repro.plan import models as plan_models
from cascade_repro.plan.matrix import MatrixSpec, plan

DATA = Path(__file__).parent / "data"


# --- registry -------------------------------------------------------------------------------------


def test_cascade_keeps_the_names_on_disk():
    t = twins.resolve(None)
    assert t is twins.CASCADE and twins.resolve("cascade") is twins.CASCADE
    assert (t.test, t.ref, t.pair_kind, t.spec_field) == ("cascade", "flat", "cascade", "cascade")
    assert t.toggle and t.test_label == "cascade (test)" and t.ref_label == "flat (ref)"


@pytest.mark.parametrize(
    "name, arms, family, toggle, axis",
    [
        ("prefix-caching", ("prefix-on", "prefix-off"), "prefix-caching", False, None),
        ("chunked-prefill", ("chunked", "unchunked"), "chunked-prefill", False, None),
        ("cuda-graphs", ("graphs", "eager"), "cuda-graphs", False, None),
        ("async-scheduling", ("async", "sync"), "async-scheduling", False, None),
        ("kv-cache-dtype=fp8", ("kv-fp8", "kv-auto"), "kv-cache-dtype", False, None),
        ("attention-backend=FLASH_ATTN:FLASHINFER", ("attn-flashinfer", "attn-flashattn"), "attention-backend",
         False, "backend"),
        ("attention-backend=flash_attn:triton_attn", ("attn-tritonattn", "attn-flashattn"), "attention-backend",
         False, "backend"),
        ("tp=1:2", ("tp2", "tp1"), "tp", False, "tp"),
        ("batch=1:8", ("batch8", "batch1"), "batch", True, "batch"),
    ],
)  # fmt: skip
def test_each_entry_names_its_arms_kind_and_how_they_differ(name, arms, family, toggle, axis):
    t = twins.resolve(name)
    assert t.arms == arms and t.pair_kind == family and t.toggle is toggle and t.axis == axis
    assert t.family in twins.PAIR_KINDS and t.effect in twins.EFFECTS and t.effect_doc
    assert t.expected_change is (family == "kv-cache-dtype")
    # Every arm of every twin keeps cascade out of the comparison (it is on by default before 0.18).
    assert t.engine_args(t.test)["disable_cascade_attn"] is True
    # ... the one engine that switches a toggled twin's arms per wave too.
    assert t.engine_args(None) == {"disable_cascade_attn": True}


def test_the_engine_arguments_each_twin_sets_exist_in_every_recorded_release():
    for rel in ("0.10.2", "0.26.0"):
        names = set(json.loads((DATA / f"vllm-surface-{rel}.json").read_text())["engine_args"])
        for t in twins.all_examples():
            for arm in t.arms:
                assert set(t.engine_args(arm)) <= names, (rel, t.name, arm)


@pytest.mark.parametrize(
    "name, message",
    [
        ("prefix", "--twin must be one of cascade, prefix-caching"),
        ("tp", "--twin tp takes its arms: tp=A:B, as in tp=1:2"),
        ("tp=2:1", "A < B"),
        ("tp=1:x", "two integers"),
        ("batch=2:8", "the reference arm runs one request at a time"),
        ("attention-backend=FLASH_ATTN", "two different backend names"),
        ("attention-backend=FLASH_ATTN:FLASH_ATTN", "two different backend names"),
    ],
)
def test_a_bad_twin_is_one_line(name, message):
    with pytest.raises(ValueError, match=message) as e:
        twins.resolve(name)
    assert "\n" not in str(e.value)


def test_the_spec_refuses_what_a_twin_cannot_take():
    with pytest.raises(UsageError, match="--twin prefix-caching needs the vllm engine"):
        MatrixSpec(engine="hf", twin="prefix-caching").validate()
    with pytest.raises(UsageError, match=r"--twin tp=1:2 sets the tp of each arm \(1 and 2\): drop --tp"):
        MatrixSpec(engine="vllm", twin="tp=1:2", tp=[4]).validate()
    with pytest.raises(UsageError, match="--engine-args enforce_eager: --twin cuda-graphs sets it per arm"):
        MatrixSpec(engine="vllm", twin="cuda-graphs", engine_args={"enforce_eager": True}).validate()
    with pytest.raises(UsageError, match="--twin chunked-prefill prefills in 128-token steps, which vLLM allows up "
                       "to batch 128: --batch 8, 256"):  # fmt: skip
        MatrixSpec(engine="vllm", twin="chunked-prefill", batch=[8, 256]).validate()
    with pytest.raises(UsageError, match="--twin must be one of"):
        MatrixSpec(engine="vllm", twin="graphs").validate()
    ok = MatrixSpec(engine="hf", twin="batch=1:8")
    ok.validate()
    assert ok.twin == "batch=1:8"


# --- planning: cells, engine keys, pairs ------------------------------------------------------------


def _plan(**kw):
    spec = MatrixSpec(**kw)
    spec.validate()
    return plan(spec)


def test_cascade_plan_is_todays():
    p = _plan(engine="vllm", batch=[8])
    assert list(p.engines) == ["vllm-tp1-auto-fadefault-flashattn-s0"]
    assert [c.cell_id for c in p.cells] == ["tp1-b8-cascade", "tp1-b8-flat", "tp1-b1-flat"]
    assert p.engines["vllm-tp1-auto-fadefault-flashattn-s0"].arm is None


def test_an_engine_setting_gives_each_arm_its_engine_and_a_rerun_control():
    p = _plan(engine="vllm", twin="prefix-caching", batch=[8, 16])
    keys = {k: (e.arm, e.cells) for k, e in p.engines.items()}
    base = "vllm-tp1-auto-fadefault-flashattn-s0"
    assert keys == {
        f"{base}-prefix-on": ("prefix-on", ["tp1-b8-prefix-on", "tp1-b16-prefix-on"]),
        f"{base}-prefix-off": ("prefix-off", ["tp1-b8-prefix-off", "tp1-b16-prefix-off"]),
        f"{base}-prefix-off-r1": ("prefix-off", ["tp1-b8-prefix-off-r1", "tp1-b16-prefix-off-r1"]),
    }
    pairs = {p.pair_id: (p.kind, p.test.cell_id, p.ref.cell_id) for p in plan_pairs(p.cells, twins.PREFIX_CACHING)}
    assert pairs["tp1-b8-prefix-on~prefix-off"] == ("prefix-caching", "tp1-b8-prefix-on", "tp1-b8-prefix-off")
    assert pairs["tp1-b8-prefix-off-r1~r0"][0] == "noise-restart"
    assert pairs["tp1-b16-prefix-off~b8"][0] == "noise-batch"


def test_tp_and_backend_twins_pair_across_their_axis():
    tw = twins.resolve("tp=1:2")
    p = _plan(engine="vllm", twin=tw.name, batch=[8])
    cells = {c.cell_id: (c.tp, c.engine_key) for c in p.cells}
    assert cells["tp2-b8-tp2"][0] == 2 and cells["tp1-b8-tp1"][0] == 1
    pairs = {x.pair_id: x for x in plan_pairs(p.cells, tw)}
    assert (pairs["tp2-b8-tp2~tp1"].test.tp, pairs["tp2-b8-tp2~tp1"].ref.tp) == (2, 1)
    tw = twins.resolve("attention-backend=FLASH_ATTN:TRITON_ATTN")
    p = _plan(engine="vllm", twin=tw.name, batch=[8])
    assert {e.backend for e in p.engines.values()} == {"FLASH_ATTN", "TRITON_ATTN"}
    pairs = {x.pair_id: x for x in plan_pairs(p.cells, tw)}
    pair = pairs["tp1-b8-attn-tritonattn~attn-flashattn"]
    assert (pair.test.backend, pair.ref.backend, pair.kind) == ("TRITON_ATTN", "FLASH_ATTN", "attention-backend")


def test_the_batch_twin_pairs_batch_n_with_batch_1_in_one_engine():
    tw = twins.resolve("batch=1:8")
    p = _plan(engine="hf", twin=tw.name)
    assert [(c.cell_id, c.batch) for c in p.cells] == [("tp1-b8-batch8", 8), ("tp1-b1-batch1", 1),
                                                        ("tp1-b1-batch1-r1", 1)]  # fmt: skip
    assert [e.arm for e in p.engines.values()] == [None, "batch1"]  # the control: a second start
    pairs = {x.pair_id: (x.kind, x.test.batch, x.ref.batch) for x in plan_pairs(p.cells, tw)}
    assert pairs == {"tp1-b8-batch8~batch1": ("batch", 8, 1), "tp1-b1-batch1-r1~r0": ("noise-restart", 1, 1)}


def test_calibration_of_another_twin_scales_the_attention_output():
    p = _plan(engine="vllm", twin="cuda-graphs", batch=[8], calibrate=[0.01, 0.1])
    cal = [(c.cell_id, c.inject) for c in p.cells if c.origin == "calibration"]
    assert cal == [("tp1-b8-graphs-scale0.01", "out-scale=0.01"), ("tp1-b8-graphs-scale0.1", "out-scale=0.1")]
    p = _plan(engine="vllm", batch=[8], calibrate=[0.1])
    assert [c.inject for c in p.cells if c.origin == "calibration"] == ["lse-shift=0.1"]


# --- versions ---------------------------------------------------------------------------------------


def test_versions_decide_per_twin():
    assert vllm_surface.twin_problem("cascade", "0.31.9") is None
    why = vllm_surface.twin_problem("cascade", "0.32.0")
    assert why.startswith("--twin cascade cannot be tested on vLLM 0.32.0: cascade attention was removed")
    assert vllm_surface.testable_twins("0.34.0") == [f for f in twins.FAMILIES if f != "cascade"]
    assert vllm_surface.testable_twins("0.26.0") == list(twins.FAMILIES)
    assert set(vllm_surface.TWIN_RELEASES) <= set(twins.FAMILIES)  # the rest: every release
    line = vllm_surface.twin_refusal("cascade", "cascade", 1, "0.34.0", 8)
    assert "this vLLM can test --twin prefix-caching, chunked-prefill" in line and "\n" not in line
    assert vllm_surface.twin_refusal("tp", "tp=1:2", 2, "0.26.0", 1) == (
        "--twin tp=1:2 needs 2 GPUs for its test arm; this machine has 1 (run it where that many are visible)"
    )
    assert vllm_surface.twin_refusal("tp", "tp=1:2", 2, "0.26.0", 2) is None


def test_matrix_refuses_tp_on_one_gpu_in_one_line(monkeypatch):
    from support.cli import CliRunner

    from cascade_repro.cli import app
    from cascade_repro.run import envinfo

    monkeypatch.setattr(vllm_surface, "installed_version", lambda: "0.26.0")
    monkeypatch.setattr(envinfo, "visible_gpu_count", lambda: 1)
    res = CliRunner().invoke(app, ["matrix", "--engine", "vllm", "--twin", "tp=1:2", "--limit", "2"])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip().splitlines() == [
        "error: --twin tp=1:2 needs 2 GPUs for its test arm; this machine has 1 (run it where that many are visible)"
    ]
    monkeypatch.setattr(vllm_surface, "installed_version", lambda: "0.34.0")
    res = CliRunner().invoke(app, ["matrix", "--engine", "vllm", "--twin", "cascade", "--limit", "2"])
    assert res.exit_code == 4 and len(res.stderr.strip().splitlines()) == 1
    assert "--twin cascade cannot be tested on vLLM 0.34.0" in res.stderr
    assert res.stderr.strip().endswith('; for cascade itself: pip install "cascade-repro[cascade]" (vLLM 0.31.0)')
    # A dry run plans for the machine it will run on: it says what this one would refuse, and plans.
    monkeypatch.setattr(vllm_surface, "installed_version", lambda: "0.26.0")
    res = CliRunner().invoke(app, ["matrix", "--engine", "vllm", "--twin", "tp=1:2", "--limit", "2", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines()[0] == (
        "warning: --twin tp=1:2 needs 2 GPUs for its test arm; this machine has 1 (run it where that many are visible)"
    )
    monkeypatch.setattr(envinfo, "visible_gpu_count", lambda: 0)  # a laptop planning one-GPU work: no word
    res = CliRunner().invoke(app, ["matrix", "--engine", "vllm", "--limit", "16", "--dry-run"])
    assert res.exit_code == 0 and "warning" not in res.stderr, res.output


# --- proof of effect --------------------------------------------------------------------------------


def test_cell_effect_sums_waves_and_keeps_the_first_reason():
    rec = twins.effect_record
    t = twins.PREFIX_CACHING
    waves = [{"extra": {"effect": rec(t, 0, {}, "no prompt token came from the prefix cache")}},
             {"extra": {"effect": rec(t, 0, {}, "later")}}]  # fmt: skip
    assert cell_effect(waves).why == cell_effect(waves[:1]).why
    assert cell_effect(waves).why == "no prompt token came from the prefix cache" and cell_effect(waves).count == 0
    waves.append({"extra": {"effect": rec(t, 320, {})}})
    assert (cell_effect(waves).count, cell_effect(waves).waves, cell_effect(waves).why) == (320, 3, "")
    assert cell_effect([{"extra": {}}]).why == "no wave reported it"


def test_cascade_mixed_in_names_the_arms_that_ran_it_and_is_empty_otherwise():
    assert cascade_mixed_in("batch=1:64", [("batch64", {"cascade_steps": 128}), ("batch1", {"cascade_steps": 0})]) == (
        "; cascade attention ran on 128 steps of the batch64 arm, though batch=1:64 keeps it off in both "
        "arms: its effect is mixed into this comparison"
    )
    assert cascade_mixed_in("tp=1:2", [("tp2", {"cascade_steps": float("nan")}), ("tp1", {})]) == ""


def _fake_vllm_wave(tmp_path: Path, twin: str, arm: str, batch: int = 8, prompt_len: int = 301):
    from cascade_repro.engines.vllm import VLLMEngine

    tw = twins.resolve(twin)
    spec = MatrixSpec(engine="vllm", twin=tw.name, batch=[batch], max_tokens=3, topk=2)
    plan_ = plan(spec)
    ep = next(e for e in plan_.engines.values() if e.arm == arm)
    eng = VLLMEngine("/models/m", spec, ep, run_dir=tmp_path / arm, models=plan_models)
    prompts = [[1] * (prompt_len - 1) + [i] for i in range(batch)]
    _, st = eng.run_wave(prompts, arm, 3, prefix_len=prompt_len - 1)
    eng.effective_seen = eng.effective()
    eng.close()
    return eng, st.extra["effect"]


@pytest.mark.parametrize(
    "twin, ignored, count, why",
    [
        ("prefix-caching", "enable_prefix_caching", 8 * 288, "no prompt token came from the prefix cache"),
        # 8 prompts of 301 tokens through 128-token steps: 19 steps, each but the last ends mid-prompt.
        ("chunked-prefill", "max_num_batched_tokens", 18, "every prompt fit the step budget (max_num_batched_tokens=8192)"),
        # The 3 decode steps replayed a FULL graph; the 2,408-token prefill step ran eager (> 512).
        ("cuda-graphs", "enforce_eager", 3, None),
        # 1 prefill and 3 decode steps, all scheduled by the AsyncScheduler.
        ("async-scheduling", "async_scheduling", 4, "no step was scheduled by vLLM's AsyncScheduler"),
        ("kv-cache-dtype=fp8", "kv_cache_dtype", 24, "the layers' KV cache is auto (2 bytes per element), not fp8"),
        ("attention-backend=FLASH_ATTN:TRITON_ATTN", "attention_config", 24,
         "the layers run FlashAttentionImpl, not TRITON_ATTN's"),
    ],
)  # fmt: skip
def test_the_fake_vllm_proves_each_setting_took_effect_or_not(fake_vllm, tmp_path, monkeypatch, twin, ignored, count, why):
    pytest.importorskip("torch")
    tw = twins.resolve(twin)
    eng, eff = _fake_vllm_wave(tmp_path / "on", twin, tw.test)
    assert (eff["twin"], eff["count"], eff.get("why")) == (tw.name, count, None), eff
    if twin == "cuda-graphs":
        # The reference arm is the one that drops a setting here: graphs on where eager was asked.
        _, eff = _fake_vllm_wave(tmp_path / "ref", twin, tw.ref)
        assert eff["count"] == 0 and eff["why"] == "the engine runs eager (CUDA-graph mode off)"
        _, eff = _fake_vllm_wave(tmp_path / "big", twin, tw.test, batch=1024, prompt_len=20)
        assert eff["count"] == 0 and "batch 1024 is above the largest captured size 512" in eff["why"]
        return
    monkeypatch.setenv("FAKE_VLLM_IGNORE", ignored)
    _, eff = _fake_vllm_wave(tmp_path / "off", twin, tw.test)
    assert (eff["count"], eff["why"]) == (0, why)


def test_fake_vllm_reads_back_the_attention_class_and_tp_size(fake_vllm, tmp_path):
    pytest.importorskip("torch")
    tw = twins.resolve("attention-backend=FLASH_ATTN:FLASHINFER")
    eng, eff = _fake_vllm_wave(tmp_path, tw.name, tw.test)
    assert eng.readback["attn_impl_classes"] == ["FlashInferImpl"] and eng.readback["tp_world_size"] == 1
    assert eng.effective_seen["twin_readback"] == eng.readback and eng.effective_seen["twin"] == tw.name
    assert eff["evidence"] == {"attn_impl_classes": ["FlashInferImpl"]}
    assert eng.llm is None  # closed


# --- runs on the fake engine: reports name the twin, effect on and off, expected change --------------


def _matrix(tmp_path: Path, run_id: str, *args: str, env: dict[str, str] | None = None):
    """`matrix` on the fake engine, in this process (its workers are processes of their own, started
    with ``env`` in their environment); the result's ``exit_code`` and ``stderr``, and the run directory."""
    from support.cli import CliRunner

    from cascade_repro.cli import app

    argv = ["matrix", "--engine", "fake", "--limit", "16", "--batch", "8", "--results-dir", str(tmp_path),
            "--run-id", run_id, "--quiet", *args]  # fmt: skip
    res = CliRunner().invoke(app, argv, env=env)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res, tmp_path / run_id


def test_fake_engine_run_names_the_twin_and_says_when_it_never_took_effect(tmp_path):
    import pandas as pd

    res, run = _matrix(tmp_path, "on", "--twin", "prefix-caching")
    assert res.exit_code == 0, res.stderr
    pairs = pd.read_parquet(run / "pairs.parquet")
    row = pairs[pairs["kind"] == "prefix-caching"].iloc[0]
    assert (row["pair_id"], row["verdict"], row["depth"]) == ("tp1-b8-prefix-on~prefix-off", "identical", "")
    assert row["cascade_steps"] > 0
    assert json.loads((run / "run.json").read_text())["spec"]["twin"] == "prefix-caching"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["headline"] == (
        "cascade-repro --twin prefix-caching: no prefix-caching effect beyond noise in 1 pair (1 identical)"
    )
    report = (run / "report.md").read_text()
    assert report.startswith(f"## {summary['headline']}\n")
    # The facts line, the evidence and the examples name this twin's arms and what proved it, not cascade's.
    assert "**twin** `prefix-caching: prefix-on vs prefix-off`" in report
    assert "| prefix-cache hits |" in report and "cascade steps" not in report.split("<details>", 1)[1]
    # Uncalibrated: what --calibrate would measure is this twin's fault (the attention output scaled).
    not_calibrated = "Not calibrated: run with `--calibrate` to measure the smallest attention-output scale"
    assert not_calibrated in report and "LSE" not in report
    junit = (run / "junit.xml").read_text()
    assert 'classname="prefix-caching.tp1" name="batch8-tp1-b8-prefix-on~prefix-off"' in junit
    assert "prefix-cache hits" in junit and "smallest attention-output scale this setup flags" in junit

    res, run = _matrix(tmp_path, "off", "--twin", "prefix-caching", env={"CASCADE_REPRO_FAKE_EFFECT": "off"})
    assert res.exit_code == 4, res.stderr
    row = pd.read_parquet(run / "pairs.parquet").iloc[0]
    assert row["verdict"] == "not exercised"
    assert json.loads((run / "summary.json").read_text())["headline"] == (
        "cascade-repro --twin prefix-caching: nothing exercised: prefix-caching never took effect in 1 pair"
    )
    assert row["reasons"] == (
        "prefix-caching never took effect in this cell (the fake engine was told to ignore it "
        "(CASCADE_REPRO_FAKE_EFFECT=off)): the comparison proves nothing"
    )


def test_cascade_run_in_another_twins_arms_is_named_in_the_pairs_reasons(tmp_path):
    """Every twin but cascade keeps cascade off in both arms; an engine that ran it anyway (the batch
    twin's one engine on vLLM 0.26.0 did) mixes its effect in, and the pair says so."""
    import pandas as pd

    res, run = _matrix(tmp_path, "mixed", "--twin", "prefix-caching", env={"CASCADE_REPRO_FAKE_EFFECT": "cascade"})
    assert res.exit_code == 0, res.stderr
    cells = pd.read_parquet(run / "cells.parquet").set_index("cell_id")
    row = pd.read_parquet(run / "pairs.parquet").iloc[0]
    steps = {"prefix-on": int(cells.loc[row["test_cell"], "cascade_steps"]),
             "prefix-off": int(cells.loc[row["ref_cell"], "cascade_steps"])}  # fmt: skip
    assert min(steps.values()) > 0
    assert row["verdict"] == "identical"  # the fake's arms are equal: the note, not the verdict, says it
    assert row["reasons"].endswith(
        f"; cascade attention ran on {steps['prefix-on']} steps of the prefix-on arm and "
        f"{steps['prefix-off']} steps of the prefix-off arm, though prefix-caching keeps it off in both "
        "arms: its effect is mixed into this comparison"
    )
    res, run = _matrix(tmp_path, "clean", "--twin", "prefix-caching")
    assert "cascade attention ran" not in pd.read_parquet(run / "pairs.parquet").iloc[0]["reasons"]


def test_a_positive_control_is_flagged_on_any_twin_and_an_expected_change_does_not_fail(tmp_path):
    import pandas as pd

    res, run = _matrix(tmp_path, "scaled", "--twin", "async-scheduling", "--inject", "out-scale=0.5")
    assert res.exit_code == 1, res.stderr
    row = pd.read_parquet(run / "pairs.parquet").iloc[0]
    assert (row["kind"], row["verdict"]) == ("async-scheduling", "regression")
    # The same fault under a twin that changes results by design: reported, not failed on...
    res, run = _matrix(tmp_path, "fp8", "--twin", "kv-cache-dtype=fp8", "--inject", "out-scale=0.5")
    assert res.exit_code == 0, res.stderr
    assert pd.read_parquet(run / "pairs.parquet").iloc[0]["verdict"] == "regression"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["headline"] == (
        "cascade-repro --twin kv-cache-dtype=fp8: regression in 1 of 1 pair: tp1-b8-kv-fp8~kv-auto "
        "(expected: kv-cache-dtype=fp8 changes results by design)"
    )
    assert summary["exit_reason"].startswith("1 expected difference: kv-cache-dtype=fp8 changes results by design")
    # ...unless asked.
    res, _ = _matrix(tmp_path, "fp8", "--twin", "kv-cache-dtype=fp8", "--inject", "out-scale=0.5",
                     "--fail-on", "expected")  # fmt: skip
    assert res.exit_code == 1, res.stderr


# --- explain: will the setting take effect? ----------------------------------------------------------


def test_explain_predicts_per_cell_where_knowable():
    from cascade_repro.plan.twin_effect import predict_effects

    def pred(name, batch, **kw):
        tw = twins.resolve(name)
        cells = _plan(engine="vllm", twin=tw.name, batch=batch).cells
        args = dict(shared_prefix=1597, prompt_lens=[40, 60, 1700], block_size=16, gpus=1) | kw
        return [(p.cell_id, p.takes_effect, p.why) for p in predict_effects(tw, cells, **args)]

    assert pred("prefix-caching", [8]) == [
        ("tp1-b8-prefix-on", "yes", "shared prefix 1597 tokens >= one 16-token block: 1584 cached")
    ]
    assert pred("prefix-caching", [8], shared_prefix=10)[0][1:] == (
        "no", "shared prefix 10 tokens < one 16-token block: nothing to hit"
    )
    assert pred("chunked-prefill", [1], prompt_lens=[40, 60, 100])[0][1:] == (
        "no", "a wave's prompts hold 100 tokens <= the 128-token step budget"
    )
    assert pred("chunked-prefill", [2], prompt_lens=[40, 60, 100])[0][1] == "yes"
    assert pred("cuda-graphs", [8, 1024])[1][1:] == (
        "no", "batch 1024 > the largest captured size 512: decode runs eager"
    )
    assert pred("tp=1:2", [8]) == [("tp2-b8-tp2", "no", "TP 2 needs 2 GPUs, 1 visible (matrix refuses it)")]
    assert pred("async-scheduling", [8])[0][1] == "?"
    assert pred("batch=1:8", [8]) == [("tp1-b8-batch8", "yes", "every wave runs 8 requests at once")]


def test_explain_command_prints_the_twin_lines():
    from support.cli import CliRunner

    from cascade_repro.cli import app

    res = CliRunner().invoke(
        app, ["explain", "--twin", "prefix-caching", "--batch", "8", "--gpu", "H200", "--prefix-tokens", "8"]
    )
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == [
        "tp1-b8-prefix-on: prefix-caching takes effect: no (shared prefix 8 tokens < one 16-token block: "
        "nothing to hit)"
    ]


def test_out_scale_scales_any_backends_attention_output_only_inside_a_wave(tmp_path):
    torch = pytest.importorskip("torch")
    from cascade_repro.vllm_surface import inject as inj
    from cascade_repro.vllm_surface import probe

    class SomeImpl:
        def forward(self, layer, q, *rest, output=None):
            return q.clone()

    st = probe.ProbeState(tmp_path)
    assert probe.wrap_impl_forward(SomeImpl, st) and not probe.wrap_impl_forward(SomeImpl, st)  # once
    q = torch.ones(2, 3)
    st.apply({"wave": None, "inject": "out-scale=0.5", "seq": 1})
    assert torch.equal(SomeImpl().forward(None, q), q)  # a warm-up or profiling run: not counted, not scaled
    st.apply({"wave": "w1", "inject": "out-scale=0.5", "seq": 2})
    assert torch.equal(SomeImpl().forward(None, q), q * 1.5)
    assert st.waves["w1"]["scaled_calls"] == 1
    st.apply({"wave": "w2", "inject": None, "seq": 3})
    assert torch.equal(SomeImpl().forward(None, q), q) and "w2" not in st.waves  # nothing counted
    assert inj.parse("out-scale=0.01").label == "out-scale=0.01"


def test_calibrate_states_a_twins_detection_power(tmp_path):
    res, run = _matrix(tmp_path, "cal", "--twin", "prefix-caching", "--calibrate", "0.01,1")
    assert res.exit_code == 0, res.stderr
    summary = json.loads((run / "summary.json").read_text())
    (entry,) = summary["detection_power"]
    assert entry["fault"] == "out-scale" and entry["flags_from"] == 0.01  # the fake moves 8 * E nats
    assert [s["pair_id"] for s in entry["ladder"]] == ["tp1-b8-prefix-on-scale0.01~prefix-off",
                                                       "tp1-b8-prefix-on-scale1~prefix-off"]  # fmt: skip
    assert "This setup flags an attention-output scale of 1 + 0.01 at 16 prompts x 64 tokens" in (
        run / "report.md"
    ).read_text()


def test_minimize_refuses_another_twin_in_one_line(tmp_path):
    from cascade_repro.minimize.search import pick_pair

    res, run = _matrix(tmp_path, "pc", "--twin", "prefix-caching")
    assert res.exit_code == 0, res.stderr
    with pytest.raises(UsageError, match="minimize shrinks a cascade pair .*compares --twin prefix-caching$"):
        pick_pair(run, None)


def test_the_readmes_first_gpu_command_on_a_vllm_without_cascade_prints_the_command_to_type(monkeypatch):
    """Without --twin (cascade, the default) on vLLM >= 0.32: refused before any engine starts, in
    one line that ends with the exact command to type; that command plans a run on this vLLM."""
    import shlex
    import sys

    from support.cli import CliRunner

    from cascade_repro.cli import app
    from cascade_repro.run import envinfo

    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    first = next(line for line in readme.splitlines() if line.startswith("cascade-repro matrix --engine vllm"))
    argv = shlex.split(first.partition("#")[0])[1:]
    monkeypatch.setattr(vllm_surface, "installed_version", lambda: "0.34.0")
    monkeypatch.setattr(envinfo, "visible_gpu_count", lambda: 1)
    monkeypatch.setattr(sys, "argv", ["cascade-repro", *argv])
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 4, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: vLLM 0.34.0 has no cascade attention (the default --twin")
    command = lines[0].partition("type: ")[2]
    assert command == shlex.join(["cascade-repro", *argv]) + " --twin prefix-caching"
    res = CliRunner().invoke(app, [*shlex.split(command)[1:], "--dry-run"])
    assert res.exit_code == 0 and "warning" not in res.stderr, res.output
    assert vllm_surface.default_twin_refusal("0.31.0", "x") is None and vllm_surface.default_twin_refusal(None, "x") is None
