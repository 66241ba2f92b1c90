"""The run's other tables: noise controls, cells, the invocations of a resumed run, and the
divergent examples."""

from __future__ import annotations

from cascade_repro.judge.outcome import NOISE_RERUN
from cascade_repro.report.load import Example, RunData
from cascade_repro.report.text import (
    MISSING,
    Strong,
    fmt_float,
    fmt_int,
    fmt_ratio,
    one_line,
    plural,
    portable_paths,
    text_of,
    text_or_missing,
)
from cascade_repro.report.view import Table, cascade_pairs, cells, control_pairs, has_if, invocations

RERUN_NOTE = "same-engine rerun: bitwise identical expected; not used as a noise floor"

PLANNER = "added by the planner"


def _cell_label(cell_id, origins: dict[str, str]) -> str:
    """A cell id, marked when the planner added the cell as a noise control."""
    label = text_of(cell_id)
    return f"{label} ({PLANNER})" if origins.get(label) == "control" else label


def _control_note(r: dict, used: dict[str, int], floors: dict[str, int]) -> str:
    pid = text_of(r.get("pair_id"))
    notes = [RERUN_NOTE] if r.get("kind") == NOISE_RERUN else []
    if used.get(pid):
        notes.append(f"drift control of {plural(used[pid], 'cascade pair')}")
    if floors.get(pid):
        notes.append(f"divergence floor of {plural(floors[pid], 'cascade pair')}")
    return "; ".join(notes)


def _uses(pairs: list[dict], key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in pairs:
        v = text_or_missing(r.get(key))
        if v != MISSING:
            out[v] = out.get(v, 0) + 1
    return out


def noise_table(data: RunData) -> Table:
    """Build one row per noise-control pair, saying which cascade pairs it serves."""
    origins = {text_of(r.get("cell_id")): text_of(r.get("origin")) for r in data.rows("cells")}
    judged = cascade_pairs(data)
    used, floors = _uses(judged, "control_pair_id"), _uses(judged, "noise_pair_id")
    headers = [
        "pair",
        "kind",
        "tp",
        "batch",
        "test cell",
        "ref cell",
        "diverged",
        "first div. median",
        "top-k viol.",
        "max Δlogprob",
        "note",
    ]
    rows = [
        [
            text_of(r.get("pair_id")),
            text_of(r.get("kind")),
            fmt_int(r.get("tp")),
            fmt_int(r.get("batch")),
            _cell_label(r.get("test_cell"), origins),
            _cell_label(r.get("ref_cell"), origins),
            fmt_ratio(r.get("n_diverged"), r.get("n")),
            fmt_float(r.get("first_div_median"), ".1f"),
            fmt_int(r.get("topk_violations")),
            fmt_float(r.get("dlogprob_max"), ".3g"),
            _control_note(r, used, floors),
        ]
        for r in control_pairs(data)
    ]
    return Table(headers, rows, wrap=frozenset({"note"}))


def cell_table(data: RunData) -> Table:
    """Build one row per cell with throughput and repetition metrics."""
    headers = [
        "cell",
        "tp",
        "batch",
        "arm",
        "status",
        # A run of several twins: each cell's count is of the setting of the twin that planned it.
        "effect (its twin's)" if data.manifest.several else data.twin.effect_label,
        "tokens/s",
        "seq-rep-1",
        "seq-rep-2",
        "seq-rep-3",
        "seq-rep-4",
        "distinct-2",
        "zlib ratio",
        "tail-loop rate",
    ]
    rows_in = cells(data)
    show_if = has_if(rows_in)
    if show_if:
        headers += ["IF strict", "IF loose"]
    rows = []
    for r in rows_in:
        status = text_of(r.get("status"))
        rows.append(
            [
                text_of(r.get("cell_id")),
                fmt_int(r.get("tp")),
                fmt_int(r.get("batch")),
                arm_label(r),
                Strong(status) if status == "error" else status,
                fmt_ratio(r.get("cascade_steps"), r.get("total_steps")),
                fmt_float(r.get("tokens_per_s"), ".1f"),
                *(fmt_float(r.get(f"seq_rep_{i}")) for i in range(1, 5)),
                fmt_float(r.get("distinct_2")),
                fmt_float(r.get("zlib_ratio")),
                fmt_float(r.get("tail_loop_rate")),
                *([fmt_float(r.get("if_strict")), fmt_float(r.get("if_loose"))] if show_if else []),
            ]
        )
    return Table(headers, rows)


def arm_label(r: dict) -> str:
    """A cell's arm, with its injected fault and whether the planner added it."""
    label = text_of(r.get("arm"))
    inject = text_or_missing(r.get("inject"))
    if inject != MISSING:
        label += f" + {inject}"
    return f"{label} ({PLANNER})" if r.get("origin") == "control" else label


def invocations_table(data: RunData) -> Table | None:
    """One row per invocation of a resumed run (None for a run made in one go)."""
    invs = invocations(data)
    if len(invs) < 2:
        return None
    rows = []
    for k, inv in enumerate(invs, 1):
        env = inv.env
        stack = ", ".join(f"{key} {env[key]}" for key in ("vllm", "torch", "gpu_name") if env.get(key))
        rows.append([str(k), text_of(inv.kind or "matrix"), text_of(inv.stored("started_at")), fmt_int(inv.cells_kept),
                     fmt_int(inv.cells_run), fmt_float(inv.total_s, ".1f"), stack or MISSING,
                     portable_paths(one_line(text_of(inv.stored("command"))))])  # fmt: skip
    return Table(["#", "kind", "started", "cells kept", "cells run", "s", "stack", "command"], rows,
                 wrap=frozenset({"command"}))  # fmt: skip


def _topk(alts: list[tuple[int, float]], k: int = 5) -> str:
    return ", ".join(f"{tid} ({lp:.3g})" for tid, lp in alts[:k]) or MISSING


def example_title(ex: Example) -> str:
    """Name an example in one line."""
    key = f" ({ex.prompt_key})" if ex.prompt_key else ""
    at = f"first divergence at token {ex.first_div}" if ex.first_div is not None else "divergence not located"
    return one_line(f"{ex.pair_id} · prompt {ex.prompt_index}{key} · {at}")


def example_table(ex: Example) -> Table:
    """Show both sides' token, log-probability and top-k at the first divergence."""
    sides = [f"{ex.twin.test} ({ex.test_cell})", f"{ex.twin.ref} ({ex.ref_cell})"]
    return Table(
        [f"at token {fmt_int(ex.first_div)}", *sides],
        [
            ["token id", fmt_int(ex.test_token), fmt_int(ex.ref_token)],
            ["logprob", fmt_float(ex.test_logprob, ".4g"), fmt_float(ex.ref_logprob, ".4g")],
            ["top-k", _topk(ex.test_topk), _topk(ex.ref_topk)],
        ],
        wrap=frozenset(sides),
    )
