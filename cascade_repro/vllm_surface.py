"""What this harness knows of vLLM's internals, in one place: module paths and cascade's hard limits.

Everything that patches, imports or mimics vLLM (the probe, the kernel check, ``explain``,
``doctor``, the hf engine's reference cascade, the reports' warnings) asks this module. A vLLM
release that moves its attention backend or changes a threshold is one edit here.

Only the standard library, and no vLLM import: the probe loads this in every vLLM process, and
``--help`` must stay instant. (``minimize/standalone.py`` spells the module path out on purpose: it
is the template of a repro script that must run with vLLM alone.)
"""

from __future__ import annotations

# vLLM 0.26.0: the FlashAttention backend holds use_cascade_attention, cascade_attention and the
# merge_attn_states it calls; WorkerWrapperBase is where collective_rpc resolves a method name.
FLASH_ATTN_MODULE = "vllm.v1.attention.backends.flash_attn"
WORKER_BASE_MODULE = "vllm.v1.worker.worker_base"
USE_CASCADE_ATTENTION = f"{FLASH_ATTN_MODULE}.use_cascade_attention"

# use_cascade_attention's hard conditions: a common prefix of at least this many tokens (after
# alignment to the KV block size) and at least this many requests in the step.
MIN_COMMON_PREFIX = 256
MIN_REQUESTS = 8
