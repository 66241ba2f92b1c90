"""`--engine-args` / `-E key=value`: any vLLM engine argument, passed to both arms alike.

vLLM users describe their setup in engine arguments (``block_size``, ``max_num_batched_tokens``,
``kv_cache_dtype``, quantization, ...); lm-eval's ``--model_args`` passes any key to ``LLM(...)``.
This module parses them, refuses the few that would break the experiment or that the harness owns
(with the option to use instead), and checks every name against the installed vLLM's
``EngineArgs`` fields, or, where vLLM is not importable (``--dry-run`` on a laptop), against the
fields recorded from vLLM 0.26.0 (``tests/data/vllm-surface-0.26.0.json``; a test keeps
the two equal). Standard library only, and vLLM is imported only when arguments are given.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
from collections.abc import Iterable
from typing import Any

from cascade_repro.errors import UsageError

RECORDED_RELEASE = "0.26.0"
# EngineArgs fields of vLLM 0.26.0 (public names), recorded by scripts/old-vllm/record_surface.py.
RECORDED_FIELDS = frozenset(
    {
        "additional_config",
        "aggregate_engine_logging",
        "all2all_backend",
        "allow_deprecated_quantization",
        "allowed_local_media_path",
        "allowed_media_domains",
        "async_scheduling",
        "attention_backend",
        "attention_config",
        "block_size",
        "calculate_kv_scales",
        "code_revision",
        "collect_detailed_traces",
        "compilation_config",
        "config_format",
        "convert",
        "cp_kv_cache_interleave_size",
        "cpu_distributed_timeout_seconds",
        "cpu_offload_gb",
        "cpu_offload_params",
        "cudagraph_capture_sizes",
        "cudagraph_metrics",
        "data_parallel_address",
        "data_parallel_backend",
        "data_parallel_external_lb",
        "data_parallel_hybrid_lb",
        "data_parallel_multi_port_external_lb",
        "data_parallel_rank",
        "data_parallel_rpc_port",
        "data_parallel_size",
        "data_parallel_size_local",
        "data_parallel_start_rank",
        "dbo_decode_token_threshold",
        "dbo_prefill_token_threshold",
        "dcp_comm_backend",
        "dcp_kv_cache_interleave_size",
        "decode_context_parallel_size",
        "default_mm_loras",
        "device_ids",
        "diffusion_config",
        "disable_cascade_attn",
        "disable_chunked_mm_input",
        "disable_custom_all_reduce",
        "disable_hybrid_kv_cache_manager",
        "disable_log_stats",
        "disable_nccl_for_dp_synchronization",
        "disable_sliding_window",
        "distributed_executor_backend",
        "distributed_timeout_seconds",
        "download_dir",
        "dtype",
        "ec_transfer_config",
        "enable_bf16x3_router_gemm",
        "enable_chunked_prefill",
        "enable_cumem_allocator",
        "enable_dbo",
        "enable_elastic_ep",
        "enable_ep_weight_filter",
        "enable_eplb",
        "enable_expert_parallel",
        "enable_flashinfer_autotune",
        "enable_layerwise_nvtx_tracing",
        "enable_logging_iteration_details",
        "enable_lora",
        "enable_mamba_cache_stochastic_rounding",
        "enable_mfu_metrics",
        "enable_mixed_moe_lora_format",
        "enable_mm_embeds",
        "enable_mm_processor_stats",
        "enable_moe_shared_loras",
        "enable_prefix_caching",
        "enable_prompt_embeds",
        "enable_return_routed_experts",
        "enable_sleep_mode",
        "enable_tower_connector_lora",
        "enforce_eager",
        "eplb_config",
        "expert_placement_strategy",
        "fail_on_environ_validation",
        "fully_sharded_loras",
        "gdn_prefill_backend",
        "generation_config",
        "gpu_memory_utilization",
        "hf_config_path",
        "hf_overrides",
        "hf_token",
        "ignore_patterns",
        "interleave_mm_strings",
        "io_processor_plugin",
        "ir_op_priority",
        "jit_monitor_mode",
        "jit_monitor_verbose",
        "kernel_config",
        "kv_cache_dtype",
        "kv_cache_dtype_skip_layers",
        "kv_cache_memory_bytes",
        "kv_cache_metrics",
        "kv_cache_metrics_sample",
        "kv_events_config",
        "kv_offloading_backend",
        "kv_offloading_size",
        "kv_sharing_fast_prefill",
        "kv_transfer_config",
        "language_model_only",
        "limit_mm_per_prompt",
        "linear_backend",
        "load_format",
        "logits_processors",
        "logprobs_mode",
        "long_prefill_token_threshold",
        "lora_dtype",
        "lora_target_modules",
        "mamba_backend",
        "mamba_block_size",
        "mamba_cache_dtype",
        "mamba_cache_mode",
        "mamba_cache_philox_rounds",
        "mamba_config",
        "mamba_ssm_cache_dtype",
        "master_addr",
        "master_port",
        "max_cpu_loras",
        "max_cudagraph_capture_size",
        "max_logprobs",
        "max_long_partial_prefills",
        "max_lora_rank",
        "max_loras",
        "max_model_len",
        "max_num_batched_tokens",
        "max_num_partial_prefills",
        "max_num_scheduled_tokens",
        "max_num_seqs",
        "max_parallel_loading_workers",
        "media_io_kwargs",
        "mm_encoder_attn_backend",
        "mm_encoder_attn_dtype",
        "mm_encoder_fp8_scale_path",
        "mm_encoder_fp8_scale_save_margin",
        "mm_encoder_fp8_scale_save_path",
        "mm_encoder_only",
        "mm_encoder_tp_mode",
        "mm_ipc_gpu_memory_gb",
        "mm_processor_cache_gb",
        "mm_processor_cache_type",
        "mm_processor_kwargs",
        "mm_shm_cache_max_object_size_mb",
        "mm_tensor_ipc",
        "model",
        "model_class_overrides",
        "model_impl",
        "model_loader_extra_config",
        "model_weights",
        "moe_backend",
        "nnodes",
        "node_rank",
        "num_gpu_blocks_override",
        "numa_bind",
        "numa_bind_cpus",
        "numa_bind_nodes",
        "offload_backend",
        "offload_group_size",
        "offload_num_in_group",
        "offload_params",
        "offload_prefetch_step",
        "optimization_level",
        "otlp_traces_endpoint",
        "override_attention_dtype",
        "override_generation_config",
        "performance_mode",
        "pipeline_parallel_size",
        "pooler_config",
        "prefill_context_parallel_size",
        "prefill_schedule_interval",
        "prefix_caching_hash_algo",
        "prefix_match_unit",
        "profiler_config",
        "pt_load_map_location",
        "quantization",
        "quantization_config",
        "ray_workers_use_nsight",
        "reasoning_config",
        "reasoning_parser",
        "reasoning_parser_plugin",
        "renderer_num_workers",
        "revision",
        "runner",
        "safetensors_load_strategy",
        "safetensors_prefetch_block_size",
        "safetensors_prefetch_num_threads",
        "scheduler_cls",
        "scheduler_reserve_full_isl",
        "scheduling_policy",
        "seed",
        "served_model_name",
        "show_hidden_metrics_for_version",
        "shutdown_timeout",
        "skip_mm_profiling",
        "skip_tokenizer_init",
        "spec_method",
        "spec_model",
        "spec_tokens",
        "specialize_active_lora",
        "speculative_config",
        "stream_interval",
        "structured_outputs_config",
        "tensor_parallel_size",
        "tokenizer",
        "tokenizer_mode",
        "tokenizer_revision",
        "tokens_only",
        "trust_remote_code",
        "ubatch_size",
        "use_fp64_gumbel",
        "use_tqdm_on_load",
        "video_pruning_rate",
        "watermark",
        "weight_transfer_config",
        "worker_cls",
        "worker_extension_cls",
    }
)

# Owned by the harness: each is a matrix option (an axis or a per-arm setting), so passing it here
# would either be overwritten or make the two arms differ.
OWNED = {
    "model": "use --model",
    "tensor_parallel_size": "use --tp (an axis of the matrix)",
    "seed": "use --seed (an axis of the matrix)",
    "dtype": "use --dtype (an axis of the matrix)",
    "attention_config": "use --backend and --fa-version (axes of the matrix)",
    "attention_backend": "use --backend (an axis of the matrix)",
    "disable_cascade_attn": "the harness sets it per arm (cascade on in the cascade arm, off in the flat twin)",
}


def parse_value(text: str) -> Any:
    """A value as JSON when it reads as JSON (``32``, ``true``, ``{"a": 1}``), else the string itself."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def parse_pairs(items: Iterable[str]) -> dict[str, Any]:
    """``-E key=value`` (repeatable) into a dict; vLLM's dashed spelling (``block-size``) is accepted."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise UsageError(f"-E {item!r}: expected key=value, e.g. -E block_size=32")
        out[key] = parse_value(value.strip())
    return out


def parse_json(text: str) -> dict[str, Any]:
    """``--engine-args`` JSON into a dict; malformed input is a one-line UsageError."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--engine-args is not valid JSON: {e}") from None
    except RecursionError:
        raise UsageError("--engine-args is nested too deeply") from None
    if not isinstance(value, dict):
        raise UsageError("--engine-args must be a JSON object, e.g. '{\"block_size\": 32}'")
    return {str(k).replace("-", "_"): v for k, v in value.items()}


def known_fields() -> tuple[frozenset[str], str]:
    """The engine-argument names to check against, and where they come from."""
    if importlib.util.find_spec("vllm") is not None:
        try:
            import dataclasses

            import vllm
            from vllm.engine.arg_utils import EngineArgs

            names = frozenset(f.name for f in dataclasses.fields(EngineArgs))
            return names, f"vLLM {getattr(vllm, '__version__', '?')}'s EngineArgs"
        except Exception:  # noqa: BLE001 - a broken install: fall back to the recorded list
            pass
    return RECORDED_FIELDS, f"vLLM {RECORDED_RELEASE}'s EngineArgs as recorded (vLLM is not importable here)"


def check(args: dict[str, Any], max_batch: int, source: str = "options") -> None:
    """Raise a one-line UsageError for the first argument that is unknown or would break the experiment."""
    if not args:
        return
    for key, value in args.items():
        if not isinstance(key, str) or not key:
            raise UsageError(f"{source}: engine argument names must be strings, got {key!r}")
        if key in OWNED:
            raise UsageError(f"{source}: engine argument {key!r}: {OWNED[key]}")
        if key == "enable_prefix_caching" and value is not True:
            raise UsageError(
                f"{source}: engine argument enable_prefix_caching={value!r}: cascade attention needs "
                "prefix caching (the shared prefix must be cached), so both arms keep it on"
            )
        if key == "max_num_seqs":
            if not isinstance(value, int) or isinstance(value, bool) or value < max_batch:
                raise UsageError(
                    f"{source}: engine argument max_num_seqs={value!r}: must be an integer >= the largest "
                    f"--batch ({max_batch}), or a wave would not run as one batch (--batch is the number of "
                    "concurrent requests per wave)"
                )
    names, where = known_fields()
    for key in args:
        if key not in names:
            close = difflib.get_close_matches(key, sorted(names), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(f"{source}: {key!r} is not an engine argument of {where}{hint}")
