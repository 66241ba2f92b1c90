"""How far do two engine starts of the same settings differ on their own? Inside one run directory:
every pair of cells at the same batch whose engines were started with the same effective settings
(run.json's ``engines.*.effective``, less the names of arms, twins and probe folders, and what
each read back from vLLM, ``twin_readback``: an engine without one, a cascade twin's, is left out)
and where cascade never fired. Per pair: how
many prompts generated the same token ids. The baseline for ``same_samples.py`` (side by side vs one
engine at a time). Reads the samples files, run.json and cells.parquet (pandas); prints JSON.

    python3 two_starts.py RUN > two-starts.json
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pandas as pd
from same_samples import completions

# Names, and the cascade switch a cascade twin's engine carries for its per-wave toggle.
IGNORED = {"arm_switch", "engine_arm", "probe_dir", "probe_patched", "twin", "twin_readback", "disable_cascade_attn"}


def same_settings(a: dict, b: dict) -> bool:
    if {k: v for k, v in a.items() if k not in IGNORED} != {k: v for k, v in b.items() if k not in IGNORED}:
        return False
    return a.get("twin_readback") is not None and a.get("twin_readback") == b.get("twin_readback")


def main(run: Path) -> dict:
    engines = json.loads((run / "run.json").read_text())["engines"]
    cells = pd.read_parquet(run / "cells.parquet")
    cells = cells[cells.cascade_steps == 0]
    done = completions(run)
    pairs = []
    for a, b in itertools.combinations(sorted(cells.itertuples(), key=lambda c: c.cell_id), 2):
        if a.batch != b.batch or a.engine_key == b.engine_key or not same_settings(
            engines[a.engine_key]["effective"], engines[b.engine_key]["effective"]
        ):
            continue
        n = sorted(i for (cell, i) in done if cell == a.cell_id)
        same = sum(done[(a.cell_id, i)] == done.get((b.cell_id, i)) for i in n)
        pairs.append({"a": a.cell_id, "b": b.cell_id, "batch": int(a.batch), "prompts": len(n), "identical": same})
    return {
        "run": run.name,
        "pairs": pairs,
        "prompts": sum(p["prompts"] for p in pairs),
        "identical": sum(p["identical"] for p in pairs),
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1])), indent=1))
