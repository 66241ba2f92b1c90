"""Split one matrix across machines by engine key: ``cascade-repro matrix --shard i/n``.

The unit of a shard is the engine key: one worker process, one engine start, all its cells. An
engine key is never split, so a shard never starts an engine another shard also starts.

Assignment (deterministic, a pure function of the plan and ``n``): engine keys are taken heaviest
first (most cells; ties by key name, ascending) and each goes to the shard with the fewest cells so
far (ties: the lowest shard index). This is the classic longest-processing-time rule: with equal
keys it is round-robin over the sorted keys, and with unequal keys (``--arm-switch restart
--rerun`` gives the flat engine twice the cells of the cascade one) it keeps the cell counts of the
shards within one key's worth of each other. Every shard of a matrix computes the same assignment
from the same plan, so no coordination is needed. More shards than engine keys leaves some empty:
allowed (a CI matrix of fixed width over a smaller run), with a warning.

The shard is not part of the matrix: it lives in ``RunOptions``, not ``MatrixSpec``, so every shard
of a matrix has the same ``spec_hash`` and the same plan, and ``cascade-repro merge`` checks exactly
that. Each shard's run directory holds the full plan in ``run.json`` plus ``"shard": "i/n"``, and
samples only for its own engine keys. Scoring a shard alone (its own reports) covers only its own
cells, so pairs whose two cells ran in different shards appear only in the merged report.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cascade_repro.errors import UsageError
from cascade_repro.rundir.manifest import Manifest


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.index <= self.count:
            raise UsageError(f"--shard {self.index}/{self.count}: i must be between 1 and n")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @classmethod
    def parse(cls, text: str) -> Shard:
        """Parse ``"i/n"``; a one-line UsageError otherwise."""
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
        if not m:
            raise UsageError(f"--shard: expected i/n (e.g. 1/2), got {text!r}")
        index, count = int(m.group(1)), int(m.group(2))
        if count < 1:
            raise UsageError(f"--shard {text}: n must be at least 1")
        return cls(index, count)


def _n_cells(plan: Any) -> int:
    cells = plan["cells"] if isinstance(plan, Mapping) else plan.cells
    return len(cells)


def owners(engines: Mapping[str, Any], count: int) -> dict[str, int]:
    """Each engine key's shard index (1-based) among ``count`` shards.

    Only the first ``min(count, number of keys)`` shards can get a key (a key goes to the shard with
    the fewest cells, the lowest index on a tie, and every later shard is as empty as the first
    empty one): the work is that of the keys, not of ``count``, so ``--shard 1/99999999`` costs what
    ``--shard 1/4`` does on four keys. ``engines`` maps engine key to an ``EnginePlan`` or its
    run.json form (a dict with ``cells``).
    """
    if count < 1:
        raise UsageError("--shard: n must be at least 1")
    weights = {k: _n_cells(ep) for k, ep in engines.items()}
    loads = [0] * min(count, max(len(weights), 1))
    owner: dict[str, int] = {}
    for key in sorted(weights, key=lambda k: (-weights[k], k)):
        j = min(range(len(loads)), key=lambda s: (loads[s], s))
        owner[key] = j + 1
        loads[j] += weights[key]
    return owner


def assign(engines: Mapping[str, Any], count: int) -> list[list[str]]:
    """Return the engine keys of each shard (index 0 is shard 1), each list in plan order: one list
    per shard, so for a ``count`` the caller means to walk (``keys_for`` and ``owners`` do not)."""
    owner = owners(engines, count)
    return [[k for k in engines if owner[k] == j] for j in range(1, count + 1)]


def keys_for(engines: Mapping[str, Any], shard: Shard) -> list[str]:
    """Return the engine keys that ``shard`` runs, in plan order (possibly none)."""
    owner = owners(engines, shard.count)
    return [k for k in engines if owner[k] == shard.index]


def empty_warning(engines: Mapping[str, Any], shard: Shard) -> str | None:
    """Return a warning when ``shard`` gets no engine key (more shards than keys), else None."""
    if keys_for(engines, shard):
        return None
    n = len(engines)
    return (
        f"shard {shard} has nothing to run: the matrix has {n} engine key{'s' if n != 1 else ''} "
        f"for {shard.count} shards (a shard is a whole engine key)"
    )


def restrict(m: Manifest) -> Manifest:
    """Return ``m`` with its plan cut down to its shard's engine keys; ``m`` itself if unsharded.

    Used to execute and score one shard; run.json on disk keeps the full plan.
    """
    if not m.shard:
        return m
    keep = set(keys_for(m.plan.engines, Shard.parse(m.shard)))
    out = copy.copy(m)  # shallow, as before: the cut plan is new, the other sections are shared
    out.plan = dataclasses.replace(
        m.plan,
        engines={k: v for k, v in m.plan.engines.items() if k in keep},
        cells=[c for c in m.plan.cells if c.engine_key in keep],
    )
    return out
