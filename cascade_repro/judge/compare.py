"""Build the three tables every report is rendered from (columns in docs/architecture.md): the cells
table (``cell_rows``), and the pairs and comparisons tables with each pair's verdict (``score_samples``,
``build_tables``): the count floor, the reference statistics and their minimum effects, the decision.

Reading the samples is ``judge/samples.py``'s, pairing the cells ``judge/pairing.py``'s, scoring one
pair ``judge/pair_score.py``'s; their public names are importable from here too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from cascade_repro.judge import reference_verdict as refv
from cascade_repro.judge import speed
from cascade_repro.judge.effect import cascade_mixed_in, cell_effect
from cascade_repro.judge.metrics.drift import drift_floor
from cascade_repro.judge.metrics.reference import ArmError, by_step_mean
from cascade_repro.judge.outcome import (
    CALIBRATION,
    FLOOR_KINDS,
    TWIN_KIND,
    TWIN_KINDS,
)
from cascade_repro.judge.pair_score import DRIFT_KEYS, PairScore, compare_pair, mean_or_nan
from cascade_repro.judge.pairing import TWIN_AXES, PairSpec, control_candidates, plan_pairs, twin_key
from cascade_repro.judge.result import Counts, PairResult
from cascade_repro.judge.samples import (
    CellSamples,
    RunSamples,
    compact_topk,
    load_cell_samples,
    load_prompts,
)
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
from cascade_repro.vllm_surface import faults

# The moved names stay importable from here (judge/samples.py, judge/pairing.py, judge/pair_score.py).
__all__ = [
    "DRIFT_KEYS",
    "REP_KEYS",
    "TWIN_AXES",
    "CellSamples",
    "PairScore",
    "PairSpec",
    "RunSamples",
    "build_tables",
    "cell_rows",
    "compact_topk",
    "compare_pair",
    "control_candidates",
    "load_cell_samples",
    "load_prompts",
    "plan_pairs",
    "score_samples",
    "twin_key",
]

REP_KEYS = [f"seq_rep_{n}" for n in range(1, 5)] + [f"distinct_{n}" for n in range(1, 5)]


def causes_from_logs(cells_df: pd.DataFrame, run_dir: Path) -> None:
    """Name the cause of an engine's death where a cell's error does not (a run recorded before the
    worker read it from its log): from the engine's worker log, on the first of its cells that
    errored, the one that was running when it died (the later ones only found it dead)."""
    if cells_df.empty:
        return
    for key, group in cells_df[cells_df["status"] == "error"].groupby("engine_key", sort=False):
        first = group.index[0]
        if faults.SUFFIX in str(cells_df.at[first, "error"]):
            continue
        fault = faults.cause_from_file(layout.worker_log(run_dir, str(key)))
        if fault is not None:
            cells_df.at[first, "error"] = faults.with_cause(str(cells_df.at[first, "error"]), fault)


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
            "len_mean": mean_or_nan([r["length"] for r in reps]),
            **speed.cell_speed(waves),
        }
        for k in REP_KEYS:
            row[k] = mean_or_nan([r[k] for r in reps])
        row["zlib_ratio"] = mean_or_nan([r["zlib_ratio"] for r in reps])
        row["tail_loop_rate"] = mean_or_nan([float(r["tail_loop"]) for r in reps])
        row["longest_repeat_mean"] = mean_or_nan([r["longest_repeat"] for r in reps])
        row["finish_length_rate"] = mean_or_nan([float(r["finish_length"]) for r in reps])
        # Instruction-following accuracy (prompt level, IFEval strict / loose); informational only.
        row["if_n"] = len(cs.ifs)
        row["if_strict"] = mean_or_nan([float(s) for s, _ in cs.ifs.values()])
        row["if_loose"] = mean_or_nan([float(lo) for _, lo in cs.ifs.values()])
        rows.append(row)
    return pd.DataFrame(rows)


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
    causes_from_logs(cells_df, run_dir)
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
        ref_cell = by_id.get(ps.ref.cell_id, {})
        ref_done = ref_cell.get("status") == "done"
        ok = test_cell.get("status") == "done" and ref_done
        test_fault = (
            faults.kernel_fault(str(test_cell.get("error") or ""))
            if test_cell.get("status") == "error" and ref_done
            else ""
        )
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
            test_fault=test_fault,
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
        if effect is not None:
            agg["reasons"] += cascade_mixed_in(twin.name, ((ps.test.arm, test_cell), (ps.ref.arm, ref_cell)))
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
