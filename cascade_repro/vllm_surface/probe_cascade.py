"""The probe's patches on FlashAttention's cascade path: count the decisions and the calls, force the flat
arm (or cascade on a declined decode step), inject the LSE faults.

What is patched (vLLM 0.26.0, ``vllm/v1/attention/backends/flash_attn.py``; cascade attention was
removed in 0.32.0 and is patched only where it exists):

- ``use_cascade_attention`` (module function). The model runner decides per step through
  ``attn_metadata_builder.use_cascade_attention(...)`` (``vllm/v1/worker/gpu_model_runner.py``,
  ``_compute_cascade_attn_prefix_len``), and ``FlashAttentionMetadataBuilder.use_cascade_attention``
  calls the module-level function by its global name, so replacing the module attribute covers it.
  It is only called when the scheduler reports shared prefix blocks. The wrapper counts decisions
  and, when the control file says ``force_off``, returns False without asking the heuristic (the
  flat arm of an engine that serves both arms).
- ``cascade_attention`` (module function, called by ``FlashAttentionImpl.forward`` by its global
  name; ``flash_attn_diffkv.py`` imports it by name, which the patch also replaces): counts
  executions (once per attention layer per cascade step) and records ``fa_version``.
- ``merge_attn_states`` as imported into that module (from ``vllm/v1/attention/ops/merge_attn_states.py``;
  ``cascade_attention`` calls it by its global name): only inside ``cascade_attention``, with
  ``inject == "lse-layout"`` the suffix LSE is handed over in the transposed memory layout (see
  :func:`misread_lse`); with ``inject == "lse-shift=X"`` the prefix LSE is handed over plus X nats.
- ``FlashAttentionImpl.__init__``: records the FlashAttention version each layer really uses.

Each patch works on any module object that has the same function names (the tests hand in fakes).
Only the standard library is imported, so this file loads without vLLM or torch.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from cascade_repro import vllm_surface
from cascade_repro.vllm_surface import inject as inj  # standard library only, like this module
from cascade_repro.vllm_surface.probe_state import MARK, ProbeState, original


def misread_lse(lse: Any) -> Any:
    """Return the LSE as the merge reads it when the kernel wrote it token-major (the FA2 split-KV bug).

    vLLM's LSEs are ``[num_heads, num_tokens]`` and ``merge_attn_states``'s CUDA kernel indexes the
    raw buffer as ``lse[head * num_tokens + token]`` (``csrc/attention/merge_attn_states.cu``), ignoring
    strides. The result is a *contiguous* ``[H, T]`` tensor whose memory holds the values in
    token-major order (``t * H + h``), so the kernel reads the wrong value for almost every
    (head, token). This is the same reinterpretation as
    ``cascade_attention.transpose_lse_layout`` for one batch row. (A strided ``.t()`` view would not
    do: the kernel ignores strides and would read the original memory unchanged.)
    """
    if getattr(lse, "dim", None) is None or lse.dim() != 2:
        return lse
    h, t = lse.shape
    return lse.t().contiguous().view(h, t)


def _hard_conditions(arguments: dict[str, Any], common: int, n_reqs: int) -> bool:
    """vLLM's conditions that no cost model overrides: cascade can run this step at all."""
    if common < vllm_surface.MIN_COMMON_PREFIX or n_reqs < vllm_surface.MIN_REQUESTS:
        return False
    if any(bool(arguments.get(k)) for k in ("use_alibi", "use_sliding_window", "use_local_attention")):
        return False
    try:
        return int(arguments.get("dcp_world_size", 1) or 1) <= 1
    except (TypeError, ValueError):
        return False


def wrap_decision(orig: Callable[..., Any], state: ProbeState) -> Callable[..., Any]:
    orig = original(orig)
    try:
        signature: inspect.Signature | None = inspect.signature(orig)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(orig)
    def use_cascade_attention(*args: Any, **kwargs: Any) -> Any:
        state.refresh()
        common = kwargs.get("common_prefix_len", args[0] if args else 0)
        query_lens = kwargs.get("query_lens", args[1] if len(args) > 1 else ())
        try:
            common_i = int(common)
            n_reqs = len(query_lens)
            # A pure decode step (one query token per request) is where FA2's split-KV path ran.
            decode = n_reqs > 0 and int(max(query_lens)) <= 1
        except (TypeError, ValueError):
            common_i, n_reqs, decode = 0, 0, False
        if state.force_off:
            state.record_decision(False, True, common_i, n_reqs, decode)
            return False
        result = orig(*args, **kwargs)
        if not result and state.force_on and decode and signature is not None:
            try:
                arguments = signature.bind(*args, **kwargs).arguments
            except TypeError:
                arguments = None
            if arguments is not None and _hard_conditions(arguments, common_i, n_reqs):
                state.record_decision(True, False, common_i, n_reqs, decode, forced_on=True)
                return True
        state.record_decision(bool(result), False, common_i, n_reqs, decode)
        return result

    setattr(use_cascade_attention, MARK, orig)
    return use_cascade_attention


def _sm_count(tensor: Any) -> int | None:
    try:
        if tensor.device.type != "cuda":
            return None
        import torch  # already loaded in every process that runs attention

        return int(torch.cuda.get_device_properties(tensor.device).multi_processor_count)
    except Exception:  # noqa: BLE001 - bookkeeping only
        return None


def note_decode_shape(state: ProbeState, args: tuple, kwargs: dict[str, Any]) -> None:
    """Record a decode-step cascade call's shape: requests, own-part length, heads (no GPU sync).

    ``cascade_attention(output, query, key_cache, value_cache, *, cu_query_lens, max_query_len,
    max_kv_len, common_prefix_len, fa_version, ...)`` as FlashAttentionImpl calls it in 0.10.2 and
    0.26.0: ``query`` is [tokens, query heads, head dim], ``key_cache`` [..., KV heads, head dim],
    and the suffix call's ``max_seqlen_k`` is ``max_kv_len - common_prefix_len``.
    """
    try:
        if int(kwargs.get("max_query_len", 0)) != 1:
            return
        query = args[1] if len(args) > 1 else kwargs["query"]
        key_cache = args[2] if len(args) > 2 else kwargs["key_cache"]
        n = int(kwargs["cu_query_lens"].shape[0]) - 1
        suffix = int(kwargs["max_kv_len"]) - int(kwargs["common_prefix_len"])
        q_heads, head_dim = int(query.shape[1]), int(query.shape[2])
        kv_heads = int(key_cache.shape[-2])
    except Exception:  # noqa: BLE001 - an unexpected call shape: count nothing, break nothing
        return
    if state.num_sms is None:
        state.num_sms = _sm_count(query)
    state.record_decode_call(n, suffix, q_heads, kv_heads, head_dim, kwargs.get("fa_version"))


def wrap_cascade(orig: Callable[..., Any], state: ProbeState) -> Callable[..., Any]:
    orig = original(orig)

    @functools.wraps(orig)
    def cascade_attention(*args: Any, **kwargs: Any) -> Any:
        state.record_call(kwargs.get("fa_version"))
        note_decode_shape(state, args, kwargs)
        state.in_cascade = True
        try:
            return orig(*args, **kwargs)
        finally:
            state.in_cascade = False

    setattr(cascade_attention, MARK, orig)
    return cascade_attention


# merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, ...)
PREFIX_LSE_POS, SUFFIX_LSE_POS = 2, 4


def _replace_arg(args: tuple, kwargs: dict[str, Any], pos: int, name: str, fn: Callable[[Any], Any]) -> tuple:
    """Apply ``fn`` to one argument, passed by keyword or by position; return the new args."""
    if name in kwargs:
        kwargs[name] = fn(kwargs[name])
    elif len(args) > pos:
        args = (*args[:pos], fn(args[pos]), *args[pos + 1 :])
    return args


def wrap_merge(orig: Callable[..., Any], state: ProbeState) -> Callable[..., Any]:
    orig = original(orig)

    @functools.wraps(orig)
    def merge_attn_states(*args: Any, **kwargs: Any) -> Any:
        fault = state.inject
        if state.in_cascade and fault is not None and fault.active(state.token_index):
            if fault.kind == inj.LSE_LAYOUT:
                args = _replace_arg(args, kwargs, SUFFIX_LSE_POS, "suffix_lse", misread_lse)
            elif fault.kind == inj.LSE_SHIFT:
                # The prefix weighed e**X times too much against the suffix (a new tensor: vLLM's is
                # not modified in place).
                args = _replace_arg(args, kwargs, PREFIX_LSE_POS, "prefix_lse", lambda t: t + fault.nats)
            state.record_inject()
        return orig(*args, **kwargs)

    setattr(merge_attn_states, MARK, orig)
    return merge_attn_states


def _wrap_impl_init(cls: type, state: ProbeState) -> None:
    orig = original(cls.__dict__.get("__init__", cls.__init__))

    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        try:
            state.note_impl(type(self).__name__, getattr(self, "vllm_flash_attn_version", None))
        except Exception as e:  # noqa: BLE001 - bookkeeping must never break model construction
            state._note_error(f"note_impl: {e}")

    setattr(__init__, MARK, orig)
    cls.__init__ = __init__


WRAPPERS: dict[str, Callable[[Callable[..., Any], ProbeState], Callable[..., Any]]] = {
    "use_cascade_attention": wrap_decision,
    "cascade_attention": wrap_cascade,
    "merge_attn_states": wrap_merge,
}


# Names other modules may have imported from flash_attn and that must see the wrapper too.
# merge_attn_states is deliberately not rebound elsewhere: other backends import the same function
# from vllm/v1/attention/ops/merge_attn_states.py and must stay untouched.
REBIND = ("use_cascade_attention", "cascade_attention")


def patch_flash_attn(
    module: ModuleType, state: ProbeState, rebind: Iterable[ModuleType] | None = None
) -> list[str]:
    """Replace the cascade functions of ``module`` with counting wrappers; return what was patched.

    Other modules that imported ``use_cascade_attention`` or ``cascade_attention`` by name
    (``rebind``; by default every loaded ``vllm.*`` module, e.g. ``flash_attn_diffkv``) get the
    wrapper too. Patching twice wraps the originals, not the wrappers.
    """
    done: list[str] = []
    replaced: dict[int, tuple[Any, Any]] = {}
    mod_name = getattr(module, "__name__", "?")
    for name, make in WRAPPERS.items():
        fn = module.__dict__.get(name)
        if fn is None:
            continue
        orig = original(fn)
        wrapper = make(orig, state)
        setattr(module, name, wrapper)
        replaced[id(orig)] = (orig, wrapper)
        done.append(f"{mod_name}.{name}")
    impl = module.__dict__.get("FlashAttentionImpl")
    if isinstance(impl, type):
        _wrap_impl_init(impl, state)
        done.append(f"{mod_name}.FlashAttentionImpl.__init__")
    if rebind is None:
        rebind = [
            m for n, m in list(sys.modules.items()) if n.startswith("vllm.") and isinstance(m, ModuleType)
        ]
    for other in rebind:
        d = getattr(other, "__dict__", None)
        if other is module or not isinstance(d, dict):
            continue
        for name in REBIND:
            val = d.get(name)
            if val is None:
                continue
            hit = replaced.get(id(original(val)))
            if hit is not None and hit[0] is original(val):
                setattr(other, name, hit[1])
                done.append(f"{getattr(other, '__name__', '?')}.{name}")
    state.patched.extend(done)
    return done
