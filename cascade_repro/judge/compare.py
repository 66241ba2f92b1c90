"""Score samples and pair cells: cascade vs flat twin, and flat-vs-flat noise controls.

Produces the three tables every report is rendered from (columns in docs/architecture.md).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cascade_repro.judge import reference_verdict as refv
from cascade_repro.judge import speed
from cascade_repro.judge.effect import cell_effect
from cascade_repro.judge.ifeval.score import paired_if, score_response
from cascade_repro.judge.metrics.divergence import divergence_metrics
from cascade_repro.judge.metrics.drift import drift_floor, drift_triple
from cascade_repro.judge.metrics.reference import ArmError, arm_error, by_step_mean
from cascade_repro.judge.metrics.repetition import repetition_metrics
from cascade_repro.judge.outcome import (
    CALIBRATION,
    FLOOR_KINDS,
    NOISE_BATCH,
    NOISE_RERUN,
    NOISE_RESTART,
    TWIN_KIND,
    TWIN_KINDS,
)
from cascade_repro.judge.result import Counts, PairResult
from cascade_repro.judge.statistics import MEASURED, Judged, Measured, fill
from cascade_repro.judge.tables import PAIR_COLUMNS
from cascade_repro.judge.verdicts import (
    REFERENCE,
    DriftStats,
    Evidence,
    EvidencePiece,
    Thresholds,
    bias_stats,
    decide,
    depth,
    drift_ratio_stats,
    paired_bootstrap_ci,
)
from cascade_repro.plan.matrix import spec_of
from cascade_repro.rundir import layout, sample_scan
from cascade_repro.rundir.cells import Cell
from cascade_repro.rundir.manifest import Manifest
from cascade_repro.twin import CASCADE as TWIN
from cascade_repro.twin import TwinAxis

REP_KEYS = [f"seq_rep_{n}" for n in range(1, 5)] + [f"distinct_{n}" for n in range(1, 5)]
TWIN_AXES = ("tp", "seed", "dtype", "fa_version", "backend")


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


def _mean_control_drift(triples: dict[int, dict[str, Any]]) -> float:
    vals = [t["drift_control"] for t in triples.values() if t["drift_positions"] > 0]
    vals = [v for v in vals if v == v]  # NaN when a side carried no logprobs
    return float(np.mean(vals)) if vals else -1.0


def _mean(values: list[float]) -> float:
    return float(statistics.fmean(values)) if values else float("nan")


def cell_rows(m: Manifest, read: RunSamples) -> pd.DataFrame:
    """One row per planned cell: status, probe counters, throughput and repetition means."""
    rows = []
    spec = spec_of(m.spec_json)
    model = m.model_name if m.has("model_name") else spec.model
    samples, progress = read.cells, read.progress
    for c in m.plan.cells:
        prog = progress[c.engine_key]
        cid = c.cell_id
        waves = prog.waves.get(cid, [])
        status = "done" if cid in prog.done else ("error" if cid in prog.errors else "pending")
        error = prog.errors.get(cid, "")
        if status != "done" and prog.corrupt.get(cid):
            # Never a silent "pending": say which record was lost and what to do.
            finish = sample_scan.finish_hint(m, [c.engine_key])
            status, error = (
                "error",
                sample_scan.corrupt_reason(c.engine_key, prog.corrupt[cid], prog.why, finish),
            )
        cs = samples.get(cid, CellSamples())
        reps = list(cs.rep.values())
        wall = sum(w.get("wall_s") or 0.0 for w in waves)
        tokens = sum(w.get("tokens") or 0 for w in waves)
        row = {
            "cell_id": cid,
            "engine_key": c.engine_key,
            "engine": spec.engine,
            "model": model,
            "tp": c.tp,
            "batch": c.batch,
            "arm": c.arm,
            "rerun": c.rerun,
            "seed": c.seed,
            "dtype": c.dtype,
            "fa_version": "default" if c.fa_version is None else str(c.fa_version),
            "backend": c.backend,
            "status": status,
            "error": error,
            "n_prompts": len(reps),
            "cascade_steps": sum(w.get("cascade_steps") or 0 for w in waves),
            "total_steps": sum(w.get("total_steps") or 0 for w in waves),
            "cascade_calls": sum(w.get("cascade_calls") or 0 for w in waves),
            # Waves of engines that do not tell prefill from decode steps leave this unknown (NaN).
            "cascade_decode_steps": sum(w["cascade_decode_steps"] for w in waves)
            if waves and all(w.get("cascade_decode_steps") is not None for w in waves)
            else float("nan"),
            "inject": c.inject or "",
            "origin": c.origin,
            "dtype_effective": str(prog.engine.get("effective", {}).get("dtype") or c.dtype).replace(
                "torch.", ""
            ),
            "wall_s": wall,
            "tokens": tokens,
            "tokens_per_s": tokens / wall if wall > 0 else float("nan"),
            "len_mean": _mean([r["length"] for r in reps]),
            **speed.cell_speed(waves),
        }
        for k in REP_KEYS:
            row[k] = _mean([r[k] for r in reps])
        row["zlib_ratio"] = _mean([r["zlib_ratio"] for r in reps])
        row["tail_loop_rate"] = _mean([float(r["tail_loop"]) for r in reps])
        row["longest_repeat_mean"] = _mean([r["longest_repeat"] for r in reps])
        row["finish_length_rate"] = _mean([float(r["finish_length"]) for r in reps])
        # Instruction-following accuracy (prompt level, IFEval strict / loose); informational only.
        row["if_n"] = len(cs.ifs)
        row["if_strict"] = _mean([float(s) for s, _ in cs.ifs.values()])
        row["if_loose"] = _mean([float(lo) for _, lo in cs.ifs.values()])
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass
class PairSpec:
    pair_id: str
    kind: str  # one of outcome.PAIR_KINDS
    test: Cell
    ref: Cell


def twin_key(c: Cell) -> tuple:
    return tuple(getattr(c, a) for a in TWIN_AXES)


def _ref_key(c: Cell, twin: TwinAxis) -> tuple:
    """What a test cell and its twin share: every axis but the one the twin's arms differ in."""
    axes = tuple(getattr(c, a) if a != twin.axis else None for a in TWIN_AXES)
    return (*axes, c.batch if twin.axis != "batch" else None)


def plan_pairs(cells: list[Cell] | list[dict[str, Any]], twin: TwinAxis = TWIN) -> list[PairSpec]:
    """Pair each test cell with its twin (cascade with flat); add reference-vs-reference noise controls.

    A twin that differs in a cell axis (``tp=1:2``, ``batch=1:N``, ``attention-backend=A:B``)
    pairs across it: the test cell at TP 2 with the TP 1 cell of the same batch, the batch-N cell
    with the batch-1 cell.

    Noise controls, per engine configuration: flat at batch B vs flat at the smallest batch, the
    smallest batch vs the next one (so every flat cell is the test side of one batch control), and
    a flat rerun vs its first run: ``noise-restart`` when the rerun had an engine start of its own,
    ``noise-rerun`` when it shared the engine. Calibration cells (cascade with an injected LSE
    shift) pair with the same twin as the clean cascade cell. Cells may come in their run.json form.
    """
    cells = [c if isinstance(c, Cell) else Cell.from_json(c) for c in cells]
    flat = {(twin_key(c), c.batch, c.rerun): c for c in cells if c.arm == twin.ref}
    refs = {_ref_key(c, twin): c for c in cells if c.arm == twin.ref and c.rerun == 0}
    pairs: list[PairSpec] = []
    for c in cells:
        if c.arm == twin.test and c.rerun == 0:
            ref = refs.get(_ref_key(c, twin))
            if ref:
                kind = CALIBRATION if c.origin == CALIBRATION else twin.pair_kind
                pairs.append(PairSpec(f"{c.cell_id}~{twin.ref}", kind, c, ref))
    by_twin: dict[tuple, list[Cell]] = {}
    for c in cells:
        if c.arm == twin.ref and c.rerun == 0:
            by_twin.setdefault(twin_key(c), []).append(c)
    for group in by_twin.values():
        group = sorted(group, key=lambda c: c.batch)
        base = group[0]
        for c in group[1:]:
            pairs.append(PairSpec(f"{c.cell_id}~b{base.batch}", NOISE_BATCH, c, base))
        if len(group) > 1:
            pairs.append(PairSpec(f"{base.cell_id}~b{group[1].batch}", NOISE_BATCH, base, group[1]))
    for (tk, b, r), c in flat.items():
        if r == 1 and (tk, b, 0) in flat:
            ref = flat[(tk, b, 0)]
            kind = NOISE_RESTART if c.engine_key != ref.engine_key else NOISE_RERUN
            pairs.append(PairSpec(f"{c.cell_id}~r0", kind, c, ref))
    return pairs


def control_candidates(pairs: list[PairSpec]) -> dict[str, list[tuple[PairSpec, str]]]:
    """For each cascade/calibration pair: the floor controls that contain its twin, with their other cell id.

    The control must contain the pair's twin, so the three cells (cascade, twin, the control's
    other side) give the same contexts on their agreeing positions. The scorer judges the pair
    against the candidate whose drift is largest (``compare_pair``), as the count floor takes the
    worst control: controls between similar batch shapes are quieter, and cascade is judged against
    the largest drift that an equivalent recomputation showed.
    """
    by_cell: dict[str, list[PairSpec]] = {}
    for ps in pairs:
        if ps.kind in FLOOR_KINDS:
            by_cell.setdefault(ps.test.cell_id, []).append(ps)
            by_cell.setdefault(ps.ref.cell_id, []).append(ps)
    out: dict[str, list[tuple[PairSpec, str]]] = {}
    for ps in pairs:
        if ps.kind not in (*TWIN_KINDS, CALIBRATION):
            continue
        twin = ps.ref.cell_id
        seen: dict[str, PairSpec] = {}
        for c in by_cell.get(twin, []):
            seen.setdefault(_other(c, twin).cell_id, c)  # one control per other cell
        if seen:
            out[ps.pair_id] = [(c, other) for other, c in seen.items()]
    return out


def _other(ps: PairSpec, cell_id: str) -> Cell:
    return ps.ref if ps.test.cell_id == cell_id else ps.test


DRIFT_KEYS = (
    "drift_positions", "drift_test", "drift_control", "bias_test", "bias_control", "topk_drift_test", "topk_drift_control",
)  # fmt: skip
_NO_DRIFT = dict.fromkeys(DRIFT_KEYS, float("nan"))


@dataclass
class PairScore:
    """One pair as scored, before its verdict: its pairs.parquet columns so far (``row``) and what
    the verdict's statistics are computed from, which no table keeps."""

    row: dict[str, Any]
    # Per-prompt seq-rep-4 deltas (test - ref), for the paired bootstrap.
    deltas: list[float]
    # The chosen control's other cell id (None: no candidate control had samples).
    control_other: str | None
    # The chosen control's triples with at least one agreeing position: what the drift and bias
    # statistics are computed from.
    agreeing: list[dict[str, Any]]
    # Both arms' errors against the reference, prompt by prompt (where it scored both).
    ref: list[tuple[ArmError, ArmError]]
    # Each further reference statistic's per-prompt errors, (test, twin), by statistic name.
    ref_measures: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


def compare_pair(
    ps: PairSpec, samples: dict[str, CellSamples], others: Iterable[str] = ()
) -> tuple[PairScore, list[dict[str, Any]]]:
    """Return the pair's score (its aggregate row without verdict) and its per-prompt rows.

    ``others``: cell ids of the candidate controls' other sides. Every prompt gets the drift of
    test and control against the twin (``metrics/drift.py``) on agreeing positions, for the
    candidate with the largest mean control drift; its id is ``PairScore.control_other``.
    """
    a = samples.get(ps.test.cell_id, CellSamples())
    b = samples.get(ps.ref.cell_id, CellSamples())
    common = sorted(set(a.tokens) & set(b.tokens))
    triples: dict[str, dict[int, dict[str, Any]]] = {}
    for other in others:
        c = samples.get(other)
        if c is None:
            continue
        triples[other] = {
            i: drift_triple(
                a.tokens[i],
                a.logprobs[i],
                a.topk[i],
                b.tokens[i],
                b.logprobs[i],
                b.topk[i],
                c.tokens[i],
                c.logprobs[i],
                c.topk[i],
            )  # fmt: skip
            for i in common
            if i in c.tokens
        }
    chosen = max(triples, key=lambda o: _mean_control_drift(triples[o]), default=None)
    drifts = triples.get(chosen, {}) if chosen else {}
    agreeing = [t for t in drifts.values() if t["drift_positions"] > 0]
    rows = []
    for i in common:
        d = divergence_metrics(a.tokens[i], a.logprobs[i], a.topk[i], b.tokens[i], b.logprobs[i], b.topk[i])
        drift = drifts.get(i, _NO_DRIFT)
        rows.append(
            {
                "pair_id": ps.pair_id,
                "prompt_index": i,
                "prompt_key": a.keys.get(i, str(i)),
                **d,
                "seq_rep_4_test": a.rep[i]["seq_rep_4"],
                "seq_rep_4_ref": b.rep[i]["seq_rep_4"],
                "len_test": a.rep[i]["length"],
                "len_ref": b.rep[i]["length"],
                **drift,
                "ref_err_test": a.ref[i].mean_abs if i in a.ref else float("nan"),
                "ref_err_ref": b.ref[i].mean_abs if i in b.ref else float("nan"),
                "ref_regret_test": a.ref[i].regret if i in a.ref else float("nan"),
                "ref_regret_ref": b.ref[i].regret if i in b.ref else float("nan"),
            }
        )
    diverged = [r for r in rows if not r["exact"]]
    deltas = [r["seq_rep_4_test"] - r["seq_rep_4_ref"] for r in rows]
    strict = paired_if({i: v[0] for i, v in a.ifs.items()}, {i: v[0] for i, v in b.ifs.items()})
    loose = paired_if({i: v[1] for i, v in a.ifs.items()}, {i: v[1] for i, v in b.ifs.items()})
    row = {
        "pair_id": ps.pair_id,
        "kind": ps.kind,
        "inject": ps.test.inject or "",
        "test_cell": ps.test.cell_id,
        "ref_cell": ps.ref.cell_id,
        "tp": ps.test.tp,
        "batch": ps.test.batch,
        "ref_batch": ps.ref.batch,
        "seed": ps.test.seed,
        "dtype": ps.test.dtype,
        "fa_version": "default" if ps.test.fa_version is None else str(ps.test.fa_version),
        "backend": ps.test.backend,
        "n": len(rows),
        "n_identical": len(rows) - len(diverged),
        "n_diverged": len(diverged),
        "first_div_median": float(statistics.median([r["first_div"] for r in diverged]))
        if diverged
        else float("nan"),
        "common_prefix_ratio_mean": _mean([r["common_prefix_ratio"] for r in rows]),
        "edit_distance_mean": _mean([r["edit_distance"] for r in rows]),
        "topk_violations": sum(1 for r in rows if r["topk_ok"] is False),
        "dlogprob_mean": _mean([r["dlogprob_mean"] for r in rows]),
        "dlogprob_max": max([r["dlogprob_max"] for r in rows], default=float("nan")),
        # Instruction following, test vs ref on the prompts both scored; McNemar exact on strict.
        "if_n": strict["if_n"],
        "if_strict_test": strict["if_test"],
        "if_strict_ref": strict["if_ref"],
        "if_strict_delta": strict["if_delta"],
        "if_loose_delta": loose["if_delta"],
        "if_gained": strict["if_gained"],
        "if_lost": strict["if_lost"],
        "p_if": strict["p"],
        "drift_tokens": int(sum(t["drift_positions"] for t in agreeing)),
    }
    both = [(a.ref[i], b.ref[i]) for i in common if i in a.ref and i in b.ref]
    measures = {
        stat.name: [
            (ta[i], tb[i])
            for i in common
            if i in (ta := a.ref_measures.get(stat.name, {}))
            and i in (tb := b.ref_measures.get(stat.name, {}))
        ]
        for stat in MEASURED
    }
    return PairScore(row, deltas, chosen, agreeing, both, measures), rows


def build_tables(
    m: Manifest,
    run_dir: Path,
    thresholds: Thresholds,
    warn: Callable[[str], None] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Score the run and return (cells, pairs, comparisons) DataFrames (:func:`score_samples`)."""
    _, cells, pairs, comparisons = score_samples(m, run_dir, thresholds, warn)
    return cells, pairs, comparisons


def score_samples(
    m: Manifest,
    run_dir: Path,
    thresholds: Thresholds,
    warn: Callable[[str], None] | None = None,
    *,
    pair_prefix: str = "",
    read: RunSamples | None = None,
) -> tuple[RunSamples, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Read each samples file once and score the run: (what was read, cells, pairs, comparisons);
    ``warn`` is told of each sample line skipped as damaged (file and line). One twin's view of a
    run of several (judge/several.py): its pair ids begin with ``pair_prefix``, and ``read`` is what
    was read for every twin."""
    cells = m.plan.cells
    twin = m.twin
    pair_specs = plan_pairs(cells, twin)
    for ps in pair_specs:
        ps.pair_id = pair_prefix + ps.pair_id
    candidates = control_candidates(pair_specs)
    wanted = {c.cell_id for c in cells}
    from cascade_repro.rundir.reference import read_reference

    ref_rows, ref_start = read_reference(run_dir)
    reference = str(ref_start.get("dtype") or "") if ref_rows else ""
    if read is None:
        read = load_cell_samples(run_dir, m.plan.engines, wanted, load_prompts(run_dir), ref_rows, warn)
    samples, progress = read.cells, read.progress
    cells_df = cell_rows(m, read)
    by_id = cells_df.set_index("cell_id").to_dict("index")
    preds = m.predictions if isinstance(m.predictions, dict) else {}
    predicted = preds.get("cells") if isinstance(preds.get("cells"), dict) else {}

    scores: list[PairScore] = []
    comp_rows = []
    matched: dict[str, PairSpec] = {}
    for ps in pair_specs:
        cands = candidates.get(ps.pair_id, [])
        score, rows = compare_pair(ps, samples, [other for _, other in cands])
        if (other := score.control_other) is not None:
            matched[ps.pair_id] = next(c for c, o in cands if o == other)
        scores.append(score)
        comp_rows.extend(rows)
    aggs = [score.row for score in scores]

    # The count floor of a cascade pair: the worst flat-vs-flat control of the same engine config,
    # whatever its batch size. A control measures how often a numerically equivalent recomputation
    # (another batch shape, another engine start) flips greedy tokens of this model on these
    # prompts; cascade is one more such recomputation, so its divergence count is judged against the
    # largest one measured: the control at the same batch alone made benign bf16 drift at small
    # batches look like a bug (docs/architecture.md, "Noise controls"). The drift ratio, which compares the same
    # contexts, uses the worst control that contains the twin instead (``control_candidates``).
    noise_div: dict[tuple, dict[str, Any]] = {}
    noise_topk: dict[tuple, int] = {}
    for agg, ps in zip(aggs, pair_specs, strict=True):
        if ps.kind not in FLOOR_KINDS or not agg["n"]:
            continue
        k = twin_key(ps.test)
        cur = noise_div.get(k)
        if cur is None or agg["n_diverged"] / agg["n"] > cur["n_diverged"] / cur["n"]:
            noise_div[k] = agg
        noise_topk[k] = max(noise_topk.get(k, 0), agg["topk_violations"])

    # Every pair's errors against the reference, controls included: the controls' ratios are this
    # run's measured null, the minimum effect a test pair must exceed (reference_verdict.py).
    ref_stats: dict[str, refv.RefStats] = {}
    # The further reference statistics (statistics.MEASURED), the same way: by name, then pair id.
    more: dict[str, dict[str, refv.RefStats]] = {stat.name: {} for stat in MEASURED}
    for score, ps in zip(scores, pair_specs, strict=True):
        agg, both = score.row, score.ref
        floor = drift_floor(by_id.get(ps.test.cell_id, {}).get("dtype_effective"))
        stats = refv.reference_stats([x for x, _ in both], [y for _, y in both], floor, thresholds)
        ref_stats[ps.pair_id] = stats
        agg.update(_ref_columns(stats, both, reference))
        for name, vals in score.ref_measures.items():
            more[name][ps.pair_id] = refv.paired_errors(
                [x for x, _ in vals], [y for _, y in vals], floor, thresholds
            )
    ref_controls: dict[str, dict[tuple, list[tuple[str, refv.RefStats]]]] = {}
    for ps in pair_specs:
        if ps.kind in FLOOR_KINDS:
            for name, by_pair in ((REFERENCE, ref_stats), *more.items()):
                ref_controls.setdefault(name, {}).setdefault(twin_key(ps.test), []).append(
                    (ps.pair_id, by_pair[ps.pair_id])
                )

    evidence: dict[str, tuple[EvidencePiece, ...]] = {}
    for score, ps in zip(scores, pair_specs, strict=True):
        agg, agreeing = score.row, score.agreeing
        mean, lo, hi = paired_bootstrap_ci(score.deltas, thresholds.bootstrap, thresholds.ci, thresholds.seed)
        test_cell = by_id.get(ps.test.cell_id, {})
        # Every statistic's columns, filled by its registry entry from what was measured (a control
        # weighs no evidence: its reference statistics are the null, without a minimum effect).
        measured = Measured(
            repetition=(mean, lo, hi),
            reference={name: Judged(by_pair[ps.pair_id]) for name, by_pair in more.items()},
        )
        agg.update(_speed_columns(ps, progress, predicted))
        agg["cascade_steps"] = int(test_cell.get("cascade_steps", 0))
        effect = None
        if ps.kind != TWIN_KIND and (ps.kind in TWIN_KINDS or (ps.kind == CALIBRATION and twin is not TWIN)):
            # Another twin's pair: the steps its setting took effect on stand where cascade's are.
            prog = progress.get(ps.test.engine_key)
            effect = cell_effect(prog.waves.get(ps.test.cell_id, []) if prog is not None else [])
            agg["cascade_steps"] = effect.count
        agg["total_steps"] = int(test_cell.get("total_steps", 0))
        decode_steps = test_cell.get("cascade_decode_steps", float("nan"))
        # Cascade's decode/prefill depth says nothing of another setting.
        decode_steps = None if pd.isna(decode_steps) or effect is not None else int(decode_steps)
        agg["cascade_decode_steps"] = float("nan") if decode_steps is None else decode_steps
        agg["depth"] = (
            depth(agg["cascade_steps"], decode_steps)
            if ps.kind in (*TWIN_KINDS, CALIBRATION) and effect is None
            else ""
        )
        if ps.kind not in (*TWIN_KINDS, CALIBRATION):
            agg.update(noise_pair_id="", noise_n=0, noise_n_diverged=0, noise_topk_violations=0)
            agg.update(_topk_drift_columns(None, ""), **fill(measured))
            agg.update(verdict="control", reasons="", decided_by="", rule="")
            continue
        tk = twin_key(ps.test)
        noise = noise_div.get(tk)
        agg["noise_pair_id"] = noise["pair_id"] if noise else ""
        agg["noise_n"] = noise["n"] if noise else 0
        agg["noise_n_diverged"] = noise["n_diverged"] if noise else 0
        agg["noise_topk_violations"] = noise_topk.get(tk, 0)
        control = matched.get(ps.pair_id)
        drift = topk = bias = None
        if control is not None:
            floor = drift_floor(test_cell.get("dtype_effective"))
            drift = drift_ratio_stats(
                [t["drift_test"] for t in agreeing], [t["drift_control"] for t in agreeing], floor, thresholds
            )
            topk = drift_ratio_stats(
                [t["topk_drift_test"] for t in agreeing],
                [t["topk_drift_control"] for t in agreeing],
                floor,
                thresholds,
            )
            bias = bias_stats(
                [(t["bias_test"], t["drift_test"]) for t in agreeing],
                [(t["bias_control"], t["drift_control"]) for t in agreeing],
                floor,
            )
        agg.update(_topk_drift_columns(topk, control.pair_id if control else ""))
        ok = test_cell.get("status") == "done" and by_id.get(ps.ref.cell_id, {}).get("status") == "done"
        ev = Evidence(
            n=agg["n"],
            n_diverged=agg["n_diverged"],
            topk_violations=agg["topk_violations"],
            noise_n=agg["noise_n"],
            noise_n_diverged=agg["noise_n_diverged"],
            noise_topk_violations=agg["noise_topk_violations"],
            d_rep_mean=mean,
            d_rep_lo=lo,
            d_rep_hi=hi,
            cascade_steps=agg["cascade_steps"],
            status_ok=ok and agg["n"] > 0,
            drift=drift,
            bias=bias,
            cascade_decode_steps=decode_steps,
            twin=twin.name if effect is not None else "",
            effect_why=effect.why if effect is not None else "",
        )
        has_noise = noise is not None and noise["n"] > 0
        dec = decide(ev, thresholds, has_noise=has_noise)
        floor_of, floor_id = refv.min_effect(ref_controls.get(REFERENCE, {}).get(tk, []))
        also = [
            refv.RefMeasure(stat.name, stat.label, more[stat.name][ps.pair_id],
                            *refv.min_effect(ref_controls.get(stat.name, {}).get(tk, [])))
            for stat in MEASURED
        ]  # fmt: skip
        noise_text = (
            f"diverged {ev.n_diverged}/{ev.n} vs {ev.noise_n_diverged}/{ev.noise_n} in the control"
            if has_noise
            else f"diverged {ev.n_diverged}/{ev.n}"
        )
        dec = refv.decide(dec, ref_stats[ps.pair_id], floor_of, floor_id, thresholds, reference,
                          n_diverged=ev.n_diverged, noise_text=noise_text, also=also)  # fmt: skip
        measured.drift, measured.bias = drift, bias
        measured.p_divergence, measured.p_topk = dec.p_divergence, dec.p_topk
        if dec.rule == refv.RULE_REFERENCE:  # the minimum effects the reference rule judged by
            at = {p.name: p.level for p in dec.evidence if p.rule == REFERENCE}
            measured.reference = {
                REFERENCE: Judged(ref_stats[ps.pair_id], floor_of, floor_id, at.get(REFERENCE, float("nan"))),
                **{m.name: Judged(m.stats, m.min_effect, m.min_effect_pair, at.get(m.name, float("nan")))
                   for m in also},
            }  # fmt: skip
        agg.update(fill(measured))
        agg.update(verdict=dec.verdict, reasons=dec.reasons, decided_by=dec.decided_by, rule=dec.rule)
        evidence[ps.pair_id] = dec.evidence

    # The pairs table is written from the typed results (a control weighs no evidence).
    results = [
        PairResult(
            pair_id=row["pair_id"],
            kind=row["kind"],
            verdict=row["verdict"],
            rule=row["rule"],
            decided_by=tuple(k for k in row["decided_by"].split(",") if k),
            evidence=evidence.get(row["pair_id"], ()),
            row=row,
            counts=Counts.from_row(row),
            depth=row["depth"],
        )
        for row in aggs
    ]
    pairs_df = pd.DataFrame([r.to_row() for r in results], columns=PAIR_COLUMNS)
    comp_df = pd.DataFrame(comp_rows)
    if not comp_df.empty:
        for col in ("topk_ok",):
            comp_df[col] = comp_df[col].astype("object")
    return read, cells_df, pairs_df, comp_df


def _speed_columns(
    ps: PairSpec, progress: dict[str, sample_scan.CellProgress], predicted: dict[str, Any]
) -> dict[str, Any]:
    """Decode speed of the test cell against the ref cell, wave by wave (``speed.py``), and for a
    cascade pair the heuristic's predicted speedup and the flag when it chose cascade and lost."""

    def waves_of(cell: Cell) -> list[dict[str, Any]]:
        prog = progress.get(cell.engine_key)
        return prog.waves.get(cell.cell_id, []) if prog is not None else []

    out: dict[str, Any] = dict(speed.paired_speed(waves_of(ps.test), waves_of(ps.ref)))
    pred = predicted.get(ps.test.cell_id) if ps.kind in (*TWIN_KINDS, CALIBRATION) else None
    out["predicted_speedup"] = speed.predicted_speedup(
        pred.get("decode_cost") if isinstance(pred, dict) else None
    )
    out["speed_flag"] = ""
    if ps.kind == TWIN_KIND:
        test_waves = waves_of(ps.test)
        decode = sum(int(w.get("cascade_decode_steps") or 0) for w in test_waves)
        forced = sum(int((w.get("extra") or {}).get("forced_on") or 0) for w in test_waves)
        out["speed_flag"] = speed.speed_flag(
            out["speed_ratio"],
            out["speed_ratio_lo"],
            int(out["speed_waves"]),
            decode,
            forced,
            out["speed_ratio_hi"],
        )
    return out


def _ref_columns(
    stats: refv.RefStats, both: list[tuple[ArmError, ArmError]], reference: str
) -> dict[str, Any]:
    """The reference columns of one pair (NaN where the reference did not score it)."""
    import json

    def curve(errs: list[ArmError]) -> str:
        # four significant digits, not six decimals: a per-step error of 5.7e-06 must not read as 6e-06 or 0
        vals = by_step_mean([e.by_step for e in errs])
        return json.dumps([float(f"{v:.4g}") if v == v else None for v in vals]) if vals else ""

    return {
        "reference": reference if stats.measured else "",
        "ref_n": stats.n,
        "ref_err_test": stats.test,
        "ref_err_twin": stats.twin,
        "ref_ratio": stats.ratio,
        "ref_ratio_lo": stats.lo,
        "ref_ratio_hi": stats.hi,
        "ref_up": stats.up,
        "ref_down": stats.down,
        "p_ref_sign": stats.p_sign,
        "p_ref_wilcoxon": stats.p_wilcoxon,
        "p_ref": stats.p,
        "ref_regret_test": stats.regret_test,
        "ref_regret_twin": stats.regret_twin,
        "ref_signed_test": stats.signed_test,
        "ref_signed_twin": stats.signed_twin,
        "ref_by_step_test": curve([a for a, _ in both]),
        "ref_by_step_twin": curve([b for _, b in both]),
    }


def _topk_drift_columns(topk: DriftStats | None, control_pair_id: str) -> dict[str, Any]:
    """The drift control's id and the top-k drift ratio of one pair (shown, never weighed; NaN where
    nothing was measured). The weighed statistics' columns are their registry entries'."""
    t = topk or DriftStats()
    return {
        "control_pair_id": control_pair_id,
        "topk_drift_ratio": t.ratio,
        "topk_drift_ratio_lo": t.lo,
        "topk_drift_ratio_hi": t.hi,
    }
