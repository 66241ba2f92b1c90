"""vLLM's outputs as the harness's completions: one ``RequestOutput`` as a ``Completion``
(``completion_of``), its chosen and top-k logprobs per position from vLLM's flat (``flat_topk``:
whole-list ``uniform_topk``, else ``topk_by_position``) or nested (``topk_entries``) form. Imports
nothing of vLLM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cascade_repro.engines.base import Completion


def vllm_text(c: Any, token_ids: list[int], finish: str) -> str:
    """The text as vLLM detokenized it (SamplingParams(detokenize=True))."""
    return c.text


def completion_of(out: Any, k: int, text: Callable[[Any, list[int], str], str] = vllm_text) -> Completion:
    """One vLLM RequestOutput as a Completion: its tokens, ``text(completion, token_ids, finish)``,
    and the chosen and top-k logprobs of each position (flat or nested, as vLLM returned them)."""
    c = out.outputs[0]
    token_ids = [int(t) for t in c.token_ids]
    finish = "stop" if c.finish_reason == "stop" else "length"
    txt = text(c, token_ids, finish)
    steps = c.logprobs
    if steps is not None and hasattr(steps, "start_indices"):
        lps, topk = flat_topk(steps, token_ids, k)
        return Completion(token_ids, txt, finish, lps, topk)
    lps: list[float] = []
    topk: list[list[list[float]]] = []
    for i, tid in enumerate(token_ids):
        d = steps[i] if steps is not None and i < len(steps) else None
        chosen, top = topk_entries(d, tid, k)
        lps.append(chosen)
        topk.append(top)
    return Completion(token_ids, txt, finish, lps, topk)


def flat_topk(flat: Any, token_ids: list[int], k: int) -> tuple[list[float], list[list[list[float]]]]:
    """(chosen logprobs, top-k [id, logprob] lists) of each of ``token_ids`` from a vLLM FlatLogprobs.

    vLLM stores each position as the sampled token first (with its own rank), then the top-k in
    rank order (ranks 1..k, logprobs descending): so the chosen logprob is the first entry and the
    top-k list is the rest, as :func:`topk_entries` computes it from the dict form (which holds
    the sampled token once; here it appears twice when it is in the top-k). A position laid out
    otherwise (another first token, ranks not 1..k) goes through :func:`topk_entries` on its dict.
    """
    fast = uniform_topk(flat, token_ids, k)
    return fast if fast is not None else topk_by_position(flat, token_ids, k)


def _columns(flat: Any) -> tuple[Any, Any, Any, Any, Any]:
    """A FlatLogprobs' start and end indices, token ids, logprobs and ranks."""
    return flat.start_indices, flat.end_indices, flat.token_ids, flat.logprobs, flat.ranks


def topk_by_position(flat: Any, token_ids: list[int], k: int) -> tuple[list[float], list[list[list[float]]]]:
    """:func:`flat_topk` one position at a time: any layout."""
    starts, ends, ids, vals, ranks = _columns(flat)
    lps: list[float] = []
    topk: list[list[list[float]]] = []
    n = min(len(token_ids), len(starts))
    for i in range(n):
        s, e = starts[i], ends[i]
        if e > s and ids[s] == token_ids[i] and e - s - 1 <= k and ranks[s + 1 : e] == list(range(1, e - s)):
            lps.append(float(vals[s]))
            topk.append([[t, float(v)] for t, v in zip(ids[s + 1 : e], vals[s + 1 : e], strict=True)])
        else:
            chosen, top = topk_entries(flat[i], token_ids[i], k)
            lps.append(chosen)
            topk.append(top)
    for _ in range(len(token_ids) - n):  # positions without logprobs, as topk_entries gives them
        lps.append(float("nan"))
        topk.append([])
    return lps, topk


def uniform_topk(
    flat: Any, token_ids: list[int], k: int
) -> tuple[list[float], list[list[list[float]]]] | None:
    """:func:`flat_topk` for the layout vLLM gives when every position has all k entries: k + 1
    entries each, back to back, the sampled token first, then ranks 1..k. Whole-list slices and
    C-level ``map``/``zip`` instead of a Python loop per position, the costlier way at large batches.
    None when any position is laid out otherwise (the caller then goes position by position).
    """
    starts, ends, ids, vals, ranks = _columns(flat)
    n, w = len(token_ids), k + 1
    if k < 1 or n == 0 or len(starts) != n or len(ends) != n or len(ids) != n * w or len(vals) != n * w:
        return None
    if list(starts) != list(range(0, n * w, w)) or list(ends) != list(range(w, n * w + 1, w)):
        return None
    if list(ids[0::w]) != token_ids or any(list(ranks[j::w]).count(j) != n for j in range(1, w)):
        return None
    if set(map(type, vals)) != {float}:  # the loop writes float(v): keep the JSON the same, "0.0" not "0"
        return None
    top_ids, top_vals = list(ids), list(vals)
    del top_ids[0::w], top_vals[0::w]  # drop each position's sampled entry: the top-k are left, in order
    pairs = list(map(list, zip(top_ids, top_vals, strict=True)))
    return list(vals[0::w]), [pairs[i : i + k] for i in range(0, len(pairs), k)]


def topk_entries(step: Any, token_id: int, k: int) -> tuple[float, list[list[float]]]:
    """Return (logprob of ``token_id``, the k most likely [id, logprob] sorted by logprob desc).

    ``step`` is vLLM's per-position dict ``{token_id: Logprob(logprob, rank, decoded_token)}``; it
    holds the top-k and, in addition, the sampled token when that one ranks below k.
    """
    if not step:
        return float("nan"), []
    items = []
    for tid, lp in step.items():
        val = float(getattr(lp, "logprob", lp))
        rank = getattr(lp, "rank", None)
        items.append((int(tid), val, rank if isinstance(rank, int) else None))
    chosen = next((v for t, v, _ in items if t == token_id), float("nan"))
    if any(r is not None for _, _, r in items):
        ranked = [x for x in items if x[2] is not None and x[2] <= k]
        ranked.sort(key=lambda x: (-x[1], x[2]))
    else:
        ranked = sorted(items, key=lambda x: -x[1])
    return chosen, [[t, v] for t, v, _ in ranked[:k]]
