"""Score one pair of cells before its verdict (``compare_pair`` -> ``PairScore``): its per-prompt
comparison rows, its pairs-table columns so far, and what the verdict's statistics are computed from
(the seq-rep-4 deltas, the chosen drift control's triples, both arms' errors against the reference).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cascade_repro.judge.ifeval.score import paired_if
from cascade_repro.judge.metrics.divergence import divergence_metrics
from cascade_repro.judge.metrics.drift import drift_triple
from cascade_repro.judge.metrics.reference import ArmError
from cascade_repro.judge.pairing import PairSpec
from cascade_repro.judge.samples import CellSamples
from cascade_repro.judge.statistics import MEASURED


def _mean_control_drift(triples: dict[int, dict[str, Any]]) -> float:
    vals = [t["drift_control"] for t in triples.values() if t["drift_positions"] > 0]
    vals = [v for v in vals if v == v]  # NaN when a side carried no logprobs
    return float(np.mean(vals)) if vals else -1.0


def mean_or_nan(values: list[float]) -> float:
    return float(statistics.fmean(values)) if values else float("nan")


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
        "common_prefix_ratio_mean": mean_or_nan([r["common_prefix_ratio"] for r in rows]),
        "edit_distance_mean": mean_or_nan([r["edit_distance"] for r in rows]),
        "topk_violations": sum(1 for r in rows if r["topk_ok"] is False),
        "dlogprob_mean": mean_or_nan([r["dlogprob_mean"] for r in rows]),
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
