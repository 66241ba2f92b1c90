"""The registry's data: every built-in entry (``CASCADE``, ``PREFIX_CACHING``, ... and the
parameterised families' builders), each with its own effect reader and prediction, and the
registry's tables (``FIXED``, ``PARAMETERISED``, ``FAMILIES``, ``PAIR_KINDS``, ``SPELLINGS``), which
``twin/names.py`` keeps up to date in place as entries are registered. Standard library only."""

from __future__ import annotations

import re
from typing import Any

from cascade_repro.twin.axis import (
    DEFAULT_MAX_CAPTURE,
    CellFacts,
    TwinAxis,
    WaveFacts,
    effect_record,
)

# --- what proves each setting took effect, and where it will -------------------------------------
# Observed as vLLM ran: prefix-caching, the prompt tokens served from the cache
# (RequestOutput.num_cached_tokens); chunked-prefill, the scheduler's partial prefills; cuda-graphs,
# the steps the model runner ran through a CUDA graph; async-scheduling, the steps an AsyncScheduler
# scheduled (the probe's hooks, vllm_surface). The others count the wave's decode tokens when what
# the workers report holds: every attention layer built for an FP8 KV cache of 1-byte elements; the
# backend's implementation class in every worker; the TP world size; the wave's requests in one
# scheduler step (batch). Where a hook does not exist in the installed vLLM (0.10.2 has no graph
# point), the read-back config stands in and the evidence says ``observed: False``. 0 comes with
# what was read.


def _count(d: dict[str, Any], key: str) -> int:
    return int(d.get(key, 0) or 0)


def _prefix_effect(tw: TwinAxis, f: WaveFacts) -> dict[str, Any]:
    cached = f.cached_tokens
    ev = {"num_cached_tokens": cached, "enable_prefix_caching": f.readback.get("enable_prefix_caching")}
    return effect_record(tw, cached, ev, "" if cached else "no prompt token came from the prefix cache")


def _prefix_prediction(tw: TwinAxis, c: CellFacts) -> tuple[str, str]:
    prefix, block = c.shared_prefix, c.block_size
    if prefix is None:
        return "?", "shared prefix not measured"
    if prefix >= block:
        return (
            "yes",
            f"shared prefix {prefix} tokens >= one {block}-token block: {prefix // block * block} cached",
        )
    return "no", f"shared prefix {prefix} tokens < one {block}-token block: nothing to hit"


def _chunk_effect(tw: TwinAxis, f: WaveFacts) -> dict[str, Any]:
    rb, agg = f.readback, f.counters
    chunks = _count(agg, "prefill_chunks")
    ev = {"prefill_chunks": chunks, "sched_steps": _count(agg, "sched_steps"),
          "max_num_batched_tokens": rb.get("max_num_batched_tokens")}  # fmt: skip
    why = "" if chunks else (
        f"every prompt fit the step budget (max_num_batched_tokens={rb.get('max_num_batched_tokens')})"
        if ev["sched_steps"] else "the probe saw no scheduler step (its Scheduler hook did not run)"
    )  # fmt: skip
    return effect_record(tw, chunks, ev, why)


def _chunk_prediction(tw: TwinAxis, c: CellFacts) -> tuple[str, str]:
    if not c.prompt_lens:
        return "?", "prompt lengths not measured"
    wave = sum(sorted(c.prompt_lens, reverse=True)[: c.batch])
    if wave > CHUNK_TOKENS:
        return "yes", f"a wave's prompts hold up to {wave} tokens > the {CHUNK_TOKENS}-token step budget"
    return "no", f"a wave's prompts hold {wave} tokens <= the {CHUNK_TOKENS}-token step budget"


def _graphs_on(mode: Any, eager: Any) -> bool:
    return eager is not True and str(mode or "").upper() not in ("NONE", "CUDAGRAPHMODE.NONE", "0", "")


def _graphs_effect(tw: TwinAxis, f: WaveFacts) -> dict[str, Any]:
    rb, agg, batch = f.readback, f.counters, f.batch
    sizes = rb.get("cudagraph_capture_sizes") or []
    top = max(sizes) if isinstance(sizes, list) and sizes else None
    on_cfg = _graphs_on(rb.get("cudagraph_mode"), rb.get("enforce_eager"))
    ev = {"cudagraph_mode": rb.get("cudagraph_mode"), "enforce_eager": rb.get("enforce_eager"),
          "largest_captured_batch": top}  # fmt: skip
    cfg_why = (
        f"batch {batch} is above the largest captured size {top}: decode ran eager"
        if top is not None and batch > top else "the engine runs eager (CUDA-graph mode off)"
    )  # fmt: skip
    if rb.get("graph_hook"):
        # Observed: the steps the model runner ran through a CUDA graph (vllm_surface's graph points).
        full, pw = _count(agg, "graph_full_steps"), _count(agg, "graph_piecewise_steps")
        ev.update(
            graph_full_steps=full,
            graph_piecewise_steps=pw,
            graph_eager_steps=_count(agg, "graph_eager_steps"),
        )
        why = "" if full + pw else (cfg_why if not on_cfg or (top is not None and batch > top)
                                    else "no step of the wave ran through a CUDA graph")  # fmt: skip
        return effect_record(tw, full + pw, ev, why)
    # No graph point in this vLLM (0.10.2): the decode tokens under the read-back mode.
    ok = on_cfg and (top is None or batch <= top)
    ev["observed"] = False
    return effect_record(tw, f.tokens if ok else 0, ev, "" if ok else cfg_why)


def _graphs_prediction(tw: TwinAxis, c: CellFacts) -> tuple[str, str]:
    top = max(c.captured) if c.captured else DEFAULT_MAX_CAPTURE
    if c.batch <= top:
        return "yes", f"batch {c.batch} <= the largest captured size {top}"
    return "no", f"batch {c.batch} > the largest captured size {top}: decode runs eager"


def _async_effect(tw: TwinAxis, f: WaveFacts) -> dict[str, Any]:
    rb, agg = f.readback, f.counters
    ev = {"async_scheduling": rb.get("async_scheduling")}
    if rb.get("scheduler_hook") and _count(agg, "sched_steps"):
        # Observed: steps scheduled by the AsyncScheduler (what async_scheduling=True installs).
        n = _count(agg, "async_sched_steps")
        ev.update(async_sched_steps=n, sched_steps=int(agg["sched_steps"]))
        return effect_record(tw, n, ev, "" if n else "no step was scheduled by vLLM's AsyncScheduler")
    ok = rb.get("async_scheduling") is True
    ev["observed"] = False
    return effect_record(tw, f.tokens if ok else 0, ev,
                         "" if ok else "the engine's scheduler config has async_scheduling off")  # fmt: skip


def _kv_fp8_effect(tw: TwinAxis, f: WaveFacts) -> dict[str, Any]:
    rb, tokens = f.readback, f.tokens
    ev = {"kv_cache_dtype": rb.get("kv_cache_dtype")}
    layers, sizes = rb.get("layer_kv_cache_dtypes") or [], rb.get("kv_cache_element_bytes") or []
    if layers:
        # Observed in every worker: each attention layer built for fp8, its cache in 1-byte elements.
        ev.update(layer_kv_cache_dtypes=layers, kv_cache_tensor_dtypes=rb.get("kv_cache_tensor_dtypes") or [],
                  kv_cache_element_bytes=sizes)  # fmt: skip
        ok = all(str(d).lower().startswith("fp8") for d in layers) and (not sizes or sizes == [1])
        why = "" if ok else (f"the layers' KV cache is {', '.join(map(str, layers))} "
                             f"({', '.join(map(str, sizes)) or '?'} bytes per element), not fp8")  # fmt: skip
        return effect_record(tw, tokens if ok else 0, ev, why)
    ok = str(rb.get("kv_cache_dtype") or "").lower().startswith("fp8")
    ev["observed"] = False
    return effect_record(tw, tokens if ok else 0, ev,
                         "" if ok else f"the KV cache is {rb.get('kv_cache_dtype')}, not fp8")  # fmt: skip


def backend_matches(backend: Any, classes: list[str]) -> bool:
    """Whether an attention implementation class is the named backend's (FLASH_ATTN is
    FlashAttentionImpl, FLASHINFER FlashInferImpl, TRITON_ATTN TritonAttentionImpl)."""
    want = str(backend or "").lower().replace("_", "")
    return bool(want) and any(c.lower().replace("attention", "attn").startswith(want) for c in classes)


def _backend_effect(tw: TwinAxis, f: WaveFacts) -> dict[str, Any]:
    classes = list(f.readback.get("attn_impl_classes") or [])
    ok = backend_matches(tw.test_value, classes)
    return effect_record(tw, f.tokens if ok else 0, {"attn_impl_classes": classes},
                         "" if ok else f"the layers run {', '.join(classes) or 'an unknown class'}, "
                         f"not {tw.test_value}'s")  # fmt: skip


def _tp_effect(tw: TwinAxis, f: WaveFacts) -> dict[str, Any]:
    size = f.readback.get("tp_world_size")
    ok = size == tw.test_value
    return effect_record(tw, f.tokens if ok and f.arm == tw.test else 0, {"tp_world_size": size},
                         "" if ok else f"the workers joined a TP group of {size}")  # fmt: skip


def _tp_prediction(tw: TwinAxis, c: CellFacts) -> tuple[str, str]:
    if c.gpus is None:
        return "?", f"needs {tw.gpus} GPUs; none counted here"
    if c.gpus >= tw.gpus:
        return "yes", f"{c.gpus} GPUs visible for TP {tw.test_value}"
    return "no", f"TP {tw.test_value} needs {tw.gpus} GPUs, {c.gpus} visible (matrix refuses it)"


def _batch_effect(tw: TwinAxis, f: WaveFacts) -> dict[str, Any]:
    if f.readback.get("scheduler_hook") and _count(f.counters, "sched_steps"):
        # Observed: the most requests vLLM's scheduler put in one step of the wave.
        most = _count(f.counters, "max_sched_reqs")
        ok = most == tw.test_value
        why = (
            ""
            if ok or f.arm != tw.test
            else f"at most {most} of the wave's {f.batch} requests ran in one step"
        )
        return effect_record(tw, f.tokens if ok else 0, {"batch": f.batch, "max_sched_reqs": most}, why)
    ok = f.batch == tw.test_value
    return effect_record(tw, f.tokens if ok else 0, {"batch": f.batch, "observed": False})


def _batch_prediction(tw: TwinAxis, c: CellFacts) -> tuple[str, str]:
    return "yes", f"every wave runs {c.batch} requests at once"


# vLLM's cascade attention on (disable_cascade_attn=False, or the hf engine's reference cascade)
# against the same engine with it off.
CASCADE = TwinAxis(
    name="cascade",
    family="cascade",
    test="cascade",
    ref="flat",
    test_label="cascade (test)",
    ref_label="flat (ref)",
    summary="cascade attention on (disable_cascade_attn=False) vs forced off in the same engine",
    toggle=True,
    ref_args=(("disable_cascade_attn", True),),
    effect="cascade_steps",
    effect_doc="steps vLLM ran with cascade attention (the plugin counts its decisions)",
    engines=("vllm", "hf", "fake"),
)

# A prefill chunk small enough that every rendered prompt of the built-in sets (a system prompt of
# a few hundred tokens and the question) is cut into several chunks; vLLM needs it >= max_num_seqs,
# which the engine sets to the largest batch for both arms of this twin.
CHUNK_TOKENS = 128

PREFIX_CACHING = TwinAxis(
    name="prefix-caching",
    family="prefix-caching",
    test="prefix-on",
    ref="prefix-off",
    test_label="prefix caching (test)",
    ref_label="no prefix caching (ref)",
    summary="enable_prefix_caching=True (the shared prefix served from the cache) vs False",
    test_args=(("enable_prefix_caching", True), ("disable_cascade_attn", True)),
    ref_args=(("enable_prefix_caching", False), ("disable_cascade_attn", True)),
    effect="prefix_hits",
    effect_doc="prompt tokens served from the prefix cache (RequestOutput.num_cached_tokens)",
    reader=_prefix_effect,
    predictor=_prefix_prediction,
)

CHUNKED_PREFILL = TwinAxis(
    name="chunked-prefill",
    family="chunked-prefill",
    test="chunked",
    ref="unchunked",
    test_label="chunked prefill (test)",
    ref_label="whole prefill (ref)",
    summary=f"max_num_batched_tokens={CHUNK_TOKENS} (every prompt prefilled in chunks) vs vLLM's default budget",
    test_args=(("enable_chunked_prefill", True), ("max_num_batched_tokens", CHUNK_TOKENS),
               ("disable_cascade_attn", True)),
    ref_args=(("disable_cascade_attn", True),),
    effect="prefill_chunks",
    effect_doc="prefill steps that ran part of a request's prompt (scheduled < prompt left)",
    reader=_chunk_effect,
    predictor=_chunk_prediction,
)  # fmt: skip

CUDA_GRAPHS = TwinAxis(
    name="cuda-graphs",
    family="cuda-graphs",
    test="graphs",
    ref="eager",
    test_label="CUDA graphs (test)",
    ref_label="eager (ref)",
    summary="decode steps replayed from CUDA graphs vs enforce_eager=True",
    test_args=(("enforce_eager", False), ("disable_cascade_attn", True)),
    ref_args=(("enforce_eager", True), ("disable_cascade_attn", True)),
    effect="graph_steps",
    effect_doc="steps the model runner ran through a CUDA graph (a FULL replay or PIECEWISE graphs; the "
    "engine's config stands in where the vLLM has no such hook)",
    reader=_graphs_effect,
    predictor=_graphs_prediction,
)

ASYNC_SCHEDULING = TwinAxis(
    name="async-scheduling",
    family="async-scheduling",
    test="async",
    ref="sync",
    test_label="async scheduling (test)",
    ref_label="sync scheduling (ref)",
    summary="async_scheduling=True (the next step scheduled while one runs) vs False",
    test_args=(("async_scheduling", True), ("disable_cascade_attn", True)),
    ref_args=(("async_scheduling", False), ("disable_cascade_attn", True)),
    effect="config",
    effect_doc="steps scheduled by vLLM's async scheduler (AsyncScheduler, what async_scheduling=True installs)",
    reader=_async_effect,
)

KV_CACHE_FP8 = TwinAxis(
    name="kv-cache-dtype=fp8",
    family="kv-cache-dtype",
    test="kv-fp8",
    ref="kv-auto",
    test_label="FP8 KV cache (test)",
    ref_label="model-dtype KV cache (ref)",
    summary="kv_cache_dtype=fp8 vs the model's dtype (auto): lossy by design, a difference is expected",
    test_args=(("kv_cache_dtype", "fp8"), ("disable_cascade_attn", True)),
    ref_args=(("kv_cache_dtype", "auto"), ("disable_cascade_attn", True)),
    effect="config",
    effect_doc="decode tokens generated with every attention layer's KV cache fp8, stored in 1-byte elements "
    "(read from every worker)",
    reader=_kv_fp8_effect,
    expected_change=True,
)

# Attention backends as vLLM's AttentionBackendEnum names them; an arm's name is the lower-case
# name with the underscores dropped (``flashinfer``, ``tritonattn``), prefixed ``attn-``.
BACKEND = re.compile(r"[A-Z][A-Z0-9_]*")


def _backend_twin(a: str, b: str) -> TwinAxis:
    def arm(x: str) -> str:
        return "attn-" + x.lower().replace("_", "")

    return TwinAxis(
        name=f"attention-backend={a}:{b}",
        family="attention-backend",
        test=arm(b),
        ref=arm(a),
        test_label=f"{b} (test)",
        ref_label=f"{a} (ref)",
        summary=f"attention backend {b} vs {a}",
        test_args=(("disable_cascade_attn", True),),
        ref_args=(("disable_cascade_attn", True),),
        axis="backend",
        test_value=b,
        ref_value=a,
        effect="config",
        effect_doc="decode tokens generated with the test backend's implementation class in the model's layers "
        "(read back from every worker through the plugin)",
        reader=_backend_effect,
    )


def _tp_twin(a: int, b: int) -> TwinAxis:
    return TwinAxis(
        name=f"tp={a}:{b}",
        family="tp",
        test=f"tp{b}",
        ref=f"tp{a}",
        test_label=f"TP {b} (test)",
        ref_label=f"TP {a} (ref)",
        summary=f"tensor_parallel_size={b} vs {a}",
        test_args=(("disable_cascade_attn", True),),
        ref_args=(("disable_cascade_attn", True),),
        axis="tp",
        test_value=b,
        ref_value=a,
        effect="config",
        effect_doc="decode tokens generated in a TP group of the test arm's size (read back from every worker)",
        reader=_tp_effect,
        predictor=_tp_prediction,
        gpus=max(a, b),
    )


def _batch_twin(a: int, b: int) -> TwinAxis:
    return TwinAxis(
        name=f"batch={a}:{b}",
        family="batch",
        test=f"batch{b}",
        ref=f"batch{a}",
        test_label=f"batch {b} (test)",
        ref_label=f"batch {a} (ref)",
        summary=f"each prompt in a wave of {b} concurrent requests vs of {a} (batch invariance)",
        toggle=True,
        test_args=(("disable_cascade_attn", True),),
        ref_args=(("disable_cascade_attn", True),),
        axis="batch",
        test_value=b,
        ref_value=a,
        effect="config",
        effect_doc=f"decode tokens (the fake engine: steps) of waves whose scheduler ran {b} requests in one step",
        reader=_batch_effect,
        predictor=_batch_prediction,
        engines=("vllm", "hf", "fake"),
    )


FIXED: dict[str, TwinAxis] = {
    t.name: t for t in (CASCADE, PREFIX_CACHING, CHUNKED_PREFILL, CUDA_GRAPHS, ASYNC_SCHEDULING, KV_CACHE_FP8)
}
_BUILT_IN = frozenset(FIXED)
# The parameterised entries: how --help and errors spell them, and an example each.
PARAMETERISED = {
    "attention-backend": ("attention-backend=A:B", "attention-backend=FLASH_ATTN:FLASHINFER"),
    "tp": ("tp=A:B", "tp=1:2"),
    "batch": ("batch=1:N", "batch=1:8"),
}
# Every family, in the registry's order (a registered entry's appended); kept up to date in place.
FAMILIES: list[str] = [*(t.family for t in FIXED.values()), *PARAMETERISED]
# Every pair kind a twin gives a test cell against its twin (a live set: registering adds to it).
PAIR_KINDS: set[str] = set(FAMILIES)
# The names as --help lists them.
SPELLINGS: list[str] = [*FIXED, *(s for s, _ in PARAMETERISED.values())]
MAX_AXIS = 1 << 16
