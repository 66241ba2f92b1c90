"""Shrink a `regression` pair to the smallest wave that still shows the fault.

The oracle runs one wave twice on one engine (cascade arm, then flat arm, toggled as in the
matrix) and calls the wave failing when a prompt's first divergence breaks vLLM's top-k rule
(`metrics.divergence.topk_contains`): the flat arm's top-k does not hold the token cascade chose,
or the reverse. Plain divergence is not enough on a GPU: bf16 batch noise alone diverges
near-ties on a third of the prompts (docs/evidence), and a search driven by noise would end on a
case that does not reproduce. ``criterion="any"`` is there for exact (fp32, CPU) engines.

Search order: max-tokens first (from the recorded run, the first divergence bounds it), then
ddmin over the wave's requests (which shrinks the batch size too), then max-tokens again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cascade_repro import vllm_surface
from cascade_repro.errors import UsageError
from cascade_repro.judge.metrics.divergence import divergence_metrics
from cascade_repro.judge.outcome import REGRESSION
from cascade_repro.minimize.ddmin import ddmin
from cascade_repro.minimize.tokens import hex_bytes, token_bytes
from cascade_repro.plan.matrix import spec_of
from cascade_repro.plan.waves import waves
from cascade_repro.rundir import layout, sample_scan
from cascade_repro.rundir.manifest import Manifest, read_manifest
from cascade_repro.twin import CASCADE as TWIN

CRITERIA = ("topk", "any")
MIN_REQUESTS = vllm_surface.MIN_REQUESTS  # vLLM never runs cascade with fewer requests in a step


@dataclass
class Case:
    """One wave: the prompt index of each request, in submission order, and the tokens to generate."""

    prompt_indices: list[int]
    max_tokens: int


@dataclass
class Violation:
    """One request whose cascade output left the flat output at ``step``."""

    position: int  # request position in the wave
    prompt_index: int
    step: int
    topk_ok: bool | None
    cascade_token: int | None
    flat_token: int | None
    cascade_logprob: float | None
    flat_logprob: float | None
    # Each arm's logprob of the other arm's token, when its top-k holds it (None: outside top-k).
    cascade_lp_of_flat_token: float | None
    flat_lp_of_cascade_token: float | None
    cascade_topk: list[list[float]] = field(default_factory=list)
    flat_topk: list[list[float]] = field(default_factory=list)
    cascade_text: str = ""
    flat_text: str = ""
    # The tokens' bytes in hex (`e2 80`), "" where the tokenizer does not say: a byte fragment
    # decodes to U+FFFD alone, and issue.md shows these instead (minimize/tokens.py).
    cascade_bytes: str = ""
    flat_bytes: str = ""


@dataclass
class Trial:
    case: Case
    failed: bool
    violations: list[Violation]
    n_diverged: int
    cascade_steps: int
    total_steps: int
    wall_s: float


@dataclass
class MinimizeResult:
    pair_id: str
    criterion: str
    start: Case
    final: Trial | None  # None: the start case did not reproduce
    tests: int
    exhausted: bool
    wall_s: float
    trials: list[dict[str, Any]]
    # Repeated runs of the smallest failing cases: [{"requests", "max_tokens", "runs", "fails"}].
    confirmations: list[dict[str, int]] = field(default_factory=list)

    @property
    def final_confirmation(self) -> dict[str, int] | None:
        """The confirmation runs of the final case, if it had any."""
        if self.final is None:
            return None
        n, m = len(self.final.case.prompt_indices), self.final.case.max_tokens
        return next((c for c in self.confirmations if (c["requests"], c["max_tokens"]) == (n, m)), None)

    @property
    def stable(self) -> bool:
        """The final case failed on every confirmation run."""
        c = self.final_confirmation
        return c is not None and c["fails"] == c["runs"]

    @property
    def reproduced(self) -> bool:
        return self.final is not None and self.final.failed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "reproduced": self.reproduced,
            "stable": self.stable,
            "final_confirmation": self.final_confirmation,
        }


# --------------------------------------------------------------------------- picking the start


def pick_pair(run_dir: Path, pair_id: str | None) -> dict[str, Any]:
    """Return the row of the pair to minimize: the named one, else the smallest-batch regression."""
    import pandas as pd

    path = Path(run_dir) / layout.PAIRS
    if not path.is_file():
        raise UsageError(
            f"{run_dir} has no {layout.PAIRS}: is it a finished run? (`cascade-repro report --rescore` rebuilds it)"
        )
    # A run of several twins: its cascade pairs (the engine is built from their engine plan's twin).
    axes = read_manifest(Path(run_dir)).twins
    if TWIN not in axes:
        named = ",".join(t.name for t in axes)
        raise UsageError(
            f"minimize shrinks a cascade pair (both arms served by one engine); {run_dir} compares --twin {named}"
        )
    pairs = pd.read_parquet(path)
    pairs = pairs[pairs["kind"] == TWIN.pair_kind]
    if pair_id is not None:
        row = pairs[pairs["pair_id"] == pair_id]
        if row.empty:
            known = ", ".join(pairs["pair_id"]) or "none"
            raise UsageError(f"no cascade pair {pair_id!r} in {run_dir} (cascade pairs: {known})")
        return row.iloc[0].to_dict()
    reg = pairs[pairs["verdict"] == REGRESSION]
    if reg.empty:
        counts = pairs["verdict"].value_counts().to_dict()
        raise UsageError(
            f"no pair of {run_dir} is judged `regression` (verdicts: {counts}); "
            "name one with --pair to minimize it anyway"
        )
    return reg.sort_values(["batch", "pair_id"]).iloc[0].to_dict()


def _cell_samples(run_dir: Path, engine_key: str, cell_id: str) -> dict[int, dict[str, Any]]:
    path = layout.samples_path(run_dir, engine_key)
    return {r["prompt_index"]: r for r in sample_scan.iter_samples(path, {cell_id})}


def start_case(m: Manifest, run_dir: Path, pair: dict[str, Any], criterion: str) -> Case:
    """The recorded wave with the most failing prompts, cut to the earliest failing step + 1 tokens."""
    cells = m.plan.cell_map()
    test, ref = cells[pair["test_cell"]], cells[pair["ref_cell"]]
    a = _cell_samples(run_dir, test.engine_key, test.cell_id)
    b = _cell_samples(run_dir, ref.engine_key, ref.cell_id)
    failing: dict[int, int] = {}  # prompt index -> first divergence
    waves_of: dict[int, int] = {}
    for i, ra in a.items():
        rb = b.get(i)
        if rb is None:
            continue
        d = divergence_metrics(
            ra["token_ids"],
            ra.get("logprobs") or [],
            ra.get("topk") or [],
            rb["token_ids"],
            rb.get("logprobs") or [],
            rb.get("topk") or [],
        )
        if _fails(d, criterion):
            failing[i] = d["first_div"]
            waves_of[i] = int(ra.get("wave", 0))
    max_tokens = int(spec_of(m.spec_json).max_tokens)
    n_prompts = int(m.prompt_set.n or (max(a) + 1 if a else 0))
    batch = int(test.batch)
    plan = waves(n_prompts, batch)
    if not failing:
        # Nothing to go on in the samples (e.g. --pair on a noisy pair): start from the first wave.
        return Case([i for i, _ in plan[0]], max_tokens) if plan else Case([], max_tokens)
    by_wave: dict[int, list[int]] = {}
    for i, w in waves_of.items():
        by_wave.setdefault(w, []).append(i)
    w = max(sorted(by_wave), key=lambda k: len(by_wave[k]))
    first = min(failing[i] for i in by_wave[w])
    return Case([i for i, _ in plan[w]], min(max_tokens, first + 1))


def _fails(d: dict[str, Any], criterion: str) -> bool:
    if criterion == "any":
        return not d["exact"]
    return d["topk_ok"] is False


# --------------------------------------------------------------------------- the oracle


def _lp_of(topk: list, step: int, token: int | None) -> float | None:
    if token is None or step >= len(topk):
        return None
    for e in topk[step]:
        if int(e[0]) == token:
            return float(e[1])
    return None


class Oracle:
    """Run a case on both arms of one engine and judge it."""

    def __init__(
        self,
        engine: Any,
        rendered: list[list[int]],
        prefix_len: int,
        criterion: str,
        on_trial: Callable[[Trial], None] | None = None,
    ) -> None:
        if criterion not in CRITERIA:
            raise UsageError(f"--criterion must be one of {', '.join(CRITERIA)}, not {criterion!r}")
        self.engine, self.rendered, self.prefix_len, self.criterion = engine, rendered, prefix_len, criterion
        self.on_trial = on_trial
        self.trials: list[Trial] = []

    def __call__(self, case: Case) -> Trial:
        t0 = time.time()
        prompts = [self.rendered[i] for i in case.prompt_indices]
        cas, stats = self.engine.run_wave(prompts, TWIN.test, case.max_tokens, prefix_len=self.prefix_len)
        flat, _ = self.engine.run_wave(prompts, TWIN.ref, case.max_tokens, prefix_len=self.prefix_len)
        tok = self.engine.tokenizer()
        violations, diverged = [], 0
        for pos, (c, f) in enumerate(zip(cas, flat, strict=True)):
            d = divergence_metrics(c.token_ids, c.logprobs, c.topk, f.token_ids, f.logprobs, f.topk)
            diverged += not d["exact"]
            if not _fails(d, self.criterion):
                continue
            s = d["first_div"]
            ct = c.token_ids[s] if s < len(c.token_ids) else None
            ft = f.token_ids[s] if s < len(f.token_ids) else None
            violations.append(
                Violation(
                    position=pos,
                    prompt_index=case.prompt_indices[pos],
                    step=s,
                    topk_ok=d["topk_ok"],
                    cascade_token=ct,
                    flat_token=ft,
                    cascade_logprob=c.logprobs[s] if s < len(c.logprobs) else None,
                    flat_logprob=f.logprobs[s] if s < len(f.logprobs) else None,
                    cascade_lp_of_flat_token=_lp_of(c.topk, s, ft),
                    flat_lp_of_cascade_token=_lp_of(f.topk, s, ct),
                    cascade_topk=[[int(e[0]), float(e[1])] for e in (c.topk[s] if s < len(c.topk) else [])],
                    flat_topk=[[int(e[0]), float(e[1])] for e in (f.topk[s] if s < len(f.topk) else [])],
                    cascade_text=tok.decode([ct]) if ct is not None else "",
                    flat_text=tok.decode([ft]) if ft is not None else "",
                    cascade_bytes=hex_bytes(token_bytes(tok, ct)) if ct is not None else "",
                    flat_bytes=hex_bytes(token_bytes(tok, ft)) if ft is not None else "",
                )
            )
        trial = Trial(
            case=Case(list(case.prompt_indices), case.max_tokens),
            failed=bool(violations),
            violations=violations,
            n_diverged=diverged,
            cascade_steps=int(stats.cascade_steps),
            total_steps=int(stats.total_steps),
            wall_s=round(time.time() - t0, 3),
        )
        self.trials.append(trial)
        if self.on_trial:
            self.on_trial(trial)
        return trial


# --------------------------------------------------------------------------- the search


def search(
    oracle: Callable[[Case], Trial],
    start: Case,
    max_tests: int = 64,
    min_requests: int = MIN_REQUESTS,
    full_tokens: int | None = None,
    confirm: int = 3,
) -> tuple[Trial | None, int, bool, list[dict[str, int]]]:
    """Return (the smallest failing trial found or None, trials run, stopped by max_tests, confirmations).

    Near cascade's thresholds a failure can depend on timing: with 8 requests, cascade runs only
    when all 8 land in one scheduler step, and the engine may start a step before the last
    request arrives. So the smallest failing case is run ``confirm`` times in all; if any run
    passes, the next larger failing case is tried, and the first that fails every time wins
    (else the one that failed most often). Confirmation runs are not bounded by ``max_tests``
    but by ``confirm`` x 3 candidates.
    """
    tests = 0
    failing: list[Trial] = []

    def run(case: Case) -> Trial:
        nonlocal tests
        tests += 1
        t = oracle(case)
        if t.failed:
            failing.append(t)
        return t

    first = run(start)
    if not first.failed and full_tokens and full_tokens > start.max_tokens:
        first = run(Case(start.prompt_indices, full_tokens))  # the cut was too tight: use the recorded length
    if not first.failed:
        return None, tests, False, []
    best = first
    tokens = first.case.max_tokens

    def fails(subset: list[int]) -> bool:
        nonlocal best
        t = run(Case(subset, tokens))
        if t.failed:  # ddmin moves to every failing subset it sees, so the last one is its answer
            best = t
        return t.failed

    dd = ddmin(start.prompt_indices, fails, max_tests=max(0, max_tests - tests), min_size=min_requests)
    shorter = min(v.step for v in best.violations) + 1
    if shorter < best.case.max_tokens and tests < max_tests:
        t = run(Case(best.case.prompt_indices, shorter))
        if t.failed:
            best = t
    if confirm <= 1:
        return (
            best,
            tests,
            dd.exhausted,
            [
                {
                    "requests": len(best.case.prompt_indices),
                    "max_tokens": best.case.max_tokens,
                    "runs": 1,
                    "fails": 1,
                }
            ],
        )

    def key(t: Trial) -> tuple[int, int]:
        return len(t.case.prompt_indices), t.case.max_tokens

    seen: set[tuple[tuple[int, ...], int]] = set()
    candidates: list[Trial] = []
    for t in sorted([best, *failing], key=key):
        ident = (tuple(t.case.prompt_indices), t.case.max_tokens)
        if ident not in seen:
            seen.add(ident)
            candidates.append(t)
    confirmations: list[dict[str, int]] = []
    chosen: Trial | None = None
    for cand in candidates[:3]:
        fails_n, last_fail = 1, cand
        for _ in range(confirm - 1):
            t = run(cand.case)
            if t.failed:
                fails_n += 1
                last_fail = t
        confirmations.append(
            {
                "requests": len(cand.case.prompt_indices),
                "max_tokens": cand.case.max_tokens,
                "runs": confirm,
                "fails": fails_n,
            }
        )
        if fails_n == confirm:
            chosen = last_fail
            break
    if chosen is None:  # nothing failed every time: the most reliable of those tried, smaller first
        top = max(confirmations, key=lambda c: (c["fails"], -c["requests"]))
        chosen = next(
            t
            for t in candidates
            if (len(t.case.prompt_indices), t.case.max_tokens) == (top["requests"], top["max_tokens"])
        )
    return chosen, tests, dd.exhausted, confirmations
