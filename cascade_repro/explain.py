"""The ``explain`` command's library side: every planned cell of a spec predicted before any GPU
time (``plan/predict.py``, by vLLM's rule in ``vllm_surface/cascade_rule.py``), and the decode
threshold per TP in words.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from cascade_repro.engines import get as engine_info
from cascade_repro.errors import UsageError
from cascade_repro.plan.predict import CellPrediction, predict
from cascade_repro.twin import CASCADE
from cascade_repro.vllm_surface import ModelAttention
from cascade_repro.vllm_surface.cascade_rule import (
    DEFAULT_BLOCK_SIZE,
    MAX_SCAN,
    MIN_COMMON_PREFIX,
    default_fa_for,
    resolve_sms,
    rule_and_source,
)


@dataclass
class Explanation:
    """Predictions for every planned cell, and the decode threshold per TP."""

    engine: str
    model: str
    attention: ModelAttention
    num_sms: int | None
    sms_source: str
    block_size: int
    shared_prefix_tokens: int
    prefix_tokens: int
    dcp_world_size: int
    rule_source: str
    cells: list[CellPrediction]
    thresholds: dict[int, dict[str, Any]]
    # A twin other than cascade: its name and, per test cell, whether its setting takes effect.
    twin: str = CASCADE.name
    twin_cells: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["thresholds"] = {str(k): v for k, v in self.thresholds.items()}
        return d

    def predictions(self) -> dict[str, dict[str, Any]]:
        return {c.cell_id: c.summary() for c in self.cells}


def threshold_lines(ex: Explanation) -> list[str]:
    """One sentence per TP: from how many concurrent requests decode steps choose cascade."""
    lines = []
    sms = f"{ex.num_sms} SMs" if ex.num_sms is not None else "an unknown SM count"
    for tp, t in sorted(ex.thresholds.items()):
        heads = f"{t['q_heads']} query / {t['kv_heads']} KV heads per GPU"
        frm = t["decode_from_batch"]
        if frm is None:
            why = (
                f"shared prefix {ex.prefix_tokens} < {MIN_COMMON_PREFIX} tokens"
                if ex.prefix_tokens < MIN_COMMON_PREFIX
                else "no batch size up to the scan limit"
                if ex.num_sms is not None
                else "pass --gpu or --sm-count"
            )
            lines.append(f"TP {tp} ({heads}): decode steps never choose cascade ({why})")
            continue
        where = f" on {sms}" if engine_info(ex.engine).cost_model else ""
        s = f"TP {tp} ({heads}): decode steps choose cascade from ≈ {frm} concurrent requests at TP {tp}{where}"
        if not t["monotone"]:
            s += " (not at every larger batch: the cost model has rounding steps)"
        lines.append(s)
        if t.get("fa2_band") is not None and not t.get("fa2_band_ranges"):
            lines.append(
                f"TP {tp}: with FA2, no batch size here runs cascade decode steps through FA2's split-KV "
                "path (the field bug's band, vLLM <= 0.11.0)"
            )
        elif t.get("fa2_band") is not None:
            lines.append(
                f"TP {tp}: with FA2, decode steps of {t['fa2_band']} concurrent requests run cascade through "
                f"FA2's split-KV path (the field bug's band, vLLM <= 0.11.0) once a request's own part "
                f"reaches {t['fa2_band_suffix']} tokens (question + max tokens)"
            )
    return lines


# ---------------------------------------------------------------------------------------------
# Entry points: from a MatrixSpec (the `explain` command) and from a run.json (the report)
# ---------------------------------------------------------------------------------------------


def explain_spec(
    spec: Any,
    *,
    gpu: str | None = None,
    sm_count: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    dcp_world_size: int = 1,
    prefix_tokens: int | None = None,
    prefer_vllm: bool = True,
    max_scan: int = MAX_SCAN,
) -> Explanation:
    """Explain a MatrixSpec: load the model config, measure the shared prefix, predict every cell.

    ``prefix_tokens`` skips tokenization (the shared prefix length, in tokens, before alignment).
    """
    from cascade_repro.plan.matrix import plan
    from cascade_repro.plan.models import load_config, resolve_model

    spec.validate()
    if len(spec.twin_axes) > 1:
        raise UsageError(
            f"explain predicts one twin at a time: give --twin one of {', '.join(t.name for t in spec.twin_axes)}"
        )
    if dcp_world_size <= 0:
        raise UsageError(f"--dcp must be positive, got {dcp_world_size}")
    if block_size <= 0:
        raise UsageError(f"--block-size must be positive, got {block_size}")
    model_path, model_name = resolve_model(spec.model)
    cfg = dict(load_config(model_path))
    if engine_info(spec.engine).is_vllm:  # vLLM applies hf_overrides to the config it reads
        cfg.update(spec.hf_overrides or {})
    attention = ModelAttention.from_config(cfg)
    suffix_lens = None
    prompt_lens = None
    if prefix_tokens is None:
        from cascade_repro.plan.models import load_tokenizer
        from cascade_repro.prompts.chat import measure_prefix
        from cascade_repro.prompts.promptsets import load_prompt_set, load_system_prompt

        pset = load_prompt_set(spec.prompts, spec.limit, spec.prompt_field, spec.key_field)
        tok = load_tokenizer(model_path, spec.trust_remote_code)
        measured = measure_prefix(tok, load_system_prompt(spec.system_prompt), pset.records)
        prefix_tokens = measured.tokens
        aligned = prefix_tokens // block_size * block_size
        suffix_lens = [len(r) - aligned for r in measured.rendered]
        prompt_lens = [len(r) for r in measured.rendered]
    elif prefix_tokens < 0:
        raise UsageError(f"--prefix-tokens must be >= 0, got {prefix_tokens}")
    num_sms, source = (
        resolve_sms(gpu, sm_count)
        if engine_info(spec.engine).cost_model
        else (None, "not used by the hf engine")
    )
    rule, rule_source = rule_and_source(prefer_vllm and engine_info(spec.engine).is_vllm)
    if not engine_info(spec.engine).cost_model:
        rule_source = "hard conditions only (the hf engine's reference cascade has no cost model)"
    cells = plan(spec).cells
    preds, thresholds = predict(
        cells, attention, engine=spec.engine, shared_prefix_tokens=prefix_tokens, suffix_lens=suffix_lens,
        num_sms=num_sms, block_size=block_size, dcp_world_size=dcp_world_size, rule=rule, max_scan=max_scan,
        max_tokens=spec.max_tokens, default_fa=default_fa_for(gpu or source),
    )  # fmt: skip
    from cascade_repro.plan.twin_effect import predict_effects

    tw = spec.twin_axis
    twin_cells = []
    if tw is not CASCADE:
        from cascade_repro.run.envinfo import visible_gpu_count

        captured = sorted({1, *spec.batch}) if spec.graphs_for_batches else None
        twin_cells = [p.to_dict() for p in predict_effects(
            tw, cells, shared_prefix=prefix_tokens, prompt_lens=prompt_lens, block_size=block_size,
            gpus=visible_gpu_count() if tw.gpus > 1 else None, captured=captured,
        )]  # fmt: skip
    return Explanation(
        engine=spec.engine, model=model_name, attention=attention, num_sms=num_sms, sms_source=source,
        block_size=block_size, shared_prefix_tokens=prefix_tokens,
        prefix_tokens=prefix_tokens // block_size * block_size, dcp_world_size=dcp_world_size,
        rule_source=rule_source, cells=preds, thresholds=thresholds, twin=tw.name, twin_cells=twin_cells,
    )  # fmt: skip


def twin_lines(ex: Explanation) -> list[str]:
    """One line per test cell of a twin other than cascade: whether its setting takes effect, and why."""
    return [
        f"{c['cell_id']}: {ex.twin} takes effect: {c['takes_effect']} ({c['why']})" for c in ex.twin_cells
    ]
