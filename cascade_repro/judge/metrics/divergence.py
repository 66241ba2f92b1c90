"""Divergence metrics between two completions of the same prompt (side a = "test", b = "ref").

A side is its generated token ids, the per-step log-probability of the chosen token
(``list[float]``, may be empty when the engine did not return logprobs) and the per-step top-k
(``list`` of ``[[token_id, logprob], ...]``, may be empty). All functions are pure.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np

from cascade_repro.judge.metrics.repetition import _as_list  # one list conversion for both metric families

__all__ = [
    "common_prefix_ratio",
    "divergence_metrics",
    "dlogprob_stats",
    "edit_distance_norm",
    "first_divergence",
    "logprob_margin",
    "topk_contains",
]

TopK = Sequence[Sequence[Sequence[float]]]  # per step: [[token_id, logprob], ...]

_CHUNK = 32


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (chunked slice compares, then a short scan)."""
    m = min(len(a), len(b))
    i = 0
    while i < m:
        j = min(i + _CHUNK, m)
        if a[i:j] != b[i:j]:
            while a[i] == b[i]:
                i += 1
            return i
        i = j
    return m


def _common_suffix_len(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the longest common suffix, at most ``limit``."""
    k = 0
    la, lb = len(a), len(b)
    while k < limit and a[la - 1 - k] == b[lb - 1 - k]:
        k += 1
    return k


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where ``a`` and ``b`` differ.

    If one is a strict prefix of the other, the shorter length; ``None`` if identical.
    """
    a, b = _as_list(a), _as_list(b)
    if len(a) == len(b) and a == b:
        return None
    return _common_prefix_len(a, b)


def common_prefix_ratio(a: Sequence[int], b: Sequence[int]) -> float:
    """Common-prefix length / ``max(len(a), len(b))``; 1.0 when both are empty."""
    a, b = _as_list(a), _as_list(b)
    longest = max(len(a), len(b))
    if longest == 0:
        return 1.0
    return _common_prefix_len(a, b) / longest


# --------------------------------------------------------------------------- edit distance


def _levenshtein_bitparallel(a: Sequence[int], b: Sequence[int]) -> int:
    """Exact Levenshtein distance, Myers (1999) / Hyyrö (2001) bit-vector algorithm.

    The column of the DP matrix along ``a`` lives in one Python int, so the cost is
    ``len(b)`` iterations of a dozen big-int operations on ``len(a)``-bit ints.
    """
    m = len(a)
    if m == 0:
        return len(b)
    if len(b) == 0:
        return m
    peq: dict[int, int] = {}
    bit = 1
    for c in a:
        peq[c] = peq.get(c, 0) | bit
        bit <<= 1
    full = bit - 1
    last = 1 << (m - 1)
    pv, mv, score = full, 0, m
    get = peq.get
    for c in b:
        eq = get(c, 0)
        xv = eq | mv
        xh = (((eq & pv) + pv) ^ pv) | eq
        ph = mv | ~(xh | pv)
        mh = pv & xh
        if ph & last:
            score += 1
        elif mh & last:
            score -= 1
        ph = (ph << 1) | 1
        mh <<= 1
        pv = (mh | ~(xv | ph)) & full
        mv = ph & xv & full
    return score


_INF = 1 << 40


def _levenshtein_banded(a: Sequence[int], b: Sequence[int], band: int) -> int:
    """Levenshtein cost of the best alignment restricted to a diagonal band (numpy, row by row).

    With ``d = len(b) - len(a)`` (requires ``|d| <= band``) the band holds the diagonals
    ``k = j - i`` in ``[min(0, d) - band, max(0, d) + band]``. Every alignment inside the band is
    a real alignment, so the result is an upper bound of the true distance; any alignment that
    leaves the band needs more than ``band`` insertions/deletions, so the result is exact
    whenever the true distance is ``<= band``. Cost: ``len(a)`` rows of ``O(|d| + 2 band)``.
    """
    n, m = len(a), len(b)
    d = m - n
    klo = min(0, d) - band
    khi = max(0, d) + band
    width = khi - klo + 1
    ks = np.arange(klo, khi + 1, dtype=np.int64)  # diagonal of each band slot
    # Row 0: D[0][j] = j for 0 <= j <= m.
    row = np.where((ks >= 0) & (ks <= m), ks, _INF)
    off = width + 1
    ypad = np.full(m + n + 3 * width + 2, -1, dtype=np.int64)
    ypad[off : off + m] = np.asarray(b, dtype=np.int64)
    xs = np.asarray(a, dtype=np.int64)
    slot = np.arange(width, dtype=np.int64)
    cur = np.empty(width, dtype=np.int64)
    for i in range(1, n + 1):
        # Column j = i + k; substitution uses b[j - 1] = ypad[off + i - 1 + k].
        s = off + i - 1 + klo
        cost = ypad[s : s + width] != xs[i - 1]
        np.add(row, cost, out=cur)  # diagonal move: D[i-1][j-1] + (a[i-1] != b[j-1])
        np.minimum(cur[:-1], row[1:] + 1, out=cur[:-1])  # vertical: D[i-1][j] + 1
        # Cells outside 0 <= j <= m are unreachable.
        lo = max(0, -i - klo)
        hi = min(width, m - i - klo + 1)
        cur[:lo] = _INF
        cur[hi:] = _INF
        # Horizontal moves: D[i][j] = min_{j' <= j} T[j'] + (j - j') -> prefix minimum.
        cur -= slot
        np.minimum.accumulate(cur, out=cur)
        cur += slot
        cur[hi:] = _INF
        row, cur = cur, row
    return int(row[d - klo])


try:  # exact Levenshtein on token-id lists in C++, 14-50x faster than the code below
    from rapidfuzz.distance import Levenshtein as _rapidfuzz
except ImportError:  # e.g. a GPU image without it: the pure implementations below
    _rapidfuzz = None

AUTO = "auto"  # edit_distance_norm's default band: exact with rapidfuzz, else a 256-wide band
AUTO_BAND = 256


def edit_distance_norm(a: Sequence[int], b: Sequence[int], band: int | str | None = AUTO) -> float:
    """Levenshtein distance / ``max(len(a), len(b))``; 0.0 when both are empty.

    By default (``band=AUTO``) the distance is exact when rapidfuzz is installed (a dependency of
    this package) and otherwise computed as with ``band=256``. An explicit ``band`` keeps the pure
    implementation's semantics below, for comparison and for machines without rapidfuzz.

    The common prefix and common suffix are stripped first (they never change the distance).
    On the remainders (lengths ``n'``, ``m'``):

    * ``band is None`` or ``max(n', m') <= band``: exact (bit-parallel, ``O(n' m' / 64)``);
      in particular always exact when ``max(len(a), len(b)) <= band``.
    * ``|n' - m'| > band``: the trivial upper bound ``max(n', m')`` (substitute the overlap,
      insert/delete the rest). The true distance is then at least ``|n' - m'| > band``.
    * otherwise: the best alignment inside the diagonal band of half-width ``band`` around the
      diagonals between the two corners (see ``_levenshtein_banded``): an upper bound that is exact
      whenever the true distance is ``<= band``; cost ``O(n' * band)``.

    Every branch is symmetric in ``a`` and ``b`` and returns 0 only for equal inputs.
    """
    exact_fast = band == AUTO and _rapidfuzz is not None
    if band == AUTO:
        band = None if exact_fast else AUTO_BAND
    if band is not None and (not isinstance(band, int) or band < 0):
        raise ValueError(f"band must be >= 0, None or 'auto', got {band!r}")
    a, b = _as_list(a), _as_list(b)
    longest = max(len(a), len(b))
    if longest == 0:
        return 0.0
    p = _common_prefix_len(a, b)
    if p == len(a) == len(b):
        return 0.0
    s = _common_suffix_len(a, b, min(len(a), len(b)) - p)
    ra = a[p : len(a) - s]
    rb = b[p : len(b) - s]
    na, nb = len(ra), len(rb)
    if exact_fast:
        dist = int(_rapidfuzz.distance(ra, rb))
    elif band is None or max(na, nb) <= band:
        # Bits along the longer side, iterate over the shorter: fewer Python-level iterations.
        dist = _levenshtein_bitparallel(ra, rb) if na >= nb else _levenshtein_bitparallel(rb, ra)
    elif abs(na - nb) > band:
        dist = max(na, nb)
    else:
        dist = _levenshtein_banded(ra, rb, band)
    return dist / longest


# --------------------------------------------------------------------------- logprobs


def _topk_at(topk: TopK, i: int) -> Sequence[Sequence[float]] | None:
    if i < 0 or i >= len(topk):
        return None
    entry = topk[i]
    if entry is None or len(entry) == 0:
        return None
    return entry


def topk_contains(
    a_tokens: Sequence[int], a_topk: TopK, b_tokens: Sequence[int], b_topk: TopK
) -> bool | None:
    """vLLM's ``check_logprobs_close`` rule (``tests/models/utils.py``).

    At the first index ``i`` (within both lengths) where the tokens differ, ``a[i]`` must be
    among b's top-k ids at ``i`` and ``b[i]`` among a's top-k ids at ``i``. True when that holds
    or when there is no such index; None when either side has no top-k data at ``i``.
    """
    a, b = _as_list(a_tokens), _as_list(b_tokens)
    return _topk_rule(a, a_topk, b, b_topk, _common_prefix_len(a, b))


def _topk_rule(a: list[int], a_topk: TopK, b: list[int], b_topk: TopK, i: int) -> bool | None:
    """``topk_contains`` with the common-prefix length ``i`` already known."""
    if i >= len(a) or i >= len(b):
        return True
    ta, tb = _topk_at(a_topk, i), _topk_at(b_topk, i)
    if ta is None or tb is None:
        return None
    a_tok, b_tok = a[i], b[i]
    return any(int(e[0]) == a_tok for e in tb) and any(int(e[0]) == b_tok for e in ta)


def logprob_margin(tokens: Sequence[int], topk: TopK, other_token: int, i: int) -> float | None:
    """``logprob(tokens[i]) - logprob(other_token)`` in this side's top-k at step ``i``.

    None when the step is out of range, the top-k is missing, or either token is not in it.
    """
    if i < 0 or i >= len(tokens):
        return None
    entry = _topk_at(topk, i)
    if entry is None:
        return None
    own = tokens[i]
    own_lp = other_lp = None
    for e in entry:
        tid = int(e[0])
        if tid == own and own_lp is None:
            own_lp = float(e[1])
        if tid == other_token and other_lp is None:
            other_lp = float(e[1])
    if own_lp is None or other_lp is None:
        return None
    return own_lp - other_lp


def dlogprob_stats(
    a_logprobs: Sequence[float], b_logprobs: Sequence[float], upto: int
) -> tuple[float, float]:
    """Mean and max of ``|a_lp[j] - b_lp[j]|`` for ``j < upto`` (the agreeing common prefix).

    ``upto`` is clipped to the logprobs actually present on both sides; (0.0, 0.0) when nothing
    is left (``upto == 0`` or logprobs unavailable).
    """
    u = min(upto, len(a_logprobs), len(b_logprobs))
    if u <= 0:
        return 0.0, 0.0
    diffs = list(map(abs, map(operator.sub, a_logprobs[:u], b_logprobs[:u])))
    return float(sum(diffs) / u), float(max(diffs))


def divergence_metrics(
    a_tokens: Sequence[int],
    a_logprobs: Sequence[float],
    a_topk: TopK,
    b_tokens: Sequence[int],
    b_logprobs: Sequence[float],
    b_topk: TopK,
) -> dict:
    """All divergence metrics of one (test = a, ref = b) pair, as one flat dict.

    Keys: ``exact, first_div (-1 when identical), common_prefix_ratio, edit_distance, topk_ok,
    margin_test, margin_ref, dlogprob_mean, dlogprob_max``. The margins are taken at the first
    divergence on side a (own token vs b's token, in a's top-k) and side b (vice versa); None when
    the sequences are identical, one is a prefix of the other, or the top-k lacks a token.
    The logprob drift is measured over the common prefix, where both sides chose the same tokens.
    """
    a, b = _as_list(a_tokens), _as_list(b_tokens)
    la, lb = len(a), len(b)
    exact = la == lb and a == b
    cp = la if exact else _common_prefix_len(a, b)
    longest = max(la, lb)
    margin_test = margin_ref = None
    if exact:
        edit = 0.0
        topk_ok: bool | None = True
    else:
        edit = edit_distance_norm(a, b)
        topk_ok = _topk_rule(a, a_topk, b, b_topk, cp)
        if cp < la and cp < lb:
            margin_test = logprob_margin(a, a_topk, b[cp], cp)
            margin_ref = logprob_margin(b, b_topk, a[cp], cp)
    dl_mean, dl_max = dlogprob_stats(a_logprobs, b_logprobs, cp)
    return {
        "exact": exact,
        "first_div": -1 if exact else cp,
        "common_prefix_ratio": cp / longest if longest else 1.0,
        "edit_distance": edit,
        "topk_ok": topk_ok,
        "margin_test": margin_test,
        "margin_ref": margin_ref,
        "dlogprob_mean": dl_mean,
        "dlogprob_max": dl_max,
    }
