"""What this harness knows of vLLM's internals, in one place: module paths, cascade's hard limits,
and how they differ between the releases it was written against.

Everything that patches, imports or mimics vLLM (the probe, the kernel check, ``explain``,
``doctor``, the hf engine's reference cascade, the reports' warnings) asks this module. A vLLM
release that moves its attention backend or changes a threshold is one edit here.

Only the standard library, and no vLLM import: the probe loads this in every vLLM process, and
``--help`` must stay instant. (``minimize/standalone.py`` spells the module path out on purpose: it
is the template of a repro script that must run with vLLM alone.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The FlashAttention backend holds use_cascade_attention, cascade_attention and the
# merge_attn_states it calls (same path and names in 0.10.2 and 0.26.0).
FLASH_ATTN_MODULE = "vllm.v1.attention.backends.flash_attn"
USE_CASCADE_ATTENTION = f"{FLASH_ATTN_MODULE}.use_cascade_attention"
# Where collective_rpc resolves a method name on WorkerWrapperBase: vllm/worker/worker_base.py up
# to at least 0.10.2, vllm/v1/worker/worker_base.py in 0.26.0. The probe hooks both; whichever the
# installed vLLM imports gets the method.
WORKER_BASE_MODULE = "vllm.v1.worker.worker_base"
WORKER_BASE_MODULES = (WORKER_BASE_MODULE, "vllm.worker.worker_base")

# use_cascade_attention's hard conditions: a common prefix of at least this many tokens (after
# alignment to the KV block size) and at least this many requests in the step.
MIN_COMMON_PREFIX = 256
MIN_REQUESTS = 8


@dataclass(frozen=True)
class Release:
    """Facts read from one vLLM release's source: what the engine and the probe must do there."""

    version: str
    worker_base_module: str
    # How the attention backend and FlashAttention version are chosen: the ``attention_config``
    # engine argument, or the VLLM_ATTENTION_BACKEND / VLLM_FLASH_ATTN_VERSION variables.
    attention_via: str
    # VLLM_USE_V2_MODEL_RUNNER exists (the V2 runner has no cascade path, so it must be 0).
    v2_model_runner: bool
    # use_cascade_attention takes dcp_world_size (decode context parallelism) as its last argument.
    rule_takes_dcp: bool
    # LLM.reset_prefix_cache() says whether the reset happened (0.10.2's V1 engine returns None).
    reset_returns_bool: bool
    source: str


# Ordered by version. 0.10.2: read from its wheel (flash_attn.py: use_cascade_attention with 8
# parameters, cascade_attention(..., fa_version=...), merge_attn_states imported from
# vllm/attention/ops/merge_attn_states.py; vllm/worker/worker_base.py: WorkerWrapperBase;
# vllm/attention/utils/fa_utils.py: get_flash_attn_version reads VLLM_FLASH_ATTN_VERSION;
# engine/arg_utils.py: disable_cascade_attn, no attention_config). 0.26.0: read from its wheel.
RELEASES: tuple[Release, ...] = (
    Release("0.10.2", "vllm.worker.worker_base", "env", False, False, False, "vLLM 0.10.2 wheel"),
    Release(
        "0.26.0", "vllm.v1.worker.worker_base", "attention_config", True, True, True, "vLLM 0.26.0 wheel"
    ),
)


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """``"0.10.2rc1+cu128"`` -> ``(0, 10, 2)``; None when it does not start with a number."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", version or "")
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def release_for(version: str | None) -> tuple[Release, bool]:
    """The known release whose surface applies to ``version`` and whether it is that very release.

    A version between two known releases gets the older one's facts (what its engine arguments
    and names looked like when last read), and ``False``: not verified.
    """
    vt = version_tuple(version)
    if vt is None:
        return RELEASES[-1], False
    best = RELEASES[0]
    for r in RELEASES:
        rt = version_tuple(r.version) or ()
        if rt <= vt:
            best = r
    return best, (version_tuple(best.version) or ()) == vt[:3]


# Cascade attention's life in vLLM (release notes and config sources): on by default through
# 0.17 (``disable_cascade_attn`` False), off by default from 0.18.0 (PR #36318) and removed in
# 0.32.0 (the flag is kept and has no effect).
CASCADE_OPT_IN_FROM = (0, 18, 0)
CASCADE_REMOVED_IN = (0, 32, 0)
# FA2's wrong LSE layout in the split-KV decode path (vllm-project/flash-attention PR #87): the
# fork commit pinned by vLLM 0.11.0 and earlier lacks it, 0.11.1's has it.
FA2_LSE_FIX_IN = (0, 11, 1)
FIRST_V1_CASCADE = (0, 7, 0)  # the first release whose fork carries PR #34's transpose


def cascade_status(version: str | None) -> str:
    """``"default on"``, ``"opt-in"``, ``"removed"`` or ``"unknown"`` for a vLLM version."""
    vt = version_tuple(version)
    if vt is None:
        return "unknown"
    if vt >= CASCADE_REMOVED_IN:
        return "removed"
    if vt >= CASCADE_OPT_IN_FROM:
        return "opt-in"
    return "default on"


def has_fa2_lse_bug(version: str | None) -> bool | None:
    """Whether this vLLM's FA2 has the split-KV LSE layout bug (None: too old or unknown to say)."""
    vt = version_tuple(version)
    if vt is None or vt < FIRST_V1_CASCADE:
        return None
    return vt < FA2_LSE_FIX_IN
