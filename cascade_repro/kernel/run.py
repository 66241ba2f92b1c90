"""Run the grid through vLLM's own kernels on a GPU and judge cascade against the flat path.

Per case, on the same inputs (``reference.build_inputs``):

- cascade: ``vllm.v1.attention.backends.flash_attn.cascade_attention``, called with the arguments
  ``FlashAttentionImpl.forward`` passes (vLLM 0.26.0 ``flash_attn.py`` lines 1042-1068), with the
  metadata ``FlashAttentionMetadataBuilder.build`` makes for a cascade step (lines 606-631: one
  prefix "sequence" of all query tokens, ``prefix_kv_lens=[common_prefix_len]``,
  ``suffix_kv_lens = seq_lens - common_prefix_len``, and for FA3 the AOT scheduler metadata);
- flat: the one ``flash_attn_varlen_func`` call of the non-cascade forward (lines 1014-1039) over
  the whole paged KV, with the metadata of a plain step (lines 632-639);
- reference: ``reference.exact_attention`` in float64.

Verdict: ``ok`` when cascade's relative error is within ``factor`` times the flat path's, else
``mismatch``. ``inject="lse-layout"`` wraps the ``merge_attn_states`` that ``cascade_attention``
calls with :func:`cascade_repro.vllm_surface.probe.wrap_merge`, the probe's own wrapper, for the cascade call
only; the flat path never merges.

vLLM is imported only by :func:`load_vllm`; the rest of this module runs without it, and the
tests drive :func:`run_case` on a CPU with a stand-in for the vLLM module.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from cascade_repro import vllm_surface
from cascade_repro.errors import UsageError
from cascade_repro.kernel.grid import KernelCase

FLASH_ATTN_MODULE = vllm_surface.FLASH_ATTN_MODULE
INJECTIONS = ("lse-layout",)
DEFAULT_FACTOR = 4.0
DEFAULT_EPS = 1e-6
STATUSES = ("ok", "mismatch", "error", "skipped")


class MissingRequirement(UsageError):
    """No CUDA GPU, or no vLLM with its FlashAttention kernels: the CLI prints one line, exit 2."""


@dataclass
class VllmApi:
    """The vLLM functions the harness calls, resolved from the flash_attn backend module.

    ``cascade_attention`` and ``merge_attn_states`` are looked up on ``module`` at call time, so a
    patched ``merge_attn_states`` (the injection) is what vLLM's ``cascade_attention`` calls.
    """

    module: ModuleType
    version: str = "?"
    unsupported_reason: Callable[[int], str | None] = lambda v: None
    batch_invariant: bool = False

    @property
    def flash_attn_varlen_func(self) -> Callable[..., Any]:
        return self.module.flash_attn_varlen_func

    @property
    def get_scheduler_metadata(self) -> Callable[..., Any] | None:
        return getattr(self.module, "get_scheduler_metadata", None)

    def canonicalize(self, t: Any) -> Any:
        fn = getattr(self.module, "canonicalize_singleton_dim_strides", None)
        return fn(t) if fn is not None else t

    @property
    def supports_quant_query_input(self) -> bool:
        fn = getattr(self.module, "flash_attn_supports_quant_query_input", None)
        return bool(fn()) if fn is not None else True

    def would_cascade(self, case: KernelCase, num_sms: int | None) -> bool | None:
        """vLLM's own ``use_cascade_attention`` for this step (informational; None if unknown)."""
        fn = getattr(self.module, "use_cascade_attention", None)
        if fn is None or num_sms is None:
            return None
        try:
            import numpy as np

            return bool(
                fn(
                    common_prefix_len=case.prefix_len,
                    query_lens=np.array(case.query_lens, dtype=np.int32),
                    num_query_heads=case.num_q_heads,
                    num_kv_heads=case.num_kv_heads,
                    use_alibi=False,
                    use_sliding_window=False,
                    use_local_attention=False,
                    num_sms=num_sms,
                    dcp_world_size=1,
                )
            )
        except Exception:  # noqa: BLE001 - informational only; the signature changes between versions
            return None


def missing_requirements() -> list[str]:
    """What this machine lacks for the GPU run, as short phrases (empty when nothing is missing)."""
    import importlib.util

    missing = []
    try:
        import torch

        if not torch.cuda.is_available():
            missing.append(f"no CUDA GPU visible to torch {torch.__version__}")
    except ImportError:
        missing.append("torch is not installed")
    if importlib.util.find_spec("vllm") is None:
        missing.append(f'vLLM is not installed (pip install "{vllm_surface.CASCADE_REQUIREMENT}")')
    return missing


def vllm_version() -> str:
    """The installed vLLM's version, read without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return "?"


def require_gpu_and_vllm() -> None:
    missing = missing_requirements()
    if missing:
        raise MissingRequirement("cascade-repro kernel needs a CUDA GPU and vLLM: " + "; ".join(missing))


def load_vllm() -> VllmApi:
    """Import vLLM's FlashAttention backend; MissingRequirement when its kernels are unavailable."""
    try:
        import vllm
    except Exception as e:  # noqa: BLE001 - any import failure means the same thing to the user
        raise MissingRequirement(f"cascade-repro kernel needs vLLM: importing vllm failed: {e}") from None
    try:
        module = importlib.import_module(FLASH_ATTN_MODULE)
    except Exception as e:  # noqa: BLE001
        raise MissingRequirement(f"cascade-repro kernel: importing {FLASH_ATTN_MODULE} failed: {e}") from None
    for name in ("cascade_attention", "merge_attn_states", "flash_attn_varlen_func"):
        if not hasattr(module, name):
            raise MissingRequirement(
                f"cascade-repro kernel: {FLASH_ATTN_MODULE} has no {name} (vLLM {vllm.__version__}; "
                "its FlashAttention kernels are not available on this platform?)"
            )
    try:
        from vllm.vllm_flash_attn import fa_version_unsupported_reason as reason
    except Exception:  # noqa: BLE001

        def reason(v: int) -> str | None:
            return None

    try:
        import vllm.envs as envs

        batch_invariant = bool(envs.VLLM_BATCH_INVARIANT)
    except Exception:  # noqa: BLE001
        batch_invariant = False
    return VllmApi(
        module=module,
        version=str(getattr(vllm, "__version__", "?")),
        unsupported_reason=reason,
        batch_invariant=batch_invariant,
    )


# --------------------------------------------------------------------------------------------
# Verdicts and results
# --------------------------------------------------------------------------------------------


def verdict(
    cascade_rel: float, flat_rel: float, factor: float, eps: float = DEFAULT_EPS
) -> tuple[str, float, str]:
    """(status, ratio, reason): ``ok`` when cascade_rel <= factor * max(flat_rel, eps)."""
    if not math.isfinite(flat_rel):
        return "error", math.nan, "flat path output is not finite"
    denom = max(flat_rel, eps)
    if not math.isfinite(cascade_rel):
        return "mismatch", math.nan, "cascade output is not finite"
    ratio = cascade_rel / denom
    if cascade_rel <= factor * denom:
        return "ok", ratio, ""
    return (
        "mismatch",
        ratio,
        f"cascade rel {cascade_rel:.3g} > {factor:g} x flat rel {denom:.3g} (ratio {ratio:.3g})",
    )


@dataclass
class CaseResult:
    case: KernelCase
    status: str
    reason: str = ""
    cascade: dict = field(default_factory=dict)
    flat: dict = field(default_factory=dict)
    ratio: float | None = None
    seq_ratio: float | None = None
    vllm_would_cascade: bool | None = None
    inject_calls: int = 0
    wall_s: float = 0.0

    RESULT_FIELDS = ("status", "reason", "cascade", "flat", "ratio", "seq_ratio", "vllm_would_cascade",
                     "inject_calls", "wall_s")  # fmt: skip

    @classmethod
    def from_dict(cls, case: KernelCase, d: dict) -> CaseResult:
        """The result ``to_dict`` wrote (e.g. in a worker process), attached to its case."""
        return cls(case=case, **{k: d[k] for k in cls.RESULT_FIELDS if k in d})

    def to_dict(self) -> dict:
        return {
            **self.case.to_dict(),
            "status": self.status,
            "reason": self.reason,
            "cascade": self.cascade,
            "flat": self.flat,
            "ratio": self.ratio,
            "seq_ratio": self.seq_ratio,
            "vllm_would_cascade": self.vllm_would_cascade,
            "inject_calls": self.inject_calls,
            "wall_s": round(self.wall_s, 4),
        }


# --------------------------------------------------------------------------------------------
# The injection: the probe's merge wrapper around one cascade call
# --------------------------------------------------------------------------------------------


class InjectSwitch:
    """The part of ``probe.ProbeState`` that ``probe.wrap_merge`` reads, without its files."""

    def __init__(self, inject: str | None) -> None:
        from cascade_repro.vllm_surface import inject as inj

        self.inject = inj.try_parse(inject)  # what wrap_merge reads: a parsed injection
        self.in_cascade = False
        self.token_index = 0  # one kernel call is no answer: an injection's @STEP onset never comes
        self.calls = 0

    def record_inject(self) -> None:
        self.calls += 1


@contextlib.contextmanager
def merge_injected(module: ModuleType, inject: str | None) -> Iterator[InjectSwitch]:
    """Replace ``module.merge_attn_states`` with ``probe.wrap_merge``'s wrapper while inside.

    Set ``switch.in_cascade`` around the cascade call: the wrapper changes nothing outside it.
    """
    from cascade_repro.vllm_surface.probe import wrap_merge

    switch = InjectSwitch(inject)
    if inject is None:
        yield switch
        return
    check_inject(inject)
    orig = module.merge_attn_states
    module.merge_attn_states = wrap_merge(orig, switch)  # type: ignore[arg-type]
    try:
        yield switch
    finally:
        module.merge_attn_states = orig


# --------------------------------------------------------------------------------------------
# One case
# --------------------------------------------------------------------------------------------


def run_case(
    api: VllmApi,
    case: KernelCase,
    device: str = "cuda",
    inject: str | None = None,
    factor: float = DEFAULT_FACTOR,
    eps: float = DEFAULT_EPS,
    num_sms: int | None = None,
) -> CaseResult:
    """Build the case's inputs, run cascade and flat through ``api``, compare both with float64."""
    import torch

    from cascade_repro.kernel.reference import build_inputs, error_stats, exact_attention

    t0 = time.perf_counter()
    inputs = build_inputs(case, device)
    ref = exact_attention(inputs)
    dev = inputs.query.device
    dtype = inputs.query.dtype
    query = inputs.query
    # FlashAttentionImpl.forward: fix degenerate strides of size-1 dims (MQA) before the kernels.
    key_cache = api.canonicalize(inputs.key_cache)
    value_cache = api.canonicalize(inputs.value_cache)
    block_table = inputs.block_table
    query_start_loc = inputs.cu_query_lens
    seq_lens = inputs.seq_lens_t
    num_reqs, num_tokens = inputs.num_seqs, inputs.num_tokens
    max_query_len, max_seq_len = max(inputs.query_lens), max(inputs.seq_lens)
    common = inputs.prefix_len
    h, kvh, d = inputs.num_q_heads, inputs.num_kv_heads, inputs.head_dim
    fa = case.fa_version
    # The builder: max_num_splits is what the metadata carries; VLLM_BATCH_INVARIANT forces 1 and
    # turns the AOT scheduler off (flash_attn.py lines 469-502).
    splits = 1 if api.batch_invariant else case.max_num_splits
    aot = fa == 3 and not api.batch_invariant and api.get_scheduler_metadata is not None

    def schedule(
        batch_size: int, cu_query_lens: Any, max_q: int, seqlens: Any, max_k: int, causal: bool
    ) -> Any:
        # FlashAttentionMetadataBuilder.build's schedule() (lines 504-530); FA2 has no AOT scheduler.
        if not aot:
            return None
        return api.get_scheduler_metadata(
            batch_size=batch_size,
            max_seqlen_q=max_q,
            max_seqlen_k=max_k,
            num_heads_q=h,
            num_heads_kv=kvh,
            headdim=d,
            cache_seqlens=seqlens,
            qkv_dtype=dtype,
            cu_seqlens_q=cu_query_lens,
            page_size=case.block_size,
            causal=causal,
            window_size=(-1, -1),
            num_splits=splits,
        )

    # Attention registers _q_scale/_k_scale/_v_scale as float32 scalars of 1.0 (attention.py line 129).
    one = torch.tensor(1.0, dtype=torch.float32, device=dev)

    # Flat: the non-cascade branch of forward (flash_attn.py lines 902-1039).
    out_flat = torch.full_like(query, float("nan"))  # a kernel that skips an element shows up as NaN
    descale_shape = (query_start_loc.shape[0] - 1, kvh)
    api.flash_attn_varlen_func(
        q=query,
        k=key_cache,
        v=value_cache,
        out=out_flat,
        cu_seqlens_q=query_start_loc,
        max_seqlen_q=max_query_len,
        seqused_k=seq_lens,
        max_seqlen_k=max_seq_len,
        softmax_scale=inputs.scale,
        causal=True,
        alibi_slopes=None,
        window_size=[-1, -1],
        block_table=block_table,
        softcap=0,
        scheduler_metadata=schedule(num_reqs, query_start_loc, max_query_len, seq_lens, max_seq_len, True),
        fa_version=fa,
        q_descale=one.expand(descale_shape) if api.supports_quant_query_input else None,
        k_descale=one.expand(descale_shape),
        v_descale=one.expand(descale_shape),
        num_splits=splits,
    )

    # Cascade: the builder's cascade metadata (lines 606-631) and forward's call (lines 1042-1068).
    cu_prefix_query_lens = torch.tensor([0, num_tokens], dtype=torch.int32, device=dev)
    prefix_kv_lens = torch.tensor([common], dtype=torch.int32, device=dev)
    suffix_kv_lens = seq_lens[:num_reqs] - common
    prefix_sched = schedule(1, cu_prefix_query_lens, num_tokens, prefix_kv_lens, common, False)
    suffix_sched = schedule(
        num_reqs, query_start_loc, max_query_len, suffix_kv_lens, max_seq_len - common, True
    )
    out_cascade = torch.full_like(query, float("nan"))
    with merge_injected(api.module, inject) as switch:
        switch.in_cascade = True
        try:
            api.module.cascade_attention(
                out_cascade,
                query,
                key_cache,
                value_cache,
                cu_query_lens=query_start_loc,
                max_query_len=max_query_len,
                cu_prefix_query_lens=cu_prefix_query_lens,
                prefix_kv_lens=prefix_kv_lens,
                suffix_kv_lens=suffix_kv_lens,
                max_kv_len=max_seq_len,
                softmax_scale=inputs.scale,
                alibi_slopes=None,
                sliding_window=(-1, -1),
                logits_soft_cap=0,
                block_table=block_table,
                common_prefix_len=common,
                max_num_splits=splits,
                fa_version=fa,
                prefix_scheduler_metadata=prefix_sched,
                suffix_scheduler_metadata=suffix_sched,
                q_descale=one,
                k_descale=one,
                v_descale=one,
            )
        finally:
            switch.in_cascade = False
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)

    cu = inputs.cu_query_lens.tolist()
    c_stats = error_stats(out_cascade, ref, cu)
    f_stats = error_stats(out_flat, ref, cu)
    status, ratio, reason = verdict(c_stats["rel"], f_stats["rel"], factor, eps)
    seq_ratio = None
    if math.isfinite(c_stats.get("seq_rel_max", math.nan)) and math.isfinite(
        f_stats.get("seq_rel_max", math.nan)
    ):
        seq_ratio = c_stats["seq_rel_max"] / max(f_stats["seq_rel_max"], eps)
    if inject is not None and switch.calls == 0 and status != "error":
        status, reason = (
            "error",
            "injection requested but merge_attn_states was never called through the wrapper",
        )
    return CaseResult(
        case=case,
        status=status,
        reason=reason,
        cascade=c_stats,
        flat=f_stats,
        ratio=None if math.isnan(ratio) else ratio,
        seq_ratio=seq_ratio,
        vllm_would_cascade=api.would_cascade(case, num_sms),
        inject_calls=switch.calls,
        wall_s=time.perf_counter() - t0,
    )


# --------------------------------------------------------------------------------------------
# The grid
# --------------------------------------------------------------------------------------------


def environment(api: VllmApi | None, device: str) -> dict:
    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        env.update(gpu=props.name, sms=props.multi_processor_count, capability=f"{props.major}.{props.minor}")
    if api is not None:
        env["vllm"] = api.version
        env["vllm_batch_invariant"] = api.batch_invariant
        env["flash_attn_module"] = getattr(api.module, "__file__", None)
        env["fa_unsupported"] = {str(v): api.unsupported_reason(v) for v in (2, 3)}
    for k in ("VLLM_BATCH_INVARIANT", "VLLM_FLASH_ATTN_VERSION", "CUDA_VISIBLE_DEVICES"):
        if os.environ.get(k):
            env[k] = os.environ[k]
    return env


def check_inject(inject: str | None) -> None:
    """A usage error unless ``inject`` is None or a fault this module knows."""
    if inject is not None and inject not in INJECTIONS:
        raise UsageError(f"unknown --inject {inject!r}: expected one of {', '.join(INJECTIONS)}")


def error_line(e: BaseException) -> str:
    """``Type: first line of the message``, at most 300 characters."""
    text = f"{type(e).__name__}: {e}".strip()
    return (text.splitlines() or [type(e).__name__])[0][:300]


def run_one(
    api: VllmApi,
    case: KernelCase,
    *,
    inject: str | None,
    factor: float,
    eps: float,
    device: str,
    num_sms: int | None,
    unsupported: dict[int, str | None],
) -> CaseResult:
    """One case of the grid: skipped when its FA version is unsupported, an error row when it raises."""
    import torch

    t0 = time.perf_counter()
    if unsupported.get(case.fa_version):
        return CaseResult(case, "skipped", f"FA{case.fa_version} unsupported: {unsupported[case.fa_version]}")
    try:
        with torch.inference_mode():
            return run_case(api, case, device, inject, factor, eps, num_sms)
    except Exception as e:  # noqa: BLE001 - reported per case; the grid goes on
        res = CaseResult(case, "error", error_line(e))
        res.wall_s = time.perf_counter() - t0
        if device.startswith("cuda"):
            with contextlib.suppress(Exception):
                torch.cuda.empty_cache()
        return res


def cuda_usable(device: str) -> bool:
    """Whether the CUDA context still runs work (after an illegal access it never does again)."""
    import torch

    if not device.startswith("cuda"):
        return True
    try:
        torch.cuda.synchronize(torch.device(device))
        return float((torch.ones(1, device=device) + 1).item()) == 2.0
    except Exception:  # noqa: BLE001 - any failure means the context is gone
        return False
