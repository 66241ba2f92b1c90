"""What vLLM's rule predicts for a run's planned cells, read from its run.json: stored under
``predictions`` by the runner, beside the probe's counts (``plan/predict.py`` predicts)."""

from __future__ import annotations

from typing import Any

from cascade_repro.engines import get as engine_info
from cascade_repro.errors import UsageError
from cascade_repro.plan.matrix import spec_of
from cascade_repro.plan.predict import predict
from cascade_repro.rundir.manifest import Manifest
from cascade_repro.vllm_surface import ModelAttention
from cascade_repro.vllm_surface.cascade_rule import (
    DEFAULT_BLOCK_SIZE,
    default_fa_for,
    rule_and_source,
    sms_in_gpu_name,
)


def _spec_value(m: Manifest, name: str, default: Any) -> Any:
    """A spec field where run.json's spec holds it, else ``default``: the fallbacks here are not
    MatrixSpec's defaults (which ``plan.matrix.spec_of`` fills in), e.g. an engine not named reads as vLLM."""
    stored = m.spec_json if isinstance(m.spec_json, dict) else {}
    return getattr(spec_of(m.spec_json), name) if name in stored else default


def _run_sms(m: Manifest) -> tuple[int | None, str]:
    env = m.stack_env
    try:
        n = int(env.get("sm_count"))
        if n > 0:
            return n, "run.json env.sm_count"
    except (TypeError, ValueError):
        pass
    name = env.get("gpu_name")
    if isinstance(name, str) and (sms := sms_in_gpu_name(name)) is not None:
        return sms, f"run.json env.gpu_name {name!r} (table)"
    return None, "unknown"


_NO_MODEL = object()  # a spec without a model key


def predict_cells(
    m: Manifest, *, model_config: dict[str, Any] | None = None, num_sms: int | None = None
) -> dict[str, dict[str, Any]]:
    """Predict every planned cell of a run.json: ``{cell_id: {"prefill", "decode", "decode_from_batch"}}``.

    Reads the spec, the plan, ``prompt_set.shared_prefix_tokens`` and ``prompt_tokens_mean``, the SM
    count from ``env`` (``sm_count``, else the GPU name via :data:`GPU_SMS`) and the model config
    from ``model_path`` (``spec.hf_overrides`` applied for vLLM). ``decode`` is None when it
    depends on an SM count nobody recorded.
    """
    from cascade_repro.plan.models import load_config

    spec = spec_of(m.spec_json)
    engine = str(_spec_value(m, "engine", "vllm"))
    if model_config is None:
        model = m.model_path or _spec_value(m, "model", _NO_MODEL)
        if model is _NO_MODEL:
            raise UsageError("run.json names no model (model_path, spec.model)")
        model_config = dict(load_config(str(model)))
        if engine_info(engine).is_vllm:
            model_config.update(spec.hf_overrides or {})
    ps = m.prompt_set
    shared = int(ps.shared_prefix_tokens or 0)
    block = DEFAULT_BLOCK_SIZE
    for e in (m.engines if isinstance(m.engines, dict) else {}).values():
        eff = e.effective
        if isinstance(eff, dict) and isinstance(eff.get("block_size"), int) and eff["block_size"] > 0:
            block = eff["block_size"]
            break
    aligned = shared // block * block
    # Lengths only where the tokenizer recorded them (a default 0 is no measurement).
    measured = m.has("prompt_set")
    mean = ps.prompt_tokens_mean if measured and ps.has("prompt_tokens_mean") else None
    suffix = [max(1, round(float(mean) - aligned))] if isinstance(mean, int | float) else None
    # the split-KV band reads the longest own part
    longest = ps.prompt_tokens_max if measured and ps.has("prompt_tokens_max") else None
    if isinstance(longest, int) and suffix is not None:
        suffix.append(max(1, longest - aligned))
    if num_sms is None and engine_info(engine).cost_model:
        num_sms, _ = _run_sms(m)
    rule, _ = rule_and_source(engine_info(engine).is_vllm)
    preds, _ = predict(
        m.plan.cells, ModelAttention.from_config(model_config), engine=engine, shared_prefix_tokens=shared,
        suffix_lens=suffix, num_sms=num_sms, block_size=block, rule=rule,
        max_tokens=int(_spec_value(m, "max_tokens", None) or 0) if isinstance(longest, int) else None,
        default_fa=default_fa_for(str((m.env or {}).get("gpu_name") or "")),
    )  # fmt: skip
    return {p.cell_id: p.summary() for p in preds}


def predictions_for(m: Manifest) -> dict[str, Any]:
    """What the runner stores under ``run.json["predictions"]``; ``{}`` when nothing can be predicted.

    ``{"rule", "num_sms", "sms_source", "cells": predict_cells(m)}``. The hf engine gets
    hard-condition predictions too (its reference cascade has no cost model), so its report
    can show them beside the measured counts. Never raises: a prediction is an annotation, and a
    run must not fail for want of one.
    """
    try:
        engine = str(_spec_value(m, "engine", "vllm"))
        if not engine_info(engine).has_weights:  # the fake: no model config to read the attention from
            return {}
        sms, source = _run_sms(m) if engine_info(engine).cost_model else (None, "not used by the hf engine")
        rule = rule_and_source(True)[1] if engine_info(engine).cost_model else "hard conditions (hf engine)"
        return {"rule": rule, "num_sms": sms, "sms_source": source, "cells": predict_cells(m, num_sms=sms)}
    except Exception:  # noqa: BLE001 - see docstring
        return {}
