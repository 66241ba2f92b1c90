"""The reference pass's files, ``reference/<engine key>.jsonl``: their records and their reader.

The pass (``run/reference.py``) writes them; the judge reads them. A record is keyed by the sample's
content, :func:`fingerprint` of the prompt's hash and the generated token ids, so a sequence two cells
share is scored once and a cut pass resumes where it stopped. Records:

- ``reference_start``: ``{"type","precision","device","model","torch","transformers","started_at"}``
- ``reference``: ``{"type","fp","n","lp":[float],"top_ids":[[int]],"top_lp":[[float]][,"arm_ids":[[int]],
  "arm_lp":[[float]]]}``: ``lp[i]`` the reference logprob of generated token ``i``, ``top_ids[i]``/``top_lp[i]``
  the reference's top-k at that step (its argmax first), ``arm_ids[i]``/``arm_lp[i]`` the reference's
  exact logprob (from its full log-softmax) of every token id that any arm returning this sequence
  listed in its own top-k at step ``i``: the union over the samples that share the fingerprint, so a
  sequence two arms share is still read once. Records written before ``arm_ids`` existed lack both
  fields: they judge with the chosen-token rule alone, and a pass that needs the ids recomputes them.
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
    # The reference's logprob of each id the arms listed in their top-k, per step (None: an older
    # record, which scored the chosen tokens only).
    arm_ids: list[list[int]] | None = None
    arm_lp: list[list[float]] | None = None

    @property
    def argmax_lp(self) -> list[float]:
        return [row[0] if row else math.nan for row in self.top_lp]

    def covers(self, wanted: list[set[int]]) -> bool:
        """Whether this record holds the reference's logprob of every id in ``wanted[i]`` at each step."""
        if self.arm_ids is None or len(wanted) > len(self.arm_ids):
            return False
        return all(ids <= set(have) for ids, have in zip(wanted, self.arm_ids, strict=False))

    def arm_logprobs(self) -> list[dict[int, float]]:
        """Per step, the reference's logprob by token id: the arms' ids, then its own top-k (both exact)."""
        out = []
        for i in range(len(self.lp)):
            row = dict(zip(self.top_ids[i], self.top_lp[i], strict=True))
            if self.arm_ids is not None and self.arm_lp is not None:
                row.update(zip(self.arm_ids[i], self.arm_lp[i], strict=True))
            out.append(row)
        return out


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _id_rows(ids: object, lps: object, n: int) -> bool:
    """``ids``/``lps``: n steps, each a list of token ids beside a list of as many logprobs."""
    if not (isinstance(ids, list) and isinstance(lps, list) and len(ids) == len(lps) == n):
        return False
    for i_row, l_row in zip(ids, lps, strict=True):
        if not (isinstance(i_row, list) and isinstance(l_row, list) and len(i_row) == len(l_row)):
            return False
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in i_row):
            return False
        if not all(_number(v) for v in l_row):
            return False
    return True


def _valid(rec: dict[str, Any]) -> RefRow | None:
    """A reference record as read from a file that may have travelled: None unless well formed
    (``arm_ids``/``arm_lp`` may be absent, an older record's, but not one without the other)."""
    lp, ids, tl, n = rec.get("lp"), rec.get("top_ids"), rec.get("top_lp"), rec.get("n")
    if not (isinstance(lp, list) and isinstance(n, int) and len(lp) == n and all(_number(v) for v in lp)):
        return None
    if not _id_rows(ids, tl, n):
        return None
    arm_ids, arm_lp = rec.get("arm_ids"), rec.get("arm_lp")
    if (arm_ids is None) != (arm_lp is None) or (arm_ids is not None and not _id_rows(arm_ids, arm_lp, n)):
        return None
    return RefRow(
        [float(v) for v in lp],
        ids,
        [[float(v) for v in r] for r in tl],
        arm_ids,
        None if arm_lp is None else [[float(v) for v in r] for r in arm_lp],
    )


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
