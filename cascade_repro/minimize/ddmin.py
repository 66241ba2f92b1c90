"""Zeller's ddmin: shrink a failing input to a 1-minimal one with as few tests as possible.

Pure: the caller's ``fails(subset)`` runs the GPU. Subsets are tried in a fixed order, results
are cached (a repeated subset costs nothing), and ``max_tests`` bounds the GPU time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class DDResult(Generic[T]):
    items: list[T]
    tests: int  # calls of ``fails`` that ran (cache hits and skipped sizes not counted)
    exhausted: bool  # stopped by ``max_tests`` before reaching 1-minimality
    log: list[tuple[int, bool]] = field(default_factory=list)  # (subset size, failed) per test run


def split(items: Sequence[T], n: int) -> list[list[T]]:
    """``n`` contiguous chunks whose sizes differ by at most one, in order."""
    q, r = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        size = q + (1 if i < r else 0)
        out.append(list(items[start : start + size]))
        start += size
    return [c for c in out if c]


def ddmin(
    items: Sequence[T],
    fails: Callable[[list[T]], bool],
    max_tests: int = 64,
    min_size: int = 1,
) -> DDResult[T]:
    """Return a subset of ``items`` (order kept) on which ``fails`` still holds.

    ``items`` itself is assumed to fail. Subsets smaller than ``min_size`` are never tried: the
    caller knows they cannot fail (cascade needs at least 8 requests in a step).
    """
    positions = list(range(len(items)))  # positions, so equal items stay distinct
    cache: dict[tuple[int, ...], bool] = {}
    res = DDResult(items=list(items), tests=0, exhausted=False)

    def test(pos: list[int]) -> bool | None:
        key = tuple(pos)
        if key in cache:
            return cache[key]
        if len(pos) < min_size:
            return False
        if res.tests >= max_tests:
            return None
        res.tests += 1
        failed = bool(fails([items[p] for p in pos]))
        res.log.append((len(pos), failed))
        cache[key] = failed
        return failed

    n = 2
    while len(positions) >= 2 and not res.exhausted:
        chunks = split(positions, n)
        # Reduce to a chunk, else to a complement (with two chunks the complements are the chunks).
        candidates = [(c, 2) for c in chunks]
        if len(chunks) > 2:
            candidates += [([p for p in positions if p not in set(c)], max(n - 1, 2)) for c in chunks]
        reduced = False
        for cand, next_n in candidates:
            r = test(cand)
            if r is None:
                res.exhausted = True
                break
            if r:
                positions, n, reduced = cand, next_n, True
                break
        if res.exhausted:
            break
        if not reduced:
            if n >= len(positions):
                break  # 1-minimal: no single element can be removed
            n = min(len(positions), 2 * n)
    res.items = [items[p] for p in positions]
    return res
