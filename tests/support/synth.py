"""Synthetic completions with realistic repetition and divergence, shared by the tests' synthetic
runs (``make_synthetic_run.py``) and the CPU benchmarks (``benchmarks/bench_metrics.py``).

A *pair* is two sample records of the same prompt (test = cascade arm, ref = flat twin), each in
the samples-JSONL shape (``token_ids``, ``text``, ``finish_reason``, ``logprobs``, ``topk``).
Everything is drawn from a seeded ``random.Random``, so a seed names the data.

The mixture (probabilities per completion or per pair):

* tokens: Zipf-like over a 49,152-token vocabulary (SmolLM2's), so unigrams repeat as in text
  (seq-rep-1 ~0.37) while most 4-grams do not;
* 25% of refs copy one to three earlier spans of 8-40 tokens (quotes, list items);
* 15% of refs fall into a tail loop: a phrase of 1-20 tokens repeated up to the end;
* 45% of pairs are identical token for token (their logprobs drift by ~1e-3, as bf16 does);
* the rest diverge at a uniform point and then re-synchronise after a shifted copy (40%),
  continue with unrelated text (30%) or degenerate into a loop (30%, the cascade-bug symptom);
* every step carries a top-k list of k = 5 ``[token_id, logprob]`` with the chosen token first;
  at the divergence point each side's token is in the other's top-k 85% of the time (so ~72% of
  divergences pass vLLM's ``check_logprobs_close`` rule).

Memory: per-step top-k lists (and the chosen token's logprob) are shared per token id, so 100,000
completions fit in about 1.5 GB of Python objects.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

VOCAB = 49_152
LENGTH = 256
TOPK = 5

_T: dict[str, Any] = {}


def _tables() -> dict[str, Any]:
    if not _T:
        r = random.Random(12345)
        _T["ids"] = list(range(VOCAB))
        _T["cum"] = list(itertools.accumulate(1.0 / (k + 2.7) ** 1.07 for k in range(VOCAB)))
        letters = "abcdefghijklmnopqrstuvwxyz가나다라마바사아자차카타파하"
        _T["words"] = [
            ("" if r.random() < 0.3 else " ") + "".join(r.choices(letters, k=r.randint(1, 7))) for _ in range(VOCAB)
        ]
        # Full-precision floats, as vLLM returns them (their JSON is as long as the real thing).
        alts = [[[r.randrange(VOCAB), -r.uniform(0.7, 9.0)] for _ in range(TOPK - 1)] for _ in range(8191)]
        # The top-k list of a step that chose token t (shared by every occurrence of t).
        _T["steps"] = [[[t, -r.expovariate(3.0)], *alts[t % 8191]] for t in range(VOCAB)]
    return _T


def _zipf(rng: random.Random, k: int) -> list[int]:
    t = _tables()
    return rng.choices(t["ids"], cum_weights=t["cum"], k=k)


def _loop_tail(rng: random.Random, start: list[int], length: int) -> list[int]:
    period = rng.choice([1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20])
    phrase = _zipf(rng, period)
    out = list(start)
    while len(out) < length:
        out.extend(phrase)
    return out[:length]


def _ref_tokens(rng: random.Random, length: int) -> list[int]:
    t = _zipf(rng, length)
    # Short completions (--max-tokens below ~60) get shorter spans and no tail loop; from 64 tokens
    # up the draws are the ones longer runs always had.
    if rng.random() < 0.25 and length >= 17:  # copied spans
        for _ in range(rng.randint(1, 3)):
            n = rng.randint(8, 40 if length > 48 else length // 2)
            src = rng.randrange(0, length - n)
            dst = rng.randrange(src + 1, length - n + 1) if src + 1 <= length - n else src
            t[dst : dst + n] = t[src : src + n]
    if rng.random() < 0.15 and length >= 64:  # tail loop
        t = _loop_tail(rng, t[: rng.randint(16, length - 48)], length)
    return t


def _test_tokens(
    rng: random.Random, ref: list[int], p_identical: float = 0.45, p_loop: float = 0.3
) -> tuple[list[int], int]:
    """Return (test tokens, first divergence or -1)."""
    n = len(ref)
    if n == 0 or rng.random() < p_identical:
        return list(ref), -1
    d = rng.randrange(0, n)
    head = ref[:d]
    other = ref[d]
    if rng.random() < 0.85:  # usually the runner-up: one of the other side's top-k alternatives
        other = rng.choice(_tables()["steps"][ref[d]][1:])[0]
    while other == ref[d]:
        other = _zipf(rng, 1)[0]
    u = rng.random()
    if u >= 1 - p_loop:  # degenerates into a loop
        return _loop_tail(rng, head + [other], n), d
    u = u / (1 - p_loop) if p_loop < 1 else 0.0
    if u < 4 / 7:  # one different token, then the same text again, possibly shifted by a few tokens
        s = rng.randint(-3, 3)
        t = (head + [other] + ref[max(d + 1 + s, 0) :] + _zipf(rng, 4))[:n]
    else:  # unrelated continuation
        t = head + [other] + _zipf(rng, n - d - 1)
    return t, d


def _side(rng: random.Random, tokens: list[int], length_cap: int) -> dict[str, Any]:
    tb = _tables()
    steps, words = tb["steps"], tb["words"]
    return {
        "token_ids": tokens,
        "text": "".join([words[t] for t in tokens]),
        "finish_reason": "length" if len(tokens) >= length_cap else "stop",
        "logprobs": [steps[t][0][1] for t in tokens],  # the chosen token's logprob in its top-k
        "topk": [steps[t] for t in tokens],
    }


def make_pair(rng: random.Random, length: int = LENGTH) -> tuple[dict[str, Any], dict[str, Any]]:
    """One (test, ref) pair of sample records (the fields the metrics read)."""
    ref_t = _ref_tokens(rng, length)
    test_t, d = _test_tokens(rng, ref_t)
    ref = _side(rng, ref_t, length)
    test = _side(rng, test_t, length)
    if d < 0:  # identical: the same choices, logprobs drift a little
        g = rng.gauss
        test["logprobs"] = [lp + g(0.0, 1e-3) for lp in ref["logprobs"]]
    else:
        # Same logprobs over the agreeing prefix (plus drift), then each side's own.
        test["logprobs"][:d] = [lp + 1e-3 for lp in ref["logprobs"][:d]]
        # At the divergence point the test token is usually among ref's alternatives (see
        # _test_tokens), and ref's token among test's.
        if rng.random() < 0.85:
            test["topk"] = list(test["topk"])
            step = list(test["topk"][d])
            step[1] = [ref_t[d], step[0][1] - rng.uniform(0.01, 1.5)]
            test["topk"][d] = step
    return test, ref


def pairs(n_pairs: int, seed: int = 0, length: int = LENGTH) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    rng = random.Random(seed)
    return [make_pair(rng, length) for _ in range(n_pairs)]
