"""The probe's methods on vLLM's ``WorkerWrapperBase``, which the engine calls on every worker through
``LLM.collective_rpc``: the sync (a wave's counters, and the next control handed over), and the facts
(the model runner's class, each attention layer's implementation class and KV cache dtype, the TP
world size), which also wraps each implementation's ``forward`` with the out-scale fault.

``WorkerWrapperBase`` is ``vllm/v1/worker/worker_base.py`` (``vllm/worker/worker_base.py`` in 0.10.2,
so both are hooked); ``run_method`` resolves a method's name with ``getattr`` on the wrapper
(``vllm/v1/serial_utils.py`` and ``vllm/v1/executor/multiproc_executor.py``). Only the standard
library is imported at module level, so this file loads without vLLM or torch.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType
from typing import Any

from cascade_repro.vllm_surface import inject as inj  # standard library only, like this module
from cascade_repro.vllm_surface.probe_state import MARK, ProbeState

RPC_METHOD = "cascade_repro_probe_sync"


def patch_worker_base(module: ModuleType, state: ProbeState) -> list[str]:
    """Give ``WorkerWrapperBase`` the sync method the engine calls through ``collective_rpc``."""
    cls = module.__dict__.get("WorkerWrapperBase")
    if not isinstance(cls, type):
        return []

    def cascade_repro_probe_sync(
        self: Any, wave: str | None = None, control: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        snap = state.sync(wave, control)
        snap["rpc_rank"] = getattr(self, "rpc_rank", None)
        snap["global_rank"] = getattr(self, "global_rank", None)
        return snap

    setattr(cls, RPC_METHOD, cascade_repro_probe_sync)
    state.patched.append(f"{module.__name__}.WorkerWrapperBase.{RPC_METHOD}")
    return [RPC_METHOD]


FACTS_METHOD = "cascade_repro_probe_facts"


def _attention_layers(worker: Any) -> list[Any]:
    runner = getattr(getattr(worker, "worker", worker), "model_runner", None)
    get = getattr(runner, "get_model", None)
    model = get() if callable(get) else getattr(runner, "model", None)
    modules = getattr(model, "modules", None)
    if not callable(modules):
        return []
    return [m for m in modules() if getattr(m, "impl", None) is not None]


def _impl_classes(worker: Any) -> list[type]:
    return list({type(m.impl) for m in _attention_layers(worker)})


# AttentionImpl.forward(self, layer, query, key, value, kv_cache, attn_metadata, output, ...): the
# position of ``output`` after self, in every backend the twins use (0.26.0 to 0.34.0).
IMPL_OUTPUT_POS = 6


def wrap_impl_forward(cls: type, state: ProbeState) -> bool:
    """Scale the attention output of ``cls.forward`` by ``1 + E`` while the control says
    ``out-scale=E`` (a twin's positive control, in whatever backend runs). Python-level: a step
    replayed from a full CUDA graph keeps what was captured, so the count of scaled calls
    (``scaled_calls``) is the proof that it ran."""
    fwd = cls.__dict__.get("forward")
    if not callable(fwd) or getattr(fwd, MARK, None) is not None:
        return False
    orig = fwd

    @functools.wraps(orig)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, *args, **kwargs)
        f = state.inject
        # The buffer the layer reads the result from: the ``output`` argument where one is handed
        # over (vLLM's unified_attention_with_output ignores forward's return from 0.26.0 on), else
        # what forward returned.
        target = kwargs.get("output")
        if target is None and len(args) > IMPL_OUTPUT_POS:
            target = args[IMPL_OUTPUT_POS]
        if target is None or not hasattr(target, "mul_"):
            target = out
        if f is not None and f.kind == inj.OUT_SCALE and state.wave is not None and target is not None:
            try:
                target.mul_(1.0 + f.nats)
                state.record_scaled()
            except Exception as e:  # noqa: BLE001 - never break the forward
                state._note_error(f"out-scale: {e!r}"[:200])
        return out

    setattr(forward, MARK, orig)
    cls.forward = forward
    state.patched.append(f"{cls.__module__}.{cls.__name__}.forward")
    return True


def kv_cache_facts(layers: list[Any]) -> dict[str, Any]:
    """What the attention layers store their KV cache as: the dtype each was built with
    (``layer.kv_cache_dtype``: "auto", "fp8", ...) and the bound cache tensors' dtypes and bytes per
    element (an FP8 cache is stored in 1-byte elements, as uint8 or a float8 dtype)."""
    names: set[str] = set()
    tensors: set[str] = set()
    sizes: set[int] = set()
    for layer in layers:
        d = getattr(layer, "kv_cache_dtype", None)
        if d is not None:
            names.add(str(d))
        cache = getattr(layer, "kv_cache", None)
        for t in cache if isinstance(cache, list | tuple) else [cache]:
            if getattr(t, "numel", None) is not None and t.numel() > 0:
                tensors.add(str(t.dtype).replace("torch.", ""))
                sizes.add(int(t.element_size()))
    return {"layer_kv_cache_dtypes": sorted(names), "kv_cache_tensor_dtypes": sorted(tensors),
            "kv_cache_element_bytes": sorted(sizes)}  # fmt: skip


def worker_facts(worker: Any, state: ProbeState | None = None) -> dict[str, Any]:
    """What a model worker reads back of its own setup: its model runner's class, the attention
    implementation classes its layers were built with (any backend), what they store the KV cache as
    and the tensor-parallel world size it joined. With ``state``, each class's forward also gets the
    out-scale fault (:func:`wrap_impl_forward`)."""
    out: dict[str, Any] = {"pid": os.getpid()}
    runner = getattr(getattr(worker, "worker", worker), "model_runner", None)
    if runner is not None:
        out["model_runner"] = f"{type(runner).__module__}.{type(runner).__name__}"
    try:
        out.update(kv_cache_facts(_attention_layers(worker)))
    except Exception as e:  # noqa: BLE001 - a fact not read is reported, never raised inside vLLM
        out["kv_cache_error"] = f"{type(e).__name__}: {e}"[:200]
    try:
        classes = _impl_classes(worker)
        out["attn_impl_classes"] = sorted(c.__name__ for c in classes)
        if state is not None:
            out["out_scale_wrapped"] = sorted(c.__name__ for c in classes if wrap_impl_forward(c, state))
    except Exception as e:  # noqa: BLE001 - a fact not read is reported, never raised inside vLLM
        out["attn_impl_error"] = f"{type(e).__name__}: {e}"[:200]
    try:
        from vllm.distributed import parallel_state

        out["tp_world_size"] = int(parallel_state.get_tensor_model_parallel_world_size())
    except Exception as e:  # noqa: BLE001
        out["tp_error"] = f"{type(e).__name__}: {e}"[:200]
    return out


def patch_worker_facts(module: ModuleType, state: ProbeState) -> list[str]:
    """Give ``WorkerWrapperBase`` the facts method (:func:`worker_facts`) for ``collective_rpc``."""
    cls = module.__dict__.get("WorkerWrapperBase")
    if not isinstance(cls, type):
        return []

    def cascade_repro_probe_facts(self: Any) -> dict[str, Any]:
        return worker_facts(self, state)

    setattr(cls, FACTS_METHOD, cascade_repro_probe_facts)
    state.patched.append(f"{module.__name__}.WorkerWrapperBase.{FACTS_METHOD}")
    return [FACTS_METHOD]
