"""The probe's view of cascade attention on the FlashInfer backend (vLLM 0.10.2; 0.11.0 turns it off).

vLLM's FlashInfer backend (``vllm/v1/attention/backends/flashinfer.py``) decides cascade through the
same ``use_cascade_attention`` the FlashAttention backend defines (its builder calls the name it
imported from ``flash_attn``, which the probe's patch of that module reaches: counted, and forced
off on the flat arm). It does not call ``cascade_attention``: when the builder's ``build`` gets a
common prefix it plans FlashInfer's own ``MultiLevelCascadeAttentionWrapper`` (two levels: the shared
prefix for every query token, then each request's own pages), and ``FlashInferImpl.forward`` runs
``attn_metadata.cascade_wrapper.run(query, kv_cache)`` for every layer of the step. So the counts that
prove cascade ran are taken on that wrapper: each ``run`` is one cascade call, and a ``run`` whose
query holds one token per request (the plan's second level has as many query rows as requests) is a
decode-step call. There is no FA2 split to recompute here (``fa_version`` None).

In 0.11.0 (PR #26130) the builder's ``use_cascade_attention`` returns False, so the wrapper is never
planned there: the same hook then counts nothing, which the cascade twin reports as not exercised.

Standard library only, as the probe: nothing here runs unless vLLM imports its FlashInfer backend.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

MODULE = "vllm.v1.attention.backends.flashinfer"
WRAPPER_CLASS = "MultiLevelCascadeAttentionWrapper"
_MARK = "_cascade_repro_flashinfer"


def _level_rows(indptr: Any) -> int | None:
    """The number of rows an indptr tensor or list delimits (its length minus one)."""
    try:
        return len(indptr) - 1
    except TypeError:
        return None


def _own_pages(indptr: Any) -> int:
    """The most pages one request holds past the shared prefix (the second level's indptr)."""
    try:
        vals = [int(v) for v in indptr]
    except (TypeError, ValueError):
        return 0
    return max((b - a for a, b in zip(vals, vals[1:], strict=False)), default=0)


def plan_shape(args: tuple, kwargs: dict[str, Any]) -> dict[str, int] | None:
    """What a two-level cascade plan says about the step: requests, KV heads, head size and the
    longest own part in tokens (pages x page size: an upper bound within one page).

    ``plan(qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len,
    num_qo_heads, num_kv_heads, head_dim, page_size, ...)`` as vLLM 0.10.2 calls it, positionally.
    """
    names = ("qo_indptr_arr", "paged_kv_indptr_arr", "paged_kv_indices_arr", "paged_kv_last_page_len",
             "num_qo_heads", "num_kv_heads", "head_dim", "page_size")  # fmt: skip
    got = dict(zip(names, args, strict=False))
    got.update({k: v for k, v in kwargs.items() if k in names})
    try:
        qo, kv = got["qo_indptr_arr"], got["paged_kv_indptr_arr"]
        reqs = _level_rows(qo[-1])
        if reqs is None:
            return None
        return {
            "reqs": reqs,
            "kv_heads": int(got["num_kv_heads"]),
            "head_dim": int(got["head_dim"]),
            "suffix": _own_pages(kv[-1]) * int(got["page_size"]),
        }
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def patch(module: ModuleType, state: Any) -> list[str]:
    """Count the FlashInfer cascade wrapper's runs into the probe's ``state`` (a ``ProbeState``):
    every ``run`` a cascade call, one with a query token per request a decode-step call."""
    cls = module.__dict__.get(WRAPPER_CLASS)
    if not isinstance(cls, type) or getattr(cls, _MARK, False):
        return []
    plan_orig, run_orig = cls.plan, cls.run

    @functools.wraps(plan_orig)
    def plan(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            self._cascade_repro_shape = plan_shape(args, kwargs)
        except Exception:  # noqa: BLE001 - bookkeeping must never break a plan
            self._cascade_repro_shape = None
        return plan_orig(self, *args, **kwargs)

    @functools.wraps(run_orig)
    def run(self: Any, q: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            record_run(state, getattr(self, "_cascade_repro_shape", None), q)
        except Exception as e:  # noqa: BLE001 - never break the forward
            state._note_error(f"flashinfer cascade: {e!r}"[:200])
        return run_orig(self, q, *args, **kwargs)

    cls.plan, cls.run = plan, run
    setattr(cls, _MARK, True)
    done = [f"{module.__name__}.{WRAPPER_CLASS}.plan", f"{module.__name__}.{WRAPPER_CLASS}.run"]
    state.patched.extend(done)
    return done


def record_run(state: Any, shape: dict[str, int] | None, q: Any) -> None:
    """One cascade run: counted, and as a decode-step call when the query holds one token a request."""
    state.record_call(None)
    if not shape:
        return
    tokens, q_heads = int(q.shape[0]), int(q.shape[1])
    if tokens == shape["reqs"]:
        state.record_decode_call(
            shape["reqs"], shape["suffix"], q_heads, shape["kv_heads"], shape["head_dim"], None
        )
