"""Write a synthetic run directory: small for the tests (``conftest.synthetic_run``), at scale for
benchmark 4 (``cascade-repro report`` at 100k samples, ``benchmarks/bench_report.py``).

Default: vLLM, tp 1,2 x batch 1,8,32,64,128 x cascade on/off, plus a flat rerun, over 3,572
prompts of 256 generated tokens with top-5 logprobs per step: 30 cells, 2 engine keys,
107,160 sample records in ``samples/*.jsonl`` (~4 GB: full-precision floats, as vLLM writes them)
and 28 pairs, i.e. 100,016 rows in ``comparisons.parquet``.

The files are what a real run leaves behind: ``run.json`` with the spec and the plan from
``matrix.plan``; samples files in the worker's record order (``engine``, then per cell
``cell_start``, per wave the samples and a ``wave`` record, ``cell_done``); the three tables with the
columns of ``compare.py``. The comparison rows are computed by ``divergence_metrics`` on the very
samples written, and the repetition means by ``repetition_metrics``; verdicts come from
``verdicts.decide`` with the noise floor chosen as ``compare.build_tables`` does. No report is
rendered: that is what the benchmark times.

Per prompt, every cell of one tensor-parallel size derives from one base completion (the flat cell
at the smallest batch): flat cells stay identical to it with probability 0.6; a flat rerun equals
its first run with probability 0.9, a cascade cell its flat twin with probability 0.85 -- except on
tp 1 at batch >= 32, where it is identical with probability 0.3 and half its divergences end in a
loop (a regression to find).

    python tests/support/make_synthetic_run.py /tmp/synth-run            # the 100k-sample default
    python tests/support/make_synthetic_run.py /tmp/small --prompts 100  # quick
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synth  # noqa: E402

from cascade_repro.judge.metrics import divergence_metrics, repetition_metrics  # noqa: E402
from cascade_repro.judge.verdicts import Evidence, Thresholds, decide, paired_bootstrap_ci  # noqa: E402
from cascade_repro.plan.matrix import MatrixSpec, plan  # noqa: E402
from cascade_repro.plan.waves import waves  # noqa: E402
from cascade_repro.rundir import layout  # noqa: E402

LAYERS = 30  # SmolLM2-135M: cascade_calls = steps x layers
from cascade_repro.judge.compare import TWIN_AXES  # noqa: E402 - the pairing axes, defined once


def _prompt_hash(i: int) -> str:
    """Prompt i's stand-in for the hash of its rendered tokens: in its samples and in prompts.jsonl."""
    return hashlib.sha1(str(i).encode()).hexdigest()[:16]


def plan_pairs(cells: list[dict[str, Any]]) -> list[tuple[str, str, dict, dict]]:
    """(pair_id, kind, test cell, ref cell), the pairing rule of ``compare.plan_pairs``."""

    def twin(c: dict[str, Any]) -> tuple:
        return tuple(c[a] for a in TWIN_AXES)

    flat = {(twin(c), c["batch"], c["rerun"]): c for c in cells if c["arm"] == "flat"}
    out = []
    for c in cells:
        if c["arm"] == "cascade" and c["rerun"] == 0 and (ref := flat.get((twin(c), c["batch"], 0))):
            out.append((f"{c['cell_id']}~flat", "cascade", c, ref))
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for c in cells:
        if c["arm"] == "flat" and c["rerun"] == 0:
            groups.setdefault(twin(c), []).append(c)
    for group in groups.values():
        base = min(group, key=lambda c: c["batch"])
        out += [(f"{c['cell_id']}~b{base['batch']}", "noise-batch", c, base) for c in group if c is not base]
    for (tk, b, r), c in flat.items():
        if r == 1 and (tk, b, 0) in flat:
            out.append((f"{c['cell_id']}~r0", "noise-rerun", c, flat[(tk, b, 0)]))
    return out


def _profile(cell: dict[str, Any], min_batch: int) -> tuple[str, float, float]:
    """(parent, P(identical to the parent), P(loop | diverged)) of a cell.

    The parent is "base" (the flat cell at the smallest batch) or "twin" (the flat cell at the same
    batch): healthy cascade cells follow their flat twin closely, buggy ones (tp 1, batch >= 32) do not.
    """
    if cell["arm"] == "flat":
        if cell["rerun"]:
            return "twin", 0.9, 0.0
        return ("base", 1.0, 0.0) if cell["batch"] == min_batch else ("base", 0.6, 0.05)
    if cell["tp"] == 1 and cell["batch"] >= 32:
        return "twin", 0.3, 0.5
    return ("twin", 1.0, 0.0) if cell["batch"] < 8 else ("twin", 0.85, 0.05)


def _sample(seed: int, cell: dict[str, Any], i: int, length: int, min_batch: int) -> dict[str, Any]:
    parent, p_id, p_loop = _profile(cell, min_batch)
    if parent == "twin":
        twin = dict(cell, arm="flat", rerun=0, cell_id=f"tp{cell['tp']}-b{cell['batch']}-flat")
        base_side = _sample(seed, twin, i, length, min_batch)
    else:
        base_rng = random.Random(f"{seed}/tp{cell['tp']}/{i}")
        base_side = synth._side(base_rng, synth._ref_tokens(base_rng, length), length)
    base = base_side["token_ids"]
    rng = random.Random(f"{seed}/{cell['cell_id']}/{i}")
    tokens, d = synth._test_tokens(rng, base, p_identical=p_id, p_loop=p_loop)
    if d < 0:
        side = dict(base_side)
        side["logprobs"] = [lp + rng.gauss(0.0, 2e-3) for lp in base_side["logprobs"]]
        return side
    side = synth._side(rng, tokens, length)
    side["logprobs"][:d] = [lp + rng.gauss(0.0, 2e-3) for lp in base_side["logprobs"][:d]]
    if rng.random() < 0.85:  # the base's token is in this side's top-k at the split
        side["topk"] = list(side["topk"])
        step = list(side["topk"][d])
        step[1] = [base[d], step[0][1] - rng.uniform(0.01, 1.5)]
        side["topk"][d] = step
    return side


def write_engine_key(args: tuple) -> dict[str, Any]:
    """Write samples/<key>.jsonl; return per-cell repetition rows and per-pair comparison rows."""
    run_dir, key, cells, pairs, n, length, seed = args
    min_batch = min(c["batch"] for c in cells)
    by_id = {c["cell_id"]: c for c in cells}
    my_pairs = [p for p in pairs if p[2]["cell_id"] in by_id]
    tmp = {c["cell_id"]: open(run_dir / f".{c['cell_id']}.tmp", "w", encoding="utf-8") for c in cells}  # noqa: SIM115
    reps: dict[str, list[dict[str, Any]]] = {c["cell_id"]: [] for c in cells}
    comps: list[dict[str, Any]] = []
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    for i in range(n):
        sides = {cid: _sample(seed, c, i, length, min_batch) for cid, c in by_id.items()}
        for cid, s in sides.items():
            rec = {
                "type": "sample", "cell_id": cid, "wave": i // by_id[cid]["batch"], "prompt_index": i,
                "prompt_key": f"ko-{i:05d}", "prompt_hash": _prompt_hash(i),
                "prompt_tokens": 430 + i % 40, "token_ids": s["token_ids"], "text": s["text"],
                "finish_reason": s["finish_reason"], "logprobs": s["logprobs"], "topk": s["topk"],
            }  # fmt: skip
            tmp[cid].write(dumps(rec) + "\n")
            reps[cid].append(repetition_metrics(s["token_ids"], s["text"], s["finish_reason"]))
        for pair_id, _, tc, rc in my_pairs:
            a, b = sides[tc["cell_id"]], sides[rc["cell_id"]]
            d = divergence_metrics(a["token_ids"], a["logprobs"], a["topk"], b["token_ids"], b["logprobs"], b["topk"])
            ra, rb = reps[tc["cell_id"]][-1], reps[rc["cell_id"]][-1]
            comps.append({"pair_id": pair_id, "prompt_index": i, "prompt_key": f"ko-{i:05d}", **d,
                          "seq_rep_4_test": ra["seq_rep_4"], "seq_rep_4_ref": rb["seq_rep_4"],
                          "len_test": ra["length"], "len_ref": rb["length"]})  # fmt: skip
    for f in tmp.values():
        f.close()
    # Assemble the samples file in the worker's order, with its control records.
    waves_out: dict[str, list[dict[str, Any]]] = {}
    with open(layout.samples_path(run_dir, key), "w", encoding="utf-8") as out:
        out.write(dumps({"type": "engine", "engine_key": key, "effective": {"engine": "vllm", "tp": cells[0]["tp"]},
                         "shared_prefix_tokens": 412, "start_s": 41.3,
                         "started_at": "2026-01-02T03:04:05+0000"}) + "\n")  # fmt: skip
        for c in cells:
            cid = c["cell_id"]
            out.write(dumps({"type": "cell_start", "cell_id": cid}) + "\n")
            lengths = [r["length"] for r in reps[cid]]
            with open(run_dir / f".{cid}.tmp", encoding="utf-8") as f:
                for w, wave in enumerate(waves(n, c["batch"])):
                    real = [i for i, r in wave if r]
                    for _ in real:
                        out.write(f.readline())
                    steps = length + 1
                    fired = c["arm"] == "cascade" and c["batch"] >= 8
                    # Step timing as the probe records it: flat decode steps 2 ms + 10 us per request,
                    # cascade's 20 % slower, a 1 % wobble from wave to wave; the last step is untimed.
                    step_s = (0.002 + 1e-5 * len(wave)) * (1 + 0.01 * (w % 3))
                    n_dec = length - 1
                    timing = {"decode_cascade_s": round(n_dec * step_s * 1.2, 6) if fired else 0.0,
                              "decode_cascade_n": n_dec if fired else 0,
                              "decode_flat_s": 0.0 if fired else round(n_dec * step_s, 6),
                              "decode_flat_n": 0 if fired else n_dec, "prefill_s": 0.05, "prefill_n": 1}  # fmt: skip
                    rec = {"type": "wave", "cell_id": cid, "wave": w, "batch": len(wave), "n_real": len(real),
                           "cascade_steps": length if fired else 0, "total_steps": steps,
                           "cascade_calls": length * LAYERS if fired else 0, "common_prefix_len": 400 if fired else 0,
                           "cascade_decode_steps": n_dec if fired else 0,
                           "wall_s": round(0.9 + 0.002 * len(wave), 4), "tokens": sum(lengths[i] for i in real),
                           "extra": {"steps": timing}}  # fmt: skip
                    out.write(dumps(rec) + "\n")
                    waves_out.setdefault(cid, []).append(rec)
            (run_dir / f".{cid}.tmp").unlink()
            out.write(dumps({"type": "cell_done", "cell_id": cid, "n_samples": n,
                             "wall_s": round(sum(w["wall_s"] for w in waves_out[cid]), 3)}) + "\n")  # fmt: skip
    return {"reps": reps, "comps": comps, "waves": waves_out}


def _mean(xs: list[float]) -> float:
    return float(statistics.fmean(xs)) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--prompts", type=int, default=3572, help="prompts per cell (3572 -> 107,160 samples)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--batch", default="1,8,32,64,128")
    ap.add_argument("--no-rerun", action="store_true", help="no flat rerun cells (fewer pairs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--procs", type=int, default=2, help="engine keys written in parallel")
    args = ap.parse_args(argv)

    import pandas as pd

    t0 = time.time()
    run_dir: Path = args.run_dir
    if run_dir.exists():
        shutil.rmtree(run_dir)
    (run_dir / "samples").mkdir(parents=True)
    spec = MatrixSpec(engine="vllm", model="embedded", tp=[int(x) for x in args.tp.split(",")],
                      batch=[int(x) for x in args.batch.split(",")], rerun=not args.no_rerun,
                      max_tokens=args.max_tokens, topk=synth.TOPK)  # fmt: skip
    engines = plan(spec)
    cells = [c.to_json() for c in engines.cells]
    pairs = plan_pairs(cells)
    n, length = args.prompts, args.max_tokens
    th = Thresholds()
    run = {
        "run_id": run_dir.name, "created_at": "2026-01-02T03:04:05+0000",
        "command": f"cascade-repro matrix --engine vllm --tp {args.tp} --batch {args.batch} --rerun "
                   f"--max-tokens {length} (synthetic: tests/support/make_synthetic_run.py)",
        "tool_version": "0.1.0", "spec": spec.to_dict(), "spec_hash": "synthetic",
        "model_path": "/synthetic/SmolLM2-135M-Instruct", "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "prompt_set": {"name": "ko-ifeval-style", "source": "synthetic", "n": n, "system_prompt": "ko",
                       "system_prompt_text": "(synthetic)", "shared_prefix_tokens": 412, "prompt_tokens_mean": 449.5,
                       "tokenizer": "HuggingFaceTB/SmolLM2-135M-Instruct", "min_cascade_prefix": 256},
        "env": {"gpu_name": "NVIDIA H200", "gpu_count": "2", "sm_count": "132", "python": "3.11.7",
                "vllm": "0.26.0", "torch": "2.9.0", "platform": "Linux-x86_64"},
        "plan": engines.to_json(),
        "arm_switch": "toggle", "thresholds": th.to_dict(), "fail_on": "regression",
        "engines": {k: {"effective": {"engine": "vllm"}, "start_s": 41.3, "status": "done", "error": ""}
                    for k in engines.engines},
        "timings": {"total_s": 5400.0},
    }  # fmt: skip
    layout.write_json_atomic(run_dir / "run.json", run)
    with open(run_dir / "prompts.jsonl", "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"key": f"ko-{i:05d}", "prompt": f"synthetic prompt {i}", "instruction_id_list": [],
                                "kwargs": [], "lang": "ko", "prompt_hash": _prompt_hash(i)}) + "\n")  # fmt: skip

    jobs = []
    for key in engines.engines:
        kcells = [c for c in cells if c["engine_key"] == key]
        jobs.append((run_dir, key, kcells, pairs, n, length, args.seed))
    synth._tables()
    if args.procs > 1 and len(jobs) > 1:
        with mp.get_context("fork").Pool(min(args.procs, len(jobs))) as pool:
            results = pool.map(write_engine_key, jobs)
    else:
        results = [write_engine_key(j) for j in jobs]
    reps = {cid: r for res in results for cid, r in res["reps"].items()}
    wav = {cid: w for res in results for cid, w in res["waves"].items()}
    comps = [row for res in results for row in res["comps"]]

    cell_rows = []
    for c in cells:
        rs, ws = reps[c["cell_id"]], wav[c["cell_id"]]
        wall, tokens = sum(w["wall_s"] for w in ws), sum(w["tokens"] for w in ws)
        row = {"cell_id": c["cell_id"], "engine_key": c["engine_key"], "engine": "vllm",
               "model": run["model_name"], "tp": c["tp"], "batch": c["batch"], "arm": c["arm"], "rerun": c["rerun"],
               "seed": c["seed"], "dtype": c["dtype"], "fa_version": "default", "backend": c["backend"],
               "status": "done", "error": "", "n_prompts": len(rs),
               "cascade_steps": sum(w["cascade_steps"] for w in ws), "total_steps": sum(w["total_steps"] for w in ws),
               "cascade_calls": sum(w["cascade_calls"] for w in ws), "wall_s": wall, "tokens": tokens,
               "tokens_per_s": tokens / wall, "len_mean": _mean([r["length"] for r in rs])}  # fmt: skip
        for k in [f"seq_rep_{i}" for i in range(1, 5)] + [f"distinct_{i}" for i in range(1, 5)] + ["zlib_ratio"]:
            row[k] = _mean([r[k] for r in rs])
        row["tail_loop_rate"] = _mean([float(r["tail_loop"]) for r in rs])
        row["longest_repeat_mean"] = _mean([r["longest_repeat"] for r in rs])
        row["finish_length_rate"] = _mean([float(r["finish_length"]) for r in rs])
        row.update(if_n=len(rs), if_strict=0.55 + 0.1 * (c["arm"] == "flat"), if_loose=0.7)
        cell_rows.append(row)
    cells_df = pd.DataFrame(cell_rows)
    steps = dict(zip(cells_df["cell_id"], cells_df["cascade_steps"], strict=True))
    total_steps = dict(zip(cells_df["cell_id"], cells_df["total_steps"], strict=True))

    by_pair: dict[str, list[dict[str, Any]]] = {}
    for r in comps:
        by_pair.setdefault(r["pair_id"], []).append(r)
    aggs = []
    for pair_id, kind, tc, rc in pairs:
        rows = sorted(by_pair.get(pair_id, []), key=lambda r: r["prompt_index"])
        div = [r for r in rows if not r["exact"]]
        aggs.append({
            "pair_id": pair_id, "kind": kind, "test_cell": tc["cell_id"], "ref_cell": rc["cell_id"],
            "tp": tc["tp"], "batch": tc["batch"], "ref_batch": rc["batch"], "seed": tc["seed"], "dtype": tc["dtype"],
            "fa_version": "default", "backend": tc["backend"], "n": len(rows), "n_identical": len(rows) - len(div),
            "n_diverged": len(div),
            "first_div_median": float(statistics.median([r["first_div"] for r in div])) if div else float("nan"),
            "common_prefix_ratio_mean": _mean([r["common_prefix_ratio"] for r in rows]),
            "edit_distance_mean": _mean([r["edit_distance"] for r in rows]),
            "topk_violations": sum(1 for r in rows if r["topk_ok"] is False),
            "dlogprob_mean": _mean([r["dlogprob_mean"] for r in rows]),
            "dlogprob_max": max([r["dlogprob_max"] for r in rows], default=float("nan")),
            "if_n": len(rows), "if_strict_test": 0.55, "if_strict_ref": 0.65, "if_strict_delta": -0.1,
            "if_loose_delta": -0.05, "if_gained": 3, "if_lost": 9, "p_if": 0.07,
            "_deltas": [r["seq_rep_4_test"] - r["seq_rep_4_ref"] for r in rows], "_ps": (kind, tc),
        })  # fmt: skip
    noise: dict[tuple, dict[str, Any]] = {}  # the worst flat-vs-flat control per (twin, batch)
    for agg in aggs:
        kind, tc = agg["_ps"]
        if kind == "cascade":
            continue
        k = (tuple(tc[a] for a in TWIN_AXES), tc["batch"])
        rate = agg["n_diverged"] / agg["n"] if agg["n"] else 0.0
        cur = noise.get(k)
        if cur is None or rate > (cur["n_diverged"] / cur["n"] if cur["n"] else 0.0):
            noise[k] = agg
    for agg in aggs:
        kind, tc = agg.pop("_ps")
        mean, lo, hi = paired_bootstrap_ci(agg.pop("_deltas"), th.bootstrap, th.ci, th.seed)
        agg.update(d_seq_rep_4_mean=mean, d_seq_rep_4_lo=lo, d_seq_rep_4_hi=hi,
                   cascade_steps=int(steps[tc["cell_id"]]), total_steps=int(total_steps[tc["cell_id"]]))  # fmt: skip
        if kind != "cascade":
            agg.update(noise_pair_id="", noise_n=0, noise_n_diverged=0, noise_topk_violations=0,
                       p_divergence=float("nan"), p_topk=float("nan"), verdict="control", reasons="")  # fmt: skip
            continue
        nz = noise.get((tuple(tc[a] for a in TWIN_AXES), tc["batch"]))
        agg.update(noise_pair_id=nz["pair_id"] if nz else "", noise_n=nz["n"] if nz else 0,
                   noise_n_diverged=nz["n_diverged"] if nz else 0,
                   noise_topk_violations=nz["topk_violations"] if nz else 0)  # fmt: skip
        ev = Evidence(n=agg["n"], n_diverged=agg["n_diverged"], topk_violations=agg["topk_violations"],
                      noise_n=agg["noise_n"], noise_n_diverged=agg["noise_n_diverged"],
                      noise_topk_violations=agg["noise_topk_violations"], d_rep_mean=mean, d_rep_lo=lo, d_rep_hi=hi,
                      cascade_steps=agg["cascade_steps"], status_ok=agg["n"] > 0)  # fmt: skip
        dec = decide(ev, th, has_noise=nz is not None and nz["n"] > 0)
        agg.update(p_divergence=dec.p_divergence, p_topk=dec.p_topk, verdict=dec.verdict, reasons=dec.reasons,
                   decided_by=dec.decided_by)  # fmt: skip
    pairs_df = pd.DataFrame(aggs)
    comp_df = pd.DataFrame(comps)
    comp_df["topk_ok"] = comp_df["topk_ok"].astype("object")
    cells_df.to_parquet(run_dir / layout.CELLS, index=False)
    pairs_df.to_parquet(run_dir / layout.PAIRS, index=False)
    comp_df.to_parquet(run_dir / layout.COMPARISONS, index=False)

    size = sum(p.stat().st_size for p in (run_dir / "samples").glob("*.jsonl"))
    n_samples = sum(len(r) for r in reps.values())
    verdicts = pairs_df.loc[pairs_df["kind"] == "cascade", "verdict"].value_counts().to_dict()
    print(f"{run_dir}: {len(cells)} cells, {len(engines.engines)} engine keys, {n_samples:,} samples "
          f"({size / 2**30:.2f} GiB JSONL), {len(pairs)} pairs, {len(comp_df):,} comparison rows; "
          f"verdicts {verdicts}; {time.time() - t0:.0f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
