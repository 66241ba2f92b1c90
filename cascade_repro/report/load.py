"""Load a run directory into a `RunData` that every report format renders from."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from cascade_repro.errors import UsageError
from cascade_repro.report.text import as_int, is_missing

CELL_COLUMNS = (
    "cell_id engine_key engine model tp batch arm rerun seed dtype fa_version backend status error "
    "n_prompts cascade_steps total_steps cascade_calls wall_s tokens tokens_per_s len_mean "
    "seq_rep_1 seq_rep_2 seq_rep_3 seq_rep_4 distinct_1 distinct_2 distinct_3 distinct_4 zlib_ratio "
    "tail_loop_rate longest_repeat_mean finish_length_rate"
).split()
PAIR_COLUMNS = (
    "pair_id kind test_cell ref_cell tp batch seed dtype fa_version backend n n_identical n_diverged "
    "first_div_median common_prefix_ratio_mean edit_distance_mean topk_violations dlogprob_mean "
    "dlogprob_max d_seq_rep_4_mean d_seq_rep_4_lo d_seq_rep_4_hi noise_pair_id noise_n noise_n_diverged "
    "noise_topk_violations p_divergence p_topk cascade_steps total_steps verdict reasons"
).split()
COMPARISON_COLUMNS = (
    "pair_id prompt_index prompt_key exact first_div common_prefix_ratio edit_distance topk_ok "
    "margin_test margin_ref dlogprob_mean dlogprob_max seq_rep_4_test seq_rep_4_ref len_test len_ref"
).split()


@dataclass
class Example:
    """One divergent prompt of a cascade pair, with both texts and the tokens where they split."""

    pair_id: str
    prompt_index: int
    prompt_key: str | None
    first_div: int | None
    test_cell: str
    ref_cell: str
    test_text: str | None = None
    ref_text: str | None = None
    test_token: int | None = None
    ref_token: int | None = None
    test_logprob: float | None = None
    ref_logprob: float | None = None
    test_topk: list[tuple[int, float]] = field(default_factory=list)
    ref_topk: list[tuple[int, float]] = field(default_factory=list)
    edit_distance: float | None = None
    topk_ok: bool | None = None


@dataclass
class RunData:
    """Everything a report needs, read from one run directory."""

    run_dir: Path
    run: dict
    cells: pd.DataFrame
    pairs: pd.DataFrame
    comparisons: pd.DataFrame
    examples: list[Example]


def load_run(run_dir: Path, n_examples: int = 3) -> RunData:
    """Read run.json, the three parquet tables and the most divergent samples of a run directory."""
    run_dir = Path(run_dir)
    for name in ("run.json", "cells.parquet", "pairs.parquet", "comparisons.parquet"):
        if not (run_dir / name).is_file():
            raise UsageError(f"not a cascade-repro run directory: {run_dir} (missing {name})")
    try:
        run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"unreadable run.json in {run_dir}: {e}") from None
    if not isinstance(run, dict):
        raise UsageError(f"unreadable run.json in {run_dir}: not a JSON object")
    cells = _read_table(run_dir / "cells.parquet", CELL_COLUMNS)
    pairs = _read_table(run_dir / "pairs.parquet", PAIR_COLUMNS)
    comparisons = _read_table(run_dir / "comparisons.parquet", COMPARISON_COLUMNS)
    if pairs["kind"].isna().all() and len(pairs):
        # Old runs had no kind column: only cascade pairs carry a real verdict.
        pairs["kind"] = ["noise" if v == "control" else "cascade" for v in pairs["verdict"]]
    examples = pick_examples(pairs, comparisons, n_examples)
    _attach_samples(run_dir, examples)
    return RunData(run_dir, run, cells, pairs, comparisons, examples)


def _read_table(path: Path, columns: list[str]) -> pd.DataFrame:
    try:
        df = pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several unrelated types for a damaged file
        raise UsageError(f"unreadable {path.name} in {path.parent}: {e}") from None
    for col in columns:
        if col not in df.columns:
            df[col] = None
    return df.reset_index(drop=True)


def pick_examples(pairs: pd.DataFrame, comparisons: pd.DataFrame, n: int) -> list[Example]:
    """Rank non-exact prompts of cascade pairs and keep n, one per pair before repeating a pair."""
    if n <= 0 or comparisons.empty or pairs.empty:
        return []
    cascade = {r["pair_id"]: r for r in pairs.to_dict("records") if r.get("kind") == "cascade"}
    rows = []
    for r in comparisons.to_dict("records"):
        if r["pair_id"] not in cascade or as_int(r["prompt_index"]) is None:
            continue
        exact = r["exact"]
        if (not is_missing(exact) and bool(exact)) or (is_missing(exact) and is_missing(r["first_div"])):
            continue
        rows.append(r)
    rows.sort(key=_rank)
    chosen: list[dict] = []
    seen: set[str] = set()
    for r in rows:  # best row of each distinct pair first
        if len(chosen) < n and r["pair_id"] not in seen:
            chosen.append(r)
            seen.add(r["pair_id"])
    for r in rows:  # then fill with the next best rows
        if len(chosen) < n and not any(r is c for c in chosen):
            chosen.append(r)
    chosen.sort(key=_rank)
    out = []
    for r in chosen:
        p = cascade[r["pair_id"]]
        out.append(
            Example(
                pair_id=str(r["pair_id"]),
                prompt_index=int(as_int(r["prompt_index"]) or 0),
                prompt_key=None if is_missing(r["prompt_key"]) else str(r["prompt_key"]),
                first_div=as_int(r["first_div"]),
                test_cell=str(p["test_cell"]),
                ref_cell=str(p["ref_cell"]),
                edit_distance=None if is_missing(r["edit_distance"]) else float(r["edit_distance"]),
                topk_ok=None if is_missing(r["topk_ok"]) else bool(r["topk_ok"]),
            )
        )
    return out


def _rank(r: dict) -> tuple:
    topk_bad = 0 if not is_missing(r["topk_ok"]) and not bool(r["topk_ok"]) else 1
    fd = math.inf if is_missing(r["first_div"]) else float(r["first_div"])
    ed = 0.0 if is_missing(r["edit_distance"]) else float(r["edit_distance"])
    return (topk_bad, fd, -ed, str(r["pair_id"]), as_int(r["prompt_index"]))


def _attach_samples(run_dir: Path, examples: list[Example]) -> None:
    wanted = {(c, e.prompt_index) for e in examples for c in (e.test_cell, e.ref_cell)}
    if not wanted:
        return
    records = read_samples(sorted((run_dir / "samples").glob("*.jsonl")), wanted)
    for e in examples:
        t, r = records.get((e.test_cell, e.prompt_index)), records.get((e.ref_cell, e.prompt_index))
        if e.first_div is None and t and r:
            e.first_div = _first_div(t.get("token_ids") or [], r.get("token_ids") or [])
        if t:
            e.test_text = _str_or_none(t.get("text"))
            e.test_token, e.test_logprob, e.test_topk = _at(t, e.first_div)
            e.prompt_key = e.prompt_key or _str_or_none(t.get("prompt_key"))
        if r:
            e.ref_text = _str_or_none(r.get("text"))
            e.ref_token, e.ref_logprob, e.ref_topk = _at(r, e.first_div)


def read_samples(paths: Iterable[Path], wanted: set[tuple[str, int]]) -> dict[tuple[str, int], dict]:
    """Stream sample records of the wanted (cell_id, prompt_index) keys from JSONL files.

    A torn last line is skipped, later records replace earlier ones, and records of a cell are
    preferred once its `cell_done` line confirms them.
    """
    cells = {c for c, _ in wanted}
    # Both spellings: raw, and as json.dumps escapes it with ensure_ascii.
    needles = {c for cid in cells for c in (cid, json.dumps(cid)[1:-1])}
    pending: dict[tuple[str, int], dict] = {}
    done: dict[tuple[str, int], dict] = {}
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # torn write: the worker died mid-line
                if not any(n in line for n in needles):
                    continue  # cheap filter before paying for json.loads
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(rec, dict) or rec.get("cell_id") not in cells:
                    continue
                cid = rec["cell_id"]
                if rec.get("type") == "sample":
                    key = (cid, as_int(rec.get("prompt_index")))
                    if key in wanted:
                        pending[key] = rec
                elif rec.get("type") == "cell_done":
                    for key in [k for k in pending if k[0] == cid]:
                        done[key] = pending.pop(key)
    # Runs without cell_done lines (old or interrupted) still show their last record.
    return {**pending, **done}


def _at(rec: dict, i: int | None) -> tuple[int | None, float | None, list[tuple[int, float]]]:
    if i is None or i < 0:
        return None, None, []
    ids, lps, topk = rec.get("token_ids") or [], rec.get("logprobs") or [], rec.get("topk") or []
    token = as_int(ids[i]) if i < len(ids) else None
    lp = float(lps[i]) if i < len(lps) and not is_missing(lps[i]) else None
    alts = []
    for alt in topk[i] if i < len(topk) and isinstance(topk[i], list) else []:
        if (
            isinstance(alt, list | tuple)
            and len(alt) == 2
            and as_int(alt[0]) is not None
            and isinstance(alt[1], int | float)
        ):
            alts.append((int(as_int(alt[0]) or 0), float(alt[1])))
    return token, lp, alts


def _first_div(a: list, b: list) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _str_or_none(v: Any) -> str | None:
    return None if is_missing(v) else str(v)
