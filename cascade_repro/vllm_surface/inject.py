"""Fault injections for the cascade arm: the positive controls every harness run can include.

Two kinds, applied inside the cascade merge only (the flat arm never sees them), by the reference
cascade of the hf engine and by the vLLM probe alike:

- ``lse-layout``: the suffix LSE is read in the transposed memory layout, the FA2 split-KV bug class
  (vllm-project/flash-attention PR #87). Gross: it turns most outputs into repetition.
- ``lse-shift=X``: the prefix LSE is shifted by ``X`` nats before the merge, so the prefix is
  weighted ``e**X`` times too much against the suffix. Graded: a ladder of ``X`` (``--calibrate``)
  measures the smallest error a setup can see.

A third, for a twin other than cascade (``--twin``), where the test arm may run no cascade merge:

- ``out-scale=E``: every attention layer's output on the test arm is scaled by ``1 + E``, in
  whatever backend runs, independent of the setting under test (the vLLM probe wraps the attention
  layer's forward; the fake engine moves its logprobs by as much on every step). Graded like
  ``lse-shift``: ``--calibrate`` runs a ladder of ``E`` for such twins.

Any may start mid-answer: ``lse-shift=X@STEP`` (or ``lse-layout@STEP``) leaves every step before
generated token ``STEP`` alone (the prefill produces token 0, decode step ``k`` token ``k``), so a
fault that begins late in an answer, as the field bug's split onset did, is a positive control too.

Only the standard library is imported: the vLLM probe loads this module in every vLLM process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LSE_LAYOUT = "lse-layout"
LSE_SHIFT = "lse-shift"
OUT_SCALE = "out-scale"
KINDS = (LSE_LAYOUT, LSE_SHIFT, OUT_SCALE)
GRADED = (LSE_SHIFT, OUT_SCALE)  # the kinds with an amount: a calibration ladder's rungs
# --calibrate default: half-decade steps of prefix-LSE shift in nats (each step is one more cascade
# cell per batch size, so the ladder is short). On a 1,600-token shared prefix
# the suffix holds a few percent of the attention mass, so 0.01 nats moves the merged output by
# ~0.05 % (below bf16's resolution) and 1 nat by tens of percent.
DEFAULT_LADDER = (0.01, 0.03, 0.1, 0.3, 1.0)


@dataclass(frozen=True)
class Injection:
    """One parsed ``--inject`` value."""

    kind: str
    nats: float = 0.0
    onset: int = 0  # the first generated token whose step carries the fault

    @property
    def label(self) -> str:
        """The canonical spelling (what run.json, cell ids and reports show)."""
        base = f"{self.kind}={self.nats:g}" if self.kind in GRADED else self.kind
        return f"{base}@{self.onset}" if self.onset else base

    def active(self, token_index: int) -> bool:
        """Whether the step producing generated token ``token_index`` carries the fault."""
        return token_index >= self.onset


def parse(text: str | None) -> Injection | None:
    """Parse an ``--inject`` value; ``None``/empty is no injection. Raise ValueError naming the problem."""
    if text is None or not str(text).strip():
        return None
    s, at, step = str(text).strip().lower().partition("@")
    onset = 0
    if at:
        if not step.strip().isdigit():
            raise ValueError(f"the onset after @ must be a generated-token index >= 0, got {step!r}")
        onset = int(step)
    s = s.strip()
    if s == LSE_LAYOUT:
        return Injection(LSE_LAYOUT, onset=onset)
    kind, sep, amount = s.partition("=")
    if kind.strip() == OUT_SCALE and sep:
        try:
            scale = float(amount)
        except ValueError:
            raise ValueError(
                f"out-scale needs a relative amount, e.g. out-scale=0.01; got {amount!r}"
            ) from None
        if not math.isfinite(scale) or scale == 0 or abs(scale) > 100:
            raise ValueError(f"out-scale must be a non-zero amount within +-100, got {amount!r}")
        return Injection(OUT_SCALE, scale, onset)
    if kind.strip() == LSE_SHIFT and sep:
        try:
            nats = float(amount)
        except ValueError:
            raise ValueError(
                f"lse-shift needs a number of nats, e.g. lse-shift=0.1; got {amount!r}"
            ) from None
        if not math.isfinite(nats) or nats == 0 or abs(nats) > 100:
            raise ValueError(f"lse-shift must be a non-zero number of nats within +-100, got {amount!r}")
        return Injection(LSE_SHIFT, nats, onset)
    raise ValueError(
        f"expected lse-layout, lse-shift=X (X in nats) or out-scale=E, each optionally @STEP, got {text!r}"
    )


def try_parse(text: str | None) -> Injection | None:
    """``parse`` that returns None for anything invalid (the probe must never raise inside vLLM)."""
    try:
        return parse(text)
    except ValueError:
        return None


def parse_ladder(text: str) -> list[float]:
    """Parse ``--calibrate``: ``default`` or comma-separated positive nats, e.g. ``0.01,0.1,1``."""
    s = text.strip().lower()
    if s in ("default", "yes", "on", "true"):
        return list(DEFAULT_LADDER)
    out: list[float] = []
    for part in s.split(","):
        part = part.strip()
        if not part:  # "0.1,,1": a value the user meant to type, not one to skip
            raise ValueError(f"--calibrate: empty item in {text!r}")
        try:
            x = float(part)
        except ValueError:
            raise ValueError(f"--calibrate: {part!r} is not a number of nats") from None
        if not math.isfinite(x) or x <= 0 or x > 100:
            raise ValueError(f"--calibrate: shifts must be in (0, 100] nats, got {part}")
        out.append(x)
    if not out:
        raise ValueError("--calibrate: give at least one shift, or `default`")
    if len(set(out)) != len(out):
        raise ValueError(f"--calibrate: duplicate shifts in {text!r}")
    return sorted(out)
