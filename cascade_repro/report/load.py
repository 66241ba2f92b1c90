"""Load a run directory into a `RunData` that every report format renders from."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cascade_repro import twin as twins
from cascade_repro.errors import UsageError
from cascade_repro.judge.ifeval.score import Unscorable
from cascade_repro.judge.tables import CELL_COLUMNS, COMPARISON_COLUMNS, PAIR_COLUMNS
from cascade_repro.report.text import as_int, is_missing
from cascade_repro.rundir import layout, sample_scan
from cascade_repro.rundir.manifest import Manifest, read_manifest
from cascade_repro.twin import CASCADE as TWIN
from cascade_repro.twin import TwinAxis, pair_prefix


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
    # The run's twin: its arms' names and sample headings (cascade (test) / flat (ref), ...).
    twin: TwinAxis = TWIN


@dataclass
class RunData:
    """Everything a report needs, read from one run directory; run.json as its typed sections."""

    run_dir: Path
    manifest: Manifest
    cells: pd.DataFrame
    pairs: pd.DataFrame
    comparisons: pd.DataFrame
    examples: list[Example]
    # The prompts no IFEval verifier can score, read when the run is loaded: the report names them
    # without calling the scorer.
    unscorable: Unscorable = field(default_factory=Unscorable)
    # Why the examples have no texts or top-k tables ("" when they have them, or there are none):
    # a run copied without samples/ (committed evidence, a CI artifact) still renders, and says so.
    samples_missing: str = ""
    # repro.py as `minimize` wrote it under minimize/<pair>/ (pair id, script): the report shows it,
    # so a reader can reproduce with vLLM alone from the pasted report.
    repro_scripts: list[tuple[str, str]] = field(default_factory=list)
    _rows: dict[str, list[dict]] | None = field(default=None, init=False, repr=False, compare=False)
    # Each twin's view, made once inside :meth:`settled` (every format asks for them several times).
    _views: dict[str, RunData] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def twin(self) -> TwinAxis:
        """The run's twin (run.json's text, resolved once by the manifest); of a run of several,
        the first (:meth:`for_twin`: each one's view)."""
        return self.manifest.twin

    @property
    def twins(self) -> tuple[TwinAxis, ...]:
        return self.manifest.twins

    def for_twin(self, tw: TwinAxis) -> RunData:
        """The run as a run of ``tw`` alone reads it: run.json's view for it (``Manifest.for_twin``),
        its pairs and comparisons (their ids begin with ``twin.pair_prefix``), the cells it reads,
        each under its arm for ``tw``, and its examples. Every format renders a run of several twins
        as one such view per twin; inside :meth:`settled` each view is made once and settled too."""
        if self._rows is not None and tw.name in self._views:
            return self._views[tw.name]
        made = self._view(tw)
        if self._rows is not None:
            made._rows = {}
            self._views[tw.name] = made
        return made

    def _view(self, tw: TwinAxis) -> RunData:
        view = self.manifest.for_twin(tw)
        arms = {c.cell_id: c.arm for c in view.plan.cells}
        cells = self.cells[self.cells["cell_id"].isin(list(arms))].copy()
        if len(cells):
            cells["arm"] = cells["cell_id"].map(arms)
        prefix = pair_prefix(tw)

        def mine(df: pd.DataFrame) -> pd.DataFrame:
            return df[df["pair_id"].astype(str).str.startswith(prefix)].reset_index(drop=True)

        return RunData(
            self.run_dir,
            view,
            cells.reset_index(drop=True),
            mine(self.pairs),
            mine(self.comparisons),
            [ex for ex in self.examples if ex.pair_id.startswith(prefix)],
            self.unscorable,
            self.samples_missing,
            [(p, s) for p, s in self.repro_scripts if p.startswith(prefix)],
        )

    def rows(self, table: str) -> list[dict]:
        """``cells``, ``pairs`` or ``comparisons`` as one dict per row (copies: a caller may change
        them). Inside :meth:`settled` each table is converted once: a report reads each table dozens
        of times, and pandas' ``to_dict`` costs more than all the rendering."""
        if self._rows is None:
            return getattr(self, table).to_dict("records")
        if table not in self._rows:
            self._rows[table] = getattr(self, table).to_dict("records")
        return [dict(r) for r in self._rows[table]]

    @contextmanager
    def settled(self) -> Iterator[RunData]:
        """A block in which the tables do not change, so :meth:`rows` may convert each once."""
        if self._rows is not None:  # already inside one
            yield self
            return
        self._rows = {}
        try:
            yield self
        finally:
            self._rows = None
            for v in self._views.values():
                v._rows = None
            self._views = {}


def load_run(
    run_dir: Path,
    n_examples: int = 3,
    samples: Callable[[set[tuple[str, int]]], dict[tuple[str, int], dict]] | None = None,
) -> RunData:
    """Read run.json, the three parquet tables and the most divergent samples of a run directory.

    ``samples``: where the examples' sample records come from, by (cell_id, prompt_index), for a
    caller that has just scored them (what scoring read); the samples files otherwise."""
    run_dir = Path(run_dir)
    if not (run_dir / layout.RUN_JSON).is_file():
        raise UsageError(f"not a cascade-repro run directory: {run_dir} (missing {layout.RUN_JSON})")
    manifest = read_manifest(run_dir)  # checked where it enters: one line, exit 2
    for name in layout.TABLES:
        if not (run_dir / name).is_file():
            # A run.json without tables is a matrix that has not been scored yet (interrupted, or
            # still running): say what to do, not that the directory is foreign.
            raise UsageError(
                f"{run_dir} is not finished (no {name} yet): rerun the same `cascade-repro matrix` command "
                "to resume it, or `cascade-repro report --rescore` to score the samples it has"
            )
    cells = _read_table(run_dir / layout.CELLS, CELL_COLUMNS)
    pairs = _read_table(run_dir / layout.PAIRS, PAIR_COLUMNS)
    comparisons = _read_table(run_dir / layout.COMPARISONS, COMPARISON_COLUMNS)
    if pairs["kind"].isna().all() and len(pairs):
        # Old runs had no kind column: only cascade pairs carry a real verdict.
        pairs["kind"] = ["noise" if v == "control" else TWIN.pair_kind for v in pairs["verdict"]]
    examples = pick_examples(pairs, comparisons, n_examples)
    for ex in examples:
        ex.twin = next((t for t in manifest.twins if ex.pair_id.startswith(pair_prefix(t))), manifest.twin)
    _attach_samples(run_dir, examples, samples)
    missing = ""
    if samples is None and examples and not layout.samples_files(run_dir):
        missing = NO_SAMPLES
    return RunData(
        run_dir,
        manifest,
        cells,
        pairs,
        comparisons,
        examples,
        unscorable_prompts(run_dir),
        samples_missing=missing,
        repro_scripts=repro_scripts(run_dir),
    )


REPRO_MAX_CHARS = 60_000  # a script longer than this is not minimize's, or would not fit an issue


def repro_scripts(run_dir: Path) -> list[tuple[str, str]]:
    """The repro.py files ``minimize`` wrote in this run directory (pair folder name, text), in name
    order; a file that is a link, too long or not UTF-8 is left out."""
    found = []
    for path in sorted((run_dir / layout.MINIMIZE).glob("*/repro.py")):
        try:
            if path.is_symlink() or path.stat().st_size > REPRO_MAX_CHARS:
                continue
            found.append((path.parent.name, path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return found


NO_SAMPLES = (
    f"no {layout.SAMPLES}/ in this run directory: the divergent prompts' texts and the top-k tables at "
    "their first divergence cannot be shown"
)


def unscorable_prompts(run_dir: Path) -> Unscorable:
    """The run's prompts (``prompts.jsonl``) that carry instructions no IFEval verifier can score;
    none where the file is absent or unreadable."""
    from cascade_repro.judge.compare import load_prompts
    from cascade_repro.judge.ifeval.score import unscorable

    return unscorable(load_prompts(run_dir))


def _read_table(path: Path, columns: list[str]) -> pd.DataFrame:
    try:
        df = pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several unrelated types for a damaged file
        # One line: some of pyarrow's messages run on over several.
        why = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise UsageError(f"unreadable {path.name} in {path.parent}: {why}") from None
    # An older run lacks some columns: added empty, all at once (one by one fragments the frame).
    if missing := [col for col in columns if col not in df.columns]:
        df = pd.concat([df, pd.DataFrame(dict.fromkeys(missing), index=df.index, dtype=object)], axis=1)
    return df.reset_index(drop=True)


def pick_examples(pairs: pd.DataFrame, comparisons: pd.DataFrame, n: int) -> list[Example]:
    """Rank non-exact prompts of cascade pairs and keep n, one per pair before repeating a pair.

    The candidate filter and the rank keys are computed column-wise (a run can hold 100k+ rows);
    only the rows that are walked in rank order become dicts.
    """
    if n <= 0 or comparisons.empty or pairs.empty:
        return []
    cascade = {r["pair_id"]: r for r in pairs.to_dict("records") if r.get("kind") in twins.PAIR_KINDS}
    cols = {c: comparisons[c].to_numpy(dtype=object) for c in ("pair_id", "prompt_index", "exact", "first_div",
                                                                 "topk_ok", "edit_distance")}  # fmt: skip
    keep = [
        i
        for i, (pid, pi, exact, fd) in enumerate(
            zip(cols["pair_id"], cols["prompt_index"], cols["exact"], cols["first_div"], strict=True)
        )
        if pid in cascade
        and as_int(pi) is not None
        and not ((not is_missing(exact) and bool(exact)) or (is_missing(exact) and is_missing(fd)))
    ]
    if not keep:
        return []
    fd_key = np.array([_fd_key(cols["first_div"][i]) for i in keep], dtype=float)
    ed_key = np.array([_ed_key(cols["edit_distance"][i]) for i in keep], dtype=float)
    topk_key = np.array([_topk_key(cols["topk_ok"][i]) for i in keep], dtype=np.int64)
    keys = list(zip(topk_key.tolist(), fd_key.tolist(), (-ed_key).tolist(), strict=True))
    # Only the n best rows (on these numeric keys, ties included) and each pair's best rows can be
    # chosen below: the walk takes each pair's best row first, then fills from the top of the ranking.
    if len(keep) > 4 * n:
        cut_key = keys[int(np.lexsort((-ed_key, fd_key, topk_key))[n - 1])]
        head = [j for j, k in enumerate(keys) if k <= cut_key]
    else:
        head = list(range(len(keep)))
    best: dict[Any, tuple] = {}
    for j, k in enumerate(keys):
        pid = cols["pair_id"][keep[j]]
        b = best.get(pid)
        if b is None or k < b:
            best[pid] = k
    # Every row tied with its pair's best numeric key: the exact rank below breaks the tie.
    tied = [j for j, k in enumerate(keys) if k == best[cols["pair_id"][keep[j]]]]
    cand = sorted(set(head) | set(tied))
    rows = comparisons.iloc[[keep[j] for j in cand]].to_dict("records")
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


def _topk_key(v: Any) -> int:
    return 0 if not is_missing(v) and not bool(v) else 1


def _fd_key(v: Any) -> float:
    return math.inf if is_missing(v) else float(v)


def _ed_key(v: Any) -> float:
    return 0.0 if is_missing(v) else float(v)


def _rank(r: dict) -> tuple:
    return (_topk_key(r["topk_ok"]), _fd_key(r["first_div"]), -_ed_key(r["edit_distance"]), str(r["pair_id"]),
            as_int(r["prompt_index"]))  # fmt: skip


def _attach_samples(
    run_dir: Path,
    examples: list[Example],
    samples: Callable[[set[tuple[str, int]]], dict[tuple[str, int], dict]] | None = None,
) -> None:
    wanted = {(c, e.prompt_index) for e in examples for c in (e.test_cell, e.ref_cell)}
    if not wanted:
        return
    if samples is not None:
        records = samples(wanted)
    else:
        records = read_samples(layout.samples_files(run_dir), wanted, sample_scan.prompt_ids(run_dir))
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


def read_samples(
    paths: Iterable[Path], wanted: set[tuple[str, int]], prompts: sample_scan.PromptIds | None = None
) -> dict[tuple[str, int], dict]:
    """The sample records of the wanted (cell_id, prompt_index) keys: each the record scoring read,
    from the attempt that finished its cell (:class:`~cascade_repro.rundir.sample_scan.SampleScan`, checked
    against ``prompts`` as scoring checks it), a later record of a prompt replacing an earlier one.

    Cost: one pass over the bytes; a sample line in the worker's layout is judged by its head alone,
    so only the wanted records are decoded.
    """
    out: dict[tuple[str, int], dict] = {}
    for path in paths:
        scan = sample_scan.SampleScan(path, prompts, keys=set(wanted))
        attempts: dict[tuple[str, int, int], dict] = {}
        for start, rec in scan:
            attempts[(rec["cell_id"], start, rec["prompt_index"])] = rec
        out.update({(cid, i): rec for (cid, start, i), rec in attempts.items() if scan.finished(start, cid)})
    return out


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
