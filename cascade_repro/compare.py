"""Score samples and pair cells: cascade vs flat twin, and flat-vs-flat noise controls.

Produces the three tables every report is rendered from (columns in docs/architecture.md).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cascade_repro import runstore
from cascade_repro.ifeval.score import paired_if, score_response
from cascade_repro.metrics.divergence import divergence_metrics
from cascade_repro.metrics.repetition import repetition_metrics
from cascade_repro.verdicts import Evidence, Thresholds, decide, paired_bootstrap_ci

REP_KEYS = [f"seq_rep_{n}" for n in range(1, 5)] + [f"distinct_{n}" for n in range(1, 5)]
TWIN_AXES = ("tp", "seed", "dtype", "fa_version", "backend")


@dataclass
class CellSamples:
    """The scored samples of one finished cell, keyed by prompt index."""

    tokens: dict[int, list[int]] = field(default_factory=dict)
    logprobs: dict[int, list[float]] = field(default_factory=dict)
    topk: dict[int, list] = field(default_factory=dict)
    keys: dict[int, str] = field(default_factory=dict)
    rep: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Instruction following per prompt index: (strict, loose); only prompts that could be scored.
    ifs: dict[int, tuple[bool, bool]] = field(default_factory=dict)


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
    from cascade_repro.promptsets import iter_prompt_records

    path = Path(run_dir) / "prompts.jsonl"
    if not path.is_file():
        return []
    try:
        return list(iter_prompt_records(path))
    except UsageError:
        return []


def load_cell_samples(
    run_dir: Path, engine_keys: Iterable[str], wanted: set[str], prompts: list[Any] | None = None
) -> dict[str, CellSamples]:
    """Stream every samples file once, scoring repetition (and, given prompts, instruction following) as records go by."""
    out: dict[str, CellSamples] = {}
    prompts = prompts or []
    for key in engine_keys:
        for rec in runstore.iter_samples(runstore.samples_path(run_dir, key), wanted):
            cs = out.setdefault(rec["cell_id"], CellSamples())
            i = rec["prompt_index"]
            cs.tokens[i] = rec["token_ids"]
            cs.logprobs[i] = rec.get("logprobs") or []
            cs.topk[i] = compact_topk(rec.get("topk") or [])
            cs.keys[i] = rec.get("prompt_key", str(i))
            cs.rep[i] = repetition_metrics(
                rec["token_ids"], rec.get("text", ""), rec.get("finish_reason", "")
            )
            cs.ifs.pop(i, None)  # a later record of the same prompt replaces an earlier one
            if isinstance(i, int) and 0 <= i < len(prompts) and prompts[i].key == cs.keys[i]:
                sc = score_response(prompts[i], rec.get("text") or "")
                if sc["strict"] is not None:
                    cs.ifs[i] = (sc["strict"], sc["loose"])
    return out


def _mean(values: list[float]) -> float:
    return float(statistics.fmean(values)) if values else float("nan")


def cell_rows(run: dict[str, Any], run_dir: Path, samples: dict[str, CellSamples]) -> pd.DataFrame:
    """One row per planned cell: status, probe counters, throughput and repetition means."""
    rows = []
    spec = run["spec"]
    progress = {k: runstore.read_progress(runstore.samples_path(run_dir, k)) for k in run["plan"]["engines"]}
    for c in run["plan"]["cells"]:
        prog = progress[c["engine_key"]]
        cid = c["cell_id"]
        waves = prog.waves.get(cid, [])
        status = "done" if cid in prog.done else ("error" if cid in prog.errors else "pending")
        cs = samples.get(cid, CellSamples())
        reps = list(cs.rep.values())
        wall = sum(w.get("wall_s", 0.0) for w in waves)
        tokens = sum(w.get("tokens", 0) for w in waves)
        row = {
            "cell_id": cid,
            "engine_key": c["engine_key"],
            "engine": spec["engine"],
            "model": run.get("model_name", spec["model"]),
            "tp": c["tp"],
            "batch": c["batch"],
            "arm": c["arm"],
            "rerun": c["rerun"],
            "seed": c["seed"],
            "dtype": c["dtype"],
            "fa_version": "default" if c["fa_version"] is None else str(c["fa_version"]),
            "backend": c["backend"],
            "status": status,
            "error": prog.errors.get(cid, ""),
            "n_prompts": len(reps),
            "cascade_steps": sum(w.get("cascade_steps", 0) for w in waves),
            "total_steps": sum(w.get("total_steps", 0) for w in waves),
            "cascade_calls": sum(w.get("cascade_calls", 0) for w in waves),
            "wall_s": wall,
            "tokens": tokens,
            "tokens_per_s": tokens / wall if wall > 0 else float("nan"),
            "len_mean": _mean([r["length"] for r in reps]),
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
    kind: str  # "cascade" | "noise-batch" | "noise-rerun"
    test: dict[str, Any]
    ref: dict[str, Any]


def plan_pairs(cells: list[dict[str, Any]]) -> list[PairSpec]:
    """Pair each cascade cell with its flat twin; add flat-vs-flat noise controls.

    Noise controls: flat at batch B vs flat at the smallest batch (all else equal), and a flat
    rerun vs its first run when the matrix has ``rerun``.
    """

    def twin_key(c: dict[str, Any]) -> tuple:
        return tuple(c[a] for a in TWIN_AXES)

    flat = {(twin_key(c), c["batch"], c["rerun"]): c for c in cells if c["arm"] == "flat"}
    pairs: list[PairSpec] = []
    for c in cells:
        if c["arm"] == "cascade" and c["rerun"] == 0:
            ref = flat.get((twin_key(c), c["batch"], 0))
            if ref:
                pairs.append(PairSpec(f"{c['cell_id']}~flat", "cascade", c, ref))
    by_twin: dict[tuple, list[dict[str, Any]]] = {}
    for c in cells:
        if c["arm"] == "flat" and c["rerun"] == 0:
            by_twin.setdefault(twin_key(c), []).append(c)
    for group in by_twin.values():
        base = min(group, key=lambda c: c["batch"])
        for c in group:
            if c is not base:
                pairs.append(PairSpec(f"{c['cell_id']}~b{base['batch']}", "noise-batch", c, base))
    for (tk, b, r), c in flat.items():
        if r == 1 and (tk, b, 0) in flat:
            pairs.append(PairSpec(f"{c['cell_id']}~r0", "noise-rerun", c, flat[(tk, b, 0)]))
    return pairs


def compare_pair(
    ps: PairSpec, samples: dict[str, CellSamples]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Return the pair's aggregate row (without verdict) and its per-prompt rows."""
    a = samples.get(ps.test["cell_id"], CellSamples())
    b = samples.get(ps.ref["cell_id"], CellSamples())
    common = sorted(set(a.tokens) & set(b.tokens))
    rows = []
    for i in common:
        d = divergence_metrics(a.tokens[i], a.logprobs[i], a.topk[i], b.tokens[i], b.logprobs[i], b.topk[i])
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
            }
        )
    diverged = [r for r in rows if not r["exact"]]
    deltas = [r["seq_rep_4_test"] - r["seq_rep_4_ref"] for r in rows]
    strict = paired_if({i: v[0] for i, v in a.ifs.items()}, {i: v[0] for i, v in b.ifs.items()})
    loose = paired_if({i: v[1] for i, v in a.ifs.items()}, {i: v[1] for i, v in b.ifs.items()})
    agg = {
        "pair_id": ps.pair_id,
        "kind": ps.kind,
        "test_cell": ps.test["cell_id"],
        "ref_cell": ps.ref["cell_id"],
        "tp": ps.test["tp"],
        "batch": ps.test["batch"],
        "ref_batch": ps.ref["batch"],
        "seed": ps.test["seed"],
        "dtype": ps.test["dtype"],
        "fa_version": "default" if ps.test["fa_version"] is None else str(ps.test["fa_version"]),
        "backend": ps.test["backend"],
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
        "_deltas": deltas,
    }
    return agg, rows


def build_tables(
    run: dict[str, Any], run_dir: Path, thresholds: Thresholds
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Score the run and return (cells, pairs, comparisons) DataFrames."""
    cells = run["plan"]["cells"]
    pair_specs = plan_pairs(cells)
    wanted = {c["cell_id"] for c in cells}
    samples = load_cell_samples(run_dir, run["plan"]["engines"], wanted, load_prompts(run_dir))
    cells_df = cell_rows(run, run_dir, samples)
    status = dict(zip(cells_df["cell_id"], cells_df["status"], strict=True))
    steps = dict(zip(cells_df["cell_id"], cells_df["cascade_steps"], strict=True))
    total_steps = dict(zip(cells_df["cell_id"], cells_df["total_steps"], strict=True))

    aggs, comp_rows = [], []
    for ps in pair_specs:
        agg, rows = compare_pair(ps, samples)
        aggs.append(agg)
        comp_rows.extend(rows)

    # The noise floor of a cascade pair: the worst flat-vs-flat control of the same engine config,
    # whatever its batch size. A control measures how often a numerically equivalent recomputation
    # (another batch shape, a rerun) flips greedy tokens of this model on these prompts; cascade is
    # one more such recomputation, so its drift is judged against the largest one measured. Taking
    # only the control at the same batch made benign bf16 drift at small batches look like a bug
    # (H200, FA2: cascade b8 24/64 diverged, all inside top-k, vs 5/64 for flat b8 vs b1 but 28/64
    # for flat b128 vs b1).
    noise_div: dict[tuple, dict[str, Any]] = {}
    noise_topk: dict[tuple, int] = {}
    for agg, ps in zip(aggs, pair_specs, strict=True):
        if ps.kind == "cascade" or not agg["n"]:
            continue
        k = tuple(ps.test[a] for a in TWIN_AXES)
        cur = noise_div.get(k)
        if cur is None or agg["n_diverged"] / agg["n"] > cur["n_diverged"] / cur["n"]:
            noise_div[k] = agg
        noise_topk[k] = max(noise_topk.get(k, 0), agg["topk_violations"])

    for agg, ps in zip(aggs, pair_specs, strict=True):
        mean, lo, hi = paired_bootstrap_ci(
            agg.pop("_deltas"), thresholds.bootstrap, thresholds.ci, thresholds.seed
        )
        agg.update(d_seq_rep_4_mean=mean, d_seq_rep_4_lo=lo, d_seq_rep_4_hi=hi)
        agg["cascade_steps"] = int(steps.get(ps.test["cell_id"], 0))
        agg["total_steps"] = int(total_steps.get(ps.test["cell_id"], 0))
        if ps.kind != "cascade":
            agg.update(noise_pair_id="", noise_n=0, noise_n_diverged=0, noise_topk_violations=0)
            agg.update(p_divergence=float("nan"), p_topk=float("nan"), verdict="control", reasons="")
            continue
        tk = tuple(ps.test[a] for a in TWIN_AXES)
        noise = noise_div.get(tk)
        agg["noise_pair_id"] = noise["pair_id"] if noise else ""
        agg["noise_n"] = noise["n"] if noise else 0
        agg["noise_n_diverged"] = noise["n_diverged"] if noise else 0
        agg["noise_topk_violations"] = noise_topk.get(tk, 0)
        ok = status.get(ps.test["cell_id"]) == "done" and status.get(ps.ref["cell_id"]) == "done"
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
        )
        verdict, reasons, p_div, p_topk = decide(
            ev, thresholds, has_noise=noise is not None and noise["n"] > 0
        )
        agg.update(p_divergence=p_div, p_topk=p_topk, verdict=verdict, reasons=reasons)

    pair_cols = [
        "pair_id", "kind", "test_cell", "ref_cell", "tp", "batch", "ref_batch", "seed", "dtype", "fa_version",
        "backend", "n", "n_identical", "n_diverged", "first_div_median", "common_prefix_ratio_mean",
        "edit_distance_mean", "topk_violations", "dlogprob_mean", "dlogprob_max", "d_seq_rep_4_mean",
        "d_seq_rep_4_lo", "d_seq_rep_4_hi", "noise_pair_id", "noise_n", "noise_n_diverged",
        "noise_topk_violations", "p_divergence", "p_topk", "cascade_steps", "total_steps", "verdict", "reasons",
        "if_n", "if_strict_test", "if_strict_ref", "if_strict_delta", "if_loose_delta", "if_gained", "if_lost",
        "p_if",
    ]  # fmt: skip
    pairs_df = pd.DataFrame(aggs, columns=pair_cols)
    comp_df = pd.DataFrame(comp_rows)
    if not comp_df.empty:
        for col in ("topk_ok",):
            comp_df[col] = comp_df[col].astype("object")
    return cells_df, pairs_df, comp_df
