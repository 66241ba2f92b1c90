"""The vLLM engine's proofs of effect: what the engine says it runs with (``read_back``: its config
and every model worker's facts through the probe) and a wave's proof that the twin's setting took
effect (``wave_effect``, the twin entry's own reader over them); ``jsonable`` turns vLLM's config
values into run.json's.
"""

from __future__ import annotations

from typing import Any

from cascade_repro import twin as twins
from cascade_repro import vllm_surface
from cascade_repro.engines.base import Completion
from cascade_repro.vllm_surface import probe

RPC_TIMEOUT_S = 120.0


def jsonable(v: Any) -> Any:
    """A vLLM config value as run.json holds it: enums by name, dtypes without ``torch.``."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple, set)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    name = getattr(v, "name", None)  # enums
    if isinstance(name, str):
        return name
    return str(v).replace("torch.", "")


def read_back(llm: Any, start_facts: dict[str, Any]) -> dict[str, Any]:
    """What the engine says it runs with, for a twin's proof of effect: its config (KV cache
    dtype, async scheduling, CUDA-graph mode, the step budget, prefix caching, TP size) and,
    from every model worker (the probe's facts RPC), the attention implementation classes its
    layers were built with and the TP world size it joined."""
    cfg = llm.llm_engine.vllm_config
    mc, pc, cc = cfg.model_config, cfg.parallel_config, cfg.cache_config
    sc = getattr(cfg, "scheduler_config", None)
    comp = getattr(cfg, "compilation_config", None)
    out: dict[str, Any] = {
        "kv_cache_dtype": jsonable(getattr(cc, "cache_dtype", None)),
        "enable_prefix_caching": getattr(cc, "enable_prefix_caching", None),
        "async_scheduling": getattr(sc, "async_scheduling", None),
        "max_num_batched_tokens": getattr(sc, "max_num_batched_tokens", None),
        "enforce_eager": getattr(mc, "enforce_eager", None),
        "cudagraph_mode": jsonable(getattr(comp, "cudagraph_mode", None)),
        "cudagraph_capture_sizes": jsonable(getattr(comp, "cudagraph_capture_sizes", None)),
        "tensor_parallel_size": getattr(pc, "tensor_parallel_size", None),
    }
    try:
        facts = llm.collective_rpc(probe.FACTS_METHOD, timeout=RPC_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - the facts are evidence, not a requirement to run
        out["workers_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        facts = []
    facts = [f for f in facts or [] if isinstance(f, dict)]
    out["attn_impl_classes"] = sorted({c for f in facts for c in f.get("attn_impl_classes", [])})
    out["model_runner"] = sorted({f["model_runner"] for f in facts if f.get("model_runner")})
    for key in ("layer_kv_cache_dtypes", "kv_cache_tensor_dtypes", "kv_cache_element_bytes"):
        out[key] = sorted({x for f in facts for x in f.get(key, [])})
    # Which of the probe's step hooks run in this vLLM: where one does not, its twin's proof
    # falls back to the config read back above (wave_effect).
    patched = start_facts.get("patched", [])
    out["graph_hook"] = any(vllm_surface.V1_GRAPH_DECISION in p or "CudaGraphManager." in p for p in patched)
    out["scheduler_hook"] = any(p.endswith("Scheduler.schedule") for p in patched)
    sizes = sorted({f["tp_world_size"] for f in facts if isinstance(f.get("tp_world_size"), int)})
    out["tp_world_size"] = sizes[0] if len(sizes) == 1 else (sizes or None)
    return jsonable(out)


def wave_effect(
    tw: twins.TwinAxis,
    arm: str,
    rb: dict[str, Any],
    outs: list[Any],
    comps: list[Completion],
    agg: dict[str, Any],
) -> dict[str, Any]:
    """A wave's proof of effect for twin ``tw`` on ``arm`` (the entry's own reader, twin/entries.py), from the
    engine's read-back config ``rb``, vLLM's outputs and the probe's counters of the wave."""
    facts = twins.WaveFacts(
        arm=arm,
        readback=rb,
        counters=agg,
        tokens=sum(len(c.token_ids) for c in comps),
        batch=len(comps),
        cached_tokens=sum(int(getattr(o, "num_cached_tokens", 0) or 0) for o in outs),
    )
    return tw.wave_effect(facts)
