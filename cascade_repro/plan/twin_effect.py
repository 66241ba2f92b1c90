"""Will a twin's setting take effect in a cell? Predicted before any GPU time, where it is knowable.

Each registry entry predicts for itself (``TwinAxis.predict_effect`` in ``twin/axis.py``: a shared prefix
of a block for prefix caching, prompts longer than the step budget for chunked prefill, a batch
within the captured sizes for CUDA graphs, enough GPUs for TP); an entry without a prediction is
known once the engine starts and reads it back. Its proof after the run is ``judge/effect.py``'s
count.

Standard library only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from cascade_repro import twin as twins

DEFAULT_MAX_CAPTURE = twins.DEFAULT_MAX_CAPTURE


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
        yes, why = twin.predict_effect(
            twins.CellFacts(c.batch, shared_prefix, prompt_lens, block_size, gpus, captured)
        )
        out.append(TwinPrediction(c.cell_id, c.arm, c.batch, yes, why))
    return out
