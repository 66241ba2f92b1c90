"""When FA2's decode path splits the KV sequence: the condition of the field bug's band.

The field bug (vllm-project/flash-attention PR #87) lived in one branch of FA2's
``mha_varlen_fwd`` (``csrc/flash_attn/flash_api.cpp`` of vLLM's fork): with GQA packing
(``seqlenq_ngroups_swapped``: one query token per request, more query heads than KV heads, no
sliding window or ALiBi) and ``num_splits > 1`` the host transposed an LSE that the split-KV combine
kernel had already written in its final layout. The attention output stayed right; the LSE that
cascade's merge weighs the suffix by did not.

Whether a step splits is decided by FA2 itself, since vLLM passes no ``num_splits`` to FA2:
``set_params_splitkv`` calls :func:`num_splits_heuristic` with

* ``batch_nheads_mblocks = batch x heads x ceil(seqlen_q / 64)``, where packing makes the batch the
  number of requests, the heads the KV heads and ``seqlen_q`` the query heads per KV head;
* ``num_SMs = 2 x multiprocessors`` ("128 threads per block");
* ``num_n_blocks = ceil(max_seqlen_k / block_n)`` with ``block_n`` 256 for head dim <= 64, 128 for
  <= 128, else 64. In cascade's suffix call ``max_seqlen_k`` is the longest request's own part:
  its tokens after the shared prefix, question and generated text together.

Cascade must also be chosen for that decode step (vLLM's cost model, ``cascade_rule.decide``), so the
bug bites in a band: enough requests for cascade's decode heuristic, few enough that FA2 still
splits (``requests x KV heads < 0.8 x 2 x SMs``), and a suffix long enough for more than one KV
block per split. Ported from the fork at ee4d25bd (the commit vLLM 0.10.2 and 0.11.0 pin);
``tests/vllm_surface/test_splitkv.py`` holds hand-worked cases.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

MAX_SPLITS = 128


def block_n(head_dim: int) -> int:
    """KV block of FA2's split-KV kernels (``run_mha_fwd_splitkv_dispatch``)."""
    return 256 if head_dim <= 64 else (128 if head_dim <= 128 else 64)


def num_splits_heuristic(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int) -> int:
    """Port of FA2's ``num_splits_heuristic``, statement for statement (``num_sms`` as FA2 passes it)."""
    if batch_nheads_mblocks >= 0.8 * num_sms:  # enough blocks to almost fill the SMs: one split
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)

    def ceildiv(a: int, b: int) -> int:
        return (a + b - 1) // b

    def eligible(s: int) -> bool:
        # 64 blocks in 11 splits is 6 x 10 + 4; in 12 it would be 6 x 11 - 2, i.e. 11 splits anyway.
        return s == 1 or ceildiv(num_n_blocks, s) != ceildiv(num_n_blocks, s - 1)

    efficiency: list[float] = []
    best = 0.0
    for s in range(1, max_splits + 1):
        if not eligible(s):
            efficiency.append(0.0)
            continue
        # FA2 computes this in float32; the values here are small integers over num_sms, where
        # float64 gives the same comparisons.
        n_waves = batch_nheads_mblocks * s / num_sms
        eff = n_waves / math.ceil(n_waves)
        best = max(best, eff)
        efficiency.append(eff)
    for s in range(1, max_splits + 1):
        if eligible(s) and efficiency[s - 1] >= 0.85 * best:
            return s
    return 1


def gqa_packed(
    num_query_heads: int, num_kv_heads: int, sliding_window: bool = False, alibi: bool = False
) -> bool:
    """FA2's ``seqlenq_ngroups_swapped`` for a decode step (one query token per request)."""
    return num_query_heads > num_kv_heads and not sliding_window and not alibi


def decode_splits(
    num_reqs: int, num_query_heads: int, num_kv_heads: int, head_dim: int, max_suffix_len: int, num_sms: int
) -> int:
    """How many KV splits FA2 uses for cascade's suffix call in a pure decode step."""
    if num_reqs <= 0 or max_suffix_len <= 0:
        return 1
    if gqa_packed(num_query_heads, num_kv_heads):
        heads, seqlen_q = num_kv_heads, num_query_heads // num_kv_heads
    else:
        heads, seqlen_q = num_query_heads, 1
    mblocks = math.ceil(seqlen_q / 64)
    n_blocks = math.ceil(max_suffix_len / block_n(head_dim))
    return num_splits_heuristic(num_reqs * heads * mblocks, 2 * num_sms, n_blocks, MAX_SPLITS)


def buggy_decode(
    num_reqs: int, num_query_heads: int, num_kv_heads: int, head_dim: int, max_suffix_len: int, num_sms: int
) -> bool:
    """True when a decode step's suffix call takes the branch with the wrong LSE (packed and split)."""
    return gqa_packed(num_query_heads, num_kv_heads) and (
        decode_splits(num_reqs, num_query_heads, num_kv_heads, head_dim, max_suffix_len, num_sms) > 1
    )


@dataclass(frozen=True)
class Band:
    """Request counts whose decode steps run cascade through FA2's split path, for one suffix length."""

    suffix_len: int
    requests: tuple[int, ...]

    @property
    def ranges(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for n in self.requests:
            if out and n == out[-1][1] + 1:
                out[-1] = (out[-1][0], n)
            else:
                out.append((n, n))
        return out

    def text(self) -> str:
        if not self.requests:
            return "none"
        return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in self.ranges)


def band(
    cascade_decode: Callable[[int], bool],
    num_query_heads: int,
    num_kv_heads: int,
    head_dim: int,
    suffix_len: int,
    num_sms: int,
    max_requests: int = 1024,
) -> Band:
    """Requests per decode step (1..max_requests) where cascade fires and FA2 splits: the bug's band.

    ``cascade_decode(n)`` says whether vLLM chooses cascade for a decode step of ``n`` requests
    (``cascade_rule.decide`` with the run's prefix and heads).
    """
    hits = tuple(
        n
        for n in range(1, max_requests + 1)
        if buggy_decode(n, num_query_heads, num_kv_heads, head_dim, suffix_len, num_sms) and cascade_decode(n)
    )
    return Band(suffix_len, hits)


def split_from_suffix(
    num_reqs: int, num_query_heads: int, num_kv_heads: int, head_dim: int, num_sms: int, limit: int = 1 << 16
) -> int | None:
    """The shortest per-request suffix (tokens) from which this many requests' decode steps split."""
    if not gqa_packed(num_query_heads, num_kv_heads):
        return None
    bn = block_n(head_dim)
    # The split count only changes at block boundaries: scan whole blocks.
    for blocks in range(1, limit // bn + 1):
        if decode_splits(num_reqs, num_query_heads, num_kv_heads, head_dim, blocks * bn, num_sms) > 1:
            return (blocks - 1) * bn + 1
    return None
