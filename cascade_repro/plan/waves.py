"""How a run's prompts become waves, and which batch sizes a prompt count makes repeat a wave.

A wave is exactly ``batch`` requests; a batch at or above the prompt count runs every prompt in one
wave, topped up with repeats. The planner (``matrix.plan``) drops the batches that would repeat
another's one wave and keeps its added noise control off its pair's wave; the worker and
``minimize`` cut prompts into waves with ``waves``. Standard library only.
"""

from __future__ import annotations

from collections.abc import Collection


def control_batch(batch: int) -> int:
    """The batch size of a flat noise control the planner adds: a factor 8 away (B/8, or 8B below 8).

    Another batch shape is a different-but-equivalent computation (other split-KV and tile
    choices), which is what a control must be; a rerun inside one engine is not: it is bitwise
    identical (the prefix cache is reset per wave), so it would measure no noise at all. Similar
    shapes make quiet controls, so the planner's control is far from the batch it serves.
    """
    return batch // 8 if batch >= 8 else batch * 8


def repeated_batches(batches: Collection[int], n_prompts: int | None) -> list[int]:
    """The batch sizes whose cells would repeat another's wave: every batch at or above the number of
    prompts runs them all in one wave, so of those only the smallest is kept (the rest only add
    fillers, copies of the same prompts, to the one wave). [] where the prompt count is unknown."""
    if not n_prompts or n_prompts <= 0:
        return []
    full = sorted({b for b in batches if b >= n_prompts})
    return full[1:]


def noise_control_batch(batch: int, n_prompts: int | None) -> int | None:
    """The batch of the flat control the planner adds for ``batch``: ``control_batch``, unless that
    and ``batch`` both hold every prompt in one wave (a control of the same wave as its pair measures
    nothing); then a batch a factor 8 under the prompt count, which splits them into waves. None
    where no batch can differ (a single prompt)."""
    c = control_batch(batch)
    if not n_prompts or n_prompts <= 0 or c < n_prompts or batch < n_prompts:
        return c
    alt = max(1, n_prompts // 8)
    return alt if alt < n_prompts else None


def waves(n_prompts: int, batch: int) -> list[list[tuple[int, bool]]]:
    """Split prompt indices into waves of exactly ``batch`` requests.

    Each entry is ``(prompt_index, real)``. The last wave is topped up with filler requests taken
    cyclically from the start, so every wave runs at the batch size it is labelled with; fillers are
    generated but not recorded.
    """
    if n_prompts <= 0 or batch <= 0:
        return []
    out = []
    for start in range(0, n_prompts, batch):
        wave = [(i, True) for i in range(start, min(start + batch, n_prompts))]
        j = 0
        while len(wave) < batch:
            wave.append((j % n_prompts, False))
            j += 1
        out.append(wave)
    return out
