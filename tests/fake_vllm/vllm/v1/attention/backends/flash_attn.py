# The fake of vllm/v1/attention/backends/flash_attn.py (vLLM 0.26.0's names and signatures), the one
# every CPU suite uses: the probe's tests load fresh copies of this file and patch them, the kernel's
# tests drive `cascade-repro kernel` through it (in-process and in its worker process), and the fake
# `LLM` imports it as vLLM's module.
#
# As in vLLM, the functions call each other by their module-global names, so a patched function is
# what the others call. `flash_attn_varlen_func` computes real paged attention (in PyTorch, through
# cascade_repro.kernel.reference) and `cascade_attention` has the structure of vLLM 0.26's (lines
# 1572-1663: a prefix call, a suffix call, then `merge_attn_states`, descales omitted).
# `FlashAttentionImpl.forward` is not vLLM's: it hands `cascade_attention` the two partial results
# (`Partials`) instead of a query, which then merges them without running a kernel, so tests see
# exactly what the merge receives. torch and cascade_repro are imported only when a function runs.
#
# Recorded for tests: `CALLS` (kernel and scheduler calls), `merged` / `merged_prefix` (the suffix
# and prefix LSE every merge received), `heuristic_calls` (the cost model's prefix lengths).
# With FAKE_VLLM_FAULTS=1 in the environment when the file is loaded, cascade calls fail by their
# number of requests (3: the process is killed, as by a segfault; 4: it hangs; 5: it raises what
# PyTorch raises after an illegal memory access), and FA3 is unsupported (`UNSUPPORTED`).
import os
import signal
import time
from typing import NamedTuple

FAULTS = os.environ.get("FAKE_VLLM_FAULTS") == "1"
UNSUPPORTED = {3: "FA3 is only supported on devices with compute capability 9.x"} if FAULTS else {}

CALLS = []
merged = []
merged_prefix = []
heuristic_calls = []


class Partials(NamedTuple):
    prefix_output: object
    prefix_lse: object
    suffix_output: object
    suffix_lse: object


def flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=None,
                           seqused_k=None, softmax_scale=None, causal=False, window_size=None, softcap=0.0,
                           alibi_slopes=None, block_table=None, return_softmax_lse=False, out=None,
                           scheduler_metadata=None, q_descale=None, k_descale=None, v_descale=None,
                           num_splits=0, fa_version=2, s_aux=None):
    import torch

    from cascade_repro.kernel.reference import paged_partial_attention

    if fa_version == 2 and num_splits > 1:
        raise NotImplementedError("FA2 does not support num_splits > 1")
    assert list(window_size) == [-1, -1] and softcap == 0 and alibi_slopes is None
    assert seqused_k.dtype == torch.int32 and cu_seqlens_q.dtype == torch.int32
    assert (fa_version == 3) == (scheduler_metadata is not None)
    CALLS.append(dict(causal=causal, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                      rows=block_table.shape[0], num_splits=num_splits, fa_version=fa_version))
    o, lse = paged_partial_attention(q, k, v, cu_seqlens_q, seqused_k, block_table, softmax_scale, causal)
    if out is not None:
        out.copy_(o)
        o = out
    return (o, lse) if return_softmax_lse else o


def get_scheduler_metadata(**kw):
    import torch

    CALLS.append(dict(schedule=kw))
    return torch.zeros(4, dtype=torch.int32)


def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None):
    """The logical merge: outputs [T, H, D], LSEs [H, T]; only recorded when there is no output."""
    merged.append(suffix_lse)
    merged_prefix.append(prefix_lse)
    if output is not None:
        from cascade_repro.engines.cascade_attention import merge_attn_states as merge

        output.copy_(merge(prefix_output, prefix_lse.t(), suffix_output, suffix_lse.t()))


def canonicalize_singleton_dim_strides(t):
    return t


def _fault(num_reqs):
    if num_reqs == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    if num_reqs == 4:
        time.sleep(120)
    if num_reqs == 5:
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")


def cascade_attention(output, query, key_cache, value_cache, cu_query_lens, max_query_len,
                      cu_prefix_query_lens, prefix_kv_lens, suffix_kv_lens, max_kv_len, softmax_scale,
                      alibi_slopes, sliding_window, logits_soft_cap, block_table, common_prefix_len,
                      max_num_splits, fa_version, prefix_scheduler_metadata=None,
                      suffix_scheduler_metadata=None, q_descale=None, k_descale=None, v_descale=None,
                      s_aux=None):
    if isinstance(query, Partials):  # FlashAttentionImpl.forward: the two kernels' results given
        merge_attn_states(output, *query)
        return output
    if FAULTS:
        _fault(cu_query_lens.shape[0] - 1)
    num_tokens = query.shape[0]
    block_size = key_cache.shape[-3]
    num_common_kv_blocks = common_prefix_len // block_size
    prefix_output, prefix_lse = flash_attn_varlen_func(
        q=query, k=key_cache, v=value_cache, cu_seqlens_q=cu_prefix_query_lens, seqused_k=prefix_kv_lens,
        max_seqlen_q=num_tokens, max_seqlen_k=common_prefix_len, softmax_scale=softmax_scale, causal=False,
        window_size=list(sliding_window), block_table=block_table[:1], softcap=logits_soft_cap,
        return_softmax_lse=True, scheduler_metadata=prefix_scheduler_metadata, fa_version=fa_version,
        num_splits=max_num_splits)
    suffix_output, suffix_lse = flash_attn_varlen_func(
        q=query, k=key_cache, v=value_cache, cu_seqlens_q=cu_query_lens, seqused_k=suffix_kv_lens,
        max_seqlen_q=max_query_len, max_seqlen_k=max_kv_len - common_prefix_len,
        softmax_scale=softmax_scale, causal=True, window_size=list(sliding_window),
        block_table=block_table[:, num_common_kv_blocks:], softcap=logits_soft_cap,
        return_softmax_lse=True, scheduler_metadata=suffix_scheduler_metadata, fa_version=fa_version,
        num_splits=max_num_splits)
    merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse)
    return output


def use_cascade_attention(common_prefix_len, query_lens, num_query_heads, num_kv_heads, use_alibi,
                          use_sliding_window, use_local_attention, num_sms, dcp_world_size):
    heuristic_calls.append(common_prefix_len)
    return common_prefix_len >= 256 and len(query_lens) >= 8


class FlashAttentionMetadataBuilder:
    def use_cascade_attention(self, *args, **kwargs):
        return use_cascade_attention(*args, **kwargs)


# The arguments of a cascade call whose kernels do not run (Partials in place of the query).
_NO_KERNELS = dict(cu_query_lens=None, max_query_len=None, cu_prefix_query_lens=None, prefix_kv_lens=None,
                   suffix_kv_lens=None, max_kv_len=None, softmax_scale=None, alibi_slopes=None,
                   sliding_window=(-1, -1), logits_soft_cap=0, block_table=None, max_num_splits=0)


class FlashAttentionImpl:
    def __init__(self, version=3):
        self.vllm_flash_attn_version = version

    def forward(self, output, partials, common_prefix_len):
        """One cascade step of this layer, merging the given Partials (see the top of the file)."""
        return cascade_attention(output, Partials(*partials), None, None, **_NO_KERNELS,
                                 common_prefix_len=common_prefix_len, fa_version=self.vllm_flash_attn_version)
