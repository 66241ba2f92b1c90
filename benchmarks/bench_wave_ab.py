"""Benchmark 1, within one engine: the harness's per-wave cost against a bare ``LLM.generate``, interleaved.

``bench_vllm_overhead.py`` compares two engine starts run one after the other; on an H200 with a
135M model a batch-1 wave is launch-bound, so it measures the host CPU of that moment (the raw loop's
own b1 waves went from 388 to 299 ms within 20 s) and one pass per side cannot resolve 3 %. Here one
process builds the harness's own engine (``worker.build_engine``: the probe loaded, the same ``vllm.LLM``
kwargs a worker gets) and runs each wave of each batch size under three arms, in a rotating order
(ABC, BCA, CAB, ...), so machine drift hits every arm alike:

- **raw**: what a bare loop asks of vLLM for a wave: ``reset_prefix_cache``, a 1-token greedy
  warm-up of the shared prefix, one ``llm.generate`` with the harness's ``SamplingParams``. The
  probe is idle (the previous harness wave's sync left it so): vLLM's own decisions.
- **harness**: ``VLLMEngine.run_wave`` (control writes, the sync RPC, conversion of the outputs)
  plus the worker's records (``worker.wave_records``) queued to a background ``JsonlWriter``, as a
  worker does; the writer's remaining work once the wave returns (``drain``) is waited for outside
  the arm's time, and the summary also gives the ratio with it added (the foreground cost).
- **harness-nogc**: the same with Python's garbage collector disabled during the wave (the
  conversion of vLLM's outputs grew to 300-560 ms at b32/b64 on the H200, irregularly: a collection
  over the engine's millions of objects is the suspect).

The cascade arm on both sides follows vLLM's heuristic (not forced), so raw and harness compute the
same thing: their outputs are compared token by token (a rerun inside one engine is bitwise
identical). Each batch size's first round is a warm-up and is not counted (first-call compiles).
The table gives, per batch and arm, the median wave ms, and the median and range of the paired
ratio arm/raw; the overall ratio is the sum over counted waves (the target: harness <= 1.03 x raw).
The engine start is outside every figure.

    python benchmarks/bench_wave_ab.py --out $OUT/wave_ab.json

Needs vLLM and a GPU (or the CPU test's fake vLLM, which proves the plumbing only). Exit code 0:
harness within 1.03 x raw overall; 1: not; 2: incomplete.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cascade_repro.run.manifest import Manifest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ARMS = ("raw", "harness", "harness-nogc")
TARGET = 1.03


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--limit", type=int, default=48, help="prompts (the shipped set's first N)")
    ap.add_argument("--batch", default="1,8,32,64")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--waves", type=int, default=6, help="waves per batch size and round, at most")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per batch size (the first is warm-up)")
    ap.add_argument("--fa-version", default="", help="2 or 3 (default: vLLM's choice)")
    ap.add_argument("--graphs-for-batches", action="store_true", default=True)
    ap.add_argument("--ignore-eos", action="store_true",
                    help="every request generates --max-tokens tokens, so the arms do the same work even "
                         "where their tokens differ (they did on most b>=8 waves on an H200)")  # fmt: skip
    ap.add_argument("--gc-freeze", action="store_true",
                    help="worker.freeze_heap() once the engine is up, as a worker does (the engine's objects "
                         "leave the collector's scans); compare the harness/raw ratio with a run without it")  # fmt: skip
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting rounds after this")
    ap.add_argument("--out", type=Path, required=True)
    return ap.parse_args(argv)


def prepare_run(args: argparse.Namespace, results: Path) -> tuple[Path, Manifest]:
    """A real run directory for the matrix (so the engine gets exactly a worker's settings)."""
    from cascade_repro.judge.verdicts import Thresholds
    from cascade_repro.plan.matrix import MatrixSpec
    from cascade_repro.run import runstore
    from cascade_repro.run.runner import RunOptions, prepare

    values: dict[str, Any] = {
        "engine": "vllm",
        "model": args.model,
        "limit": args.limit,
        "batch": [int(b) for b in args.batch.split(",")],
        "cascade": [True],
        "max_tokens": args.max_tokens,
        "auto_controls": False,
        "graphs_for_batches": bool(args.graphs_for_batches),
        "ignore_eos": bool(args.ignore_eos),
    }
    if args.fa_version:
        values["fa_versions"] = [int(args.fa_version)]
    spec = MatrixSpec.from_dict(values, source="bench")
    opts = RunOptions(
        results_dir=results, run_id="wave-ab", fresh=True, fail_on="regression", thresholds=Thresholds(),
        command="bench_wave_ab", progress=False,
    )  # fmt: skip
    prepared = prepare(spec, opts)
    prepared.write()
    return prepared.run_dir, runstore.read_manifest(prepared.run_dir)


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per batch and arm: median ms, paired ratio to raw (median, min, max); overall sum ratios."""
    counted = [r for r in rows if not r["warmup"]]
    out: dict[str, Any] = {"per_batch": {}, "overall": {}}
    for b in sorted({r["batch"] for r in counted}):
        rb = [r for r in counted if r["batch"] == b]
        entry: dict[str, Any] = {}
        for arm in ARMS:
            secs = [r["arms"][arm]["s"] for r in rb if arm in r["arms"]]
            ratios = [r["arms"][arm]["s"] / r["arms"]["raw"]["s"] for r in rb if arm in r["arms"] and "raw" in r["arms"]]
            phases: dict[str, float | None] = {}
            if arm != "raw":
                names = {k for r in rb if arm in r["arms"] for k in r["arms"][arm].get("phases", {})}
                phases = {k: median([r["arms"][arm]["phases"][k] * 1e3 for r in rb if k in r["arms"].get(arm, {}).get("phases", {})]) for k in sorted(names)}
            entry[arm] = {
                "n": len(secs),
                "median_ms": median([s * 1e3 for s in secs]),
                "ratio_median": median(ratios),
                "ratio_min": min(ratios) if ratios else None,
                "ratio_max": max(ratios) if ratios else None,
                "phases_ms": phases,
            }
        out["per_batch"][str(b)] = entry
    raw_total = sum(r["arms"]["raw"]["s"] for r in counted if "raw" in r["arms"])
    for arm in ARMS:
        both = [r for r in counted if arm in r["arms"] and "raw" in r["arms"]]
        tot = sum(r["arms"][arm]["s"] for r in both)
        base = sum(r["arms"]["raw"]["s"] for r in both)
        out["overall"][arm] = {"s": round(tot, 4), "ratio": round(tot / base, 4) if base else None}
        if arm != "raw":  # with the writer's thread's work added: as if the JSON ran in the foreground
            fg = tot + sum(r["arms"][arm].get("phases", {}).get("drain_s", 0.0) for r in both)
            out["overall"][arm]["ratio_with_drain"] = round(fg / base, 4) if base else None
    out["overall"]["raw_s"] = round(raw_total, 4)
    out["identical"] = {
        "waves": sum(1 for r in counted if r.get("identical") is not None),
        "identical": sum(1 for r in counted if r.get("identical")),
        "harness_eq_nogc": sum(1 for r in counted if r.get("harness_eq_nogc")),
    }
    return out


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| batch | raw ms | harness ms | harness/raw median [min, max] | nogc ms | nogc/raw median [min, max] | harness phases (ms) |",
        "|---|---|---|---|---|---|---|",
    ]

    def f(x: Any, spec: str = ".1f") -> str:
        return "-" if x is None else format(x, spec)

    for b, e in summary["per_batch"].items():
        h, g, r = e["harness"], e["harness-nogc"], e["raw"]
        ph = ", ".join(f"{k.removesuffix('_s')} {f(v)}" for k, v in h["phases_ms"].items())
        lines.append(
            f"| {b} | {f(r['median_ms'])} | {f(h['median_ms'])} | {f(h['ratio_median'], '.3f')} "
            f"[{f(h['ratio_min'], '.3f')}, {f(h['ratio_max'], '.3f')}] | {f(g['median_ms'])} | "
            f"{f(g['ratio_median'], '.3f')} [{f(g['ratio_min'], '.3f')}, {f(g['ratio_max'], '.3f')}] | {ph} |"
        )
    o = summary["overall"]
    lines.append(
        f"| **all** | {f(o['raw_s'] * 1e3, '.0f')} | {f(o['harness']['s'] * 1e3, '.0f')} | **{f(o['harness']['ratio'], '.3f')}** | "
        f"{f(o['harness-nogc']['s'] * 1e3, '.0f')} | **{f(o['harness-nogc']['ratio'], '.3f')}** | |"
    )
    lines.append(
        f"\nwith the background writer's remaining work (drain) added to each harness wave: harness "
        f"{f(o['harness'].get('ratio_with_drain'), '.3f')}, nogc {f(o['harness-nogc'].get('ratio_with_drain'), '.3f')}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_begin = time.monotonic()
    from cascade_repro import engines
    from cascade_repro.plan.matrix import waves
    from cascade_repro.prompts.chat import prompt_hash, render_all
    from cascade_repro.run import runstore
    from cascade_repro.run.worker import build_engine, wave_records

    results = Path(tempfile.mkdtemp(prefix="wave-ab-", dir=os.environ.get("TMPDIR")))
    run_dir, run = prepare_run(args, results)
    key, eplan = next(iter(run.plan.engines.items()))
    t0 = time.monotonic()
    engine = build_engine(run, eplan, run_dir)
    start_s = time.monotonic() - t0
    print(f"engine {key} up in {start_s:.1f} s", flush=True)
    if args.gc_freeze:
        from cascade_repro.run.worker import freeze_heap

        print(f"gc.freeze() as the worker does it: {freeze_heap():,} objects frozen", flush=True)
    prompts = runstore.read_prompts(run_dir)
    rendered, shared = render_all(engine.tokenizer(), run.prompt_set.system_prompt_text, [p["prompt"] for p in prompts])
    hashes = [prompt_hash(r) for r in rendered]
    llm = engine.llm
    # As a worker writes: on a background thread for vLLM (EngineInfo.background_writes).
    writer = runstore.JsonlWriter(runstore.samples_path(run_dir, key), background=engines.get("vllm").background_writes)
    sp = engine._SamplingParams
    tp = engine._TokensPrompt
    greedy = dict(temperature=0.0, seed=eplan.seed, ignore_eos=bool(args.ignore_eos))
    p = max(0, min(shared, min(map(len, rendered)) - 1))

    def raw_wave(batch_prompts: list[list[int]]) -> tuple[float, list[list[int]]]:
        t = time.perf_counter()
        if not llm.reset_prefix_cache():
            for _ in range(20):
                time.sleep(0.05)
                if llm.reset_prefix_cache():
                    break
        if p > 0:
            llm.generate([tp(prompt_token_ids=list(batch_prompts[0][: p + 1]))], sp(max_tokens=1, **greedy), use_tqdm=False)
        outs = llm.generate(
            [tp(prompt_token_ids=list(x)) for x in batch_prompts],
            sp(max_tokens=args.max_tokens, **engine.logprob_kwargs(), **greedy), use_tqdm=False,
        )  # fmt: skip
        return time.perf_counter() - t, [list(o.outputs[0].token_ids) for o in outs]

    def harness_wave(cid: str, w: int, wave: list[tuple[int, bool]], nogc: bool) -> tuple[float, list[list[int]], dict]:
        was = gc.isenabled()
        if nogc:
            gc.disable()
        try:
            t = time.perf_counter()
            comps, stats = engine.run_wave([rendered[i] for i, _ in wave], "cascade", args.max_tokens, prefix_len=shared)
            samples, wave_rec = wave_records(cid, w, wave, comps, stats, prompts, hashes, rendered)
            for rec in samples:
                writer.write(rec)
            wave_rec["wall_s"] = round(time.perf_counter() - t, 4)
            writer.write(wave_rec)
            writer.flush()
            took = time.perf_counter() - t
            # What the writer's thread still had to do once the wave returned: the JSON a worker
            # overlaps with its next wave. Waited for here, outside the arm's time, so no other
            # arm's time holds it; the table gives the ratio with it added too (the foreground cost).
            t = time.perf_counter()
            writer.wait()
            drain = time.perf_counter() - t
        finally:
            if nogc and was:
                gc.enable()
        phases = dict((stats.extra or {}).get("phases", {}), drain_s=drain)
        return took, [c.token_ids for c in comps], phases

    rows: list[dict[str, Any]] = []
    complete = True
    data: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "engine_start_s": round(start_s, 2),
                            "gc_frozen": gc.get_freeze_count()}  # fmt: skip
    for batch in [int(b) for b in args.batch.split(",")]:
        wv = waves(len(rendered), batch)[: args.waves]
        cid = f"ab-b{batch}"
        for rnd in range(args.rounds):
            if time.monotonic() - t_begin > args.budget_s:
                complete = False
                print(f"budget reached before b{batch} round {rnd}", flush=True)
                break
            for w, wave in enumerate(wv):
                order = [ARMS[(i + rnd + w) % len(ARMS)] for i in range(len(ARMS))]
                row: dict[str, Any] = {"batch": batch, "round": rnd, "wave": w, "warmup": rnd == 0, "order": order, "arms": {}}
                toks: dict[str, list[list[int]]] = {}
                real = [j for j, (_, is_real) in enumerate(wave) if is_real]
                for arm in order:
                    if arm == "raw":
                        s, t = raw_wave([rendered[i] for i, _ in wave])
                        row["arms"][arm] = {"s": s}
                    else:
                        s, t, ph = harness_wave(cid, w, wave, nogc=arm == "harness-nogc")
                        row["arms"][arm] = {"s": s, "phases": ph}
                    toks[arm] = [t[j] for j in real]
                row["identical"] = all(toks[a] == toks["raw"] for a in ARMS)
                row["harness_eq_nogc"] = toks["harness"] == toks["harness-nogc"]
                rows.append(row)
            print(f"b{batch} round {rnd}: " + ", ".join(
                f"{a} {statistics.median([r['arms'][a]['s'] for r in rows if r['batch'] == batch and r['round'] == rnd]) * 1e3:.1f} ms"
                for a in ARMS), flush=True)  # fmt: skip
        data.update(rows=rows, summary=summarize(rows), complete=complete)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1))
    writer.close()
    engine.close()
    summary = summarize(rows)
    data.update(rows=rows, summary=summary, complete=complete, total_s=round(time.monotonic() - t_begin, 1))
    args.out.write_text(json.dumps(data, indent=1))
    print(table(summary))
    ident = summary["identical"]
    print(f"token-identical waves (raw = harness = nogc): {ident['identical']}/{ident['waves']}; "
          f"harness = nogc: {ident['harness_eq_nogc']}/{ident['waves']}")  # fmt: skip
    ratio = summary["overall"]["harness"]["ratio"]
    if not complete or ratio is None:
        return 2
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
