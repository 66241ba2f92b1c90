"""Predict, before any GPU time, whether vLLM's cascade attention fires in each planned cell.

The rule is vLLM's own, ``use_cascade_attention`` in ``vllm/v1/attention/backends/flash_attn.py``
(read from the vLLM 0.26.0 wheel). ``GPUModelRunner._compute_cascade_attn_prefix_len`` in
``vllm/v1/worker/gpu_model_runner.py`` calls it once per scheduler step with:

* ``common_prefix_len``: the KV blocks every running request shares (``num_common_prefix_blocks *
  block_size``), capped by the smallest ``num_computed_tokens`` and rounded down to the block size;
* ``query_lens``: the tokens each request runs in this step (all 1 in a pure decode step);
* ``num_query_heads``: ``num_attention_heads // tp``; ``num_kv_heads``: ``max(1, num_kv_heads // tp)``
  (``ModelConfig.get_num_attention_heads`` / ``get_num_kv_heads``);
* ``use_alibi``, ``use_sliding_window``, ``use_local_attention`` from the model and its KV-cache spec;
* ``num_sms``: the GPU's multiprocessor count; ``dcp_world_size``: decode context parallelism.

When vLLM is importable its function is called with the same arguments; otherwise
:func:`use_cascade_attention` below, a line-by-line port, decides. ``tests/test_explain.py``
checks the port against hand-worked cases, and against vLLM's function over a grid when vLLM is
installed.

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

import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from cascade_repro import vllm_surface
from cascade_repro.engines import get as engine_info
from cascade_repro.errors import UsageError
from cascade_repro.run.manifest import CellPlan, Manifest
from cascade_repro.twin import CASCADE as TWIN
from cascade_repro.vllm_surface import ModelAttention, splitkv

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


# ---------------------------------------------------------------------------------------------
# The model's attention, per GPU
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Cells
# ---------------------------------------------------------------------------------------------


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


@dataclass
class Explanation:
    """Predictions for every planned cell, and the decode threshold per TP."""

    engine: str
    model: str
    attention: ModelAttention
    num_sms: int | None
    sms_source: str
    block_size: int
    shared_prefix_tokens: int
    prefix_tokens: int
    dcp_world_size: int
    rule_source: str
    cells: list[CellPrediction]
    thresholds: dict[int, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["thresholds"] = {str(k): v for k, v in self.thresholds.items()}
        return d

    def predictions(self) -> dict[str, dict[str, Any]]:
        return {c.cell_id: c.summary() for c in self.cells}


def _rule_and_source(prefer_vllm: bool) -> tuple[Callable[..., bool] | None, str]:
    if prefer_vllm:
        fn, version = vllm_rule()
        if fn is not None:
            return fn, f"vLLM {version}: {vllm_surface.USE_CASCADE_ATTENTION}"
        return None, f"cascade_repro.explain.use_cascade_attention, a port of {VLLM_SOURCE}; {version}"
    return None, f"cascade_repro.explain.use_cascade_attention, a port of {VLLM_SOURCE}"


def predict(
    cells: Sequence[CellPlan | dict[str, Any]],
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

    A cell is a :class:`~cascade_repro.run.manifest.CellPlan` or its run.json form (a dict).

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
    for c in (c if isinstance(c, CellPlan) else CellPlan.from_json(c) for c in cells):
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


def threshold_lines(ex: Explanation) -> list[str]:
    """One sentence per TP: from how many concurrent requests decode steps choose cascade."""
    lines = []
    sms = f"{ex.num_sms} SMs" if ex.num_sms is not None else "an unknown SM count"
    for tp, t in sorted(ex.thresholds.items()):
        heads = f"{t['q_heads']} query / {t['kv_heads']} KV heads per GPU"
        frm = t["decode_from_batch"]
        if frm is None:
            why = (
                f"shared prefix {ex.prefix_tokens} < {MIN_COMMON_PREFIX} tokens"
                if ex.prefix_tokens < MIN_COMMON_PREFIX
                else "no batch size up to the scan limit"
                if ex.num_sms is not None
                else "pass --gpu or --sm-count"
            )
            lines.append(f"TP {tp} ({heads}): decode steps never choose cascade ({why})")
            continue
        where = f" on {sms}" if engine_info(ex.engine).cost_model else ""
        s = f"TP {tp} ({heads}): decode steps choose cascade from ≈ {frm} concurrent requests at TP {tp}{where}"
        if not t["monotone"]:
            s += " (not at every larger batch: the cost model has rounding steps)"
        lines.append(s)
        if t.get("fa2_band") is not None:
            lines.append(
                f"TP {tp}: with FA2, decode steps of {t['fa2_band']} concurrent requests run cascade through "
                f"FA2's split-KV path (the field bug's band, vLLM <= 0.11.0) once a request's own part "
                f"reaches {t['fa2_band_suffix']} tokens (question + max tokens)"
            )
    return lines


# ---------------------------------------------------------------------------------------------
# Entry points: from a MatrixSpec (the `explain` command) and from a run.json (the report)
# ---------------------------------------------------------------------------------------------


def explain_spec(
    spec: Any,
    *,
    gpu: str | None = None,
    sm_count: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    dcp_world_size: int = 1,
    prefix_tokens: int | None = None,
    prefer_vllm: bool = True,
    max_scan: int = MAX_SCAN,
) -> Explanation:
    """Explain a MatrixSpec: load the model config, measure the shared prefix, predict every cell.

    ``prefix_tokens`` skips tokenization (the shared prefix length, in tokens, before alignment).
    """
    from cascade_repro.plan.matrix import all_cells, plan
    from cascade_repro.plan.models import load_config, resolve_model

    spec.validate()
    if dcp_world_size <= 0:
        raise UsageError(f"--dcp must be positive, got {dcp_world_size}")
    if block_size <= 0:
        raise UsageError(f"--block-size must be positive, got {block_size}")
    model_path, model_name = resolve_model(spec.model)
    cfg = dict(load_config(model_path))
    if engine_info(spec.engine).is_vllm:  # vLLM applies hf_overrides to the config it reads
        cfg.update(spec.hf_overrides or {})
    attention = ModelAttention.from_config(cfg)
    suffix_lens = None
    if prefix_tokens is None:
        from cascade_repro.plan.models import load_tokenizer
        from cascade_repro.prompts.chat import render_all
        from cascade_repro.prompts.promptsets import load_prompt_set, load_system_prompt

        pset = load_prompt_set(spec.prompts, spec.limit, spec.prompt_field, spec.key_field)
        tok = load_tokenizer(model_path, spec.trust_remote_code)
        rendered, prefix_tokens = render_all(
            tok, load_system_prompt(spec.system_prompt), [r.prompt for r in pset.records]
        )
        aligned = prefix_tokens // block_size * block_size
        suffix_lens = [len(r) - aligned for r in rendered]
    elif prefix_tokens < 0:
        raise UsageError(f"--prefix-tokens must be >= 0, got {prefix_tokens}")
    num_sms, source = (
        resolve_sms(gpu, sm_count)
        if engine_info(spec.engine).cost_model
        else (None, "not used by the hf engine")
    )
    rule, rule_source = _rule_and_source(prefer_vllm and engine_info(spec.engine).is_vllm)
    if not engine_info(spec.engine).cost_model:
        rule_source = "hard conditions only (the hf engine's reference cascade has no cost model)"
    cells = [c.to_dict() for c in all_cells(plan(spec))]
    preds, thresholds = predict(
        cells, attention, engine=spec.engine, shared_prefix_tokens=prefix_tokens, suffix_lens=suffix_lens,
        num_sms=num_sms, block_size=block_size, dcp_world_size=dcp_world_size, rule=rule, max_scan=max_scan,
        max_tokens=spec.max_tokens, default_fa=default_fa_for(gpu or source),
    )  # fmt: skip
    return Explanation(
        engine=spec.engine, model=model_name, attention=attention, num_sms=num_sms, sms_source=source,
        block_size=block_size, shared_prefix_tokens=prefix_tokens,
        prefix_tokens=prefix_tokens // block_size * block_size, dcp_world_size=dcp_world_size,
        rule_source=rule_source, cells=preds, thresholds=thresholds,
    )  # fmt: skip


def _spec_value(m: Manifest, name: str, default: Any) -> Any:
    """A spec field where run.json's spec holds it, else ``default``: the fallbacks here are not
    MatrixSpec's defaults (which ``Manifest.spec`` fills in), e.g. an engine not named reads as vLLM."""
    stored = m.spec_json if isinstance(m.spec_json, dict) else {}
    return getattr(m.spec, name) if name in stored else default


def _run_sms(m: Manifest) -> tuple[int | None, str]:
    env = m.stack_env
    try:
        n = int(env.get("sm_count"))
        if n > 0:
            return n, "run.json env.sm_count"
    except (TypeError, ValueError):
        pass
    name = env.get("gpu_name")
    if isinstance(name, str) and name:
        for key in sorted(GPU_SMS, key=len, reverse=True):
            if _norm(key) in _norm(name):
                return GPU_SMS[key], f"run.json env.gpu_name {name!r} (table)"
    return None, "unknown"


_NO_MODEL = object()  # a spec without a model key


def predict_cells(
    m: Manifest, *, model_config: dict[str, Any] | None = None, num_sms: int | None = None
) -> dict[str, dict[str, Any]]:
    """Predict every planned cell of a run.json: ``{cell_id: {"prefill", "decode", "decode_from_batch"}}``.

    Reads the spec, the plan, ``prompt_set.shared_prefix_tokens`` and ``prompt_tokens_mean``, the SM
    count from ``env`` (``sm_count``, else the GPU name via :data:`GPU_SMS`) and the model config
    from ``model_path`` (``spec.hf_overrides`` applied for vLLM). ``decode`` is None when it
    depends on an SM count nobody recorded.
    """
    from cascade_repro.plan.models import load_config

    spec = m.spec
    engine = str(_spec_value(m, "engine", "vllm"))
    if model_config is None:
        model = m.model_path or _spec_value(m, "model", _NO_MODEL)
        if model is _NO_MODEL:
            raise UsageError("run.json names no model (model_path, spec.model)")
        model_config = dict(load_config(str(model)))
        if engine_info(engine).is_vllm:
            model_config.update(spec.hf_overrides or {})
    ps = m.prompt_set
    shared = int(ps.shared_prefix_tokens or 0)
    block = DEFAULT_BLOCK_SIZE
    for e in (m.engines if isinstance(m.engines, dict) else {}).values():
        eff = e.effective
        if isinstance(eff, dict) and isinstance(eff.get("block_size"), int) and eff["block_size"] > 0:
            block = eff["block_size"]
            break
    aligned = shared // block * block
    # Lengths only where the tokenizer recorded them (a default 0 is no measurement).
    measured = m.has("prompt_set")
    mean = ps.prompt_tokens_mean if measured and ps.has("prompt_tokens_mean") else None
    suffix = [max(1, round(float(mean) - aligned))] if isinstance(mean, int | float) else None
    # the split-KV band reads the longest own part
    longest = ps.prompt_tokens_max if measured and ps.has("prompt_tokens_max") else None
    if isinstance(longest, int) and suffix is not None:
        suffix.append(max(1, longest - aligned))
    if num_sms is None and engine_info(engine).cost_model:
        num_sms, _ = _run_sms(m)
    rule, _ = _rule_and_source(engine_info(engine).is_vllm)
    preds, _ = predict(
        m.plan.cells, ModelAttention.from_config(model_config), engine=engine, shared_prefix_tokens=shared,
        suffix_lens=suffix, num_sms=num_sms, block_size=block, rule=rule,
        max_tokens=int(_spec_value(m, "max_tokens", None) or 0) if isinstance(longest, int) else None,
        default_fa=default_fa_for(str((m.env or {}).get("gpu_name") or "")),
    )  # fmt: skip
    return {p.cell_id: p.summary() for p in preds}


def predictions_for(m: Manifest) -> dict[str, Any]:
    """What the runner stores under ``run.json["predictions"]``; ``{}`` when nothing can be predicted.

    ``{"rule", "num_sms", "sms_source", "cells": predict_cells(run)}``. The hf engine gets
    hard-condition predictions too (its reference cascade has no cost model), so its report
    can show them beside the measured counts. Never raises: a prediction is an annotation, and a
    run must not fail for want of one.
    """
    try:
        engine = str(_spec_value(m, "engine", "vllm"))
        if not engine_info(engine).has_weights:  # the fake: no model config to read the attention from
            return {}
        sms, source = _run_sms(m) if engine_info(engine).cost_model else (None, "not used by the hf engine")
        rule = _rule_and_source(True)[1] if engine_info(engine).cost_model else "hard conditions (hf engine)"
        return {"rule": rule, "num_sms": sms, "sms_source": source, "cells": predict_cells(m, num_sms=sms)}
    except Exception:  # noqa: BLE001 - see docstring
        return {}
