"""Reference cascade attention for the transformers engine, registered as an attention function.

Cascade attention splits every request's keys into the shared prefix (identical for all requests)
and the request's own suffix:

1. prefix pass: all queries of all requests attend to *one copy* of the prefix KV, non-causally
   (every query sits after the whole prefix), returning the output and the log-sum-exp (LSE);
2. suffix pass: each request's queries attend causally to its own suffix KV, returning output and LSE;
3. merge: the two partial results are combined by their LSEs, exactly as vLLM's
   ``merge_attn_states`` does (``vllm/attention/ops/triton_merge_attn_states.py``).

The flat arm is ordinary attention (PyTorch SDPA) over the same keys and mask.

Speed (CPU): the masks each layer needs (grouped for GQA, additive for SDPA) are derived once per
forward step, not once per layer; the prefix pass folds the batch into the rows of each KV head, so
the one prefix copy is read once rather than broadcast B times, and on CPU it runs in PyTorch's flash
kernel, which returns the LSE (the suffix pass, masked, keeps the explicit reference math).

``inject="lse-layout"`` reads the suffix LSE in the transposed layout before the merge: vLLM keeps
LSEs as ``[num_heads, num_tokens]``; FA2's split-KV decode path produced ``[num_tokens, num_heads]``
(vllm-project/flash-attention PR #87). Reinterpreting that memory mixes heads and tokens, which is
the bug class this harness exists to catch; it is the positive control. ``inject="lse-shift=X"``
adds X nats to the prefix LSE instead: a graded fault for measuring detection power (``inject.py``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from cascade_repro import vllm_surface
from cascade_repro.twin import CASCADE as TWIN
from cascade_repro.vllm_surface import inject as inj

ATTN_NAME = "cascade_repro"
# vLLM's hard conditions in use_cascade_attention (vllm/v1/attention/backends/flash_attn.py).
MIN_COMMON_PREFIX = vllm_surface.MIN_COMMON_PREFIX
MIN_REQUESTS = vllm_surface.MIN_REQUESTS


@dataclass
class CascadeState:
    """Per-process switchboard the engine sets before each forward; the attention reads it."""

    arm: str = TWIN.ref
    prefix_len: int = 0
    block_size: int = 16
    inject: str | None = None
    use_now: bool = False
    steps_total: int = 0
    steps_cascade: int = 0
    steps_cascade_decode: int = 0  # cascade steps with one query per request (the field bug's path)
    calls: int = 0
    common_prefix_len: int = 0
    decisions: list[bool] = field(default_factory=list)
    step: int = 0  # this wave's step: the generated token it produces (the prefill produces token 0)

    def reset_counters(self) -> None:
        self.steps_total = self.steps_cascade = self.steps_cascade_decode = self.calls = self.step = 0
        self.decisions = []

    def fault_now(self) -> str | None:
        """The injection this step carries: none before an ``@STEP`` onset."""
        fault = _fault(self.inject)
        return self.inject if fault is not None and fault.active(self.step) else None

    def begin_step(self, n_requests: int, decode: bool = False) -> bool:
        """Decide whether this forward step runs cascade, with vLLM's hard conditions.

        The prefix is block-aligned like vLLM's common prefix. vLLM's decode-time cost heuristic
        compares SM occupancy on a GPU and has no CPU counterpart, so it is not applied here.
        """
        aligned = (self.prefix_len // self.block_size) * self.block_size
        use = self.arm == TWIN.test and aligned >= MIN_COMMON_PREFIX and n_requests >= MIN_REQUESTS
        self.use_now = use
        self.common_prefix_len = aligned if use else 0
        self.step = self.steps_total
        self.steps_total += 1
        self.steps_cascade += int(use)
        self.steps_cascade_decode += int(use and decode)
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
    Fully masked rows give output 0 and LSE -inf (what the kernels return for empty KV). K/V of batch 1
    serve every row without being copied; an unmasked pass on CPU runs in PyTorch's flash kernel.
    """
    h, kvh = q.shape[1], k.shape[1]
    masked_out = None if mask is None else _grouped_mask(mask, h // kvh).logical_not_()
    out, lse = _partial_grouped(_group(q, kvh), k, v, masked_out, scale)
    return _ungroup(out, h), _ungroup(lse, h)


def _grouped_mask(mask: torch.Tensor, g: int) -> torch.Tensor:
    """The [B, 1, Q, L] mask for the grouped queries [B, KVH, G*Q, D] of ``_group``: [B, 1, G*Q, L]."""
    return mask.repeat(1, 1, g, 1)


def _partial_grouped(
    qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked_out: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``partial_attention`` on grouped queries: qg [B, KVH, M, D] -> (out [B, KVH, M, D], lse [B, KVH, M]).

    ``masked_out``: bool [B, 1, M, L], True = masked (the grouped mask, inverted), or None.
    """
    b, kvh, m, d = qg.shape
    fold = k.shape[0] == 1 and b > 1
    if fold:
        # One KV copy for every request: fold the batch into each KV head's rows, so the matmuls read
        # k and v once ([1, KVH, B*M, D] @ [1, KVH, D, L]); a broadcast matmul would copy them B times.
        qg = qg.transpose(0, 1).reshape(1, kvh, b * m, d)
        if masked_out is not None:
            masked_out = masked_out.expand(b, 1, m, masked_out.shape[-1]).reshape(1, 1, b * m, -1)
    qg, k, v = qg.float(), k.float(), v.float()
    fused = _fused_partial(qg, k, v, scale) if masked_out is None else None
    out, lse = fused if fused is not None else _manual_partial(qg, k, v, masked_out, scale)
    if fold:
        out = out.reshape(kvh, b, m, d).transpose(0, 1)
        lse = lse.reshape(kvh, b, m).transpose(0, 1)
    return out, lse


def _fused_partial(
    qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Unmasked float32 partial attention by PyTorch's CPU flash-attention kernel; None where it does not apply.

    The kernel returns the output and the log-sum-exp of the scaled scores, like the flash-attention
    kernels of vLLM's cascade path, without materialising the [M, L] scores: for the prefix pass of a
    prefill (every query of every request against the whole prefix) that is most of the work. Its LSE
    agrees with ``_manual_partial``'s to float32 rounding. Empty KV (no columns) stays on the reference
    path, which gives output 0 and LSE -inf (the kernel would give LSE 0).
    """
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is None or qg.device.type != "cpu" or k.shape[-2] == 0 or qg.shape[-2] == 0:
        return None
    try:
        out, lse = op(qg, k, v, 0.0, False, scale=scale)
    except (RuntimeError, TypeError):  # a signature this torch does not have: the reference path still works
        return None
    return out, lse


def _manual_partial(
    qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked_out: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference math: scores, masked, log-sum-exp, then the LSE-normalised probabilities times V."""
    scores = torch.matmul(qg, k.transpose(-1, -2)).mul_(scale)  # [B, KVH, M, L]
    if masked_out is not None:
        scores.masked_fill_(masked_out, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    safe_lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    probs = scores.sub_(safe_lse.unsqueeze(-1)).exp_()
    return torch.matmul(probs, v), lse


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


@functools.lru_cache(maxsize=64)
def _fault(label: str | None) -> inj.Injection | None:
    # Parsed once per label, not once per layer and step.
    return inj.try_parse(label)


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
    suffix_masked_out = _grouped_mask(mask[..., prefix_len:], q.shape[1] // k.shape[1]).logical_not_()
    return _cascade(q, k, v, suffix_masked_out, scale, prefix_len, inject)


def _cascade(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    suffix_masked_out: torch.Tensor,
    scale: float,
    prefix_len: int,
    inject: str | None,
) -> torch.Tensor:
    """``cascade_attention`` with the suffix mask already grouped and inverted ([B, 1, G*Q, L - prefix_len])."""
    h, kvh = q.shape[1], k.shape[1]
    qg = _group(q, kvh)
    # One copy of the prefix KV serves every request: row 0's (all rows hold the same prefix).
    p_out, p_lse = _partial_grouped(qg, k[:1, :, :prefix_len], v[:1, :, :prefix_len], None, scale)
    s_out, s_lse = _partial_grouped(qg, k[:, :, prefix_len:], v[:, :, prefix_len:], suffix_masked_out, scale)
    p_out, p_lse, s_out, s_lse = (_ungroup(x, h) for x in (p_out, p_lse, s_out, s_lse))
    # The kernels hand back outputs in the model dtype and LSEs in float32; so do we.
    p_out, s_out = p_out.to(q.dtype), s_out.to(q.dtype)
    fault = _fault(inject)
    if fault is not None and fault.kind == inj.LSE_LAYOUT:
        s_lse = transpose_lse_layout(s_lse)
    elif fault is not None and fault.kind == inj.LSE_SHIFT:
        p_lse = p_lse + fault.nats  # the prefix weighed e**X times too much against the suffix
    return merge_attn_states(p_out, p_lse, s_out, s_lse).to(q.dtype)


def flat_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Ordinary attention over all keys (PyTorch SDPA), GQA without copying KV heads."""
    return _flat(q, k, v, _additive_mask(_grouped_mask(mask, q.shape[1] // k.shape[1]), q.dtype), scale)


def _additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as the additive one SDPA turns it into (0 = attend, -inf = masked), same values."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        mask.logical_not(), float("-inf")
    )


def _flat(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grouped_add_mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """``flat_attention`` with the mask already grouped ([B, 1, G*Q, L]) and additive."""
    h, kvh = q.shape[1], k.shape[1]
    out = F.scaled_dot_product_attention(_group(q, kvh), k, v, attn_mask=grouped_add_mask, scale=scale)
    return _ungroup(out, h)


class _StepMasks:
    """The masks derived from the engine's mask, built once per forward step instead of once per layer.

    Every layer of one forward receives the same mask object; the derived masks are kept for that
    object and rebuilt when another one arrives.
    """

    def __init__(self) -> None:
        self.src: torch.Tensor | None = None
        self.built: dict[tuple, torch.Tensor] = {}

    def get(self, mask: torch.Tensor, key: tuple, build) -> torch.Tensor:
        if mask is not self.src:
            self.src, self.built = mask, {}
        got = self.built.get(key)
        if got is None:
            got = self.built[key] = build()
        return got

    def clear(self) -> None:
        self.src, self.built = None, {}


_STEP_MASKS = _StepMasks()


def release_step_masks() -> None:
    """Drop the masks kept for the last forward (the engine calls this when a wave ends)."""
    _STEP_MASKS.clear()


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers AttentionInterface entry: returns ([B, Q, H, D], None)."""
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    if attention_mask is None or attention_mask.dim() != 4 or attention_mask.dtype != torch.bool:
        raise RuntimeError("cascade_repro attention expects the engine's 4-D boolean mask")
    g = query.shape[1] // key.shape[1]
    if STATE.use_now:
        STATE.calls += 1
        aligned = STATE.common_prefix_len
        suffix_masked_out = _STEP_MASKS.get(
            attention_mask,
            ("cascade", g, aligned),
            lambda: _grouped_mask(attention_mask[..., aligned:], g).logical_not_(),
        )
        out = _cascade(query, key, value, suffix_masked_out, scale, aligned, STATE.fault_now())
    else:
        add_mask = _STEP_MASKS.get(
            attention_mask,
            ("flat", g, query.dtype),
            lambda: _additive_mask(_grouped_mask(attention_mask, g), query.dtype),
        )
        out = _flat(query, key, value, add_mask, scale)
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
