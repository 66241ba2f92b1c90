"""In a run of several twins each engine is built from the spec narrowed to its own twin
(``run/worker.engine_spec``): its arm's engine arguments, its effect reader. Shown on the fake vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade_repro.plan import models as plan_models
from cascade_repro.plan.matrix import MatrixSpec, plan
from cascade_repro.run.worker import engine_spec
from cascade_repro.rundir.manifest import Manifest


def test_each_engine_runs_its_own_twins_setting(fake_vllm, tmp_path: Path):
    pytest.importorskip("torch")
    from cascade_repro.engines.vllm import VLLMEngine

    spec = MatrixSpec(engine="vllm", twin="prefix-caching,chunked-prefill", batch=[8], max_tokens=3, topk=2)
    run = Manifest(spec_json=spec.to_dict())
    p = plan(spec)
    seen = {}
    for arm in ("prefix-on", "chunked"):
        ep = next(e for e in p.engines.values() if e.arm == arm)
        own = engine_spec(run, ep)
        assert own.twin == ep.twin and len(own.twin_axes) == 1
        eng = VLLMEngine("/models/m", own, ep, run_dir=tmp_path / arm, models=plan_models)
        prompts = [[1] * 300 + [i] for i in range(8)]
        _, st = eng.run_wave(prompts, arm, 3, prefix_len=300)
        eng.close()
        seen[arm] = (st.extra["effect"]["twin"], st.extra["effect"]["count"])
    # 8 prompts of 301 tokens: 288 of each from the prefix cache; 18 prefill steps cut mid-prompt.
    assert seen == {"prefix-on": ("prefix-caching", 8 * 288), "chunked": ("chunked-prefill", 18)}
