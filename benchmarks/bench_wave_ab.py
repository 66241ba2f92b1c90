"""Benchmark 1, within one engine: the harness's per-wave cost against a bare ``LLM.generate``, interleaved.

Two engine starts run one after the other (the retired ``bench_vllm_overhead.py``, RESULTS.md 1 and
1b) cannot resolve 3 %: a launch-bound batch-1 wave measures the host CPU of that moment. Here one
process builds the harness's own engine (``worker.build_engine``: the probe loaded, the same ``vllm.LLM``
kwargs a worker gets) and runs each wave of each batch size under every arm, in a rotating order
(every rotation of the arms and of their reverse, ``arm_orders``), so machine drift hits every arm
alike and no arm always follows the same other arm. The arms (``--arms``):

- **raw**: what a bare loop asks of vLLM for a wave: ``reset_prefix_cache``, a 1-token greedy
  warm-up of the shared prefix, one ``llm.generate`` with the harness's ``SamplingParams`` (flat
  logprobs where vLLM has them). The probe is idle (the previous harness wave's sync left it so).
- **harness**: what a worker does now: ``VLLMEngine.run_wave`` (control writes, the sync RPC,
  conversion of the outputs) plus the worker's records (``worker.wave_records``) queued to a
  background ``JsonlWriter``, which starts on them at once. A worker's writer encodes the last
  wave's records while the next wave starts, so this arm replays its own previous wave's records
  into a second background writer at the start of the wave: their JSON runs during this wave, and
  any GIL contention it causes lands in this arm's time. What the writer still had left of this
  wave's own records when the wave returned is waited for outside every arm (``drain``; the replay
  does that work inside).
- **harness-nohold**: the same as harness, under the name the files of RESULTS.md 1i gave the
  worker's current form (they called the retired harness-hold arm ``harness``).
- **harness-fg**: records encoded and written in the foreground, as the worker did before its
  background writer.
- **raw-nested** / **harness-nested**: both asking vLLM for the nested logprobs (a dict per token,
  as before flat logprobs), the records in the foreground: the harness as it was before both
  changes, paired with its own raw twin (vLLM builds the nested form for the raw loop too).
- **harness-nogc**: the harness with Python's garbage collector off during the wave (the
  diagnosis that led to ``worker.freeze_heap``).
- **harness-loop**: the harness with vLLM's flat logprobs converted position by position
  (``engines.vllm.topk_by_position``), as before the whole-list conversion (``uniform_topk``).
- **raw-detok** / **harness-detok**: both with vLLM detokenizing (``SamplingParams(detokenize=True)``:
  the text step by step and a string for every logprob token, in the LLM process), as before the
  engine decoded each completion once itself; ``raw``/``harness`` ask for ``detokenize=False`` where
  vLLM has it. raw-detok against raw is what vLLM's detokenization costs a wave; harness-detok is paired
  with raw-detok.

Retired arms (``harness-hold``: records held until the next wave's generate; ``harness-defer``: the
conversion moved to the writer's thread) needed hooks inside the package; RESULTS.md 1i holds their
conclusion and the commit they last ran at. They no longer run, but ``--from-json`` still pools the
waves their files recorded.

The default set is raw and harness; ``--arms`` picks others (benchmarks/RESULTS.md 1g ran raw,
harness, harness-fg, raw-nested and harness-nested). ``--from-json A.json B.json ...`` runs nothing:
it pools the waves those runs recorded and prints their table (RESULTS.md's pooled figures come
from it).

Each harness arm is paired with its raw twin (raw-nested for harness-nested, raw for the others).
The cascade arm on both sides follows vLLM's heuristic (not forced), so an arm and its twin compute
the same thing: their outputs are compared token by token. Each batch size's first round is a
warm-up and is not counted (first-call compiles). The table gives, per batch and arm, the median wave
ms, the median and range of the paired ratio, the decode steps the probe saw run cascade (harness
arms: min, median, max; a raw wave runs with the probe idle, so only its harness twin tells whether
a slow wave was one where the heuristic chose otherwise), and the harness phases; overall, each arm's sum over
counted waves against its twin's, with a 95 % bootstrap CI (waves resampled), and the harness's own
work (control writes, sync RPC, conversion, records in the foreground) as a share of the twin's time.
The target: harness <= 1.03 x raw. The engine start is outside every figure.

    python benchmarks/bench_wave_ab.py --ignore-eos --gc-freeze --out $OUT/wave_ab.json

Needs vLLM and a GPU (or the CPU test's fake vLLM, which proves the plumbing only). Exit code 0:
harness within 1.03 x raw overall; 1: not; 2: incomplete.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

if TYPE_CHECKING:
    from cascade_repro.rundir.manifest import Manifest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


RETIRED = "retired after commit cb2bbed; benchmarks/RESULTS.md 1i has its figures"


@dataclass(frozen=True)
class Arm:
    """One way of running a wave: raw vLLM or the harness, and how."""

    name: str
    harness: bool
    flat: bool = True  # ask vLLM for flat logprobs (where it has them)
    background: bool = True  # records queued to a background writer (harness arms)
    nogc: bool = False
    whole_lists: bool = True  # flat logprobs converted by whole-list slices (False: position by position)
    vllm_text: bool = False  # vLLM detokenizes (text and logprob tokens) instead of the engine decoding once
    twin: str = "raw"  # the raw arm a harness arm is paired with
    retired: str = ""  # why it no longer runs (its recorded waves still summarize)


ARM_SPECS = {
    a.name: a
    for a in (
        Arm("raw", harness=False),
        Arm("raw-nested", harness=False, flat=False),
        Arm("harness", harness=True),
        Arm("harness-hold", harness=True, retired=RETIRED),
        Arm("harness-nohold", harness=True),  # the 2026-12-02 runs' name for harness as it is now
        Arm("harness-fg", harness=True, background=False),
        Arm("harness-nested", harness=True, flat=False, background=False, twin="raw-nested"),
        Arm("harness-nogc", harness=True, nogc=True),
        Arm("harness-defer", harness=True, retired=RETIRED),
        Arm("harness-loop", harness=True, whole_lists=False),
        Arm("raw-detok", harness=False, vllm_text=True),
        Arm("harness-detok", harness=True, vllm_text=True, twin="raw-detok"),
    )
}
DEFAULT_ARMS = ("raw", "harness")
TARGET = 1.03
OWN_PHASES = ("control_s", "sync_s", "convert_s", "records_s")  # the harness's work that raw does not do


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
    ap.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                    help=f"comma-separated, from {', '.join(ARM_SPECS)}; each harness arm needs its raw twin")  # fmt: skip
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting rounds after this")
    ap.add_argument("--out", type=Path, help="JSON with every wave of every arm (required unless --from-json)")
    ap.add_argument("--from-json", type=Path, nargs="+", metavar="JSON",
                    help="run nothing: pool the counted waves of these earlier --out files and print their table")  # fmt: skip
    args = ap.parse_args(argv)
    if args.from_json:
        return args
    if args.out is None:
        ap.error("--out is required (or --from-json to summarize earlier runs)")
    names = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in names if a not in ARM_SPECS]
    if bad:
        ap.error(f"unknown arm {bad[0]!r}; choose from {', '.join(a for a in ARM_SPECS if not ARM_SPECS[a].retired)}")
    gone = [a for a in names if ARM_SPECS[a].retired]
    if gone:
        ap.error(f"arm {gone[0]!r} no longer runs ({ARM_SPECS[gone[0]].retired}); --from-json still reads its files")
    missing = sorted({ARM_SPECS[a].twin for a in names if ARM_SPECS[a].harness} - set(names))
    if missing or "harness" not in names:
        ap.error(f"--arms needs 'harness' and each harness arm's raw twin (missing: {', '.join(missing or ['harness'])})")
    args.arm_names = tuple(dict.fromkeys(names))
    return args


def prepare_run(args: argparse.Namespace, results: Path) -> tuple[Path, Manifest]:
    """A real run directory for the matrix (so the engine gets exactly a worker's settings)."""
    from cascade_repro.judge.verdicts import Thresholds
    from cascade_repro.pipeline import RunOptions
    from cascade_repro.plan.matrix import MatrixSpec
    from cascade_repro.run.runner import prepare
    from cascade_repro.rundir import manifest

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
    return prepared.run_dir, manifest.read_manifest(prepared.run_dir)


def arm_orders(arms: list[Any]) -> list[list[Any]]:
    """Every rotation of the arms, then every rotation of them reversed: each arm runs in each
    position equally often, and right after each other arm equally often (a Williams design for an
    odd number of arms). A plain rotation put harness-fg right after harness every time in 1g."""
    n = len(arms)
    fwd = [arms[i:] + arms[:i] for i in range(n)]
    rev = list(reversed(arms))
    back = [rev[i:] + rev[:i] for i in range(n)]
    return fwd + [o for o in back if o not in fwd]


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def arms_of(rows: list[dict[str, Any]]) -> list[str]:
    """The arms the rows ran, in the order of ARM_SPECS."""
    seen = {a for r in rows for a in r["arms"]}
    return [a for a in ARM_SPECS if a in seen]


def bootstrap_ci(pairs: list[tuple[float, float]], *, n: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """95 % CI of sum(arm) / sum(twin), resampling the paired waves (seeded: the same data, the same CI)."""
    import random

    if len(pairs) < 2:
        return None
    rng = random.Random(seed)
    k = len(pairs)
    stats = []
    for _ in range(n):
        pick = [pairs[rng.randrange(k)] for _ in range(k)]
        base = sum(b for _, b in pick)
        stats.append(sum(a for a, _ in pick) / base if base else float("nan"))
    stats.sort()
    return stats[int(0.025 * n)], stats[int(0.975 * n) - 1]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per batch and arm: median ms, paired ratio to the arm's raw twin (median, min, max); overall sums."""
    counted = [r for r in rows if not r["warmup"]]
    names = arms_of(counted)
    out: dict[str, Any] = {"per_batch": {}, "overall": {}}
    for b in sorted({r["batch"] for r in counted}):
        rb = [r for r in counted if r["batch"] == b]
        entry: dict[str, Any] = {}
        for arm in names:
            twin = ARM_SPECS[arm].twin
            secs = [r["arms"][arm]["s"] for r in rb if arm in r["arms"]]
            ratios = [r["arms"][arm]["s"] / r["arms"][twin]["s"] for r in rb if arm in r["arms"] and twin in r["arms"]]
            phases: dict[str, float | None] = {}
            casc = [r["arms"][arm]["cascade"]["decode_steps"] for r in rb if "cascade" in r["arms"].get(arm, {})]
            if ARM_SPECS[arm].harness:
                keys = {k for r in rb if arm in r["arms"] for k in r["arms"][arm].get("phases", {})}
                phases = {k: median([r["arms"][arm]["phases"][k] * 1e3 for r in rb if k in r["arms"].get(arm, {}).get("phases", {})]) for k in sorted(keys)}
            entry[arm] = {
                "n": len(secs),
                "median_ms": median([s * 1e3 for s in secs]),
                "ratio_median": median(ratios) if ARM_SPECS[arm].harness else None,
                "ratio_min": (min(ratios) if ratios else None) if ARM_SPECS[arm].harness else None,
                "ratio_max": (max(ratios) if ratios else None) if ARM_SPECS[arm].harness else None,
                "phases_ms": phases,
                "cascade_decode_steps": [min(casc), median(casc), max(casc)] if casc else None,
            }
        out["per_batch"][str(b)] = entry
    for arm in names:
        spec = ARM_SPECS[arm]
        twin = spec.twin if spec.harness else arm
        both = [r for r in counted if arm in r["arms"] and twin in r["arms"]]
        tot = sum(r["arms"][arm]["s"] for r in both)
        base = sum(r["arms"][twin]["s"] for r in both)
        o: dict[str, Any] = {"s": round(tot, 4), "waves": len(both)}
        if spec.harness:
            o["twin"] = twin
            o["ratio"] = round(tot / base, 4) if base else None
            ci = bootstrap_ci([(r["arms"][arm]["s"], r["arms"][twin]["s"]) for r in both])
            o["ci95"] = [round(x, 4) for x in ci] if ci else None
            own = sum(r["arms"][arm].get("phases", {}).get(k, 0.0) for r in both for k in OWN_PHASES)
            o["own_work"] = round(own / base, 4) if base else None
            # With the writer's remaining work added: as if the JSON ran in the foreground after the wave.
            fg = tot + sum(r["arms"][arm].get("phases", {}).get("drain_s", 0.0) for r in both)
            o["ratio_with_drain"] = round(fg / base, 4) if base else None
            o["identical"] = sum(1 for r in both if r.get("same_as_twin", {}).get(arm))
        out["overall"][arm] = o
    out["overall"]["raw_s"] = out["overall"].get("raw", {}).get("s", 0.0)
    out["identical"] = {
        "waves": sum(1 for r in counted if r.get("identical") is not None),
        "identical": sum(1 for r in counted if r.get("identical")),
    }
    return out


def table(summary: dict[str, Any]) -> str:
    def f(x: Any, spec: str = ".1f") -> str:
        return "-" if x is None else format(x, spec)

    lines = [
        "| batch | arm | ms (median) | / twin median [min, max] | cascade decode steps [min, median, max] | harness phases (ms, median) |",
        "|---|---|---|---|---|---|",
    ]
    for b, e in summary["per_batch"].items():
        for arm, h in e.items():
            ph = ", ".join(f"{k.removesuffix('_s')} {f(v)}" for k, v in h["phases_ms"].items())
            ratio = "" if h["ratio_median"] is None else (
                f"{f(h['ratio_median'], '.3f')} [{f(h['ratio_min'], '.3f')}, {f(h['ratio_max'], '.3f')}]")  # fmt: skip
            casc = h.get("cascade_decode_steps")
            casc_txt = "" if casc is None else ", ".join(f(x, "g") for x in casc)
            lines.append(f"| {b} | {arm} | {f(h['median_ms'])} | {ratio} | {casc_txt} | {ph} |")
    lines += [
        "",
        "| arm | / twin | all counted waves | 95 % CI | own work / twin | with drain | token-identical to twin |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, o in summary["overall"].items():
        if not isinstance(o, dict) or "ratio" not in o:
            continue
        ci = o.get("ci95")
        own = o.get("own_work")
        lines.append(
            f"| {arm} | {o['twin']} | **{f(o['ratio'], '.3f')}** | "
            f"{'-' if not ci else f'[{ci[0]:.3f}, {ci[1]:.3f}]'} | {'-' if own is None else f'{own * 100:.1f} %'} | "
            f"{f(o.get('ratio_with_drain'), '.3f')} | {o['identical']}/{o['waves']} |"
        )
    return "\n".join(lines)


def pooled(files: list[Path]) -> tuple[dict[str, Any], int]:
    """The summary of every counted wave in these runs' JSON, and how many files it read. An arm's
    name means what it meant when each file was written (the module docstring lists the renames)."""
    rows: list[dict[str, Any]] = []
    for f in files:
        rows += json.loads(f.read_text(encoding="utf-8"))["rows"]
    return summarize(rows), len(files)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        try:
            summary, n = pooled(args.from_json)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: cannot read the runs: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        print(f"{n} run(s) pooled")
        print(table(summary))
        ratio = summary["overall"].get("harness", {}).get("ratio")
        return 2 if ratio is None else (0 if ratio <= TARGET else 1)
    t_begin = time.monotonic()
    from cascade_repro import engines
    from cascade_repro.engines import vllm_logprobs
    from cascade_repro.plan.waves import waves
    from cascade_repro.prompts.chat import measure_prefix
    from cascade_repro.run.worker import build_engine, wave_records
    from cascade_repro.rundir import jsonl, layout

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
    prompts = layout.read_prompts(run_dir)
    measured = measure_prefix(engine.tokenizer(), run.prompt_set.system_prompt_text, prompts)
    rendered, shared, hashes = measured.rendered, measured.tokens, measured.hashes()
    llm = engine.llm
    # As a worker writes: on a background thread for vLLM (EngineInfo.background_writes). The
    # replay writer takes each background arm's previous wave (its JSON overlaps this wave); the
    # foreground arms write to their own file (the same bytes, so the same cost).
    bg = engines.get("vllm").background_writes
    writer = jsonl.JsonlWriter(layout.samples_path(run_dir, key), background=bg)
    replay = jsonl.JsonlWriter(run_dir / "ab-replay.jsonl", background=True)
    fg_writer = jsonl.JsonlWriter(run_dir / "ab-foreground.jsonl")
    last_records: dict[str, list[Any]] = {}
    sp = engine._SamplingParams
    tp = engine._TokensPrompt
    greedy = dict(temperature=0.0, seed=eplan.seed, ignore_eos=bool(args.ignore_eos))
    p = max(0, min(shared, min(map(len, rendered)) - 1))
    can_flat = engine.flat_logprobs
    can_decode = engine.decode_here

    def raw_wave(arm: Arm, batch_prompts: list[list[int]]) -> tuple[float, list[list[int]]]:
        engine.flat_logprobs = can_flat and arm.flat
        engine.decode_here = can_decode and not arm.vllm_text
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
            sp(max_tokens=args.max_tokens, **engine.output_kwargs(), **greedy), use_tqdm=False,
        )  # fmt: skip
        return time.perf_counter() - t, [list(o.outputs[0].token_ids) for o in outs]

    def harness_wave(arm: Arm, cid: str, w: int, wave: list[tuple[int, bool]]) -> tuple[float, list[list[int]], dict, dict]:
        engine.flat_logprobs = can_flat and arm.flat
        engine.decode_here = can_decode and not arm.vllm_text
        out = writer if (arm.background and bg) else fg_writer
        was = gc.isenabled()
        if arm.nogc:
            gc.disable()
        try:
            t = time.perf_counter()
            if out is writer:  # the previous wave's JSON, still being written as a worker's next wave starts
                for rec in last_records.get(arm.name, []):
                    replay.write(rec)
                replay.flush()
            # harness-loop: flat_topk finds no uniform layout and goes position by position
            loop = contextlib.nullcontext() if arm.whole_lists else mock.patch.object(vllm_logprobs, "uniform_topk", return_value=None)
            with loop:
                comps, stats = engine.run_wave([rendered[i] for i, _ in wave], "cascade", args.max_tokens, prefix_len=shared)
            t_rec = time.perf_counter()
            samples, wave_rec = wave_records(cid, w, wave, comps, stats, prompts, hashes, rendered)
            for rec in samples:
                out.write(rec)
            wave_rec["wall_s"] = round(time.perf_counter() - t, 4)
            out.write(wave_rec)
            kept = [*samples, wave_rec]
            tokens = [c.token_ids for c in comps]
            out.flush()
            took = time.perf_counter() - t
            records = took - (t_rec - t)
            # Outside the arm's time: what the replay had not finished when the wave returned (little:
            # a wave is longer than its JSON; 1-5 ms on the H200) and this wave's own records, which
            # the next wave of this arm replays.
            t = time.perf_counter()
            replay.wait()
            replay_left = time.perf_counter() - t
            t = time.perf_counter()
            if out is writer:
                out.wait()
            drain = time.perf_counter() - t
        finally:
            if arm.nogc and was:
                gc.enable()
        last_records[arm.name] = kept
        phases = dict((stats.extra or {}).get("phases", {}), records_s=records, drain_s=drain, replay_left_s=replay_left)
        # What the engine computed: b32/b64 waves of one arm jumped between ~2.4 and ~3.7 s in 1g, and
        # the heuristic's cascade decisions (which the raw arm shares but cannot count) may be why.
        cascade = {"steps": stats.cascade_steps, "decode_steps": stats.cascade_decode_steps, "total_steps": stats.total_steps}
        return took, tokens, phases, cascade

    arms = [ARM_SPECS[a] for a in args.arm_names]
    orders = arm_orders(arms)
    rows: list[dict[str, Any]] = []
    complete = True
    data: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "engine_start_s": round(start_s, 2),
                            "gc_frozen": gc.get_freeze_count(), "flat_logprobs_available": can_flat,
                            "engine_decodes_text": can_decode}  # fmt: skip
    for batch in [int(b) for b in args.batch.split(",")]:
        wv = waves(len(rendered), batch)[: args.waves]
        cid = f"ab-b{batch}"
        for rnd in range(args.rounds):
            if time.monotonic() - t_begin > args.budget_s:
                complete = False
                print(f"budget reached before b{batch} round {rnd}", flush=True)
                break
            for w, wave in enumerate(wv):
                order = orders[(rnd + w) % len(orders)]
                row: dict[str, Any] = {"batch": batch, "round": rnd, "wave": w, "warmup": rnd == 0,
                                       "order": [a.name for a in order], "arms": {}}  # fmt: skip
                toks: dict[str, list[list[int]]] = {}
                real = [j for j, (_, is_real) in enumerate(wave) if is_real]
                for arm in order:
                    if arm.harness:
                        s, t, ph, casc = harness_wave(arm, cid, w, wave)
                        row["arms"][arm.name] = {"s": s, "phases": ph, "cascade": casc}
                    else:
                        s, t = raw_wave(arm, [rendered[i] for i, _ in wave])
                        row["arms"][arm.name] = {"s": s}
                    toks[arm.name] = [t[j] for j in real]
                row["same_as_twin"] = {a.name: toks[a.name] == toks[a.twin] for a in arms if a.harness}
                row["identical"] = all(toks[a.name] == toks[arms[0].name] for a in arms)
                rows.append(row)
            print(f"b{batch} round {rnd}: " + ", ".join(
                f"{a.name} {statistics.median([r['arms'][a.name]['s'] for r in rows if r['batch'] == batch and r['round'] == rnd]) * 1e3:.1f} ms"
                for a in arms), flush=True)  # fmt: skip
        data.update(rows=rows, summary=summarize(rows), complete=complete)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1))
    for wr in (writer, replay, fg_writer):
        wr.close()
    engine.flat_logprobs, engine.decode_here = can_flat, can_decode
    engine.close()
    summary = summarize(rows)
    data.update(rows=rows, summary=summary, complete=complete, total_s=round(time.monotonic() - t_begin, 1))
    args.out.write_text(json.dumps(data, indent=1))
    print(table(summary))
    ident = summary["identical"]
    print(f"token-identical waves (every arm): {ident['identical']}/{ident['waves']}")
    ratio = summary["overall"]["harness"]["ratio"]
    if not complete or ratio is None:
        return 2
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
