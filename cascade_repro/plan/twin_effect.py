"""Will a twin's setting take effect in a cell? Predicted before any GPU time, where it is knowable.

What each twin's effect depends on (its proof after the run is ``judge/effect.py``'s count):

- prefix-caching: a shared prefix of at least one KV block (the warm-up request caches it; a
  prefix shorter than a block leaves nothing to hit);
- chunked-prefill: a wave's prompt tokens above the step budget (``twin.CHUNK_TOKENS``), so a
  prompt is cut;
- cuda-graphs: a batch no larger than vLLM's largest captured size (512 by default;
  ``--graphs-for-batches`` captures the matrix's own sizes);
- tp: as many GPUs as the test arm's TP size (``--twin tp=1:2`` on one GPU is refused);
- async-scheduling, kv-cache-dtype, attention-backend and batch: always, if the engine accepts the
  setting (the start reads it back; a backend the GPU lacks fails the start).

Standard library only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from cascade_repro import twin as twins

# vLLM's default largest CUDA-graph capture size (CompilationConfig, 0.10.2 to 0.26.0).
DEFAULT_MAX_CAPTURE = 512


@dataclass(frozen=True)
class TwinPrediction:
    """One cell's prediction: ``yes``, ``no`` or ``?`` (known only once the engine starts), and why."""

    cell_id: str
    arm: str
    batch: int
    takes_effect: str
    why: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def predict_effects(
    twin: twins.TwinAxis,
    cells: list[Any],
    *,
    shared_prefix: int | None,
    prompt_lens: list[int] | None,
    block_size: int,
    gpus: int | None,
    captured: list[int] | None = None,
) -> list[TwinPrediction]:
    """The test arm's cells of a plan (``Cell``), each with whether ``twin``'s setting takes effect."""
    out = []
    for c in cells:
        if c.arm != twin.test or c.origin != "matrix":
            continue
        yes, why = _one(twin, c, shared_prefix, prompt_lens, block_size, gpus, captured)
        out.append(TwinPrediction(c.cell_id, c.arm, c.batch, yes, why))
    return out


def _one(tw, c, prefix, lens, block, gpus, captured) -> tuple[str, str]:  # noqa: ANN001 - see predict_effects
    fam = tw.family
    if fam == "prefix-caching":
        if prefix is None:
            return "?", "shared prefix not measured"
        if prefix >= block:
            return (
                "yes",
                f"shared prefix {prefix} tokens >= one {block}-token block: {prefix // block * block} cached",
            )
        return "no", f"shared prefix {prefix} tokens < one {block}-token block: nothing to hit"
    if fam == "chunked-prefill":
        if not lens:
            return "?", "prompt lengths not measured"
        wave = sum(sorted(lens, reverse=True)[: c.batch])
        if wave > twins.CHUNK_TOKENS:
            return (
                "yes",
                f"a wave's prompts hold up to {wave} tokens > the {twins.CHUNK_TOKENS}-token step budget",
            )
        return "no", f"a wave's prompts hold {wave} tokens <= the {twins.CHUNK_TOKENS}-token step budget"
    if fam == "cuda-graphs":
        top = max(captured) if captured else DEFAULT_MAX_CAPTURE
        if c.batch <= top:
            return "yes", f"batch {c.batch} <= the largest captured size {top}"
        return "no", f"batch {c.batch} > the largest captured size {top}: decode runs eager"
    if fam == "tp":
        if gpus is None:
            return "?", f"needs {tw.gpus} GPUs; none counted here"
        if gpus >= tw.gpus:
            return "yes", f"{gpus} GPUs visible for TP {tw.test_value}"
        return "no", f"TP {tw.test_value} needs {tw.gpus} GPUs, {gpus} visible (matrix refuses it)"
    if fam == "batch":
        return "yes", f"every wave runs {c.batch} requests at once"
    return "?", f"read back from the engine once it starts ({tw.effect_doc})"
