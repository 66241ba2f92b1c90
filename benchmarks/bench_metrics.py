"""Benchmark 3: metrics throughput (repetition + divergence), single process and N processes.

For each size (completions; half as many test/ref pairs) the synthetic completions of
``synth.py`` are generated first (not timed), then scored: ``repetition_metrics`` on every
completion and ``divergence_metrics`` on every pair -- the full set ``compare.build_tables`` uses.
Only scoring is timed. Throughput = generated tokens scored / wall seconds; each size is scored
``--repeats`` times and the best pass is the headline (the median is kept too): on a shared VM the
best pass is the least disturbed one, and the 1-minute load average is recorded next to it.

The multi-process figure forks ``--procs`` workers after generation (they inherit the data),
releases them together through a barrier and takes the wall time from the barrier to the last
worker's end (``time.perf_counter`` is CLOCK_MONOTONIC, comparable across processes).

    python benchmarks/bench_metrics.py --sizes 1000,10000,100000 --procs 2 --out metrics.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

import synth  # noqa: E402 - the seeded data the tests use too

from cascade_repro.judge.metrics import divergence_metrics, edit_distance_norm, repetition_metrics  # noqa: E402

TARGET_TOK_S = 1_000_000


def score(pairs: list, rep: Any = repetition_metrics, div: Any = divergence_metrics) -> int:
    """Score every pair (repetition of both sides, divergence of the pair); return tokens scored."""
    tokens = 0
    for a, b in pairs:
        ta, tb = a["token_ids"], b["token_ids"]
        rep(ta, a["text"], a["finish_reason"])
        rep(tb, b["text"], b["finish_reason"])
        div(ta, a["logprobs"], a["topk"], tb, b["logprobs"], b["topk"])
        tokens += len(ta) + len(tb)
    return tokens


# Where a source tree keeps the metrics: judge/metrics/ now, metrics/ in trees from before the stages.
METRICS_DIRS = (("cascade_repro", "judge", "metrics"), ("cascade_repro", "metrics"))


def baseline_dir(src: Path) -> tuple[str, ...] | None:
    """The package path of the metrics in another source tree, or None when it holds none."""
    return next((p for p in METRICS_DIRS if (src.joinpath(*p) / "repetition.py").is_file()), None)


def load_baseline(src: Path) -> tuple[Any, Any]:
    """``repetition_metrics`` and ``divergence_metrics`` from another checkout's source tree.

    The baseline's divergence module imports its repetition module by the package's name; while it
    loads, that name is the baseline's module, so nothing of this tree slips into the A/B.
    """
    import importlib.util

    parts = baseline_dir(src)
    assert parts is not None, src
    mods: dict[str, Any] = {}
    for name in ("repetition", "divergence"):
        spec = importlib.util.spec_from_file_location(f"baseline_{name}", src.joinpath(*parts) / f"{name}.py")
        assert spec and spec.loader, src
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        key = ".".join((*parts, "repetition"))
        before = sys.modules.get(key)
        if "repetition" in mods:
            sys.modules[key] = mods["repetition"]
        try:
            spec.loader.exec_module(mod)
        finally:
            if before is not None:
                sys.modules[key] = before
        mods[name] = mod
    return mods["repetition"].repetition_metrics, mods["divergence"].divergence_metrics


def ab(pairs: list, baseline: tuple[Any, Any], repeats: int) -> dict[str, Any]:
    """Interleaved passes, this tree vs the baseline, on the same data: CPU seconds of each (best)."""
    cur, base = [], []
    for _ in range(repeats):
        for fns, out in (((repetition_metrics, divergence_metrics), cur), (baseline, base)):
            c0 = time.process_time()
            tokens = score(pairs, *fns)
            out.append(time.process_time() - c0)
    return {"tokens": tokens, "current_cpu_s": min(cur), "baseline_cpu_s": min(base),
            "current_tok_per_cpu_s": tokens / min(cur), "baseline_tok_per_cpu_s": tokens / min(base),
            "speedup": min(base) / min(cur)}  # fmt: skip


_DATA: list = []


def _worker(lo: int, hi: int, barrier, out) -> None:
    barrier.wait()
    t0 = time.perf_counter()
    tokens = score(_DATA[lo:hi])
    out.put((t0, time.perf_counter(), tokens))


def run_parallel(procs: int) -> tuple[float, int]:
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(procs)
    out = ctx.Queue()
    n = len(_DATA)
    bounds = [(n * i // procs, n * (i + 1) // procs) for i in range(procs)]
    ps = [ctx.Process(target=_worker, args=(lo, hi, barrier, out)) for lo, hi in bounds]
    for p in ps:
        p.start()
    res = [out.get() for _ in ps]
    for p in ps:
        p.join()
    return max(r[1] for r in res) - min(r[0] for r in res), sum(r[2] for r in res)


def _spin(_: int) -> float:
    t0 = time.perf_counter()
    x = 0
    for i in range(5_000_000):
        x += i * i
    return time.perf_counter() - t0


def cpu_parallel_capacity(procs: int) -> float:
    """Aggregate speed of ``procs`` busy processes relative to one (2.0 = two full cores).

    A CPU-bound spin loop, alone and then in ``procs`` processes at once: on a VM whose vCPUs
    share a physical core this is ~1.0 and no multi-process scoring can beat one process.
    """
    alone = _spin(0)
    with mp.get_context("fork").Pool(procs) as pool:
        t0 = time.perf_counter()
        pool.map(_spin, range(procs))
        wall = time.perf_counter() - t0
    return procs * alone / wall


def worst_case_pairs() -> dict[str, float]:
    """µs per divergence_metrics call on adversarial pairs: the edit distance is what could blow up."""
    import random

    rng = random.Random(7)
    out = {}
    for label, n in (("256 vs 256, unrelated after token 0", 256), ("2048 vs 2048, unrelated", 2048)):
        a = [rng.randrange(50_000) for _ in range(n)]
        b = [rng.randrange(50_000) for _ in range(n)]
        reps = 200 if n <= 256 else 20
        t0 = time.perf_counter()
        for _ in range(reps):
            edit_distance_norm(a, b)
        out[label] = (time.perf_counter() - t0) / reps * 1e6
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000", help="completions per run (comma list)")
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1, help="processes for the parallel figure")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="scoring passes per size; best and median reported")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--baseline-src", type=Path, help="A/B against the metrics of another source tree, e.g. "
                    "`git archive HEAD cascade_repro | tar -x -C /tmp/head-src` -> /tmp/head-src")  # fmt: skip
    ap.add_argument("--baseline-size", type=int, default=10_000, help="completions for the A/B")
    args = ap.parse_args()
    if args.baseline_src and baseline_dir(args.baseline_src) is None:
        looked = " or ".join("/".join((*p, "repetition.py")) for p in METRICS_DIRS)
        ap.error(f"--baseline-src {args.baseline_src}: no metrics there (looked for {looked})")
    sizes = [int(s) for s in args.sizes.split(",")]

    synth._tables()
    rows = []
    global _DATA
    for n in sizes:
        t0 = time.perf_counter()
        _DATA = synth.pairs(n // 2, seed=args.seed)
        gen_s = time.perf_counter() - t0
        load0 = os.getloadavg()[0]
        singles, cpus, parallels = [], [], []
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            tokens = score(_DATA)
            singles.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            if args.procs > 1:
                wall, ptokens = run_parallel(args.procs)
                assert ptokens == tokens
                parallels.append(wall)
        single_s = min(singles)
        row = {"completions": 2 * len(_DATA), "pairs": len(_DATA), "tokens": tokens, "gen_s": round(gen_s, 2),
               "single_s": round(single_s, 3), "single_tok_s": tokens / single_s,
               "single_tok_s_median": tokens / statistics.median(singles), "single_runs_s": singles,
               "single_tok_per_cpu_s": tokens / min(cpus), "single_runs_cpu_s": cpus,
               "loadavg_1min": [load0, os.getloadavg()[0]]}  # fmt: skip
        if parallels:
            row.update(parallel_s=round(min(parallels), 3), parallel_tok_s=tokens / min(parallels),
                       parallel_tok_s_median=tokens / statistics.median(parallels), parallel_runs_s=parallels,
                       procs=args.procs)  # fmt: skip
        row["us_per_completion_single"] = single_s / row["completions"] * 1e6
        rows.append(row)
        print(f"  {n:>7} completions: {row['single_tok_s']:,.0f} tok/s single"
              + (f", {row['parallel_tok_s']:,.0f} tok/s x{args.procs}" if args.procs > 1 else ""), flush=True)  # fmt: skip
        _DATA = []
    worst = worst_case_pairs()
    abres = None
    if args.baseline_src:
        _DATA = synth.pairs(args.baseline_size // 2, seed=args.seed + 1)
        abres = ab(_DATA, load_baseline(args.baseline_src), args.repeats)
        _DATA = []
    capacity = cpu_parallel_capacity(args.procs) if args.procs > 1 else 1.0

    print()
    hdr = f"{'completions':>11} {'tokens':>11} {'1 proc s':>9} {'1 proc tok/s':>13} {'median':>13} {'tok/CPU-s':>13} {'µs/compl.':>9}"
    if args.procs > 1:
        hdr += f" {f'{args.procs} proc s':>9} {f'{args.procs} proc tok/s':>13}"
    print(hdr + "   load avg")
    for r in rows:
        line = (f"{r['completions']:>11,} {r['tokens']:>11,} {r['single_s']:>9.2f} {r['single_tok_s']:>13,.0f}"
                f" {r['single_tok_s_median']:>13,.0f} {r['single_tok_per_cpu_s']:>13,.0f}"
                f" {r['us_per_completion_single']:>9.1f}")  # fmt: skip
        if args.procs > 1:
            line += f" {r['parallel_s']:>9.2f} {r['parallel_tok_s']:>13,.0f}"
        print(line + "   " + "→".join(f"{x:.1f}" for x in r["loadavg_1min"]))
    big = rows[-1]
    print(f"\ntarget >= {TARGET_TOK_S:,} tok/s at {big['completions']:,} completions: "
          f"single {big['single_tok_s'] / TARGET_TOK_S:.2f}x"
          + (f", {args.procs} procs {big['parallel_tok_s'] / TARGET_TOK_S:.2f}x" if args.procs > 1 else ""))  # fmt: skip
    if len(rows) > 1:
        scale = rows[-1]["us_per_completion_single"] / rows[0]["us_per_completion_single"]
        print(f"µs per completion at {rows[-1]['completions']:,} / at {rows[0]['completions']:,}: {scale:.2f} (1.00 = linear)")
    for k, v in worst.items():
        print(f"worst-case edit distance, {k}: {v:,.0f} µs per pair")
    if abres:
        print(f"A/B vs {args.baseline_src} on {args.baseline_size:,} completions (interleaved, best of "
              f"{args.repeats}, CPU time): {abres['baseline_tok_per_cpu_s']:,.0f} -> {abres['current_tok_per_cpu_s']:,.0f} "
              f"tok/CPU-s ({abres['speedup']:.2f}x)")  # fmt: skip
    if args.procs > 1:
        print(f"CPU capacity of {args.procs} processes (spin loop): {capacity:.2f}x one process")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS (data + scoring, parent): {peak:,.0f} MiB")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "worst_case_us": worst, "parallel_capacity": capacity, "ab": abres, "target_tok_s": TARGET_TOK_S,
                                        "python": platform.python_version(), "peak_rss_mib": peak}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
