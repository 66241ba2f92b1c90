"""Top-k logprobs and throughput: the same waves asked for top-5 and top-20, interleaved in one engine.

Issue 43 part 3: ask the engine for top-20 logprobs (vLLM's default ``max_logprobs``) when the user has
not chosen, if that costs little. This measures the cost. One process builds the harness's own engine
for a matrix (``worker.build_engine``: the same engine a worker gets, its probe loaded) and runs every
wave of every batch size once per top-k (``--topk 5,20``), the order of the top-k values rotating from
wave to wave so machine drift hits each alike. Each wave is timed twice: the engine's ``run_wave``
(generation and the conversion of vLLM's logprobs into completions) and with the worker's sample
records encoded as JSON (what a worker writes: a top-20 record holds four times the candidates). The
first round of each batch size is a warm-up and is not counted.

The table gives, per batch and top-k, the generated tokens per second of the counted waves (fillers
included: they are generated), and the ratio to the first top-k value's; ``overall`` sums every batch.
The decision (``engines/base.py``'s ``DEFAULT_TOPK``) is the lead's, from these numbers on the GPU:

    python benchmarks/topk_throughput.py --engine vllm --limit 64 --batch 8,64 --max-tokens 128 \
        --ignore-eos --out $OUT/topk.json

``--engine fake`` (or ``hf``) runs the plumbing on a CPU; the fake engine keeps at most 8 candidates
per step, so its "top-20" is a top-8 (said in the output). Exit code 0 when every wave ran, 2 when the
budget cut it short.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FAKE_MAX_TOPK = 8  # engines/fake.py: one digest holds eight candidates


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="vllm", help="vllm, hf or fake")
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--prompts", default="ko-ifeval-style")
    ap.add_argument("--system-prompt", default="ko")
    ap.add_argument("--limit", type=int, default=64, help="prompts (the set's first N)")
    ap.add_argument("--batch", default="8,64")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--topk", default="5,20", help="the top-k values compared, the first the baseline")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per batch size (the first is warm-up)")
    ap.add_argument("--waves", type=int, default=8, help="waves per batch size and round, at most")
    ap.add_argument("--fa-version", default="", help="2 or 3 (default: vLLM's choice)")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="every request generates --max-tokens tokens, so both top-k values do the same work")  # fmt: skip
    ap.add_argument("--graphs-for-batches", action="store_true")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting rounds after this")
    ap.add_argument("--out", type=Path, help="JSON with every counted wave and the summary")
    args = ap.parse_args(argv)
    try:
        args.topks = [int(k) for k in args.topk.split(",") if k.strip()]
        args.batches = [int(b) for b in args.batch.split(",") if b.strip()]
    except ValueError:
        ap.error("--topk and --batch take comma-separated integers")
    if len(args.topks) < 2 or len(set(args.topks)) != len(args.topks):
        ap.error("--topk needs at least two different values, e.g. 5,20")
    if args.rounds < 2:
        ap.error("--rounds needs at least 2 (the first is warm-up)")
    return args


def prepare_run(args: argparse.Namespace, results: Path) -> tuple[Path, Any]:
    """A real run directory for the matrix, built for the largest top-k (what the engine must allow)."""
    from cascade_repro.judge.verdicts import Thresholds
    from cascade_repro.pipeline import RunOptions
    from cascade_repro.plan.matrix import MatrixSpec
    from cascade_repro.run.runner import prepare
    from cascade_repro.rundir import manifest

    values: dict[str, Any] = {
        "engine": args.engine,
        "model": args.model,
        "prompts": args.prompts,
        "system_prompt": args.system_prompt,
        "limit": args.limit,
        "batch": args.batches,
        "cascade": [True],
        "max_tokens": args.max_tokens,
        "auto_controls": False,
        "topk": max(args.topks),
        "ignore_eos": bool(args.ignore_eos),
        "graphs_for_batches": bool(args.graphs_for_batches),
    }
    if args.fa_version:
        values["fa_versions"] = [int(args.fa_version)]
    spec = MatrixSpec.from_dict(values, source="bench")
    opts = RunOptions(
        results_dir=results, run_id="topk", fresh=True, fail_on="regression", thresholds=Thresholds(),
        command="topk_throughput", progress=False,
    )  # fmt: skip
    prepared = prepare(spec, opts)
    prepared.write()
    return prepared.run_dir, manifest.read_manifest(prepared.run_dir)


def summarize(rows: list[dict[str, Any]], topks: list[int]) -> dict[str, Any]:
    """Per batch and top-k, and overall: counted waves, tokens, seconds, tokens/s, ratio to the baseline."""

    def entry(rs: list[dict[str, Any]], k: int) -> dict[str, Any]:
        mine = [r["arms"][str(k)] for r in rs if str(k) in r["arms"]]
        tokens = sum(a["tokens"] for a in mine)
        wave_s = sum(a["wave_s"] for a in mine)
        total_s = wave_s + sum(a["records_s"] for a in mine)
        return {
            "waves": len(mine),
            "tokens": tokens,
            "wave_s": round(wave_s, 4),
            "with_records_s": round(total_s, 4),
            "tok_s": round(tokens / wave_s, 1) if wave_s else None,
            "tok_s_with_records": round(tokens / total_s, 1) if total_s else None,
        }

    counted = [r for r in rows if not r["warmup"]]
    out: dict[str, Any] = {"per_batch": {}, "overall": {}}
    for b in sorted({r["batch"] for r in counted}):
        rb = [r for r in counted if r["batch"] == b]
        out["per_batch"][str(b)] = {str(k): entry(rb, k) for k in topks}
    out["overall"] = {str(k): entry(counted, k) for k in topks}
    for group in (*out["per_batch"].values(), out["overall"]):
        base = group[str(topks[0])]
        for k in topks:
            e = group[str(k)]
            for key in ("tok_s", "tok_s_with_records"):
                e[f"{key}_ratio"] = round(e[key] / base[key], 4) if e[key] and base[key] else None
    return out


def table(summary: dict[str, Any], topks: list[int]) -> str:
    def f(x: Any, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    lines = [
        f"| batch | top-k | waves | tokens | tokens/s (wave) | / top-{topks[0]} | tokens/s (with records) | / top-{topks[0]} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    groups = [*summary["per_batch"].items(), ("overall", summary["overall"])]
    for b, group in groups:
        for k in topks:
            e = group[str(k)]
            lines.append(
                f"| {b} | {k} | {e['waves']} | {e['tokens']:,} | {f(e['tok_s'], ',.0f')} | {f(e['tok_s_ratio'], '.3f')} | "
                f"{f(e['tok_s_with_records'], ',.0f')} | {f(e['tok_s_with_records_ratio'], '.3f')} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_begin = time.monotonic()
    from cascade_repro.plan.waves import waves
    from cascade_repro.prompts.chat import measure_prefix
    from cascade_repro.run.worker import build_engine, wave_records
    from cascade_repro.rundir import layout

    results = Path(tempfile.mkdtemp(prefix="topk-", dir=os.environ.get("TMPDIR")))
    run_dir, run = prepare_run(args, results)
    key, eplan = next(iter(run.plan.engines.items()))
    t0 = time.monotonic()
    engine = build_engine(run, eplan, run_dir)
    print(f"engine {key} up in {time.monotonic() - t0:.1f} s", flush=True)
    if args.engine == "fake" and max(args.topks) > FAKE_MAX_TOPK:
        print(f"note: the fake engine keeps at most {FAKE_MAX_TOPK} candidates per step", flush=True)
    prompts = layout.read_prompts(run_dir)
    measured = measure_prefix(engine.tokenizer(), run.prompt_set.system_prompt_text, prompts)
    rendered, shared, hashes = measured.rendered, measured.tokens, measured.hashes()
    arm = run.twin.test

    def one_wave(k: int, cid: str, w: int, wave: list[tuple[int, bool]]) -> dict[str, Any]:
        # The engine asks for engine.topk logprobs per step (vLLM's SamplingParams, hf's torch.topk).
        engine.topk = min(k, FAKE_MAX_TOPK) if args.engine == "fake" else k
        t = time.perf_counter()
        comps, stats = engine.run_wave([rendered[i] for i, _ in wave], arm, args.max_tokens, prefix_len=shared)
        wave_s = time.perf_counter() - t
        t = time.perf_counter()
        samples, wave_rec = wave_records(cid, w, wave, comps, stats, prompts, hashes, rendered)
        for rec in (*samples, wave_rec):
            json.dumps(rec, ensure_ascii=False, separators=(",", ":"))
        records_s = time.perf_counter() - t
        kept = max((len(step) for c in comps for step in c.topk), default=0)
        return {"wave_s": wave_s, "records_s": records_s, "tokens": sum(len(c.token_ids) for c in comps),
                "topk_kept": kept}  # fmt: skip

    rows: list[dict[str, Any]] = []
    complete = True
    n = len(args.topks)
    for batch in args.batches:
        wv = waves(len(rendered), batch)[: args.waves]
        for rnd in range(args.rounds):
            if time.monotonic() - t_begin > args.budget_s:
                complete = False
                print(f"budget reached before b{batch} round {rnd}", flush=True)
                break
            for w, wave in enumerate(wv):
                shift = (rnd + w) % n  # rotate which top-k runs first
                order = args.topks[shift:] + args.topks[:shift]
                row = {"batch": batch, "round": rnd, "wave": w, "warmup": rnd == 0, "order": order,
                       "arms": {str(k): one_wave(k, f"topk-b{batch}", w, wave) for k in order}}  # fmt: skip
                rows.append(row)
            print(f"b{batch} round {rnd} done", flush=True)
    engine.close()
    summary = summarize(rows, args.topks)
    print(table(summary, args.topks))
    kept = {str(k): max((r["arms"][str(k)]["topk_kept"] for r in rows if str(k) in r["arms"]), default=0)
            for k in args.topks}  # fmt: skip
    print("candidates per step returned: " + ", ".join(f"top-{k}: {v}" for k, v in kept.items()))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        data = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "summary": summary,
                "candidates_returned": kept, "complete": complete,
                "total_s": round(time.monotonic() - t_begin, 1)}  # fmt: skip
        args.out.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return 0 if complete else 2


if __name__ == "__main__":
    sys.exit(main())
