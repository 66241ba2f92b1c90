"""Read a run's samples files once and score each sample as it goes by: repetition, instruction
following, the error against the reference. Owns ``CellSamples`` (one finished cell's scored samples),
``RunSamples`` (what one read of a run gave) and the readers ``load_prompts`` / ``load_cell_samples``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cascade_repro.judge.ifeval.score import score_response
from cascade_repro.judge.metrics.reference import ArmError, arm_error
from cascade_repro.judge.metrics.repetition import repetition_metrics
from cascade_repro.judge.statistics import MEASURED
from cascade_repro.rundir import layout, sample_scan


@dataclass
class CellSamples:
    """The scored samples of one finished cell, keyed by prompt index."""

    tokens: dict[int, list[int]] = field(default_factory=dict)
    logprobs: dict[int, list[float]] = field(default_factory=dict)
    topk: dict[int, list] = field(default_factory=dict)
    keys: dict[int, str] = field(default_factory=dict)
    # The completion's text as recorded, for the report's examples.
    texts: dict[int, Any] = field(default_factory=dict)
    rep: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Instruction following per prompt index: (strict, loose); only prompts that could be scored.
    ifs: dict[int, tuple[bool, bool]] = field(default_factory=dict)
    # The error against the reference per prompt index (only prompts the reference scored).
    ref: dict[int, ArmError] = field(default_factory=dict)
    # Each further reference statistic's per-sample error (``statistics.MEASURED``), by name then prompt.
    ref_measures: dict[str, dict[int, float]] = field(default_factory=dict)


@dataclass
class RunSamples:
    """What scoring read of a run's samples files, each read once (one
    :class:`~cascade_repro.rundir.sample_scan.SampleScan` per engine key): the scored samples of every
    finished cell by cell id, and each file's progress by engine key."""

    cells: dict[str, CellSamples]
    progress: dict[str, sample_scan.CellProgress]

    def records(self, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], dict[str, Any]]:
        """The wanted (cell_id, prompt_index) samples in their record's form (the fields the report's
        examples read), from what was scored: the report need not read the samples files again."""
        out = {}
        for cid, i in wanted:
            cs = self.cells.get(cid)
            if cs is None or i not in cs.tokens:
                continue
            topk = cs.topk[i]
            out[(cid, i)] = {
                "cell_id": cid,
                "prompt_index": i,
                "prompt_key": cs.keys[i],
                "token_ids": cs.tokens[i],
                "logprobs": cs.logprobs[i],
                "topk": topk.tolist() if isinstance(topk, np.ndarray) else topk,
                "text": cs.texts[i],
            }
        return out


def compact_topk(topk: list) -> Any:
    """Top-k as one float64 array [steps, k, 2]; ragged or odd lists are kept as they are.

    The same numbers (ids are exact in float64), ~80 bytes a step instead of ~700 as lists of
    [id, logprob] lists: top-k is most of what scoring holds for a 10,000-prompt run.
    """
    try:
        arr = np.asarray(topk, dtype=np.float64)
    except (TypeError, ValueError):
        return topk
    return arr if arr.ndim == 3 and arr.shape[2] == 2 else topk


def load_prompts(run_dir: Path) -> list[Any]:
    """Return the run's prompt records (prompts.jsonl, index i = prompt_index i), or [] when absent or unreadable."""
    from cascade_repro.errors import UsageError
    from cascade_repro.prompts.promptsets import iter_prompt_records

    path = layout.prompts_path(run_dir)
    if not path.is_file():
        return []
    try:
        # A kwarg of the wrong type leaves its prompt unscored (score_response), not the whole run.
        return list(iter_prompt_records(path, check_kwarg_types=False))
    except UsageError:
        return []


def load_cell_samples(
    run_dir: Path,
    engine_keys: Iterable[str],
    wanted: set[str],
    prompts: list[Any] | None = None,
    reference: dict[str, Any] | None = None,
    warn: Callable[[str], None] | None = None,
) -> RunSamples:
    """Read every samples file once, scoring repetition (and, given prompts, instruction following;
    given the reference's rows by fingerprint, the error against it) as records go by.

    A cell's samples are those of the attempt that finished it; which attempt that is is known only
    at the end of its file, so each attempt is scored apart until then (a cut attempt is a fraction of
    a cell). A damaged sample record, or one whose prompt_key is not its prompt's in prompts.jsonl (a
    sample of another run), is not scored: ``warn`` is told its file and line
    (:meth:`~cascade_repro.rundir.sample_scan.SampleScan.warnings`)."""
    out: dict[str, CellSamples] = {}
    progress: dict[str, sample_scan.CellProgress] = {}
    prompts = prompts or []
    reference = reference or {}
    keys = sample_scan.prompt_ids(run_dir)
    for key in engine_keys:
        scan = sample_scan.SampleScan(layout.samples_path(run_dir, key), keys, cells=wanted)
        attempts: dict[tuple[str, int], CellSamples] = {}
        for start, rec in scan:
            _add_sample(attempts.setdefault((rec["cell_id"], start), CellSamples()), rec, prompts, reference)
        out.update({cid: cs for (cid, start), cs in attempts.items() if scan.finished(start, cid)})
        progress[key] = scan.progress
        for line in scan.warnings() if warn is not None else []:
            warn(line)
    return RunSamples(out, progress)


def _add_sample(cs: CellSamples, rec: dict[str, Any], prompts: list[Any], reference: dict[str, Any]) -> None:
    """Score one sample record into its cell's samples (a later record of a prompt replaces an earlier one)."""
    from cascade_repro.rundir.reference import fingerprint

    i = rec["prompt_index"]
    cs.tokens[i] = rec["token_ids"]
    cs.logprobs[i] = rec.get("logprobs") or []
    cs.topk[i] = compact_topk(rec.get("topk") or [])
    cs.keys[i] = rec.get("prompt_key", str(i))
    cs.texts[i] = rec.get("text")
    cs.rep[i] = repetition_metrics(rec["token_ids"], rec.get("text", ""), rec.get("finish_reason", ""))
    cs.ifs.pop(i, None)
    cs.ref.pop(i, None)
    for by_prompt in cs.ref_measures.values():
        by_prompt.pop(i, None)
    ph = rec.get("prompt_hash")
    if reference and isinstance(ph, str) and isinstance(rec["token_ids"], list):
        row = reference.get(fingerprint(ph, rec["token_ids"]))
        if row is not None:
            cs.ref[i] = arm_error(cs.logprobs[i], row.lp, row.argmax_lp)
            for stat in MEASURED:
                assert stat.measure is not None
                cs.ref_measures.setdefault(stat.name, {})[i] = stat.measure(cs.logprobs[i], cs.topk[i], row)
    if isinstance(i, int) and 0 <= i < len(prompts) and prompts[i].key == cs.keys[i]:
        sc = score_response(prompts[i], rec.get("text") or "")
        if sc["strict"] is not None:
            cs.ifs[i] = (sc["strict"], sc["loose"])
