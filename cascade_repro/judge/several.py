"""A run of several twins (``--twin a,b``) judged twin by twin, as one run of each would be.

Each twin's view of the run (``Manifest.for_twin``: its cells, each under the arm that twin reads
it as) is scored by ``compare.score_samples`` over samples read once for all of them; its pair ids
begin with the twin's name and a slash (``prefix-caching/tp1-b8-prefix-on~prefix-off``), so the
pairs and comparisons tables hold every twin's rows apart and a report groups them by twin
(``twin.pair_prefix``). A cell two twins share is one row of the cells table, under the arm of the
twin that planned it. A run of one twin is scored exactly as before, with no prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from cascade_repro.judge.compare import RunSamples, load_cell_samples, load_prompts, score_samples
from cascade_repro.judge.verdicts import Thresholds
from cascade_repro.rundir.manifest import Manifest
from cascade_repro.twin import pair_prefix


def score_run(
    m: Manifest, run_dir: Path, thresholds: Thresholds, warn: Callable[[str], None] | None = None
) -> tuple[RunSamples, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Score a run, of one twin or several: (what was read, cells, pairs, comparisons)."""
    if not m.several:
        return score_samples(m, run_dir, thresholds, warn)
    from cascade_repro.rundir.reference import read_reference

    ref_rows, _ = read_reference(run_dir)
    wanted = {c.cell_id for c in m.plan.cells}
    read = load_cell_samples(run_dir, m.plan.engines, wanted, load_prompts(run_dir), ref_rows, warn)
    cells, pairs, comps = [], [], []
    for tw in m.twins:
        if not (view := m.for_twin(tw)).plan.cells:
            continue  # a shard without this twin's cells
        _, c, p, x = score_samples(view, run_dir, thresholds, warn, pair_prefix=pair_prefix(tw), read=read)
        cells.append(c)
        pairs.append(p)
        comps.append(x)
    # A shared cell is scored in each twin's view; its row is the planning twin's (the first).
    cells_df = pd.concat(cells, ignore_index=True).drop_duplicates("cell_id", keep="first")
    order = {c.cell_id: i for i, c in enumerate(m.plan.cells)}
    cells_df = cells_df.sort_values("cell_id", key=lambda s: s.map(order)).reset_index(drop=True)
    return read, cells_df, _concat(pairs), _concat(comps)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    kept = [f for f in frames if len(f)]
    if not kept:
        return frames[0]
    return pd.concat(kept, ignore_index=True)
