"""Do two run directories of the same matrix hold the same outputs? (engines side by side vs one after
another). Per cell: how many prompts generated the same token ids, and the first differing position of
the rest. Reads only the samples files; prints JSON.

    python3 same_samples.py RUN_A RUN_B > same.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def completions(run: Path) -> dict[tuple[str, int], list[int]]:
    """(cell, prompt index) -> token ids of the cell's last sample of that prompt."""
    out: dict[tuple[str, int], list[int]] = {}
    for f in sorted((run / "samples").glob("*.jsonl")):
        if f.is_symlink():
            continue
        with f.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("type") == "sample":
                    out[(str(rec.get("cell_id")), int(rec.get("prompt_index", -1)))] = list(rec.get("token_ids") or [])
    return out


def first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare(a: dict[tuple[str, int], list[int]], b: dict[tuple[str, int], list[int]]) -> dict:
    cells: dict[str, dict] = {}
    for key in sorted(set(a) & set(b)):
        c = cells.setdefault(key[0], {"prompts": 0, "identical": 0, "first_difference": []})
        c["prompts"] += 1
        if a[key] == b[key]:
            c["identical"] += 1
        else:
            c["first_difference"].append(first_difference(a[key], b[key]))
    total = sum(c["prompts"] for c in cells.values())
    same = sum(c["identical"] for c in cells.values())
    return {
        "prompts": total,
        "identical": same,
        "only_in_a": len(set(a) - set(b)),
        "only_in_b": len(set(b) - set(a)),
        "cells": cells,
    }


if __name__ == "__main__":
    ra, rb = Path(sys.argv[1]), Path(sys.argv[2])
    print(json.dumps({"a": ra.name, "b": rb.name, **compare(completions(ra), completions(rb))}, indent=1))
