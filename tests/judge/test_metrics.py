"""Tests of the pure metric functions (cascade_repro.judge.metrics): hand-computed cases and properties."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cascade_repro.judge.metrics import (
    common_prefix_ratio,
    compression_ratio,
    distinct_n,
    divergence_metrics,
    dlogprob_stats,
    edit_distance_norm,
    first_divergence,
    logprob_margin,
    longest_repeated_span,
    repetition_metrics,
    seq_rep_n,
    tail_loop,
    topk_contains,
)
from cascade_repro.judge.metrics import repetition as repetition_mod

# --------------------------------------------------------------------------- reference helpers


def naive_levenshtein(a, b) -> int:
    """Textbook O(n*m) Wagner-Fischer."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def naive_longest_repeat(t) -> int:
    """O(n^3): every length, every pair of start positions."""
    n = len(t)
    best = 0
    for length in range(1, n):
        for i in range(n - length + 1):
            for j in range(i + 1, n - length + 1):
                if t[i : i + length] == t[j : j + length]:
                    best = length
    return best


def vllm_rule(a, a_topk, b, b_topk):
    """Re-statement of vLLM tests/models/utils.py::check_logprobs_close for one prompt:
    walk zip(ids_0, ids_1); at the first mismatch assert ids_0[i] in logprobs_1[i] and
    ids_1[i] in logprobs_0[i], then stop. None stands for "no top-k data at that step"."""
    for idx, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            if idx >= len(a_topk) or idx >= len(b_topk) or not a_topk[idx] or not b_topk[idx]:
                return None
            b_ids = {int(e[0]) for e in b_topk[idx]}
            a_ids = {int(e[0]) for e in a_topk[idx]}
            return x in b_ids and y in a_ids
    return True


def is_tail_periodic(t, p, repeats=3) -> bool:
    span = p * repeats
    if p < 1 or span > len(t):
        return False
    w = t[len(t) - span :]
    return all(w[j] == w[j + p] for j in range(span - p))


small_tokens = st.lists(st.integers(0, 3), max_size=40)
tokens = st.lists(st.integers(0, 50_000), max_size=80)


# --------------------------------------------------------------------------- seq_rep / distinct


def test_seq_rep_and_distinct_hand_computed():
    t = [1, 2, 1, 2, 1]
    # unigrams: 5 total, unique {1, 2} = 2  -> seq_rep = 1 - 2/5 = 0.6, distinct = 0.4
    assert seq_rep_n(t, 1) == pytest.approx(0.6)
    assert distinct_n(t, 1) == pytest.approx(0.4)
    # bigrams: (1,2) (2,1) (1,2) (2,1): 4 total, 2 unique -> 1 - 2/4 = 0.5
    assert seq_rep_n(t, 2) == pytest.approx(0.5)
    assert distinct_n(t, 2) == pytest.approx(0.5)
    # trigrams: (1,2,1) (2,1,2) (1,2,1): 3 total, 2 unique -> 1 - 2/3 = 1/3
    assert seq_rep_n(t, 3) == pytest.approx(1 / 3)
    assert distinct_n(t, 3) == pytest.approx(2 / 3)
    # 5-grams: exactly one -> 1 - 1/1 = 0
    assert seq_rep_n(t, 5) == 0.0
    assert distinct_n(t, 5) == 1.0
    # 4-grams of [7, 7, 7, 7, 7, 7]: 3 total, 1 unique -> 1 - 1/3 = 2/3
    assert seq_rep_n([7] * 6, 4) == pytest.approx(2 / 3)


def test_seq_rep_and_distinct_edges():
    assert seq_rep_n([], 1) == 0.0
    assert distinct_n([], 1) == 1.0
    assert seq_rep_n([5], 1) == 0.0  # one unigram, unique
    assert distinct_n([5], 1) == 1.0
    assert seq_rep_n([5], 2) == 0.0  # no bigram at all
    assert distinct_n([5], 2) == 1.0
    assert seq_rep_n(np.array([3, 3]), 1) == pytest.approx(0.5)  # numpy input: 1 - 1/2
    with pytest.raises(ValueError):
        seq_rep_n([1, 2], 0)


@given(tokens, st.integers(1, 5))
def test_seq_rep_plus_distinct_is_one(t, n):
    r, d = seq_rep_n(t, n), distinct_n(t, n)
    assert 0.0 <= r <= 1.0
    assert 0.0 < d <= 1.0
    if len(t) >= n:
        assert r + d == pytest.approx(1.0)


# --------------------------------------------------------------------------- compression ratio


def test_compression_ratio():
    assert compression_ratio("") == 0.0
    # definition: 1000 utf-8 bytes over their level-9 zlib size (17 bytes with stock zlib).
    raw = b"a" * 1000
    assert compression_ratio("a" * 1000) == 1000 / len(zlib.compress(raw, 9))
    assert compression_ratio("a" * 1000) > 30  # 1000 bytes squeeze into a few dozen at most
    # "héllo" is 6 utf-8 bytes (é takes 2); short text does not compress: ratio < 1.
    assert compression_ratio("héllo") == 6 / len(zlib.compress("héllo".encode(), 9))
    assert compression_ratio("héllo") < 1.0
    looping = "the cat sat. " * 40
    varied = " ".join(f"w{i * 7919 % 1000}" for i in range(130))
    assert compression_ratio(looping) > compression_ratio(varied)


# --------------------------------------------------------------------------- tail loop


def test_tail_loop_hand_computed():
    # 1 prefix token + phrase (1,2,3) x3 back to back to the end -> period 3
    assert tail_loop([5, 1, 2, 3, 1, 2, 3, 1, 2, 3]) == 3
    # phrase (1,2,3,4) x3 -> 4 (the last 9 tokens are not 3-periodic: 2,3,4,1,... vs 1,2,3,4)
    assert tail_loop([9] + [1, 2, 3, 4] * 3) == 4
    # only 8 tokens of (1,2,3)-loop: needs 3*3 = 9 -> none
    assert tail_loop([1, 2, 3, 1, 2, 3, 1, 2]) == 0
    # loop broken by the last token -> none (the loop must reach the very end)
    assert tail_loop([1, 2, 3] * 4 + [8]) == 0
    # single-token loop: 9 x 7 is 3-periodic (p = min_phrase = 3, 3*3 = 9 tokens) -> 3
    assert tail_loop([7] * 9) == 3
    assert tail_loop([7] * 8) == 0  # 8 < 9 tokens
    # ping-pong (1,2): p=3 fails (2 != 1 three back); p=4 needs 4*3 = 12 tokens
    assert tail_loop([1, 2] * 6) == 4
    assert tail_loop([1, 2] * 5) == 0
    # parameters: period 1 allowed, 2 repeats
    assert tail_loop([4, 7, 7], min_phrase=1, min_repeats=2) == 1
    assert tail_loop([1, 2, 1, 2], min_phrase=2, min_repeats=2) == 2


def test_tail_loop_edges():
    assert tail_loop([]) == 0
    assert tail_loop([1]) == 0
    assert tail_loop(list(range(100))) == 0
    with pytest.raises(ValueError):
        tail_loop([1, 2, 3], min_phrase=0)


@given(
    prefix=st.lists(st.integers(0, 5), max_size=20),
    phrase=st.lists(st.integers(0, 5), min_size=3, max_size=8),
    repeats=st.integers(3, 5),
)
def test_tail_loop_detects_constructed_loops(prefix, phrase, repeats):
    t = prefix + phrase * repeats
    p = tail_loop(t)
    # some loop is found, no longer than the planted phrase, and it really is one
    assert 3 <= p <= len(phrase)
    assert is_tail_periodic(t, p)
    # and it is the smallest one
    assert not any(is_tail_periodic(t, q) for q in range(3, p))


@given(
    prefix=st.lists(st.integers(0, 5), max_size=20),
    length=st.integers(3, 8),
    repeats=st.integers(3, 5),
)
def test_tail_loop_exact_period_for_distinct_phrase(prefix, length, repeats):
    phrase = list(range(100, 100 + length))  # all-distinct tokens, absent from the prefix
    assert tail_loop(prefix + phrase * repeats) == length


@given(st.integers(0, 300))
def test_tail_loop_zero_on_distinct_tokens(n):
    assert tail_loop(list(range(n))) == 0


# --------------------------------------------------------------------------- longest repeated span


def test_longest_repeated_span_hand_computed():
    assert longest_repeated_span([]) == 0
    assert longest_repeated_span([5]) == 0
    assert longest_repeated_span([1, 2, 3]) == 0  # all distinct
    assert longest_repeated_span([1, 1]) == 1  # "1" at 0 and 1
    assert longest_repeated_span([1, 1, 1]) == 2  # (1,1) at 0 and 1: overlap allowed
    # (1,2,3,1) at 0 and 3 (overlapping in the middle "1")
    assert longest_repeated_span([1, 2, 3, 1, 2, 3, 1]) == 4
    # "banana" -> b=1 a=2 n=3: "ana" = (2,3,2) at 1 and 3
    assert longest_repeated_span([1, 2, 3, 2, 3, 2]) == 3
    # a 255-token run of one token: (7,)*254 at 0 and 1
    assert longest_repeated_span([7] * 255) == 254


@settings(max_examples=300)
@given(st.lists(st.integers(0, 2), max_size=30))
def test_longest_repeated_span_matches_naive(t):
    expected = naive_longest_repeat(t)
    assert longest_repeated_span(t) == expected
    assert repetition_mod._longest_repeated_span_exact(t) == expected
    assert repetition_metrics(t, "")["longest_repeat"] == expected


def test_longest_repeated_span_survives_hash_collisions(monkeypatch):
    # Thue-Morse word S and its complement S' (length 2**11) collide under any polynomial hash
    # mod 2**64 with an odd base: the failed verification must hand over to the exact algorithm.
    tm = [bin(i).count("1") % 2 for i in range(2048)]
    t = tm + [1 - x for x in tm]
    calls = []
    exact = repetition_mod._longest_repeated_span_exact

    def spy(seq):
        calls.append(len(seq))
        return exact(seq)

    monkeypatch.setattr(repetition_mod, "_longest_repeated_span_exact", spy)
    result = longest_repeated_span(t)
    assert calls  # the collision was caught
    assert result == exact(t)


# --------------------------------------------------------------------------- repetition_metrics


def test_repetition_metrics_hand_computed():
    t = [1, 2, 1, 2, 1]
    m = repetition_metrics(t, "abab a", finish_reason="length")
    assert set(m) == {
        "length", "seq_rep_1", "seq_rep_2", "seq_rep_3", "seq_rep_4",
        "distinct_1", "distinct_2", "distinct_3", "distinct_4", "zlib_ratio",
        "tail_loop", "tail_loop_period", "longest_repeat", "finish_length",
    }  # fmt: skip
    assert m["length"] == 5
    assert m["seq_rep_1"] == pytest.approx(0.6)  # 1 - 2/5
    assert m["seq_rep_2"] == pytest.approx(0.5)  # 1 - 2/4
    assert m["seq_rep_3"] == pytest.approx(1 / 3)  # 1 - 2/3
    assert m["seq_rep_4"] == 0.0  # (1,2,1,2) (2,1,2,1): 2 unique of 2
    assert m["distinct_4"] == 1.0
    assert m["zlib_ratio"] == compression_ratio("abab a")
    assert m["tail_loop"] is False and m["tail_loop_period"] == 0  # 5 tokens < 3*3
    assert m["longest_repeat"] == 3  # (1,2,1) at 0 and 2
    assert m["finish_length"] is True
    assert repetition_metrics(t, "", finish_reason="stop")["finish_length"] is False


def test_repetition_metrics_loop_and_empty():
    m = repetition_metrics([9, 8] + [1, 2, 3] * 4, "x")
    assert m["tail_loop"] is True and m["tail_loop_period"] == 3
    assert m["longest_repeat"] == 9  # (1,2,3)*3 at 2 and 5
    assert isinstance(m["tail_loop_period"], int) and isinstance(m["longest_repeat"], int)
    e = repetition_metrics([], "")
    assert e["length"] == 0 and e["seq_rep_1"] == 0.0 and e["distinct_4"] == 1.0
    assert e["zlib_ratio"] == 0.0 and e["tail_loop"] is False and e["longest_repeat"] == 0


@given(st.lists(st.integers(0, 3), max_size=60))
def test_repetition_metrics_consistent_with_functions(t):
    m = repetition_metrics(t, "")
    for n in (1, 2, 3, 4):
        assert m[f"seq_rep_{n}"] == seq_rep_n(t, n)
        assert m[f"distinct_{n}"] == distinct_n(t, n)
    assert m["tail_loop_period"] == tail_loop(t)
    assert m["longest_repeat"] == longest_repeated_span(t)


# --------------------------------------------------------------------------- first divergence / prefix


def test_first_divergence_hand_computed():
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # strict prefix: its length
    assert first_divergence([1, 2, 3], [1, 2]) == 2
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([], []) is None
    assert first_divergence([], [1]) == 0
    assert first_divergence([1], [2]) == 0
    long = list(range(100))
    assert first_divergence(long, long[:70] + [-1] + long[71:]) == 70  # past the first chunk
    assert first_divergence(np.array(long), tuple(long[:99])) == 99  # mixed input types


def test_common_prefix_ratio_hand_computed():
    assert common_prefix_ratio([1, 2, 3], [1, 2, 4]) == pytest.approx(2 / 3)
    assert common_prefix_ratio([1, 2], [1, 2, 3, 4]) == pytest.approx(2 / 4)
    assert common_prefix_ratio([], []) == 1.0
    assert common_prefix_ratio([], [1]) == 0.0
    assert common_prefix_ratio([5], [5]) == 1.0


@given(tokens, tokens)
def test_first_divergence_symmetric(a, b):
    assert first_divergence(a, b) == first_divergence(b, a)


@given(small_tokens, small_tokens)
def test_common_prefix_ratio_one_iff_identical(a, b):
    r = common_prefix_ratio(a, b)
    assert 0.0 <= r <= 1.0
    assert (r == 1.0) == (a == b)
    fd = first_divergence(a, b)
    assert (fd is None) == (a == b)
    if fd is not None:
        assert a[:fd] == b[:fd]
        assert fd == min(len(a), len(b)) or a[fd] != b[fd]


# --------------------------------------------------------------------------- edit distance


def test_edit_distance_hand_computed():
    kitten = [ord(c) for c in "kitten"]
    sitting = [ord(c) for c in "sitting"]
    # k->s, e->i, +g = 3 edits over max(6, 7) = 7
    assert edit_distance_norm(kitten, sitting) == pytest.approx(3 / 7)
    assert edit_distance_norm([1, 2, 3], [1, 3]) == pytest.approx(1 / 3)  # delete 2: 1 / 3
    assert edit_distance_norm([], [1, 2]) == 1.0  # 2 inserts / 2
    assert edit_distance_norm([], []) == 0.0
    assert edit_distance_norm([4, 5], [4, 5]) == 0.0
    assert edit_distance_norm([1], [2]) == 1.0  # one substitution / 1


def test_edit_distance_band():
    a = [1, 2] * 151  # 302 tokens
    b = [2, 1] * 151  # no common prefix or suffix; shifted by one
    # exact: delete the leading 1 and append a 1 -> 2 edits / 302
    assert edit_distance_norm(a, b, band=None) == pytest.approx(2 / 302)
    # 302 > 256, banded, but the true distance 2 <= band, so still exact
    assert edit_distance_norm(a, b) == pytest.approx(2 / 302)
    assert edit_distance_norm(a, b, band=1) == pytest.approx(2 / 302)
    # band 0: only the main diagonal -> Hamming distance, every position differs: 302 / 302
    assert edit_distance_norm(a, b, band=0) == 1.0
    # length gap beyond the band: trivial bound max(n', m')
    x = [3] + [1] * 10 + [5]  # 12 tokens
    y = [4] + [1] * 300 + [6]  # 302 tokens, no common prefix/suffix
    # exact: 2 substitutions (3->4, 5->6) + 290 inserts = 292, over 302
    assert edit_distance_norm(x, y, band=None) == pytest.approx(292 / 302)
    # |12 - 302| = 290 > 5 -> bound 302 / 302
    assert edit_distance_norm(x, y, band=5) == 1.0
    with pytest.raises(ValueError):
        edit_distance_norm([1], [2], band=-1)


@settings(max_examples=300)
@given(small_tokens, small_tokens)
def test_edit_distance_matches_naive(a, b):
    longest = max(len(a), len(b))
    exact = naive_levenshtein(a, b)
    expected = exact / longest if longest else 0.0
    d = edit_distance_norm(a, b)  # lengths <= 40 <= band: exact
    assert d == pytest.approx(expected)
    assert d == edit_distance_norm(b, a)
    assert 0.0 <= d <= 1.0
    assert (d == 0.0) == (a == b)


@settings(max_examples=300)
@given(small_tokens, small_tokens, st.integers(0, 6))
def test_edit_distance_banded_is_bounded(a, b, band):
    longest = max(len(a), len(b))
    assume(longest > 0)
    exact = naive_levenshtein(a, b)
    d = edit_distance_norm(a, b, band=band)
    assert d == edit_distance_norm(b, a, band=band)  # symmetric
    assert exact / longest - 1e-12 <= d <= 1.0  # an upper bound, never above 1
    assert (d == 0.0) == (a == b)
    if exact <= band or longest <= band:
        assert d == pytest.approx(exact / longest)  # documented exactness


@given(small_tokens, small_tokens, small_tokens)
def test_edit_distance_triangle(a, b, c):
    def raw(x, y):
        return edit_distance_norm(x, y) * max(len(x), len(y))

    assert raw(a, c) <= raw(a, b) + raw(b, c) + 1e-9


# --------------------------------------------------------------------------- top-k rule and margins

A = [1, 2, 3]
B = [1, 2, 4]
A_TOPK = [[[1, -0.01]], [[2, -0.02]], [[3, -0.1], [4, -2.3]]]
B_TOPK = [[[1, -0.01]], [[2, -0.02]], [[4, -0.2], [3, -1.9]]]


def test_topk_contains_hand_computed():
    # first divergence at 2: a[2]=3 in b's top-k {4, 3}, b[2]=4 in a's top-k {3, 4} -> True
    assert topk_contains(A, A_TOPK, B, B_TOPK) is True
    # b's top-k at 2 lacks 3 -> False
    assert topk_contains(A, A_TOPK, B, B_TOPK[:2] + [[[4, -0.2], [9, -1.0]]]) is False
    # no divergence within both lengths -> True
    assert topk_contains(A, A_TOPK, A, A_TOPK) is True
    assert topk_contains([1, 2], [], [1, 2, 3], []) is True
    # top-k missing at the divergence -> None
    assert topk_contains(A, [], B, B_TOPK) is None
    assert topk_contains(A, A_TOPK[:2] + [[]], B, B_TOPK) is None


def test_logprob_margin_hand_computed():
    # side a at 2: own 3 (-0.1) vs other 4 (-2.3): -0.1 - (-2.3) = 2.2
    assert logprob_margin(A, A_TOPK, 4, 2) == pytest.approx(2.2)
    # side b at 2: own 4 (-0.2) vs other 3 (-1.9): -0.2 - (-1.9) = 1.7
    assert logprob_margin(B, B_TOPK, 3, 2) == pytest.approx(1.7)
    assert logprob_margin(A, A_TOPK, 9, 2) is None  # other token not in the top-k
    assert logprob_margin(A, [], 4, 2) is None  # top-k unavailable
    assert logprob_margin(A, A_TOPK, 4, 3) is None  # step out of range


def test_dlogprob_stats_hand_computed():
    a = [-0.1, -0.5, -1.0]
    b = [-0.2, -0.5, -0.7]
    # |diffs| = 0.1, 0.0, 0.3 -> mean 0.4 / 3, max 0.3
    mean, mx = dlogprob_stats(a, b, 3)
    assert mean == pytest.approx(0.4 / 3) and mx == pytest.approx(0.3)
    # upto 2: 0.1, 0.0 -> mean 0.05, max 0.1
    mean, mx = dlogprob_stats(a, b, 2)
    assert mean == pytest.approx(0.05) and mx == pytest.approx(0.1)
    assert dlogprob_stats(a, b, 0) == (0.0, 0.0)
    assert dlogprob_stats([], [], 3) == (0.0, 0.0)  # logprobs unavailable


topk_step = st.lists(st.tuples(st.integers(0, 3), st.floats(-10, 0)).map(list), max_size=3)


@given(
    small_tokens,
    st.lists(topk_step, max_size=40),
    small_tokens,
    st.lists(topk_step, max_size=40),
)
def test_topk_contains_matches_vllm_rule(a, a_topk, b, b_topk):
    assert topk_contains(a, a_topk, b, b_topk) == vllm_rule(a, a_topk, b, b_topk)
    got = divergence_metrics(a, [], a_topk, b, [], b_topk)["topk_ok"]
    assert got == vllm_rule(a, a_topk, b, b_topk)


# --------------------------------------------------------------------------- divergence_metrics

KEYS = {
    "exact", "first_div", "common_prefix_ratio", "edit_distance", "topk_ok",
    "margin_test", "margin_ref", "dlogprob_mean", "dlogprob_max",
}  # fmt: skip


def test_divergence_metrics_hand_computed():
    m = divergence_metrics(A, [-0.01, -0.03, -0.1], A_TOPK, B, [-0.01, -0.02, -0.2], B_TOPK)
    assert set(m) == KEYS
    assert m["exact"] is False
    assert m["first_div"] == 2
    assert m["common_prefix_ratio"] == pytest.approx(2 / 3)
    assert m["edit_distance"] == pytest.approx(1 / 3)  # one substitution over 3
    assert m["topk_ok"] is True
    assert m["margin_test"] == pytest.approx(2.2)  # -0.1 - (-2.3)
    assert m["margin_ref"] == pytest.approx(1.7)  # -0.2 - (-1.9)
    # over the common prefix j < 2: |-0.01 - -0.01| = 0, |-0.03 - -0.02| = 0.01
    assert m["dlogprob_mean"] == pytest.approx(0.005)
    assert m["dlogprob_max"] == pytest.approx(0.01)


def test_divergence_metrics_identical_and_prefix():
    m = divergence_metrics(A, [-0.1, -0.2, -0.3], A_TOPK, A, [-0.1, -0.25, -0.3], A_TOPK)
    assert m["exact"] is True and m["first_div"] == -1
    assert m["common_prefix_ratio"] == 1.0 and m["edit_distance"] == 0.0
    assert m["topk_ok"] is True and m["margin_test"] is None and m["margin_ref"] is None
    # all 3 steps: 0, 0.05, 0 -> mean 0.05 / 3, max 0.05
    assert m["dlogprob_mean"] == pytest.approx(0.05 / 3)
    assert m["dlogprob_max"] == pytest.approx(0.05)

    p = divergence_metrics([1, 2], [], [], [1, 2, 3, 4], [], [])
    assert p["exact"] is False and p["first_div"] == 2
    assert p["common_prefix_ratio"] == 0.5 and p["edit_distance"] == 0.5  # 2 inserts / 4
    assert p["topk_ok"] is True and p["margin_test"] is None
    assert (p["dlogprob_mean"], p["dlogprob_max"]) == (0.0, 0.0)  # no logprobs

    e = divergence_metrics([], [], [], [], [], [])
    assert e["exact"] is True and e["first_div"] == -1 and e["common_prefix_ratio"] == 1.0

    missing = divergence_metrics(A, [], [], B, [], [])
    assert missing["topk_ok"] is None and missing["margin_test"] is None


@given(small_tokens, small_tokens)
def test_divergence_metrics_consistent(a, b):
    m = divergence_metrics(a, [], [], b, [], [])
    fd = first_divergence(a, b)
    assert m["exact"] == (a == b)
    assert m["first_div"] == (-1 if fd is None else fd)
    assert m["common_prefix_ratio"] == common_prefix_ratio(a, b)
    assert m["edit_distance"] == edit_distance_norm(a, b)


# --- drift on agreeing positions (metrics/drift.py) -------------------------------------------------

from cascade_repro.judge.metrics.drift import (  # noqa: E402
    agreeing_len,
    chosen_drift,
    drift_floor,
    drift_triple,
    topk_drift,
)


def _topk(rows):
    return [[[float(t), float(lp)] for t, lp in row] for row in rows]


def test_agreeing_len_stops_at_the_first_position_any_sequence_differs():
    assert agreeing_len([1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 7, 4]) == 2
    assert agreeing_len([1, 2], [1, 2, 3]) == 2
    assert agreeing_len([5], [6]) == 0


def test_chosen_drift_is_zero_on_identical_inputs_symmetric_and_scales():
    a, b = [-0.1, -0.5, -2.0], [-0.2, -0.4, -2.0]
    assert chosen_drift(a, a, 3) == 0.0
    assert chosen_drift(a, b, 3) == pytest.approx(0.2 / 3) == chosen_drift(b, a, 3)
    assert chosen_drift([x * 10 for x in a], [x * 10 for x in b], 3) == pytest.approx(2.0 / 3)
    assert chosen_drift(a, b, 1) == pytest.approx(0.1)  # only the agreeing positions count
    assert math.isnan(chosen_drift(a, b, 0))


def test_topk_drift_takes_the_largest_difference_over_shared_ids():
    a = _topk([[(1, -0.1), (2, -2.0), (3, -3.0)], [(4, -0.2), (5, -1.0), (6, -4.0)]])
    b = _topk([[(1, -0.2), (2, -2.5), (9, -3.0)], [(4, -0.2), (6, -4.0), (5, -1.0)]])
    # step 0: shared ids 1 (0.1) and 2 (0.5) -> 0.5; step 1: all shared, equal -> 0.0
    assert topk_drift(a, b, 2) == pytest.approx(0.25)
    assert topk_drift(a, a, 2) == 0.0
    assert topk_drift(a, b, 2) == pytest.approx(topk_drift(b, a, 2))
    assert math.isnan(topk_drift([], b, 2))


def test_drift_triple_compares_test_and_control_on_the_same_contexts():
    a_tok, b_tok, c_tok = [1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 8, 8]
    out = drift_triple(
        a_tok, [-0.1, -0.1, -0.1, -0.1], [], b_tok, [-0.3, -0.3, -0.3, -0.3], [], c_tok, [-0.3, -0.2, 0, 0], []
    )
    assert out["drift_positions"] == 2  # c leaves at position 2
    assert out["drift_test"] == pytest.approx(0.2)
    assert out["drift_control"] == pytest.approx(0.05)
    assert out["bias_test"] == pytest.approx(0.2)  # signed: cascade above the twin on both positions
    assert out["bias_control"] == pytest.approx(0.05)
    assert math.isnan(out["topk_drift_test"])


def test_drift_floor_follows_the_dtype_resolution():
    assert drift_floor("bfloat16") == drift_floor("torch.bfloat16") == 2.0**-8
    assert drift_floor("float16") == 2.0**-11
    assert drift_floor("float32") == 1e-4  # fp32's own unit roundoff would make 1e-6 look huge
    assert drift_floor("mystery") == 2.0**-8  # unknown: the largest floor, never a false alarm


long_tokens = st.lists(st.integers(0, 5), min_size=0, max_size=600)


@settings(max_examples=150)
@given(long_tokens, long_tokens)
def test_the_default_edit_distance_is_exact_and_equals_the_pure_exact_one(a, b):
    from cascade_repro.judge.metrics import divergence

    if divergence._rapidfuzz is None:
        pytest.skip("rapidfuzz not installed here")
    assert edit_distance_norm(a, b) == edit_distance_norm(a, b, band=None)  # rapidfuzz vs bit-parallel


def test_without_rapidfuzz_the_default_is_the_256_band(monkeypatch):
    from cascade_repro.judge.metrics import divergence

    x = [3] + [1] * 10 + [5]
    y = [4] + [1] * 300 + [6]  # a length gap of 290 > 256: the banded code's trivial bound
    monkeypatch.setattr(divergence, "_rapidfuzz", None)
    assert edit_distance_norm(x, y) == 1.0 == edit_distance_norm(x, y, band=256)
    monkeypatch.undo()
    if divergence._rapidfuzz is not None:
        assert edit_distance_norm(x, y) == pytest.approx(292 / 302)  # exact
