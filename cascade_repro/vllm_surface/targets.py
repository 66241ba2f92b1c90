"""Every name in vLLM that the probe, the engine and doctor rely on, and the releases each applies to.

A target is a module-level function or class, or a member of a class (a method, a dataclass field,
or an attribute its methods set on ``self``). ``modules`` lists where it may live: the probe hooks
every place a name has lived (``WorkerWrapperBase`` moved from ``vllm/worker/`` to ``vllm/v1/worker/``),
so one of them holding it is enough. ``applies`` says on which releases it must exist (cascade only
where the release has cascade; the V1 model runner's graph point only where that runner exists).

``tests/vllm_surface/test_targets.py`` checks every target against the source recorded from every
release in ``RELEASES`` (``tests/data/vllm-surface-<version>.json``); ``doctor`` checks the module
functions, classes and methods of the installed vLLM's release by importing them.

Standard library only, like the rest of this package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cascade_repro.vllm_surface import (
    FLASH_ATTN_MODULE,
    RELEASES,
    SCHEDULER_MODULE,
    V1_GRAPH_DECISION,
    V1_RUNNER_MODULE,
    V2_GRAPHS_MODULE,
    WORKER_BASE_MODULES,
    Release,
    version_tuple,
)

# When a target must exist, by the release's facts.
APPLIES: dict[str, Callable[[Release], bool]] = {
    "always": lambda r: True,
    "has cascade": lambda r: r.has_cascade,
    "v1 runner": lambda r: "v1" in r.model_runners.split("+"),
    "v2 runner": lambda r: "v2" in r.model_runners.split("+"),
    # The V1 runner's one decision point for a step's graph mode (0.10.2 dispatches inline).
    "v1 graph decision": lambda r: "v1" in r.model_runners.split("+") and version_tuple(r.version) >= (0, 26, 0),
    "attention_config": lambda r: r.attention_via == "attention_config",
}  # fmt: skip


@dataclass(frozen=True)
class Target:
    """One name the harness reaches into vLLM for."""

    modules: tuple[str, ...]
    # "fn" (a module-level function, or a name the module imports: merge_attn_states), "class", or
    # "Class.member" written as the name with kind "member".
    name: str
    kind: str
    # Parameters the caller passes or reads by name (a subset of the function's own).
    params: tuple[str, ...] = ()
    applies: str = "always"
    why: str = ""

    @property
    def label(self) -> str:
        return f"{self.modules[0]}.{self.name}"

    def applies_to(self, release: Release) -> bool:
        return APPLIES[self.applies](release)


def _t(module: str | tuple[str, ...], name: str, kind: str, why: str, applies: str = "always",
       params: tuple[str, ...] = ()) -> Target:  # fmt: skip
    return Target((module,) if isinstance(module, str) else module, name, kind, params, applies, why)


ATTENTION_LAYER = ("vllm.model_executor.layers.attention.attention", "vllm.attention.layer")
CONFIG = "vllm.config"  # 0.10.2 keeps ModelConfig and VllmConfig in vllm/config/__init__.py
_FA = FLASH_ATTN_MODULE
_SCHED = SCHEDULER_MODULE

TARGETS: tuple[Target, ...] = (
    # --- the probe: cascade (vllm_surface/probe_cascade.py patch_flash_attn) ---
    _t(_FA, "use_cascade_attention", "fn", "the cascade decision, counted and forced", "has cascade",
       ("common_prefix_len", "query_lens")),
    _t(_FA, "cascade_attention", "fn", "cascade executions, fa_version and decode shapes", "has cascade",
       ("common_prefix_len", "max_kv_len", "cu_query_lens", "max_query_len", "fa_version")),
    _t(_FA, "merge_attn_states", "fn", "the LSE faults inside cascade (imported name)", "has cascade"),
    _t(_FA, "FlashAttentionMetadataBuilder.use_cascade_attention", "member",
       "the model runner's call that reaches the module function", "has cascade"),
    _t(_FA, "FlashAttentionImpl.__init__", "member", "the FlashAttention version each layer uses"),
    _t(_FA, "FlashAttentionImpl.vllm_flash_attn_version", "member", "read after __init__"),
    # --- the probe: every twin (vllm_surface/probe_steps.py, probe_worker.py) ---
    _t(WORKER_BASE_MODULES, "WorkerWrapperBase", "class", "gains the sync and facts methods for collective_rpc"),
    _t(WORKER_BASE_MODULES, "WorkerWrapperBase.worker", "member", "worker_facts reaches the model runner"),
    _t("vllm.v1.worker.gpu_worker", "Worker.model_runner", "member", "worker_facts reaches the model"),
    _t(V1_RUNNER_MODULE, "GPUModelRunner.get_model", "member", "the attention layers (V1 runner)", "v1 runner"),
    _t("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.get_model", "member", "the attention layers (V2 runner)",
       "v2 runner"),
    _t(V1_RUNNER_MODULE, f"GPUModelRunner.{V1_GRAPH_DECISION}", "member",
       "each step's CUDA-graph mode (cuda-graphs twin, V1 runner)", "v1 graph decision"),
    _t(V2_GRAPHS_MODULE, "CudaGraphManager.run_fullgraph", "member", "FULL graph replays (cuda-graphs twin, V2)",
       "v2 runner"),
    _t(V2_GRAPHS_MODULE, "CudaGraphManager.run_pw_graph", "member", "PIECEWISE graph steps (cuda-graphs twin, V2)",
       "v2 runner"),
    _t(_SCHED, "Scheduler.schedule", "member", "steps, prefill chunks, requests per step"),
    _t(_SCHED, "Scheduler.requests", "member", "each request's computed and prompt tokens"),
    _t("vllm.v1.core.sched.async_scheduler", "AsyncScheduler", "class", "the async-scheduling twin's scheduler"),
    _t("vllm.v1.core.sched.output", "SchedulerOutput.num_scheduled_tokens", "member", "tokens per request a step"),
    _t("vllm.v1.request", "Request.num_computed_tokens", "member", "a request's prefill progress"),
    _t("vllm.v1.request", "Request.num_prompt_tokens", "member", "a request's prompt length"),
    _t(ATTENTION_LAYER, "Attention.impl", "member", "the implementation class each layer runs"),
    _t(ATTENTION_LAYER, "Attention.kv_cache_dtype", "member", "the KV cache dtype each layer was built with"),
    _t(ATTENTION_LAYER, "Attention.kv_cache", "member", "the bound KV cache tensor (dtype, bytes per element)"),
    _t(_FA, "FlashAttentionImpl.forward", "member", "the out-scale positive control", params=("output",)),
    _t("vllm.v1.attention.backends.triton_attn", "TritonAttentionImpl.forward", "member",
       "the out-scale positive control", params=("output",)),
    _t("vllm.v1.attention.backends.flashinfer", "FlashInferImpl.forward", "member",
       "the out-scale positive control", params=("output",)),
    _t("vllm.distributed.parallel_state", "get_tensor_model_parallel_world_size", "fn", "the tp twin's proof"),
    _t("vllm.plugins", "load_general_plugins", "fn", "loads the probe in every vLLM process"),
    # --- the engine (engines/vllm.py) ---
    _t("vllm.entrypoints.llm", "LLM.generate", "member", "the waves", params=("prompts", "sampling_params", "use_tqdm")),
    _t("vllm.entrypoints.llm", "LLM.collective_rpc", "member", "the probe's sync and facts",
       params=("method", "timeout", "args")),
    _t("vllm.entrypoints.llm", "LLM.reset_prefix_cache", "member", "a clean prefix cache before every wave"),
    _t("vllm.entrypoints.llm", "LLM.get_tokenizer", "member", "the completions' text"),
    _t("vllm.entrypoints.llm", "LLM.llm_engine", "member", "the config read back"),
    _t("vllm.v1.engine.llm_engine", "LLMEngine.vllm_config", "member", "the config read back"),
    _t("vllm.v1.engine.llm_engine", "LLMEngine.engine_core", "member", "shutdown"),
    _t("vllm.outputs", "RequestOutput.num_cached_tokens", "member", "the prefix-caching twin's proof"),
    _t("vllm.outputs", "RequestOutput.outputs", "member", "the completions"),
    _t("vllm.outputs", "CompletionOutput.token_ids", "member", "the completions"),
    _t("vllm.outputs", "CompletionOutput.logprobs", "member", "the completions"),
    _t("vllm.outputs", "CompletionOutput.finish_reason", "member", "the completions"),
    _t("vllm.inputs", "TokensPrompt", "fn", "token-id prompts (imported into vllm.inputs)"),
    _t("vllm.distributed.parallel_state", "destroy_model_parallel", "fn", "close"),
    _t("vllm.distributed.parallel_state", "destroy_distributed_environment", "fn", "close"),
    _t(("vllm.config.vllm", CONFIG), "VllmConfig.model_config", "member", "read back"),
    _t(("vllm.config.vllm", CONFIG), "VllmConfig.cache_config", "member", "read back"),
    _t(("vllm.config.vllm", CONFIG), "VllmConfig.scheduler_config", "member", "read back"),
    _t(("vllm.config.vllm", CONFIG), "VllmConfig.compilation_config", "member", "read back"),
    _t(("vllm.config.vllm", CONFIG), "VllmConfig.parallel_config", "member", "read back"),
    _t(("vllm.config.vllm", CONFIG), "VllmConfig.attention_config", "member", "read back", "attention_config"),
    _t("vllm.config.cache", "CacheConfig.cache_dtype", "member", "the kv-cache-dtype twin's config"),
    _t("vllm.config.cache", "CacheConfig.enable_prefix_caching", "member", "read back"),
    _t("vllm.config.cache", "CacheConfig.block_size", "member", "read back"),
    _t("vllm.config.scheduler", "SchedulerConfig.async_scheduling", "member", "read back"),
    _t("vllm.config.scheduler", "SchedulerConfig.max_num_batched_tokens", "member", "the chunked-prefill budget"),
    _t("vllm.config.scheduler", "SchedulerConfig.max_num_seqs", "member", "read back"),
    _t("vllm.config.compilation", "CompilationConfig.cudagraph_mode", "member", "the cuda-graphs twin's config"),
    _t("vllm.config.compilation", "CompilationConfig.cudagraph_capture_sizes", "member", "the largest graph"),
    _t("vllm.config.parallel", "ParallelConfig.tensor_parallel_size", "member", "read back"),
    _t(("vllm.config.model", CONFIG), "ModelConfig.enforce_eager", "member", "read back"),
    _t(("vllm.config.model", CONFIG), "ModelConfig.max_model_len", "member", "read back"),
    _t(("vllm.config.model", CONFIG), "ModelConfig.disable_cascade_attn", "member", "read back"),
    _t("vllm.config.attention", "AttentionConfig.backend", "member", "read back", "attention_config"),
    _t("vllm.config.attention", "AttentionConfig.flash_attn_version", "member", "read back", "attention_config"),
    # --- doctor ---
    _t("vllm.vllm_flash_attn.flash_attn_interface", "is_fa_version_supported", "fn", "FlashAttention versions"),
    _t("vllm.vllm_flash_attn.flash_attn_interface", "fa_version_unsupported_reason", "fn", "why not"),
    _t(("vllm.v1.attention.backends.fa_utils", "vllm.attention.utils.fa_utils"), "get_flash_attn_version", "fn",
       "the default FlashAttention version"),
)  # fmt: skip


def for_release(release: Release) -> list[Target]:
    """The targets that must exist in ``release``."""
    return [t for t in TARGETS if t.applies_to(release)]


def find(surface: dict, target: Target) -> str | None:
    """Where a recorded surface (``record_surface.py``'s ``modules``) holds ``target``: the module's
    name, or None. A member counts as a method, a class field or an attribute set on ``self``."""
    for module in target.modules:
        m = surface.get(module)
        if m is None:
            continue
        if target.kind == "fn":
            params = m["functions"].get(target.name)
            if params is not None and set(target.params) <= set(params):
                return module
            if params is None and not target.params and target.name in m["imports"]:
                return module
        elif target.kind == "class":
            if target.name in m["classes"]:
                return module
        else:
            cls, _, member = target.name.partition(".")
            c = m["classes"].get(cls)
            if c is None:
                continue
            params = c["methods"].get(member)
            if params is not None and set(target.params) <= set(params):
                return module
            if params is None and not target.params and (member in c["fields"] or member in c["attrs"]):
                return module
    return None


def missing(surface: dict, release: Release) -> list[str]:
    """The labels of the targets ``release`` should hold and its recorded surface lacks."""
    return [t.label for t in for_release(release) if find(surface, t) is None]


def importable(release: Release) -> list[Target]:
    """The targets of ``release`` that doctor can check by import: module functions, classes and
    class methods (fields and ``self`` attributes exist only on instances)."""
    return [t for t in for_release(release) if t.kind in ("fn", "class") or t.name.endswith(_METHOD_SUFFIXES)]


# Members that are methods (checked with getattr on the class); the rest are instance attributes.
_METHOD_SUFFIXES = (
    ".use_cascade_attention", ".__init__", ".forward", ".get_model", f".{V1_GRAPH_DECISION}", ".run_fullgraph",
    ".run_pw_graph", ".schedule", ".generate", ".collective_rpc", ".reset_prefix_cache", ".get_tokenizer",
)  # fmt: skip

__all__ = ["RELEASES", "TARGETS", "Target", "find", "for_release", "importable", "missing"]
