import dataclasses


@dataclasses.dataclass
class EngineArgs:
    model: str = ""
    attention_config: dict | None = None
    compilation_config: dict | None = None
    disable_cascade_attn: bool = True
    # The arguments the twins set (vLLM 0.26.0 has each; tests/data/vllm-surface-0.26.0.json).
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    enforce_eager: bool = False
    async_scheduling: bool | None = None
    kv_cache_dtype: str = "auto"
    # KV pressure and penalized logprobs (vLLM 0.10.2 to 0.34.0 have both).
    num_gpu_blocks_override: int | None = None
    logprobs_mode: str = "raw_logprobs"
