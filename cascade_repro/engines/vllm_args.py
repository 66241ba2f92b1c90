"""The vLLM engine's arguments that are not the arms': the names this vLLM's ``EngineArgs`` takes
(``engine_arg_names``), the wave size it must hold (``MIN_DEFAULT_MAX_NUM_SEQS``), the context length
the run needs (``auto_max_model_len``) and the memory of engines side by side on one GPU
(``apply_gpu_share``). The engine itself (``engines/vllm.py``) builds its keyword arguments with these.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from cascade_repro.engines.base import ModelLoader
from cascade_repro.rundir import layout, manifest

MIN_DEFAULT_MAX_NUM_SEQS = 256


def engine_arg_names() -> set[str]:
    """The fields of the installed vLLM's ``EngineArgs``."""
    from vllm.engine.arg_utils import EngineArgs

    try:
        return {f.name for f in dataclasses.fields(EngineArgs)}
    except TypeError:
        import inspect

        return set(inspect.signature(EngineArgs).parameters)


def auto_max_model_len(run_dir: Path, spec: Any, models: ModelLoader, model_path: str) -> int | None:
    """Longest rendered prompt + max_tokens + 1, rounded up to 256 (None: vLLM's default)."""
    try:
        from cascade_repro.prompts.chat import measure_prefix

        run = manifest.read_manifest(run_dir)
        tok = models.load_tokenizer(model_path, bool(spec.trust_remote_code))
        rendered = measure_prefix(
            tok, run.prompt_set.system_prompt_text, layout.read_prompts(run_dir)
        ).rendered
        need = max(len(r) for r in rendered) + int(spec.max_tokens) + 1
        need = -(-need // 256) * 256
        limit = None
        try:
            cfg = models.load_config(model_path)
            cfg.update(spec.hf_overrides or {})
            limit = cfg.get("max_position_embeddings")
        except Exception:  # noqa: BLE001 - the limit is only a cap
            limit = None
        if isinstance(limit, int) and limit > 0 and need > limit:
            return None  # let vLLM use (and enforce) the model's own limit
        return need
    except Exception:  # noqa: BLE001 - a best-effort default; vLLM's own default is fine too
        return None


def apply_gpu_share(kwargs: dict[str, Any], names: Any, notes: dict[str, Any]) -> None:
    """Engines side by side on one GPU: the budget the runner computed for this one
    (plan/packing.py), its KV cache in bytes and its share of the GPU. Absent in a run of one
    engine per GPU, and where the user set --gpu-memory-utilization (theirs is kept)."""
    from cascade_repro.engines import GPU_SHARE_ENV, KV_BUDGET_ENV

    if share := os.environ.get(GPU_SHARE_ENV):
        kwargs["gpu_memory_utilization"] = float(share)
    if kv := os.environ.get(KV_BUDGET_ENV):
        if "kv_cache_memory_bytes" in names:
            kwargs["kv_cache_memory_bytes"] = int(kv)
        else:
            notes["kv_cache_memory_bytes"] = (
                "not an EngineArgs field in this vLLM: the GPU share alone bounds it"
            )
