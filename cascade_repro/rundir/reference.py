"""The reference pass's files, ``reference/<engine key>.jsonl``: their records and their reader.

The pass (``run/reference.py``) writes them; the judge reads them. A record is keyed by the sample's
content, :func:`fingerprint` of the prompt's hash and the generated token ids, so a sequence two cells
share is scored once and a cut pass resumes where it stopped. Records:

- ``reference_start``: ``{"type","precision","device","model","torch","transformers","started_at"}``
- ``reference``: ``{"type","fp","n","lp":[float],"top_ids":[[int]],"top_lp":[[float]]}``: ``lp[i]``
  the reference logprob of generated token ``i``, ``top_ids[i]``/``top_lp[i]`` the reference's top-k
  at that step (its argmax first).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cascade_repro.rundir import jsonl, layout

START, RECORD = "reference_start", "reference"


def fingerprint(prompt_hash: str, token_ids: list[int]) -> str:
    """A sample's content key: the rendered prompt's hash and the tokens the arm generated."""
    blob = f"{prompt_hash}|{','.join(map(str, token_ids))}"
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


@dataclass
class RefRow:
    """The reference's view of one generated sequence."""

    lp: list[float]  # logprob of each generated token under the reference
    top_ids: list[list[int]]  # the reference's top-k per step, argmax first
    top_lp: list[list[float]]

    @property
    def argmax_lp(self) -> list[float]:
        return [row[0] if row else math.nan for row in self.top_lp]


def _valid(rec: dict[str, Any]) -> RefRow | None:
    """A reference record as read from a file that may have travelled: None unless well formed."""
    lp, ids, tl, n = rec.get("lp"), rec.get("top_ids"), rec.get("top_lp"), rec.get("n")
    if not (isinstance(lp, list) and isinstance(ids, list) and isinstance(tl, list) and isinstance(n, int)):
        return None
    if not (len(lp) == len(ids) == len(tl) == n):
        return None
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in lp):
        return None
    for i_row, l_row in zip(ids, tl, strict=True):
        if not (isinstance(i_row, list) and isinstance(l_row, list) and len(i_row) == len(l_row)):
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in i_row):
            return None
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in l_row):
            return None
    return RefRow([float(v) for v in lp], ids, [[float(v) for v in r] for r in tl])


def read_reference(run_dir: Path) -> tuple[dict[str, RefRow], dict[str, Any]]:
    """Every stored reference record of a run, by fingerprint, and the last pass's start record.

    Malformed records are skipped (they are recomputed by the next pass); a torn last line is
    ignored, as in every JSONL file of a run.
    """
    rows: dict[str, RefRow] = {}
    start: dict[str, Any] = {}
    for path in layout.reference_files(run_dir):
        if path.is_symlink():  # a run directory travels: never read through a link out of it
            continue
        for rec in jsonl.iter_records(path):
            if not isinstance(rec, dict):
                continue
            if rec.get("type") == START:
                start = rec
            elif rec.get("type") == RECORD and isinstance(rec.get("fp"), str):
                row = _valid(rec)
                if row is not None:
                    rows[rec["fp"]] = row
    return rows, start


def count_records(run_dir: Path) -> int:
    """How many reference records a run's files hold (a line count: no record is parsed)."""
    n = 0
    for path in layout.reference_files(run_dir):
        if not path.is_symlink():
            with open(path, "rb") as f:
                n += sum(1 for line in f if line.startswith(b'{"type":"reference"'))
    return n
