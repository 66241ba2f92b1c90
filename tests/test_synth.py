"""tests/support/synth.py draws completions of any length (it crashed below ~60 tokens), and its draws
from 64 tokens up are the ones it always made (the benchmark's 100k-sample run depends on them)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
import synth  # noqa: E402


@pytest.mark.parametrize("length", [1, 8, 16, 17, 24, 32, 48, 49, 63, 64])
def test_any_length(length: int):
    for seed in range(200):
        assert len(synth._ref_tokens(random.Random(seed), length)) == length


def test_long_draws_unchanged():
    # Sums of the first draws at 256 tokens, as the code before the short-length fix drew them.
    got = [sum(synth._ref_tokens(random.Random(seed), 256)) for seed in range(5)]
    assert got == [1022869, 577963, 981248, 994456, 1066552]
