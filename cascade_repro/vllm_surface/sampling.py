"""Sampling penalties every arm's requests carry (``--sampling key=value``), and how they are checked.

Greedy decoding stays greedy: a penalty only moves the logits the argmax is taken over. vLLM applies
the three penalties in its sampler (``vllm/v1/sample/sampler.py``, ``apply_penalties`` in
``vllm/model_executor/layers/utils.py``, 0.10.2 to 0.34.0), over the logits of every step:

- ``repetition_penalty`` (> 0, 1 = off): a token present in the prompt or in the output so far has a
  positive logit divided by it, a negative one multiplied by it;
- ``frequency_penalty`` (-2..2, 0 = off): subtracted once per occurrence of the token in the output so far;
- ``presence_penalty`` (-2..2, 0 = off): subtracted once when the token occurs in the output so far.

The reference pass applies the same three to its teacher-forced logits (``run/penalties.py``), and the
vLLM engine asks for the penalized logprobs (``logprobs_mode=processed_logprobs``), so each arm and the
reference score the distribution the token was chosen from. The hf and fake engines have no sampler
of vLLM's to apply them and refuse them in one line.

Standard library only: the planner, the reference pass and the vLLM engine read it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

# name -> (the value that leaves the logits alone, lowest allowed, highest allowed, lowest exclusive)
PENALTIES: dict[str, tuple[float, float, float, bool]] = {
    "repetition_penalty": (1.0, 0.0, 100.0, True),
    "frequency_penalty": (0.0, -2.0, 2.0, False),
    "presence_penalty": (0.0, -2.0, 2.0, False),
}
# The engine argument that makes vLLM return the logprobs its sampler chose from (after penalties).
LOGPROBS_MODE = ("logprobs_mode", "processed_logprobs")


def parse_pairs(pairs: Iterable[str], flag: str = "--sampling") -> dict[str, float]:
    """``["repetition_penalty=1.3"]`` -> ``{"repetition_penalty": 1.3}``; a one-line ValueError otherwise."""
    out: dict[str, float] = {}
    for pair in pairs:
        key, sep, value = str(pair).partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"{flag} takes key=value (e.g. {flag} repetition_penalty=1.3), got {pair!r}")
        try:
            out[key] = float(value)
        except ValueError:
            raise ValueError(f"{flag} {key}: expected a number, got {value.strip()!r}") from None
    return out


def problem(sampling: Any) -> str | None:
    """Why ``sampling`` (the spec's table) is not a set of penalties vLLM takes; None when it is."""
    if not isinstance(sampling, Mapping):
        return f"must be a table of sampling penalties, got {sampling!r}"
    for key, value in sampling.items():
        if key not in PENALTIES:
            return f"{key!r} is not a sampling penalty the harness passes on (known: {', '.join(PENALTIES)})"
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return f"{key} must be a number, got {value!r}"
        _, low, high, open_low = PENALTIES[key]
        if value > high or value < low or (open_low and value == low):
            bound = f"> {low:g}" if open_low else f">= {low:g}"
            return f"{key} must be {bound} and <= {high:g} (vLLM's range), got {value:g}"
    return None


def active(sampling: Mapping[str, Any] | None) -> dict[str, float]:
    """The penalties that move the logits (a value other than the one that leaves them alone)."""
    return {
        k: float(v) for k, v in (sampling or {}).items() if k in PENALTIES and float(v) != PENALTIES[k][0]
    }


def describe(sampling: Mapping[str, Any] | None) -> str:
    """``repetition_penalty=1.3`` for a log line or a dry run; ``none`` when nothing moves the logits."""
    on = active(sampling)
    return ", ".join(f"{k}={v:g}" for k, v in on.items()) or "none"
