"""vLLM's cascade rule, ported, and the GPU facts it reads: whether one scheduler step picks cascade.

The rule is vLLM's own, ``use_cascade_attention`` in ``vllm/v1/attention/backends/flash_attn.py``
(read from the vLLM 0.26.0 wheel). ``GPUModelRunner._compute_cascade_attn_prefix_len`` in
``vllm/v1/worker/gpu_model_runner.py`` calls it once per scheduler step with:

* ``common_prefix_len``: the KV blocks every running request shares (``num_common_prefix_blocks *
  block_size``), capped by the smallest ``num_computed_tokens`` and rounded down to the block size;
* ``query_lens``: the tokens each request runs in this step (all 1 in a pure decode step);
* ``num_query_heads``: ``num_attention_heads // tp``; ``num_kv_heads``: ``max(1, num_kv_heads // tp)``
  (``ModelConfig.get_num_attention_heads`` / ``get_num_kv_heads``);
* ``use_alibi``, ``use_sliding_window``, ``use_local_attention`` from the model and its KV-cache spec;
* ``num_sms``: the GPU's multiprocessor count (:data:`GPU_SMS`, or the device); ``dcp_world_size``:
  decode context parallelism.

When vLLM is importable its function is called with the same arguments (:func:`rule_and_source`);
otherwise :func:`use_cascade_attention` below, a line-by-line port, decides. ``tests/test_explain.py``
checks the port against hand-worked cases, and against vLLM's function over a grid when vLLM is
installed. Per planned cell, ``plan/predict.py`` applies it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cascade_repro import vllm_surface
from cascade_repro.errors import UsageError

MIN_COMMON_PREFIX = vllm_surface.MIN_COMMON_PREFIX
MIN_REQUESTS = vllm_surface.MIN_REQUESTS
Q_TILE_SIZE = 128
KV_TILE_SIZE = 128
DEFAULT_BLOCK_SIZE = 16  # vllm/config/cache.py: CacheConfig.DEFAULT_BLOCK_SIZE
MAX_SCAN = 4096
CASCADE_BACKEND = "FLASH_ATTN"
VLLM_SOURCE = "vllm/v1/attention/backends/flash_attn.py: use_cascade_attention (vLLM 0.26.0)"

GPU_SMS: dict[str, int] = {
    "H200": 132,
    "H100 SXM": 132,
    "H100 PCIe": 114,
    "A100": 108,
    "L40S": 142,
    "L4": 58,
    "A10": 72,
    "RTX 4090": 128,
}
"""Multiprocessor counts (``torch.cuda.get_device_properties().multi_processor_count``).

Checked against: H200 132 (PyTorch on an H200), H100 SXM5 132 and H100 PCIe 114
(NVIDIA H100 documentation: 132 SMs SXM5, 57 TPCs x 2 = 114 SMs PCIe), A100 108 and L4 58
(``deviceQuery`` output in public logs: "(108) Multiprocessors", "(058) Multiprocessors, (128) CUDA
Cores/MP: 7424"), L40S 142 (18,176 CUDA cores / 128 per Ada SM), A10 72 (9,216 / 128), RTX 4090
128 (16,384 / 128; PyTorch reports mp=128). The L4's datasheet lists 60 RT cores, but the chip
exposes 58 multiprocessors.
"""

_GPU_ALIASES = {"H100": "H100 SXM", "H100SXM5": "H100 SXM", "H100NVL": "H100 SXM", "4090": "RTX 4090"}


def _norm(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch.isalnum())


def gpu_sms(name: str) -> int:
    """Return the SM count of a GPU by name (``H200``, ``h100-pcie``, ``RTX4090``...); UsageError if unknown."""
    table = {_norm(k): v for k, v in GPU_SMS.items()}
    table.update({_norm(a): GPU_SMS[k] for a, k in _GPU_ALIASES.items()})
    n = _norm(name).removeprefix("NVIDIA").removeprefix("GEFORCE")
    if n in table:
        return table[n]
    raise UsageError(f"unknown GPU {name!r}: known {', '.join(GPU_SMS)}; or pass --sm-count N")


def sms_in_gpu_name(name: str) -> int | None:
    """The SM count of the table's GPU whose name ``name`` contains (a device name as recorded,
    ``NVIDIA H200``), the longest match first; None if none."""
    for key in sorted(GPU_SMS, key=len, reverse=True):
        if _norm(key) in _norm(name):
            return GPU_SMS[key]
    return None


def detect_sms() -> tuple[int | None, str]:
    """Return (SM count of CUDA device 0, its name) via torch, or (None, why not)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None, "no CUDA device visible"
        p = torch.cuda.get_device_properties(0)
        return int(p.multi_processor_count), str(p.name)
    except Exception as e:  # noqa: BLE001 - a broken CUDA setup must not stop a prediction
        return None, f"CUDA query failed: {e}"


# vLLM picks FA3 by default on Hopper (compute capability 9.x; get_flash_attn_version), FA2 elsewhere.
HOPPER = ("H100", "H200", "H800", "H20", "GH200")


def default_fa_for(gpu_name: str | None) -> int | None:
    """The FlashAttention version vLLM runs by default on this GPU (3 on Hopper), None if unknown."""
    n = _norm(gpu_name or "")
    return 3 if any(_norm(h) in n for h in HOPPER) else None


def resolve_sms(gpu: str | None = None, sm_count: int | None = None) -> tuple[int | None, str]:
    """Pick the SM count: --sm-count, else --gpu from :data:`GPU_SMS`, else detected; with its source."""
    if sm_count is not None:
        if sm_count <= 0:
            raise UsageError(f"--sm-count must be positive, got {sm_count}")
        return sm_count, f"--sm-count {sm_count}"
    if gpu:
        return gpu_sms(gpu), f"--gpu {gpu} (table)"
    n, name = detect_sms()
    if n is None:
        return None, f"unknown ({name}; pass --gpu or --sm-count)"
    return n, f"detected {name}"


# ---------------------------------------------------------------------------------------------
# The rule
# ---------------------------------------------------------------------------------------------


def cdiv(a: int, b: int) -> int:
    """Ceiling division, as ``vllm.utils.math_utils.cdiv``."""
    return -(a // -b)


def use_cascade_attention(
    common_prefix_len: int,
    query_lens: np.ndarray,
    num_query_heads: int,
    num_kv_heads: int,
    use_alibi: bool,
    use_sliding_window: bool,
    use_local_attention: bool,
    num_sms: int,
    dcp_world_size: int,
) -> bool:
    """Port of vLLM 0.26.0's ``use_cascade_attention`` (flash_attn.py), statement for statement."""
    if common_prefix_len < MIN_COMMON_PREFIX:
        return False
    if use_alibi or use_sliding_window or use_local_attention:
        return False
    num_reqs = len(query_lens)
    if num_reqs < MIN_REQUESTS:
        return False
    if dcp_world_size > 1:
        return False

    num_queries_per_kv = num_query_heads // num_kv_heads
    use_flash_decoding = (
        num_queries_per_kv > 1 and not use_sliding_window and not use_alibi and np.all(query_lens == 1)
    )
    if not use_flash_decoding:
        return True

    num_tokens = num_reqs
    q_tile_size = 128
    kv_tile_size = 128
    num_prefix_tiles = cdiv(common_prefix_len, kv_tile_size)

    cascade_ctas = num_query_heads * cdiv(num_tokens, q_tile_size)
    cascade_waves = cdiv(cascade_ctas, num_sms)
    cascade_time = cascade_waves * num_prefix_tiles

    flash_decoding_ctas = num_reqs * num_kv_heads * cdiv(num_queries_per_kv, q_tile_size)
    flash_decoding_ctas *= num_prefix_tiles
    flash_decoding_time = cdiv(flash_decoding_ctas, num_sms)

    return bool(cascade_time < flash_decoding_time)


def vllm_rule() -> tuple[Callable[..., bool] | None, str]:
    """Return vLLM's own ``use_cascade_attention`` and its version, or (None, why not)."""
    try:
        import vllm

        fn = importlib.import_module(vllm_surface.FLASH_ATTN_MODULE).use_cascade_attention
    except Exception as e:  # noqa: BLE001 - not installed, or no CUDA platform to import on
        return None, f"vLLM not importable here ({type(e).__name__})"
    return fn, str(getattr(vllm, "__version__", "?"))


def call_rule(fn: Callable[..., bool], **kwargs: Any) -> bool:
    """Call a ``use_cascade_attention`` with the arguments its signature takes (older vLLMs take fewer)."""
    try:
        names = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = set(kwargs)
    return bool(fn(**{k: v for k, v in kwargs.items() if k in names}))


@dataclass(frozen=True)
class Decision:
    """One ``use_cascade_attention`` call, explained."""

    fires: bool
    reason: str
    cascade_time: int | None = None
    flash_decoding_time: int | None = None


def decide(
    common_prefix_len: int,
    query_lens: Sequence[int] | np.ndarray,
    num_query_heads: int,
    num_kv_heads: int,
    use_alibi: bool = False,
    use_sliding_window: bool = False,
    use_local_attention: bool = False,
    num_sms: int = 132,
    dcp_world_size: int = 1,
    rule: Callable[..., bool] | None = None,
) -> Decision:
    """Decide like vLLM and say why; ``rule`` (vLLM's function) has the last word when given."""
    q = np.asarray(query_lens, dtype=np.int32)
    args = dict(
        common_prefix_len=common_prefix_len, query_lens=q, num_query_heads=num_query_heads,
        num_kv_heads=num_kv_heads, use_alibi=use_alibi, use_sliding_window=use_sliding_window,
        use_local_attention=use_local_attention, num_sms=num_sms, dcp_world_size=dcp_world_size,
    )  # fmt: skip
    port = use_cascade_attention(**args)
    fires = call_rule(rule, **args) if rule is not None else port
    d = _explain(port, q, **{k: v for k, v in args.items() if k != "query_lens"})
    if fires != port:
        return Decision(fires, f"{d.reason}; vLLM's own function says {fires}: its rule differs from 0.26's")
    return d


def _explain(fires: bool, q: np.ndarray, common_prefix_len: int, num_query_heads: int, num_kv_heads: int,
             use_alibi: bool, use_sliding_window: bool, use_local_attention: bool, num_sms: int,
             dcp_world_size: int) -> Decision:  # fmt: skip
    n = len(q)
    if common_prefix_len < MIN_COMMON_PREFIX:
        return Decision(fires, f"shared prefix {common_prefix_len} < {MIN_COMMON_PREFIX} tokens")
    variants = [v for v, on in (("ALiBi", use_alibi), ("sliding window", use_sliding_window),
                                ("chunked local attention", use_local_attention)) if on]  # fmt: skip
    if variants:
        return Decision(fires, f"{', '.join(variants)}: not supported by cascade")
    if n < MIN_REQUESTS:
        return Decision(fires, f"{n} request{'s' if n != 1 else ''} in the step < {MIN_REQUESTS}")
    if dcp_world_size > 1:
        return Decision(fires, "decode context parallelism > 1")
    g = num_query_heads // num_kv_heads
    if g <= 1:
        return Decision(fires, "no GQA (1 query head per KV head): flash-decoding off, cascade chosen")
    if not bool(np.all(q == 1)):
        return Decision(fires, "prefill tokens in the step: flash-decoding off, cascade chosen")
    tiles = cdiv(common_prefix_len, KV_TILE_SIZE)
    ct = cdiv(num_query_heads * cdiv(n, Q_TILE_SIZE), num_sms) * tiles
    ft = cdiv(n * num_kv_heads * cdiv(g, Q_TILE_SIZE) * tiles, num_sms)
    cmp = "<" if ct < ft else ">="
    return Decision(fires, f"cost model: cascade {ct} {cmp} flash-decoding {ft}", ct, ft)


def decode_threshold(
    common_prefix_len: int,
    num_query_heads: int,
    num_kv_heads: int,
    num_sms: int,
    use_alibi: bool = False,
    use_sliding_window: bool = False,
    use_local_attention: bool = False,
    dcp_world_size: int = 1,
    rule: Callable[..., bool] | None = None,
    max_batch: int = MAX_SCAN,
) -> tuple[int | None, bool]:
    """Scan decode steps of 1..max_batch requests; return (smallest batch that picks cascade, monotone).

    ``monotone`` is False when some larger batch within the scan does not pick cascade again.
    """
    fires = [
        decide(common_prefix_len, np.ones(n, dtype=np.int32), num_query_heads, num_kv_heads, use_alibi,
               use_sliding_window, use_local_attention, num_sms, dcp_world_size, rule).fires
        for n in range(1, max_batch + 1)
    ]  # fmt: skip
    if True not in fires:
        return None, True
    first = fires.index(True)
    return first + 1, all(fires[first:])


def rule_and_source(prefer_vllm: bool) -> tuple[Callable[..., bool] | None, str]:
    """The rule to call (vLLM's own where importable and ``prefer_vllm``; None: the port) and where it is
    from, in words (run.json's ``predictions.rule``)."""
    if prefer_vllm:
        fn, version = vllm_rule()
        if fn is not None:
            return fn, f"vLLM {version}: {vllm_surface.USE_CASCADE_ATTENTION}"
        return (
            None,
            f"cascade_repro.vllm_surface.cascade_rule.use_cascade_attention, a port of {VLLM_SOURCE}; {version}",
        )
    return None, f"cascade_repro.vllm_surface.cascade_rule.use_cascade_attention, a port of {VLLM_SOURCE}"
