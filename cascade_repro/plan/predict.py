"""Predict, before any GPU time, whether vLLM's cascade attention fires in each planned cell.

Per cell, vLLM's rule (``vllm_surface/cascade_rule.py``) on the cell's prefill step and on a decode
step at its batch size, and whether its decode steps fall in FA2's split-KV band
(``vllm_surface/splitkv.py``).

What a prediction assumes (the ``vllm`` engine of this harness makes these true): cascade enabled
(``disable_cascade_attn=False``), the FLASH_ATTN backend and the V1 model runner, prefix caching
with the shared prefix already cached when the wave arrives (the engine re-warms it before each
wave), and a wave's requests running in the same steps. The shared prefix is the one every prompt
of the set shares; a wave whose prompts share more than that can only fire more often. During
decoding, requests that finish leave the batch, so the number of requests in a step falls over
time: ``decode_from_batch`` is the smallest number of concurrently decoding requests for which a
decode step picks cascade.

The ``hf`` engine's reference cascade applies only the hard conditions (shared prefix >= 256
tokens after block alignment, >= 8 requests in the step, no sliding window or ALiBi), with no
cost model, so its predictions are those hard conditions and ``decode_from_batch`` is 8.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cascade_repro.engines import get as engine_info
from cascade_repro.errors import UsageError
from cascade_repro.rundir.cells import Cell
from cascade_repro.twin import CASCADE as TWIN
from cascade_repro.vllm_surface import ModelAttention, splitkv
from cascade_repro.vllm_surface.cascade_rule import (
    CASCADE_BACKEND,
    DEFAULT_BLOCK_SIZE,
    MAX_SCAN,
    MIN_COMMON_PREFIX,
    MIN_REQUESTS,
    decide,
    decode_threshold,
)


@dataclass
class CellPrediction:
    """Whether cascade fires in one cell's prefill and decode steps, and why."""

    cell_id: str
    tp: int
    batch: int
    arm: str
    backend: str
    q_heads: int
    kv_heads: int
    prefix_tokens: int
    prefill: bool
    decode: bool | None
    decode_from_batch: int | None
    prefill_reason: str
    decode_reason: str
    notes: list[str] = field(default_factory=list)
    # FA2's split-KV decode path (the field bug's branch) under cascade, at this run's longest
    # per-request suffix: True/False, None when FA2 does not run the cell or it cannot be known.
    fa2_split: bool | None = None
    fa2_split_reason: str = ""
    # The cost model's two numbers for a decode step at this batch (None where it does not decide).
    decode_cost: dict[str, int] | None = None

    def summary(self) -> dict[str, Any]:
        """The compact form stored in run.json: prefill, decode, decode_from_batch (and fa2_split if known)."""
        out: dict[str, Any] = {
            "prefill": self.prefill,
            "decode": self.decode,
            "decode_from_batch": self.decode_from_batch,
        }
        if self.fa2_split is not None:
            out["fa2_split"] = self.fa2_split
        if self.decode_cost is not None:
            out["decode_cost"] = dict(self.decode_cost)
        return out


def predict(
    cells: Sequence[Cell | dict[str, Any]],
    attention: ModelAttention,
    *,
    engine: str = "vllm",
    shared_prefix_tokens: int,
    suffix_lens: Sequence[int] | None = None,
    num_sms: int | None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    dcp_world_size: int = 1,
    rule: Callable[..., bool] | None = None,
    max_scan: int = MAX_SCAN,
    max_tokens: int | None = None,
    default_fa: int | None = None,
) -> tuple[list[CellPrediction], dict[int, dict[str, Any]]]:
    """Predict every cell (cell_id, tp, batch, arm, backend, fa_version) and the decode threshold per TP.

    A cell is a :class:`~cascade_repro.rundir.manifest.Cell` or its run.json form (a dict).

    ``suffix_lens`` are the prompt lengths after the block-aligned prefix, in prompt order (the
    first wave of a cell takes the first ``batch`` of them, cycling); by default every prompt is
    assumed to have more than one token past the prefix. With ``max_tokens`` (and the suffix
    lengths), each vLLM cell also says whether its decode steps take FA2's split-KV path under
    cascade (the field bug's band), for the longest own part a request can reach; a cell without
    an FA version runs ``default_fa`` (3 on Hopper; None: unknown, predicted as if FA2 ran).
    """
    if block_size <= 0:
        raise UsageError(f"block size must be positive, got {block_size}")
    aligned = shared_prefix_tokens // block_size * block_size
    suffix = list(suffix_lens or [2])
    variants = dict(
        use_alibi=attention.use_alibi,
        use_sliding_window=attention.use_sliding_window,
        use_local_attention=attention.use_local_attention,
    )
    thresholds: dict[int, dict[str, Any]] = {}
    scans: dict[tuple[int, int], tuple[int | None, bool]] = {}
    longest = (max(suffix) + max_tokens) if suffix_lens and max_tokens is not None else None
    out = []
    for c in (c if isinstance(c, Cell) else Cell.from_json(c) for c in cells):
        tp, batch, arm = int(c.tp), int(c.batch), str(c.arm)
        backend = str(c.backend or CASCADE_BACKEND).upper()
        qh, kvh = attention.per_gpu(tp)
        notes = list(attention.notes)
        if attention.num_attention_heads % tp:
            notes.append(
                f"{attention.num_attention_heads} query heads do not divide by TP {tp}: vLLM refuses this TP"
            )
        if not engine_info(engine).cost_model:  # the hf engine: hard conditions only
            ok = not (attention.use_sliding_window or attention.use_alibi)
            hard = ok and aligned >= MIN_COMMON_PREFIX
            fire = arm == TWIN.test and hard and batch >= MIN_REQUESTS
            if arm != TWIN.test:
                why = "flat arm: cascade off"
            elif not ok:
                why = "sliding window or ALiBi: the hf engine runs flat"
            elif aligned < MIN_COMMON_PREFIX:
                why = f"shared prefix {aligned} < {MIN_COMMON_PREFIX} tokens"
            elif batch < MIN_REQUESTS:
                why = f"{batch} request{'s' if batch != 1 else ''} in the step < {MIN_REQUESTS}"
            else:
                why = "hard conditions met (the hf engine has no cost model)"
            frm = MIN_REQUESTS if hard else None
            thresholds.setdefault(
                tp, {"q_heads": qh, "kv_heads": kvh, "decode_from_batch": frm, "monotone": True}
            )
            out.append(CellPrediction(c.cell_id, tp, batch, arm, backend, qh, kvh, aligned, fire, fire, frm,
                                      why, why, notes))  # fmt: skip
            continue
        if num_sms is None:
            frm, mono = None, True
        else:
            key = (qh, kvh)
            if key not in scans:
                scans[key] = decode_threshold(aligned, qh, kvh, num_sms, dcp_world_size=dcp_world_size, rule=rule,
                                              max_batch=max_scan, **variants)  # fmt: skip
            frm, mono = scans[key]
        if tp not in thresholds:
            thresholds[tp] = {"q_heads": qh, "kv_heads": kvh, "decode_from_batch": frm, "monotone": mono}
            thresholds[tp].update(
                _fa2_band(attention, qh, kvh, aligned, longest, num_sms, dcp_world_size, rule, variants)
            )
        off = None
        if arm != TWIN.test:
            off = "flat arm: cascade off"
        elif backend != CASCADE_BACKEND:
            off = f"{backend} never picks cascade (only FLASH_ATTN implements it)"
        elif attention.use_mla:
            off = "MLA model: no FLASH_ATTN cascade path"
        if off:
            out.append(CellPrediction(c.cell_id, tp, batch, arm, backend, qh, kvh, aligned, False, False, frm,
                                      off, off, notes))  # fmt: skip
            continue
        sms = num_sms if num_sms is not None else 1
        qlens = [max(1, suffix[i % len(suffix)]) for i in range(batch)]
        pre = decide(
            aligned, qlens, qh, kvh, num_sms=sms, dcp_world_size=dcp_world_size, rule=rule, **variants
        )
        dec = decide(aligned, [1] * batch, qh, kvh, num_sms=sms, dcp_world_size=dcp_world_size, rule=rule,
                     **variants)  # fmt: skip
        dec_fires: bool | None = dec.fires
        dec_reason = dec.reason
        if num_sms is None and dec.cascade_time is not None:
            dec_fires, dec_reason = None, "depends on the SM count (unknown: pass --gpu or --sm-count)"
        split, split_why = fa2_split(batch, qh, kvh, attention.head_dim, longest, num_sms, dec_fires,
                                     c.fa_version or default_fa)  # fmt: skip
        cost = None
        if num_sms is not None and dec.cascade_time is not None and dec.flash_decoding_time is not None:
            cost = {"cascade": dec.cascade_time, "flash_decoding": dec.flash_decoding_time}
        out.append(CellPrediction(c.cell_id, tp, batch, arm, backend, qh, kvh, aligned, pre.fires, dec_fires,
                                  frm, pre.reason, dec_reason, notes, split, split_why, cost))  # fmt: skip
    return out, thresholds


def fa2_split(
    batch: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int | None,
    longest_suffix: int | None,
    num_sms: int | None,
    decode_fires: bool | None,
    fa_version: Any = None,
) -> tuple[bool | None, str]:
    """Whether a cascade cell's decode steps take FA2's split-KV branch (the field bug's), and why."""
    if head_dim is None:
        return None, "head dim unknown"
    if num_sms is None:
        return None, "depends on the SM count"
    if longest_suffix is None:
        return None, "per-request suffix length unknown"
    if fa_version is not None and str(fa_version) != "2":
        return False, f"FA{fa_version} runs (vLLM's default on Hopper is FA3): no FA2 split-KV path"
    if not splitkv.gqa_packed(q_heads, kv_heads):
        return False, "no GQA packing (as many query as KV heads): not the bug's branch"
    if decode_fires is False:
        return False, "decode steps do not choose cascade"
    n = splitkv.decode_splits(batch, q_heads, kv_heads, head_dim, longest_suffix, num_sms)
    start = splitkv.split_from_suffix(batch, q_heads, kv_heads, head_dim, num_sms)
    if n > 1:
        return (
            True,
            f"{n} KV splits once a request's own part passes {start - 1} tokens (reaches {longest_suffix})",
        )
    if start is None:
        return False, f"1 split: {batch} requests x {kv_heads} KV heads fill >= 80% of 2 x {num_sms} SMs"
    return False, f"1 split up to {longest_suffix} own tokens (splits from {start})"


def _fa2_band(
    attention: ModelAttention,
    q_heads: int,
    kv_heads: int,
    aligned: int,
    longest: int | None,
    num_sms: int | None,
    dcp_world_size: int,
    rule: Callable[..., bool] | None,
    variants: dict[str, bool],
) -> dict[str, Any]:
    """The field bug's band at one TP: request counts whose decode steps cascade through FA2's split path."""
    if attention.head_dim is None or num_sms is None or longest is None:
        return {}  # nothing to say without head dim, SM count and suffix length

    def cascade_decode(n: int) -> bool:
        return decide(aligned, np.ones(n, dtype=np.int32), q_heads, kv_heads, num_sms=num_sms,
                      dcp_world_size=dcp_world_size, rule=rule, **variants).fires  # fmt: skip

    # FA2 never splits once requests x KV heads fill 80% of 2 x SMs: no need to scan further.
    top = max(MIN_REQUESTS, int(1.6 * num_sms) // max(1, kv_heads) + 1)
    b = splitkv.band(
        cascade_decode, q_heads, kv_heads, attention.head_dim, longest, num_sms, max_requests=top
    )
    return {"fa2_band": b.text(), "fa2_band_suffix": longest, "fa2_band_ranges": b.ranges}
