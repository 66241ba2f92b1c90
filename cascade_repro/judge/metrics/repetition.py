"""Repetition metrics over the token ids of one generated completion.

All functions are pure: they take the token ids the engine produced for the completion (no prompt,
no re-tokenisation) and return plain Python numbers. numpy is the only dependency.

Definitions
-----------
* ``seq_rep_n`` — Welleck et al. 2019 ("Neural Text Generation with Unlikelihood Training"):
  ``1 - |unique n-grams| / |n-grams|``; 0.0 when the sequence has no n-gram (``len < n``).
* ``distinct_n`` — ``|unique n-grams| / |n-grams|``; 1.0 when there is no n-gram.
* ``compression_ratio`` — ``len(utf8) / len(zlib.compress(utf8, 9))``; 0.0 for empty text.
  Looping text compresses well, so higher means more repetitive.
* ``tail_loop`` — period of a phrase repeated back to back up to the very end (see its docstring).
* ``longest_repeated_span`` — longest contiguous span that occurs at least twice (overlaps allowed).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

__all__ = [
    "compression_ratio",
    "distinct_n",
    "longest_repeated_span",
    "repetition_metrics",
    "seq_rep_n",
    "tail_loop",
]


def _as_list(tokens: Sequence[int]) -> list[int]:
    """Plain list of Python ints (numpy arrays are converted once; lists pass through)."""
    if type(tokens) is list:
        return tokens
    tolist = getattr(tokens, "tolist", None)
    if tolist is not None:
        return tolist()
    return list(tokens)


def _ngram_counts(tokens: list[int], n: int) -> tuple[int, int]:
    """(#unique n-grams, #n-grams) of ``tokens``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    total = len(tokens) - n + 1
    if total <= 0:
        return 0, 0
    if n == 1:
        return len(set(tokens)), total
    # zip over shifted views: C-speed tuple building, no Python-level loop.
    return len(set(zip(*(tokens[i:] for i in range(n)), strict=False))), total


_PACK_BITS = np.uint64(16)
_PACK_LIMIT = 1 << 16
_NUMPY_MIN_LEN = 24  # below this, Python sets beat numpy's per-call overhead


def _distinct_sorted(keys: np.ndarray) -> int:
    s = np.sort(keys)
    return 1 + int(np.count_nonzero(s[1:] != s[:-1]))


def _unique_ngrams_upto4(t: list[int]) -> tuple[list[int], np.ndarray | None]:
    """#unique n-grams for n = 1..4 (exact), and the tokens as an int64 array when one was built.

    Long sequences go through numpy: the tokens (or, for ids outside ``[0, 2**16)``, their dense
    ranks, which are < len(t)) are packed 16 bits per token into one uint64 key per n-gram, so each
    count is one sort of ``len(t)`` integers instead of a set of tuples. If the (n-1)-grams are all
    distinct the n-grams are too, so the count stops early.
    """
    n = len(t)
    if n < _NUMPY_MIN_LEN or n > _PACK_LIMIT:
        return [_ngram_counts(t, k)[0] for k in (1, 2, 3, 4)], None
    try:
        arr = np.fromiter(t, dtype=np.int64, count=n)
    except (OverflowError, TypeError, ValueError):  # ids beyond int64, or not numbers at all
        arr = None
    if arr is None or arr.tolist() != t:  # fromiter also accepts 1.5 or "1" (as 1): not token ids
        return [_ngram_counts(t, k)[0] for k in (1, 2, 3, 4)], None
    if int(arr.min()) >= 0 and int(arr.max()) < _PACK_LIMIT:
        a = arr.view(np.uint64)
    else:
        a = np.unique(arr, return_inverse=True)[1].astype(np.uint64).reshape(-1)
    uniques = [_distinct_sorted(a)]
    key = a
    for k in (2, 3, 4):
        total = n - k + 1
        if uniques[-1] == n - k + 2:  # every (k-1)-gram distinct: every k-gram distinct
            uniques.append(total)
            continue
        key = (key[:-1] << _PACK_BITS) | a[k - 1 :]
        uniques.append(_distinct_sorted(key))
    return uniques, arr


def seq_rep_n(tokens: Sequence[int], n: int) -> float:
    """Fraction of repeated n-grams: ``1 - unique/total``; 0.0 when there are no n-grams."""
    unique, total = _ngram_counts(_as_list(tokens), n)
    if total == 0:
        return 0.0
    return (total - unique) / total


def distinct_n(tokens: Sequence[int], n: int) -> float:
    """Fraction of distinct n-grams: ``unique/total``; 1.0 when there are no n-grams."""
    unique, total = _ngram_counts(_as_list(tokens), n)
    if total == 0:
        return 1.0
    return unique / total


def compression_ratio(text: str) -> float:
    """``len(utf-8 bytes) / len(zlib.compress(bytes, 9))``; 0.0 for empty text."""
    if not text:
        return 0.0
    raw = text.encode("utf-8", errors="surrogatepass")
    return len(raw) / len(zlib.compress(raw, 9))


def tail_loop(tokens: Sequence[int], min_phrase: int = 3, min_repeats: int = 3) -> int:
    """Smallest period ``p >= min_phrase`` of a loop that runs to the very end of the sequence.

    Returns the smallest ``p >= min_phrase`` such that the last ``p * min_repeats`` tokens are
    periodic with period ``p`` (``w[j] == w[j + p]`` for the window ``w``), i.e. some phrase of
    ``p`` tokens is repeated at least ``min_repeats`` times back to back up to the last token.
    Returns 0 when there is none (including when the sequence is shorter than
    ``min_phrase * min_repeats``).

    Short loops count on purpose: a loop whose true period ``q`` is below ``min_phrase`` (one token
    repeated, or an ``A B A B`` ping-pong) is also periodic with every multiple of ``q``, so it is
    reported — with a period ``p >= min_phrase``, usually the smallest multiple of ``q`` that is
    ``>= min_phrase`` — once it spans ``p * min_repeats`` tokens. Degenerate single-token runs
    are exactly the failure mode the cascade bug produces, so they must not be missed; the
    reported period is then a multiple of the true one, not the true one.
    """
    if min_phrase < 1 or min_repeats < 1:
        raise ValueError("min_phrase and min_repeats must be >= 1")
    t = _as_list(tokens)
    n = len(t)
    r = min_repeats
    last = t[-1] if n else None
    for p in range(min_phrase, n // r + 1):
        # Cheap filter first (one comparison), then the full periodicity check as a slice compare.
        if r > 1 and t[n - 1 - p] != last:
            continue
        start = n - p * r
        if t[start : n - p] == t[start + p :]:
            return p
    return 0


def _has_duplicate(keys: np.ndarray) -> bool:
    if keys.size < 2:
        return False
    s = np.sort(keys)
    return bool((s[1:] == s[:-1]).any())


def _dense_rank(keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ranks (0..u-1) of ``keys`` and the number ``u`` of distinct keys."""
    order = np.argsort(keys, kind="stable")
    s = keys[order]
    new = np.empty(s.size, dtype=np.int64)
    new[0] = 0
    np.not_equal(s[1:], s[:-1], out=new[1:])
    np.cumsum(new, out=new)
    rank = np.empty(s.size, dtype=np.int64)
    rank[order] = new
    return rank, int(new[-1]) + 1


def _longest_repeated_span_exact(t: list[int]) -> int:
    """Exact longest repeated span by prefix doubling (no hashing).

    ``rank_k[i]`` names the span ``[i, i + 2**k)`` (equal spans get equal ranks); ``rank_{k+1}``
    is the dense rank of the pair ``(rank_k[i], rank_k[i + 2**k])``. Doubling stops at the first
    ``2**(k+1)`` with no repeated span, then a binary search on the length ``L`` in
    ``[2**k, 2**(k+1))`` names each span of length ``L`` by ``(rank_k[i], rank_k[i + L - 2**k])``
    (two overlapping halves that cover it) and checks for duplicates. Each step is one sort:
    O(n log^2 n) time, O(n) memory.
    """
    n = len(t)
    if n < 2:
        return 0
    rank, distinct = _dense_rank(np.asarray(t, dtype=np.int64))
    if distinct == n:
        return 0
    h = 1  # rank names spans of length h, which do repeat
    base = n + 1  # ranks are < n, so pair keys r1 * base + r2 are unique per pair
    while 2 * h <= n:
        m = n - 2 * h + 1  # number of spans of length 2h
        new_rank, distinct = _dense_rank(rank[:m] * base + rank[h : h + m])
        if distinct == m:
            break
        rank = new_rank
        h *= 2
    # Length h repeats; length hi does not (2h had no duplicate, or a span of length n is unique).
    lo, hi = h, min(2 * h, n)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        m = n - mid + 1
        if _has_duplicate(rank[:m] * base + rank[mid - h : mid - h + m]):
            lo = mid
        else:
            hi = mid
    return lo


# Polynomial hashing mod 2**64 (numpy uint64 arithmetic wraps silently): an odd base is invertible.
_BASE = 0x9E3779B97F4A7C15
_BASE_INV = pow(_BASE, -1, 1 << 64)
_MIX = np.uint64(0xD6E8FEB86659FD93)
_powers_cache: tuple[np.ndarray, np.ndarray] = (np.ones(1, dtype=np.uint64), np.ones(1, dtype=np.uint64))


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(B**i, B**-i)`` for ``i < n`` as uint64 arrays (cached, grown geometrically)."""
    global _powers_cache
    pw, ipw = _powers_cache
    if pw.size < n:
        size = max(n, 2 * pw.size, 1024)
        pw = np.empty(size, dtype=np.uint64)
        ipw = np.empty(size, dtype=np.uint64)
        pw[0] = ipw[0] = 1
        pw[1:] = _BASE
        ipw[1:] = _BASE_INV
        np.multiply.accumulate(pw, out=pw)
        np.multiply.accumulate(ipw, out=ipw)
        _powers_cache = (pw, ipw)  # one atomic rebinding: readers see a consistent pair
    return pw, ipw


def _longest_repeated_span(t: list[int], lo: int = 0, arr: np.ndarray | None = None) -> int:
    """Longest repeated span of ``t``, given that a span of length ``lo`` is known to repeat.

    Galloping then binary search on the length, each probe one sort of the window hashes
    (O(n log n)): O(n log^2 n) overall. Hash equality is necessary for span equality, so a probe
    that sees no duplicate hash is exact; a duplicate may be a collision, so the final length is
    verified on the tokens, and on a (practically impossible) failed verification the exact
    doubling algorithm decides. ``arr``: ``t`` as an int64 array, when the caller already has it.
    """
    n = len(t)
    if n < 2:
        return 0
    if lo < 1:
        if len(set(t)) == n:
            return 0
        lo = 1
    pw, ipw = _powers(n)
    if arr is None:
        arr = np.asarray(t, dtype=np.int64)
    x = arr.view(np.uint64) * _MIX
    x *= ipw[:n]
    prefix = np.zeros(n + 1, dtype=np.uint64)
    np.cumsum(x, out=prefix[1:])  # prefix[i] = sum_{j<i} x_j B^-j

    def window_hashes(length: int) -> np.ndarray:
        m = n - length + 1  # hash of [i, i+length) = sum x_j B^(i-j), independent of i's offset
        return (prefix[length:] - prefix[:m]) * pw[:m]

    verified = lo  # lengths <= verified are known to repeat
    hi = n  # a span of length n occurs once: hi never repeats
    step = lo
    while lo + step < hi:  # gallop
        probe = lo + step
        if _has_duplicate(window_hashes(probe)):
            lo = probe
            step *= 2
        else:
            hi = probe
            break
    while hi - lo > 1:  # binary search; invariant: hash-dup at lo, no dup at hi
        mid = (lo + hi) // 2
        if _has_duplicate(window_hashes(mid)):
            lo = mid
        else:
            hi = mid
    if lo == verified:
        return lo
    h = window_hashes(lo)
    order = np.argsort(h)
    hs = h[order]
    for k in np.flatnonzero(hs[1:] == hs[:-1]).tolist():
        i, j = int(order[k]), int(order[k + 1])
        if t[i : i + lo] == t[j : j + lo]:
            return lo  # a true repeat of length lo, and no repeat of length lo + 1
    return _longest_repeated_span_exact(t)


def longest_repeated_span(tokens: Sequence[int]) -> int:
    """Length of the longest contiguous span occurring at least twice (occurrences may overlap).

    Binary search (after a gallop) on the length with 64-bit polynomial window hashes: each probe
    is O(n log n), so O(n log^2 n) time and O(n) memory. Collisions cannot make the result wrong:
    the final length is verified on the tokens, and should that fail the exact prefix-doubling
    algorithm (suffix-array style ranks, no hashing) computes the answer.
    """
    return _longest_repeated_span(_as_list(tokens))


def repetition_metrics(tokens: Sequence[int], text: str, finish_reason: str = "") -> dict:
    """All repetition metrics of one completion, as one flat dict (one row of a table).

    Keys: ``length, seq_rep_1..seq_rep_4, distinct_1..distinct_4, zlib_ratio, tail_loop (bool),
    tail_loop_period (int, 0 if none), longest_repeat, finish_length (finish_reason == "length")``.
    """
    t = _as_list(tokens)
    n = len(t)
    out: dict = {"length": n}
    uniques, arr = _unique_ngrams_upto4(t)
    repeated = 0  # largest n <= 4 whose n-grams repeat: a lower bound for longest_repeat
    for k, unique in zip((1, 2, 3, 4), uniques, strict=True):
        total = n - k + 1
        if total > 0:
            out[_SEQ_REP[k]] = (total - unique) / total
            if unique < total:
                repeated = k
        else:
            out[_SEQ_REP[k]] = 0.0
    for k, unique in zip((1, 2, 3, 4), uniques, strict=True):
        total = n - k + 1
        out[_DISTINCT[k]] = unique / total if total > 0 else 1.0
    out["zlib_ratio"] = compression_ratio(text)
    period = tail_loop(t)
    out["tail_loop"] = period > 0
    out["tail_loop_period"] = period
    # No repeated 4-gram means no longer repeat either: the n-gram counts already give the answer.
    out["longest_repeat"] = repeated if repeated < 4 else _longest_repeated_span(t, lo=4, arr=arr)
    out["finish_length"] = finish_reason == "length"
    return out


_SEQ_REP = {k: f"seq_rep_{k}" for k in (1, 2, 3, 4)}
_DISTINCT = {k: f"distinct_{k}" for k in (1, 2, 3, 4)}
