"""Reference cascade attention for the transformers engine, registered as an attention function.

Cascade attention splits every request's keys into the shared prefix (identical for all requests)
and the request's own suffix:

1. prefix pass: all queries of all requests attend to *one copy* of the prefix KV, non-causally
   (every query sits after the whole prefix), returning the output and the log-sum-exp (LSE);
2. suffix pass: each request's queries attend causally to its own suffix KV, returning output and LSE;
3. merge: the two partial results are combined by their LSEs, exactly as vLLM's
   ``merge_attn_states`` does (``vllm/attention/ops/triton_merge_attn_states.py``).

The flat arm is ordinary attention (PyTorch SDPA) over the same keys and mask.

``inject="lse-layout"`` reads the suffix LSE in the transposed layout before the merge: vLLM keeps
LSEs as ``[num_heads, num_tokens]``; FA2's split-KV decode path produced ``[num_tokens, num_heads]``
(vllm-project/flash-attention PR #87). Reinterpreting that memory mixes heads and tokens, which is
the bug class this harness exists to catch; it is the positive control.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

ATTN_NAME = "cascade_repro"
# vLLM's hard conditions in use_cascade_attention (vllm/v1/attention/backends/flash_attn.py).
MIN_COMMON_PREFIX = 256
MIN_REQUESTS = 8


@dataclass
class CascadeState:
    """Per-process switchboard the engine sets before each forward; the attention reads it."""

    arm: str = "flat"
    prefix_len: int = 0
    block_size: int = 16
    inject: str | None = None
    use_now: bool = False
    steps_total: int = 0
    steps_cascade: int = 0
    calls: int = 0
    common_prefix_len: int = 0
    decisions: list[bool] = field(default_factory=list)

    def reset_counters(self) -> None:
        self.steps_total = self.steps_cascade = self.calls = 0
        self.decisions = []

    def begin_step(self, n_requests: int) -> bool:
        """Decide whether this forward step runs cascade, with vLLM's hard conditions.

        The prefix is block-aligned like vLLM's common prefix. vLLM's decode-time cost heuristic
        compares SM occupancy on a GPU and has no CPU counterpart, so it is not applied here.
        """
        aligned = (self.prefix_len // self.block_size) * self.block_size
        use = self.arm == "cascade" and aligned >= MIN_COMMON_PREFIX and n_requests >= MIN_REQUESTS
        self.use_now = use
        self.common_prefix_len = aligned if use else 0
        self.steps_total += 1
        self.steps_cascade += int(use)
        self.decisions.append(use)
        return use


STATE = CascadeState()


def _group(q: torch.Tensor, kvh: int) -> torch.Tensor:
    """View queries [B, H, Q, D] as [B, KVH, G*Q, D] so GQA needs no copy of the KV heads.

    Query head h uses KV head h // G (transformers' repeat_kv order).
    """
    b, h, n, d = q.shape
    return q.reshape(b, kvh, (h // kvh) * n, d)


def _ungroup(x: torch.Tensor, h: int) -> torch.Tensor:
    """Inverse of ``_group`` for outputs [B, KVH, G*Q, D] or LSEs [B, KVH, G*Q]."""
    b, kvh = x.shape[:2]
    n = x.shape[2] // (h // kvh)
    return x.reshape(b, h, n, *x.shape[3:])


def partial_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (output [B, H, Q, D], lse [B, H, Q]) of softmax attention, computed in float32.

    q: [B, H, Q, D]; k, v: [B or 1, KVH, L, D]; mask: bool [B, 1, Q, L] or None, True = attend.
    Fully masked rows give output 0 and LSE -inf (what the kernels return for empty KV).
    """
    h, kvh = q.shape[1], k.shape[1]
    g = h // kvh
    qg = _group(q, kvh).float()
    scores = torch.matmul(qg, k.float().transpose(-1, -2)) * scale  # [B, KVH, G*Q, L]
    if mask is not None:
        scores = scores.masked_fill(~mask.repeat(1, 1, g, 1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    safe_lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    probs = torch.exp(scores - safe_lse.unsqueeze(-1))
    out = torch.matmul(probs, v.float())
    return _ungroup(out, h), _ungroup(lse, h)


def merge_attn_states(
    prefix_out: torch.Tensor, prefix_lse: torch.Tensor, suffix_out: torch.Tensor, suffix_lse: torch.Tensor
) -> torch.Tensor:
    """Merge two partial attentions by their LSEs, as vLLM's merge_attn_states kernel does.

    Outputs [..., D] and LSEs [...] broadcast together; the math is done in float32.
    """
    inf = float("inf")
    p_lse = torch.where(prefix_lse == inf, torch.full_like(prefix_lse, -inf), prefix_lse.float())
    s_lse = torch.where(suffix_lse == inf, torch.full_like(suffix_lse, -inf), suffix_lse.float())
    max_lse = torch.maximum(p_lse, s_lse)
    # Both -inf: the kernel produces NaN too, but a query always sees its own token, so never here.
    p_se = torch.exp(p_lse - max_lse)
    s_se = torch.exp(s_lse - max_lse)
    out_se = p_se + s_se
    p_scale = (p_se / out_se).unsqueeze(-1)
    s_scale = (s_se / out_se).unsqueeze(-1)
    return prefix_out.float() * p_scale + suffix_out.float() * s_scale


def transpose_lse_layout(lse: torch.Tensor) -> torch.Tensor:
    """Read a [B, H, Q] LSE as if its memory held the token-major [T, H] layout (T = B*Q).

    vLLM indexes LSEs as ``lse[head * num_tokens + token]``; a kernel that wrote
    ``lse[token * num_heads + head]`` hands the merge the wrong value for almost every (head, token).
    """
    b, h, q = lse.shape
    token_major = lse.permute(0, 2, 1).reshape(b * q * h)  # memory as the buggy kernel wrote it
    misread = token_major.view(h, b * q)  # indexed as vLLM reads it: [H, T]
    return misread.view(h, b, q).permute(1, 0, 2).contiguous()


def cascade_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    prefix_len: int,
    inject: str | None = None,
) -> torch.Tensor:
    """Cascade attention over keys whose first ``prefix_len`` columns are shared by every row.

    q: [B, H, Q, D]; k, v: [B, KVH, L, D]; mask: bool [B, 1, Q, L]. Returns [B, H, Q, D] in q's dtype.
    """
    # One copy of the prefix KV serves every request: row 0's (all rows hold the same prefix).
    p_out, p_lse = partial_attention(q, k[:1, :, :prefix_len], v[:1, :, :prefix_len], None, scale)
    s_out, s_lse = partial_attention(q, k[:, :, prefix_len:], v[:, :, prefix_len:], mask[..., prefix_len:], scale)
    # The kernels hand back outputs in the model dtype and LSEs in float32; so do we.
    p_out, s_out = p_out.to(q.dtype), s_out.to(q.dtype)
    if inject == "lse-layout":
        s_lse = transpose_lse_layout(s_lse)
    return merge_attn_states(p_out, p_lse, s_out, s_lse).to(q.dtype)


def flat_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Ordinary attention over all keys (PyTorch SDPA), GQA without copying KV heads."""
    h, kvh = q.shape[1], k.shape[1]
    out = F.scaled_dot_product_attention(_group(q, kvh), k, v, attn_mask=mask.repeat(1, 1, h // kvh, 1), scale=scale)
    return _ungroup(out, h)


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers AttentionInterface entry: returns ([B, Q, H, D], None)."""
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    if attention_mask is None or attention_mask.dim() != 4 or attention_mask.dtype != torch.bool:
        raise RuntimeError("cascade_repro attention expects the engine's 4-D boolean mask")
    if STATE.use_now:
        STATE.calls += 1
        aligned = STATE.common_prefix_len
        out = cascade_attention(query, key, value, attention_mask, scale, aligned, STATE.inject)
    else:
        out = flat_attention(query, key, value, attention_mask, scale)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the attention function with transformers; return its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_NAME, attention_forward)
    # The engine always passes a ready 4-D mask, which transformers forwards untouched; the mask
    # function is only registered so the lookup by implementation name succeeds.
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
    return ATTN_NAME
