"""Each arm against the reference: how far its own tokens' logprobs are from a more precise computation.

The arm-vs-arm statistics (``drift.py``) see only the positions before the first divergence. Here
every generated token counts, each arm on its own path: the reference (``run/reference.py``) read
the arm's exact tokens teacher-forced, so at every position the two computed the same quantity and
the difference is the arm's error. All functions are pure.

Per prompt and arm:
- ``mean_abs``: mean ``|lp_arm - lp_ref|`` of the chosen tokens (the error the verdict compares);
- ``mean_signed``: mean ``lp_arm - lp_ref`` (an arm that is systematically over- or under-confident);
- ``regret``: the reference's logprob of its own argmax minus that of the arm's choice, summed over
  the answer: how much likelihood the arm's greedy choices gave away, in the reference's eyes (0 when
  every choice was the reference's argmax);
- ``by_step``: ``|lp_arm - lp_ref|`` per generated token, for the error-by-step curve.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["ArmError", "arm_error", "by_step_mean"]


@dataclass(frozen=True)
class ArmError:
    n: int = 0  # tokens compared
    mean_abs: float = math.nan
    mean_signed: float = math.nan
    regret: float = math.nan
    by_step: tuple[float, ...] = field(default=())

    @property
    def measured(self) -> bool:
        return self.n > 0


def arm_error(arm_lp: Sequence[float], ref_lp: Sequence[float], ref_argmax_lp: Sequence[float]) -> ArmError:
    """The arm's error against the reference over its generated tokens (positions both recorded).

    Positions where either logprob is not finite are left out (an engine that returned no logprob
    for a token); an arm without logprobs has ``n == 0``.
    """
    steps: list[float] = []
    signed = regret = 0.0
    for a, r, m in zip(arm_lp, ref_lp, ref_argmax_lp, strict=False):
        if not (_finite(a) and _finite(r)):
            steps.append(math.nan)
            continue
        steps.append(abs(a - r))
        signed += a - r
        if _finite(m):
            regret += max(m - r, 0.0)  # the argmax's logprob is never below the chosen one's
    vals = [s for s in steps if s == s]
    if not vals:
        return ArmError()
    n = len(vals)
    return ArmError(n, sum(vals) / n, signed / n, regret, tuple(steps))


def by_step_mean(curves: Sequence[Sequence[float]], length: int | None = None) -> list[float]:
    """Mean over prompts of the error at each generated-token index (prompts that reached it)."""
    width = max((len(c) for c in curves), default=0) if length is None else length
    out = []
    for t in range(width):
        vals = [c[t] for c in curves if t < len(c) and c[t] == c[t]]
        out.append(sum(vals) / len(vals) if vals else math.nan)
    return out


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
