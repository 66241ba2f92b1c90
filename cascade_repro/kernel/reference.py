"""Synthetic serving-like inputs in vLLM's paged layout, and the attention they should produce.

Layout (vLLM 0.26, ``vllm/v1/attention/backends/flash_attn.py``): the backend's KV cache is
``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` logically (``get_kv_cache_shape``, line 141)
with the NHD stride order ``(0, 2, 1, 3)`` (line 156), i.e. memory ``[num_blocks, block_size,
num_kv_heads, 2 * head_size]``, and ``FlashAttentionImpl.forward`` splits it into K and V views with
``kv_cache.transpose(1, 2).split(head_size, dim=-1)`` (line 878). :func:`build_inputs` allocates that
memory and takes the same two views, so the kernels see vLLM's strides, not contiguous K and V.

Block 0 is never allocated (vLLM's block pool keeps it as the null block) and pads the block
tables. Every sequence's block table starts with the same physical prefix blocks; its own blocks
are drawn from a shuffled pool, and the whole cache is first filled with other random values, so a
kernel that reads past a sequence's length or into another sequence's blocks reads wrong numbers,
never zeros.

:func:`exact_attention` is the reference: each sequence's causal attention over [prefix + its own
suffix], gathered from the paged cache through its own block table, in float64.
:func:`naive_attention` is a slow, loop-by-loop version for tests; :func:`cascade_reference` redoes
vLLM's cascade (prefix pass, suffix pass, LSE merge) in PyTorch, with vLLM's tensor layouts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from cascade_repro.kernel.grid import KernelCase

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Per-query-head sharpness of the attention: real heads range from nearly uniform to very peaked.
HEAD_TEMP = (0.5, 2.5)
# Float64 score elements per reference chunk (2**26 * 8 bytes = 512 MiB).
CHUNK_ELEMS = 1 << 26


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class PagedInputs:
    """One batch in vLLM's layout: query [T, H, D], packed paged KV cache, block table, lengths."""

    query: torch.Tensor  # [num_tokens, num_q_heads, head_dim], model dtype
    kv_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, 2 * head_dim] (memory order)
    key_cache: torch.Tensor  # kv_cache[..., :head_dim]
    value_cache: torch.Tensor  # kv_cache[..., head_dim:]
    block_table: torch.Tensor  # int32 [num_seqs, max_blocks], padded with the null block 0
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    prefix_len: int
    block_size: int
    scale: float
    cu_query_lens: torch.Tensor  # int32 [num_seqs + 1]
    seq_lens_t: torch.Tensor  # int32 [num_seqs]
    # Only with keep_logical=True: the K/V values as written, [len, num_kv_heads, head_dim] each.
    prefix_k: torch.Tensor | None = None
    prefix_v: torch.Tensor | None = None
    suffix_k: list[torch.Tensor] = field(default_factory=list)
    suffix_v: list[torch.Tensor] = field(default_factory=list)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.query.shape[0])

    @property
    def num_q_heads(self) -> int:
        return int(self.query.shape[1])

    @property
    def num_kv_heads(self) -> int:
        return int(self.key_cache.shape[2])

    @property
    def head_dim(self) -> int:
        return int(self.query.shape[2])

    @property
    def prefix_blocks(self) -> int:
        return self.prefix_len // self.block_size

    @property
    def query_starts(self) -> list[int]:
        out, t = [], 0
        for q in self.query_lens:
            out.append(t)
            t += q
        return out


def _slots(blocks: list[int], n: int, block_size: int) -> torch.Tensor:
    """Flat slot indices (block * block_size + offset) of the first n token positions in blocks."""
    b = torch.tensor(blocks, dtype=torch.long)
    return (b.repeat_interleave(block_size) * block_size + torch.arange(block_size).repeat(len(blocks)))[:n]


def build_inputs(
    case: KernelCase, device: str | torch.device = "cpu", keep_logical: bool = False
) -> PagedInputs:
    """Seeded random inputs for one case on ``device``; never zeros anywhere the kernels may read."""
    device = torch.device(device)
    dtype = TORCH_DTYPES[case.dtype]
    q_lens, s_lens = case.lengths
    bs, p = case.block_size, case.prefix_len
    h, kvh, d = case.num_q_heads, case.num_kv_heads, case.head_dim
    n_pre = p // bs
    own = [cdiv(s, bs) for s in s_lens]
    needed = n_pre + sum(own)
    num_blocks = 1 + needed + max(4, needed // 8)  # null block 0, the used blocks, spare blocks

    # Integer layout from a CPU generator (identical on every device); floats on the device.
    g_cpu = torch.Generator().manual_seed(case.seed)
    g = torch.Generator(device=device).manual_seed(case.seed)
    pool = (torch.randperm(num_blocks - 1, generator=g_cpu) + 1).tolist()
    prefix_phys, pos = pool[:n_pre], n_pre
    rows = []
    for n in own:
        rows.append(prefix_phys + pool[pos : pos + n])
        pos += n
    width = max(len(r) for r in rows)
    table = torch.zeros(len(rows), width, dtype=torch.int32)
    for i, r in enumerate(rows):
        table[i, : len(r)] = torch.tensor(r, dtype=torch.int32)

    def randn(*shape: int) -> torch.Tensor:
        # Drawn in float32 and rounded, so bf16 and fp16 cases of one shape round the same draws.
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype)

    kv_cache = randn(num_blocks, bs, kvh, 2 * d)  # stale values everywhere first
    flat = kv_cache.view(num_blocks * bs, kvh, 2 * d)
    prefix_kv = randn(p, kvh, 2 * d)
    flat[_slots(prefix_phys, p, bs).to(device)] = prefix_kv
    suffix_kv = randn(sum(s_lens), kvh, 2 * d)
    slots = torch.cat([_slots(r[n_pre:], s, bs) for r, s in zip(rows, s_lens, strict=True)])
    flat[slots.to(device)] = suffix_kv

    temp = torch.empty(h, device=device, dtype=torch.float32).uniform_(*HEAD_TEMP, generator=g)
    query = (torch.randn(sum(q_lens), h, d, generator=g, device=device) * temp[None, :, None]).to(dtype)

    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    inputs = PagedInputs(
        query=query,
        kv_cache=kv_cache,
        key_cache=kv_cache[..., :d],
        value_cache=kv_cache[..., d:],
        block_table=table.to(device),
        query_lens=tuple(q_lens),
        seq_lens=tuple(p + s for s in s_lens),
        prefix_len=p,
        block_size=bs,
        scale=d**-0.5,
        cu_query_lens=cu,
        seq_lens_t=torch.tensor([p + s for s in s_lens], dtype=torch.int32, device=device),
    )
    if keep_logical:
        inputs.prefix_k, inputs.prefix_v = prefix_kv[..., :d], prefix_kv[..., d:]
        parts = suffix_kv.split(list(s_lens))
        inputs.suffix_k = [x[..., :d] for x in parts]
        inputs.suffix_v = [x[..., d:] for x in parts]
    return inputs


def gather_kv(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_row: torch.Tensor, start: int, stop: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of token positions [start, stop) of one sequence, read through its block-table row."""
    bs = key_cache.shape[1]
    if stop <= start:
        shape = (0, *key_cache.shape[2:])
        return key_cache.new_empty(shape), value_cache.new_empty(shape)
    first, last = start // bs, cdiv(stop, bs)
    blocks = block_row[first:last].long()
    k = key_cache[blocks].reshape(-1, *key_cache.shape[2:])
    v = value_cache[blocks].reshape(-1, *value_cache.shape[2:])
    off = start - first * bs
    return k[off : off + stop - start], v[off : off + stop - start]


def exact_attention(inputs: PagedInputs, chunk_elems: int = CHUNK_ELEMS) -> torch.Tensor:
    """Float64 causal attention of every query token over its sequence's [prefix + suffix] KV.

    Returns [num_tokens, num_q_heads, head_dim] float64 on the inputs' device. Query j of a request
    with query length Q and KV length L sits at position L - Q + j and sees keys 0..L - Q + j.
    Query head h reads KV head h // (H / KVH), FlashAttention's GQA convention.

    One softmax per query row over all its keys: one maximum and one normaliser shared by the prefix
    and suffix columns (no per-part LSE merge). The prefix columns of consecutive requests that read
    the same physical prefix blocks are computed in one batched matmul per chunk of tokens
    (at most ``chunk_elems`` float64 scores), the suffix columns request by request, each through
    the request's own block-table row.
    """
    h, kvh, d = inputs.num_q_heads, inputs.num_kv_heads, inputs.head_dim
    g = h // kvh
    dev = inputs.query.device
    out = torch.empty(inputs.num_tokens, h, d, dtype=torch.float64, device=dev)
    p, table = inputs.prefix_len, inputs.block_table
    ids = [tuple(r) for r in table[:, : inputs.prefix_blocks].tolist()]
    starts, q_lens, s_lens = inputs.query_starts, inputs.query_lens, inputs.seq_lens
    n, i = inputs.num_seqs, 0
    cached: tuple | None = None
    while i < n:
        if cached is None or cached[0] != ids[i]:
            kp, vp = gather_kv(inputs.key_cache, inputs.value_cache, table[i], 0, p)
            cached = (
                ids[i],
                kp.double().permute(1, 2, 0).contiguous(),
                vp.double().permute(1, 0, 2).contiguous(),
            )
        _, kp_t, vp_t = cached  # [KVH, D, P], [KVH, P, D]
        j, tokens = i, 0
        while j < n and ids[j] == ids[i] and (j == i or (tokens + q_lens[j]) * h * max(p, 1) <= chunk_elems):
            tokens += q_lens[j]
            j += 1
        t0, tc = starts[i], tokens
        q = (
            inputs.query[t0 : t0 + tc]
            .double()
            .view(tc, kvh, g, d)
            .permute(1, 0, 2, 3)
            .reshape(kvh, tc * g, d)
        )
        s_p = torch.bmm(q, kp_t).mul_(inputs.scale) if p else None  # [KVH, Tc*G, P]
        m = s_p.amax(-1) if s_p is not None else q.new_full((kvh, tc * g), float("-inf"))
        num = q.new_zeros(kvh, tc * g, d)
        z = q.new_zeros(kvh, tc * g)
        for s in range(i, j):
            a = (starts[s] - t0) * g
            b = a + q_lens[s] * g
            ks, vs = gather_kv(inputs.key_cache, inputs.value_cache, table[s], p, s_lens[s])
            n_suf = s_lens[s] - p
            scores = torch.bmm(q[:, a:b], ks.double().permute(1, 2, 0)).mul_(inputs.scale)  # [KVH, Q*G, S]
            qpos = torch.arange(n_suf - q_lens[s], n_suf, device=dev).repeat_interleave(g)
            scores.masked_fill_(torch.arange(n_suf, device=dev)[None, :] > qpos[:, None], float("-inf"))
            m_row = torch.maximum(m[:, a:b], scores.amax(-1))
            m[:, a:b] = m_row
            e = scores.sub_(m_row[..., None]).exp_()
            num[:, a:b] = torch.bmm(e, vs.double().permute(1, 0, 2))
            z[:, a:b] = e.sum(-1)
        if s_p is not None:
            e = s_p.sub_(m[..., None]).exp_()
            num += torch.bmm(e, vp_t)
            z += e.sum(-1)
        o = num / z[..., None]
        out[t0 : t0 + tc] = o.view(kvh, tc, g, d).permute(1, 0, 2, 3).reshape(tc, h, d)
        i = j
    return out


def naive_attention(inputs: PagedInputs) -> torch.Tensor:
    """The same attention, one (token, head) at a time with Python floats: for small tests only.

    Reads K and V from the logical tensors kept by ``build_inputs(keep_logical=True)``, not from
    the paged cache, so it also checks the cache layout.
    """
    if inputs.prefix_k is None:
        raise ValueError("naive_attention needs build_inputs(..., keep_logical=True)")
    h, kvh = inputs.num_q_heads, inputs.num_kv_heads
    g = h // kvh
    q_all = inputs.query.double().cpu().tolist()
    pk, pv = inputs.prefix_k.double().cpu().tolist(), inputs.prefix_v.double().cpu().tolist()
    out = []
    for i, (start, ql, sl) in enumerate(
        zip(inputs.query_starts, inputs.query_lens, inputs.seq_lens, strict=True)
    ):
        keys = pk + inputs.suffix_k[i].double().cpu().tolist()
        vals = pv + inputs.suffix_v[i].double().cpu().tolist()
        for j in range(ql):
            pos = sl - ql + j
            row = []
            for head in range(h):
                qv = q_all[start + j][head]
                kv_head = head // g
                logits = [
                    inputs.scale * sum(a * b for a, b in zip(qv, keys[t][kv_head], strict=True))
                    for t in range(pos + 1)
                ]
                m = max(logits)
                w = [math.exp(x - m) for x in logits]
                z = sum(w)
                dims = len(qv)
                row.append([sum(w[t] * vals[t][kv_head][c] for t in range(pos + 1)) / z for c in range(dims)])
            out.append(row)
    return torch.tensor(out, dtype=torch.float64)


def paged_partial_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seqused_k: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``flash_attn_varlen_func(..., return_softmax_lse=True)`` computes, in float32 PyTorch.

    Returns (out [T, H, D] in the query dtype, lse [H, T] float32: FlashAttention's layout). Causal
    masks align to the bottom right; a row that sees no key gets output 0 and LSE +inf, as the
    kernels return (``merge_attn_states`` reads +inf as -inf).
    """
    t, h, d = query.shape
    kvh = key_cache.shape[2]
    g = h // kvh
    out = torch.zeros(t, h, d, dtype=torch.float32, device=query.device)
    lse = torch.full((h, t), float("inf"), dtype=torch.float32, device=query.device)
    cu = cu_seqlens_q.tolist()
    used = seqused_k.tolist()
    for b in range(len(cu) - 1):
        s0, s1, lk = cu[b], cu[b + 1], int(used[b])
        qn = s1 - s0
        if qn == 0 or lk == 0:
            continue
        k, v = gather_kv(key_cache, value_cache, block_table[b], 0, lk)
        q = query[s0:s1].float().view(qn, kvh, g, d)
        scores = torch.einsum("qkgd,lkd->kgql", q, k.float()) * scale
        if causal:
            qpos = torch.arange(lk - qn, lk, device=q.device)
            scores.masked_fill_(torch.arange(lk, device=q.device)[None, :] > qpos[:, None], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # [KVH, G, Qn]
        finite = torch.isfinite(row_lse)
        probs = torch.exp(scores - torch.where(finite, row_lse, torch.zeros_like(row_lse))[..., None])
        o = torch.einsum("kgql,lkd->qkgd", probs, v.float()).reshape(qn, h, d)
        out[s0:s1] = o
        lse[:, s0:s1] = torch.where(finite, row_lse, torch.full_like(row_lse, float("inf"))).reshape(h, qn)
    return out.to(query.dtype), lse


def cascade_reference(inputs: PagedInputs, inject: str | None = None) -> torch.Tensor:
    """vLLM's cascade in PyTorch, with its layouts: prefix pass, suffix pass, LSE merge.

    Mirrors ``cascade_attention`` (``flash_attn.py`` lines 1572-1663): the prefix pass runs every
    query token as one non-causal sequence over ``block_table[:1]`` and ``common_prefix_len`` keys;
    the suffix pass runs each request causally over ``block_table[:, num_common_kv_blocks:]`` and
    ``seq_len - common_prefix_len`` keys; the partial outputs (rounded to the model dtype, LSEs in
    float32 ``[H, T]``) are merged by their LSEs. ``inject="lse-layout"`` hands the merge the suffix
    LSE through :func:`cascade_repro.vllm_surface.probe.misread_lse`, the probe's own transformation.
    """
    from cascade_repro.engines.cascade_attention import merge_attn_states
    from cascade_repro.vllm_surface.probe import misread_lse

    t = inputs.num_tokens
    p = inputs.prefix_len
    dev = inputs.query.device
    p_out, p_lse = paged_partial_attention(
        inputs.query, inputs.key_cache, inputs.value_cache,
        torch.tensor([0, t], dtype=torch.int32, device=dev), torch.tensor([p], dtype=torch.int32, device=dev),
        inputs.block_table[:1], inputs.scale, causal=False,
    )  # fmt: skip
    s_out, s_lse = paged_partial_attention(
        inputs.query, inputs.key_cache, inputs.value_cache, inputs.cu_query_lens, inputs.seq_lens_t - p,
        inputs.block_table[:, inputs.prefix_blocks :], inputs.scale, causal=True,
    )  # fmt: skip
    if inject == "lse-layout":
        s_lse = misread_lse(s_lse)
    elif inject is not None:
        raise ValueError(f"unknown injection {inject!r}")
    return merge_attn_states(p_out, p_lse.t(), s_out, s_lse.t()).to(inputs.query.dtype)


def error_stats(out: torch.Tensor, ref: torch.Tensor, cu_query_lens: list[int] | None = None) -> dict:
    """max_abs, mean_abs, rel = ||out - ref|| / ||ref|| (Frobenius, float64), and the worst request's rel.

    Non-finite outputs give NaN statistics (a NaN never passes a verdict).
    """
    diff = out.double() - ref
    stats = {
        "max_abs": float(diff.abs().max()),
        "mean_abs": float(diff.abs().mean()),
        "rel": float(diff.norm() / ref.norm()),
        "finite": bool(torch.isfinite(out).all()),
    }
    if not stats["finite"]:
        stats.update(max_abs=math.nan, mean_abs=math.nan, rel=math.nan)
    if cu_query_lens is not None and len(cu_query_lens) > 1:
        d2 = diff.pow(2).flatten(1).sum(1)
        r2 = ref.pow(2).flatten(1).sum(1)
        cs_d = torch.cat([d2.new_zeros(1), d2.cumsum(0)])
        cs_r = torch.cat([r2.new_zeros(1), r2.cumsum(0)])
        idx = torch.tensor(cu_query_lens, device=diff.device)
        per = ((cs_d[idx[1:]] - cs_d[idx[:-1]]) / (cs_r[idx[1:]] - cs_r[idx[:-1]])).sqrt()
        stats["seq_rel_max"] = float(per.max()) if stats["finite"] else math.nan
    return stats
