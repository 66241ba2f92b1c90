"""`cascade-repro explain --measure`: where cascade starts to pay on this GPU, and where vLLM's heuristic switches.

vLLM picks cascade on decode steps with a cost model (``use_cascade_attention``) written before FA3
was integrated; vLLM issue #15647 asks for it to be split by FA version and for evidence of where
it is wrong. This module plans the sweep (batch sizes around the heuristic's decode threshold, FA2
and FA3, cascade forced on every decode step vLLM's hard conditions allow so that cascade's cost
is measured also where the heuristic declines it, every request generating ``max_tokens`` so a
wave keeps its batch size) and reads the answer out of the finished run: per batch size, the cost
model's two numbers and each FA version's measured decode speed of cascade against flat.

The measuring itself is an ordinary matrix run (``pipeline.run_matrix``); this module only shapes
its spec and reads its tables.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from cascade_repro.judge import speed
from cascade_repro.plan.matrix import spec_of
from cascade_repro.report.text import as_int
from cascade_repro.rundir.manifest import Manifest
from cascade_repro.twin import CASCADE as TWIN
from cascade_repro.vllm_surface import MIN_REQUESTS

FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0)  # of the heuristic's decode threshold
FALLBACK_THRESHOLD = 32  # when no threshold is known (no cost model decision in range)
FA_VERSIONS = [2, 3]
MARGIN = 0.01  # a ratio within 1 +- this is "even"


def sweep_batches(threshold: int | None) -> list[int]:
    """Batch sizes around the decode threshold: half of it to three times it, none below 8."""
    t = threshold or FALLBACK_THRESHOLD
    return sorted({max(MIN_REQUESTS, round(t * f)) for f in FACTORS})


def sweep_values(values: dict[str, Any], threshold: int | None, given: set[str]) -> dict[str, Any]:
    """The matrix values of the sweep: what the user gave stands, the rest is the sweep's default."""
    out = dict(values)
    defaults: dict[str, Any] = {
        "batch": sweep_batches(threshold),
        "fa_versions": list(FA_VERSIONS),
        TWIN.spec_field: [True, False],
        "force_cascade": True,
        "ignore_eos": True,
        "graphs_for_batches": True,
        "max_tokens": 128,
    }
    for k, v in defaults.items():
        if k not in given:
            out[k] = v
    out["engine"] = "vllm"
    return out


@dataclass
class Measured:
    """One FA version's cascade pair at one batch size."""

    ratio: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    waves: int = 0
    cascade_decode_steps: int = 0
    total_steps: int = 0
    wall: float = math.nan  # whole waves, cascade over flat (engine steps plus output processing)


@dataclass
class SweepRow:
    tp: int
    batch: int
    heuristic: bool | None  # the cost model's decode-step choice at this batch (None: unknown)
    cascade_cost: int | None
    flash_decoding_cost: int | None
    by_fa: dict[str, Measured] = field(default_factory=dict)


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def sweep_rows(pairs: list[dict[str, Any]], predictions: dict[str, dict[str, Any]]) -> list[SweepRow]:
    """One row per (tp, batch) from a run's cascade pair rows and its per-cell predictions."""
    rows: dict[tuple[int, int], SweepRow] = {}
    for p in pairs:
        if p.get("kind") != TWIN.pair_kind:
            continue
        tp, batch = as_int(p.get("tp")), as_int(p.get("batch"))
        if tp is None or batch is None:
            continue
        pred = predictions.get(str(p.get("test_cell")), {})
        cost = pred.get("decode_cost") if isinstance(pred.get("decode_cost"), dict) else {}
        row = rows.get((tp, batch))
        if row is None:
            dec = pred.get("decode")
            row = rows[(tp, batch)] = SweepRow(
                tp, batch, dec if isinstance(dec, bool) else None, as_int(cost.get("cascade")),
                as_int(cost.get("flash_decoding")),
            )  # fmt: skip
        fa = str(p.get("fa_version") or "default")
        row.by_fa[fa] = Measured(
            _num(p.get("speed_ratio")), _num(p.get("speed_ratio_lo")), _num(p.get("speed_ratio_hi")),
            as_int(p.get("speed_waves")) or 0, as_int(p.get("cascade_decode_steps")) or 0,
            as_int(p.get("total_steps")) or 0, _num(p.get("wall_ratio")),
        )  # fmt: skip
    return [rows[k] for k in sorted(rows)]


def fa_columns(rows: list[SweepRow]) -> list[str]:
    return sorted({fa for r in rows for fa in r.by_fa}, key=lambda s: (not s.isdigit(), s))


def pays(m: Measured | None) -> bool | None:
    """True: cascade faster than flat in every wave; False: slower or even; None: not measured."""
    if m is None or m.waves == 0 or math.isnan(m.ratio):
        return None
    hi = m.hi if not math.isnan(m.hi) else m.ratio
    return m.ratio < 1.0 - MARGIN and hi < 1.0


def crossover(rows: list[SweepRow], fa: str, tp: int) -> int | None:
    """The smallest batch from which cascade paid at that and every larger measured batch (None: never)."""
    found: int | None = None
    for r in sorted((r for r in rows if r.tp == tp), key=lambda r: r.batch, reverse=True):
        if pays(r.by_fa.get(fa)) is True:
            found = r.batch
        elif r.by_fa.get(fa) is not None:
            break
    return found


def heuristic_switch(rows: list[SweepRow], tp: int) -> int | None:
    """The smallest swept batch whose decode steps the heuristic gives to cascade."""
    return min((r.batch for r in rows if r.tp == tp and r.heuristic is True), default=None)


def _cell(m: Measured | None) -> str:
    if m is None:
        return "-"
    s = speed.fmt_speed(m.ratio)
    if m.waves >= 2 and not math.isnan(m.lo):
        s += f" ({(m.lo - 1) * 100:+.0f}% to {(m.hi - 1) * 100:+.0f}%)"
    if not math.isnan(m.wall):
        s += f"; whole wave {speed.fmt_speed(m.wall)}"
    if m.total_steps and m.cascade_decode_steps == 0:
        s += ", cascade never ran"
    return s


def table(rows: list[SweepRow]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the sweep table (format-neutral)."""
    fas = fa_columns(rows)
    headers = ["tp", "batch", "heuristic (decode step)", "cost model: cascade / flash-decoding",
               *(f"FA{fa} cascade vs flat" if fa.isdigit() else f"{fa} cascade vs flat" for fa in fas)]  # fmt: skip
    body = []
    for r in rows:
        cost = "-" if r.cascade_cost is None else f"{r.cascade_cost} / {r.flash_decoding_cost}"
        heur = {True: "cascade", False: "flat", None: "?"}[r.heuristic]
        body.append([str(r.tp), str(r.batch), heur, cost, *(_cell(r.by_fa.get(fa)) for fa in fas)])
    return headers, body


def summary_lines(rows: list[SweepRow]) -> list[str]:
    """Per TP: where the heuristic switches and where each FA version's cascade started to pay."""
    out = []
    for tp in sorted({r.tp for r in rows}):
        sw = heuristic_switch(rows, tp)
        largest = max(r.batch for r in rows if r.tp == tp)
        parts = [f"TP {tp}: the heuristic gives decode steps to cascade from "
                 + (f"{sw} requests" if sw is not None else f"no swept batch (up to {largest})")]  # fmt: skip
        for fa in fa_columns(rows):
            x = crossover(rows, fa, tp)
            name = f"FA{fa}" if fa.isdigit() else fa
            parts.append(
                f"{name} cascade measured faster than flat from {x} requests"
                if x is not None
                else f"{name} cascade never measured faster (up to {largest})"
            )
        out.append("; ".join(parts))
    return out


def markdown(rows: list[SweepRow], facts: list[str]) -> str:
    """A table ready to paste into vLLM #15647, with the facts that make it reproducible."""
    headers, body = table(rows)
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body),
        "",
        *(f"- {line}" for line in summary_lines(rows)),
        *(f"- {f}" for f in facts),
    ]
    return "\n".join(lines) + "\n"


def facts(m: Manifest) -> list[str]:
    """GPU, vLLM, model and the sweep's settings from run.json, for the pasted table."""
    env = m.stack_env
    spec = spec_of(m.spec_json)
    # Each fact is said as "?" where run.json lacks it, not as its default.
    given = m.spec_json if isinstance(m.spec_json, dict) else {}
    ps = m.prompt_set

    def known(section: Any, name: str) -> Any:
        return getattr(section, name) if section.has(name) else "?"

    preds = m.predictions if isinstance(m.predictions, dict) else {}
    model = m.model_name if m.has("model_name") else (spec.model if "model" in given else "?")
    max_tokens = spec.max_tokens if "max_tokens" in given else "?"
    out = [
        f"GPU {env.get('gpu_name', '?')} ({preds.get('num_sms', '?')} SMs); vLLM {env.get('vllm', '?')}; "
        f"torch {env.get('torch', '?')}",
        f"model {model}; shared prefix {known(ps, 'shared_prefix_tokens')} tokens; {known(ps, 'n')} prompts x "
        f"{max_tokens} tokens{' (ignore_eos: every request decodes to the end)' if spec.ignore_eos else ''}",
        "speed: wall time per engine decode step, cascade cell over its flat twin, median over waves (range), "
        "then the whole waves' wall time (with vLLM's output processing); "
        + (
            "cascade forced on every decode step vLLM's hard conditions allow"
            if spec.force_cascade
            else "cascade where vLLM's heuristic chose it"
        )  # fmt: skip
        + ("; CUDA graphs off (enforce_eager)" if spec.enforce_eager else "; CUDA graphs on"),
    ]
    return out


def as_dict(rows: list[SweepRow]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(r) for r in rows]


def require_vllm() -> None:
    """A one-line usage error, before anything is loaded, when vLLM cannot run here."""
    import importlib.util

    from cascade_repro.errors import UsageError

    if importlib.util.find_spec("vllm") is None:
        raise UsageError(
            "explain --measure runs vLLM on this machine's GPU, and vLLM is not importable here "
            "(without --measure, explain predicts without it)"
        )


def measure(spec: Any, opts: Any, console: Any = None) -> tuple[Any, list[SweepRow], str]:
    """Run the sweep's matrix (resumable like any matrix), write ``sweep.md`` beside its reports,
    and return (the run's outcome, the rows, the Markdown)."""
    from cascade_repro.pipeline import run_matrix
    from cascade_repro.report.load import load_run
    from cascade_repro.report.view import predictions
    from cascade_repro.rundir import layout

    require_vllm()
    outcome = run_matrix(spec, opts, console)
    data = load_run(outcome.run_dir)
    rows = sweep_rows(data.pairs.to_dict("records"), predictions(data))
    md = markdown(rows, facts(data.manifest))
    layout.write_text_atomic(layout.sweep_path(outcome.run_dir), md)
    return outcome, rows, md
