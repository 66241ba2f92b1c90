"""Benchmark: hf engine ms/step on CPU, batch 1, 8 and 16, cascade and flat arm, before and after.

Runs the embedded SmolLM2-135M (fp32) the way ``cascade-repro matrix`` does: the shared prefix of the
default prompt set (~1,600 tokens) prefilled once, then one wave per (batch, arm) over the first
``batch`` prompts (~1,700-token contexts), greedy. A forward pre-hook on the model stamps the start of
every step, so a step is one forward plus the engine's sampling and bookkeeping. Step 0 is the
suffix prefill; decode is the median of the remaining steps (a median, because a shared CPU is noisy).

"before" is the engine at a git revision (default ``HEAD``: the committed code) or in a folder that
holds an older ``cascade_repro`` package; "after" is the working tree. Each runs in its own subprocess
with the same thread count, one after the other. ``--model`` takes a model folder instead of the
embedded model (timings only depend on the architecture, so a randomly initialised copy will do).

    python benchmarks/bench_hf_engine.py [--before HEAD|DIR|none] [--steps 16] [--batches 1,8,16]
                                         [--threads N] [--model embedded|DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(batches: list[int], steps: int, model: str, clock: str) -> dict:
    """Run in the subprocess: per (batch, arm) prefill ms, decode ms/step, wall s."""
    import torch

    from cascade_repro.engines.hf import HFEngine, default_threads
    from cascade_repro.plan.models import resolve_model
    from cascade_repro.prompts.chat import measure_prefix
    from cascade_repro.prompts.promptsets import load_prompt_set, load_system_prompt

    default_threads()
    pset = load_prompt_set("ko-ifeval-style", max(batches))
    path, _ = resolve_model(model)
    eng = HFEngine(path, dtype="float32", device="cpu", topk=5)
    measured = measure_prefix(eng.tokenizer(), load_system_prompt("ko"), pset.records)
    rendered, shared = measured.rendered, measured.tokens
    now = time.process_time if clock == "cpu" else time.perf_counter
    stamps: list[float] = []
    eng.model.register_forward_pre_hook(lambda *_: stamps.append(now()))
    eng.run_wave(rendered[:1], "flat", 1, prefix_len=shared)  # the prefix prefill, once per engine
    rows = []
    for b in batches:
        wave = [rendered[i % len(rendered)] for i in range(b)]
        for arm in ("cascade", "flat"):
            stamps.clear()
            t0 = now()
            _, stats = eng.run_wave(wave, arm, steps + 1, prefix_len=shared)
            t1 = now()
            durs = [b - a for a, b in zip(stamps, [*stamps[1:], t1], strict=True)]
            rows.append(
                {
                    "batch": b,
                    "arm": arm,
                    "ctx": max(len(x) for x in wave),
                    "prefill_ms": 1000 * durs[0],
                    "decode_ms": 1000 * statistics.median(durs[1:]) if len(durs) > 1 else float("nan"),
                    "steps": len(durs),
                    "cascade_steps": stats.cascade_steps,
                    "wall_s": t1 - t0,
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "prefix": shared, "rows": rows}


def run_side(src: Path, batches: list[int], steps: int, threads: int | None, model: str, clock: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--_measure", out.name]
        cmd += [
            "--batches",
            ",".join(map(str, batches)),
            "--steps",
            str(steps),
            "--model",
            model,
            "--clock",
            clock,
        ]
        subprocess.run(cmd, env=env, check=True, cwd=str(src))
        return json.loads(Path(out.name).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="HEAD", help="git revision or package folder for 'before', or 'none'")
    ap.add_argument("--steps", type=int, default=16, help="decode steps per wave (after the prefill step)")
    ap.add_argument("--batches", default="1,8,16")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for both sides")
    ap.add_argument("--model", default="embedded", help="'embedded' or a model folder")
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall: elapsed time; cpu: this process's CPU time (with --threads 1, a steadier reading on a busy machine)",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the raw numbers here")
    ap.add_argument("--_measure", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    batches = [int(x) for x in args.batches.split(",")]
    if args._measure:
        Path(args._measure).write_text(json.dumps(measure(batches, args.steps, args.model, args.clock)))
        return

    sides: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if Path(args.before, "cascade_repro").is_dir():
            sides["before"] = run_side(
                Path(args.before).resolve(), batches, args.steps, args.threads, args.model
            )
        elif args.before != "none":
            old = Path(tmp) / "before"
            old.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.before, "cascade_repro", "prompts"],
                check=True,
                capture_output=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
            # prompts/ ships inside the installed package as cascade_repro.prompts_data.
            shutil.copytree(old / "prompts", old / "cascade_repro" / "prompts_data", dirs_exist_ok=True)
            print(f"before: {args.before}", file=sys.stderr)
            sides["before"] = run_side(old, batches, args.steps, args.threads, args.model, args.clock)
        print("after: working tree", file=sys.stderr)
        sides["after"] = run_side(ROOT, batches, args.steps, args.threads, args.model, args.clock)

    after = sides["after"]
    print(
        f"\nhf engine, SmolLM2-135M fp32 on CPU, torch {after['torch']}, {after['threads']} threads, "
        f"shared prefix {after['prefix']} tokens, {args.steps} decode steps per wave, {args.clock} clock\n"
    )
    if "before" in sides:
        head = "| batch | arm | ctx | prefill ms before | prefill ms after | decode ms/step before | decode ms/step after | speed-up (decode) |"
    else:
        head = "| batch | arm | ctx | prefill ms | decode ms/step |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    before_rows = {(r["batch"], r["arm"]): r for r in sides.get("before", {}).get("rows", [])}
    for r in after["rows"]:
        key = (r["batch"], r["arm"])
        if before_rows:
            b = before_rows[key]
            print(
                f"| {r['batch']} | {r['arm']} | {r['ctx']} | {b['prefill_ms']:.0f} | {r['prefill_ms']:.0f} | "
                f"{b['decode_ms']:.1f} | {r['decode_ms']:.1f} | {b['decode_ms'] / r['decode_ms']:.2f}x |"
            )
        else:
            print(
                f"| {r['batch']} | {r['arm']} | {r['ctx']} | {r['prefill_ms']:.0f} | {r['decode_ms']:.1f} |"
            )
    if args.json:
        args.json.write_text(json.dumps(sides, indent=1))


if __name__ == "__main__":
    main()
