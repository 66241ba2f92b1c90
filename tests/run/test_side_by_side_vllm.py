"""vLLM engines side by side on a (faked) GPU: each worker is handed its GPU, its KV budget and its
share of the GPU, and the engine passes them to vLLM; one engine per GPU passes nothing, as before.
The fake vLLM (tests/fake_vllm) reads back what it was given; CASCADE_REPRO_GPUS stands in for an H200."""

from __future__ import annotations

import json
import os

import pytest

from cascade_repro import pipeline
from cascade_repro.plan import packing
from cascade_repro.plan.matrix import MatrixSpec
from cascade_repro.run import runner
from cascade_repro.run.reference import ReferenceOptions
from cascade_repro.rundir import layout, manifest


def _run(tmp, cut_model, run_id, per_gpu):
    spec = MatrixSpec.from_dict({"engine": "vllm", "model": str(cut_model), "limit": 8, "batch": [8],
                                 "twin": "prefix-caching", "max_tokens": 3, "auto_controls": False},
                                source="test")  # fmt: skip
    opts = pipeline.RunOptions(results_dir=tmp, run_id=run_id, fresh=True, command="test", progress=False,
                               reference=ReferenceOptions("off", "auto"), max_engines_per_gpu=per_gpu)  # fmt: skip
    return pipeline.run_matrix(spec, opts)


def _engines(run_dir):
    out = {}
    for key in manifest.read_manifest(run_dir).plan.engines:
        for line in layout.samples_path(run_dir, key).read_text().splitlines():
            rec = json.loads(line)
            if rec["type"] == "engine":
                out[key] = rec["effective"]
    return out


def _samples(run_dir):
    return {
        key: [json.loads(x)["token_ids"] for x in layout.samples_path(run_dir, key).read_text().splitlines()
              if '"type":"sample"' in x]
        for key in manifest.read_manifest(run_dir).plan.engines
    }  # fmt: skip


@pytest.mark.slow
def test_vllm_workers_get_their_budget_side_by_side_and_none_alone(fake_vllm, cut_model, tmp_path, monkeypatch):
    monkeypatch.setenv("CASCADE_REPRO_GPUS", "1x141")
    # The workers are processes of their own: the fake vLLM must be on their path too.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake_vllm), os.environ.get("PYTHONPATH", "")]))
    side = _run(tmp_path, cut_model, "side", None)
    run = manifest.read_manifest(side.run_dir)
    want = runner.packing_of(run, None)
    assert want.concurrent and want.budget
    mem = want.memory[1]
    share = float(want.env_for(1, (0,))[packing.ENV_GPU_UTIL])
    eff = _engines(side.run_dir)
    assert len(eff) == 2
    for e in eff.values():
        assert (e["kv_cache_memory_bytes"], e["gpu_memory_utilization"]) == (mem.kv, share)
    alone = _run(tmp_path, cut_model, "alone", 1)
    for e in _engines(alone.run_dir).values():
        assert "kv_cache_memory_bytes" not in e and e["gpu_memory_utilization"] == 0.5  # the spec's, as before
    assert _samples(side.run_dir) == _samples(alone.run_dir)
    assert side.exit_code == alone.exit_code


@pytest.mark.slow
def test_a_model_too_big_for_the_gpu_is_refused_before_anything_runs(fake_vllm, cut_model, tmp_path, monkeypatch):
    from cascade_repro.errors import UsageError

    monkeypatch.setenv("CASCADE_REPRO_GPUS", "1x1.5")  # the cut model and a 1 GiB KV floor do not fit its 1.35 GiB
    with pytest.raises(UsageError, match=r"^one engine at tp 1 needs .* more than the 1\.3 GiB a 1\.5 GiB GPU"):
        _run(tmp_path, cut_model, "big", None)
    assert not (tmp_path / "big").exists()  # refused before anything was written
    monkeypatch.setenv("CASCADE_REPRO_GPUS", "1x141")
    spec = MatrixSpec.from_dict({"engine": "vllm", "model": str(cut_model), "limit": 8, "batch": [8], "tp": [2],
                                 "max_tokens": 3}, source="test")  # fmt: skip
    with pytest.raises(UsageError, match=r"^--tp 2 needs 2 GPUs, 1 visible"):
        runner.prepare(spec, pipeline.RunOptions(results_dir=tmp_path, progress=False))
