"""How long a matrix takes, said before it starts: measured speeds, refined by the run's own waves.

A wave always runs at its full batch (the last one is topped up with fillers that are generated
too), and greedy decoding stops at ``max_tokens`` at the latest, so a wave's cost is bounded by
``batch x max_tokens`` generated tokens at the engine's speed for that batch. The speeds below were
measured with the shipped prompt set (1,597-token Korean system prompt) on the embedded model; a
run on another box, model or prompt set is refined by its own waves as soon as it has some
(:func:`measured_wave_seconds`), which is what the progress line's ETA uses.

The table's speeds are at 64 new tokens per request. A wave's prefill of the long shared prompt is
a fixed cost that this model spreads over the tokens, so runs with few new tokens are
underestimated on CPU (b1 at 8 tokens took 2.0 s against 0.3 s estimated) until their own first
waves correct it.

Standard library only: ``--dry-run`` must answer fast.
"""

from __future__ import annotations

import bisect
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cascade_repro.plan import cuda_cache
from cascade_repro.plan.matrix import spec_of
from cascade_repro.plan.packing import Packing, Slot, schedule
from cascade_repro.twin import CASCADE as TWIN

if TYPE_CHECKING:
    from cascade_repro.plan.matrix import MatrixSpec
    from cascade_repro.rundir.manifest import Manifest


@dataclass(frozen=True)
class SpeedTable:
    """Generated tokens per second by batch size for one engine on one kind of device."""

    engine: str
    device: str
    where: str  # what it was measured on, said beside every estimate made from it
    tok_s: Mapping[int, float]
    start_s: float  # an engine start, warm caches
    overhead_s: float  # preparing (imports, tokenizing) and scoring plus the four reports

    def rate(self, batch: int) -> float:
        """Tokens/s at ``batch``: linear in log(batch) between measured sizes, flat beyond them."""
        sizes = sorted(self.tok_s)
        if batch <= sizes[0]:
            return self.tok_s[sizes[0]]
        if batch >= sizes[-1]:
            return self.tok_s[sizes[-1]]
        i = bisect.bisect_left(sizes, batch)
        lo, hi = sizes[i - 1], sizes[i]
        f = (math.log(batch) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return self.tok_s[lo] + f * (self.tok_s[hi] - self.tok_s[lo])


# hf on CPU: `matrix --max-tokens 64` over 16-32 prompts on an idle 2-core x86 box (load ~1),
# wave seconds per batch 2.45 (b1), 6.36 (b4), 7.2 (b8), 11.4 (b16), 26.1 (b32); a loaded box is
# slower (the issue that asked for this measured ~4 tok/s at load 4-6).
# vLLM: benchmarks/RESULTS.md's overhead run on one H200 (vLLM 0.26.0, FA3, top-5 logprobs,
# CUDA graphs for the batch sizes); engine start from the cold/warm table there.
SPEEDS: dict[tuple[str, str], SpeedTable] = {
    ("hf", "cpu"): SpeedTable(
        "hf", "cpu", "an idle 2-core CPU", {1: 26.0, 4: 40.0, 8: 71.0, 16: 90.0, 32: 78.0},
        start_s=5.0, overhead_s=12.0,
    ),
    ("vllm", "cuda"): SpeedTable(
        "vllm", "cuda", "one H200", {1: 317.0, 8: 2023.0, 32: 1479.0, 64: 2071.0},
        start_s=63.0, overhead_s=25.0,
    ),
}  # fmt: skip

# FA2's first run on a Hopper GPU compiles its kernels (its wheel has sm_80 code and PTX only), once
# per machine: the engine start takes this much longer (249.8 s cold against 64.6 s warm on the H200;
# 241 s cold on another fresh one), and its first waves this much more (a b1 cell of 64 short waves,
# 87 s against its 9-s twin after it). Nothing of it persists in the driver's compute cache.
FA2_JIT_START_S = 185.0
FA2_JIT_WAVES_S = 75.0
FA2_JIT_S = FA2_JIT_START_S + FA2_JIT_WAVES_S
# Above this on a CPU, a run says how long it will take before it starts.
CPU_WARN_S = 15 * 60


@dataclass(frozen=True)
class Estimate:
    """A matrix's expected wall time and what it was computed from."""

    seconds: float | None  # None: no measured speed for this engine and device
    waves: int
    tokens: int  # generated tokens at most (fillers included)
    starts: int
    basis: str
    # Engines side by side (plan/packing.py): the same work one after another, and each key's
    # place and time (packing.Slot); None and () for a sequential run.
    sequential_s: float | None = None
    slots: tuple[Slot, ...] = ()

    def line(self) -> str:
        """One line for --dry-run and the warning before a long run."""
        work = f"{self.waves} waves, at most {self.tokens:,} generated tokens, {plural(self.starts, 'engine start')}"
        if self.seconds is None:
            return f"estimate: none ({self.basis}); {work}"
        side = ""
        if self.sequential_s is not None:
            side = f", engines side by side; one after another: about {fmt_duration(self.sequential_s)}"
        return f"estimate: about {fmt_duration(self.seconds)} ({work}{side}; {self.basis})"


def plural(n: int, word: str) -> str:
    # report.text.plural's twin: importing report/ would pull pandas into --dry-run.
    return f"{n} {word}" + ("" if n == 1 else "s")


def fmt_duration(seconds: float) -> str:
    """``40 s``, ``3 min``, ``1 h 05 min``: an estimate's precision, not a stopwatch's."""
    s = max(0.0, float(seconds))
    if s < 90:
        return f"{max(1, round(s))} s"
    m = round(s / 60)
    if m < 60:
        return f"{m} min"
    return f"{m // 60} h {m % 60:02d} min"


def wave_count(n_prompts: int, batch: int) -> int:
    return -(-n_prompts // batch) if n_prompts > 0 and batch > 0 else 0


def wave_wall(w: Mapping[str, Any]) -> tuple[int, float] | None:
    """(batch, wall seconds) of a wave record that has both, else None."""
    batch, wall = w.get("batch"), w.get("wall_s")
    if isinstance(batch, int) and isinstance(wall, (int, float)) and wall > 0:
        return batch, float(wall)
    return None


def mean_walls(walls: Mapping[int, list[float]]) -> dict[int, float]:
    return {b: sum(v) / len(v) for b, v in walls.items() if v}


def measured_wave_seconds(waves: Iterable[Mapping[str, Any]]) -> dict[int, float]:
    """Mean wall seconds of a wave per batch size, from a run's wave records (the run's own speed)."""
    walls: dict[int, list[float]] = {}
    for w in waves:
        if (bw := wave_wall(w)) is not None:
            walls.setdefault(bw[0], []).append(bw[1])
    return mean_walls(walls)


def wave_seconds(
    table: SpeedTable | None, batch: int, max_tokens: int, measured: Mapping[int, float] | None = None
) -> float | None:
    """One wave's expected seconds: the run's own mean at this batch if it has one, else the table."""
    if measured and batch in measured:
        return measured[batch]
    if table is None:
        return None
    return batch * max_tokens / table.rate(batch)


def estimate(
    engine: str,
    device: str,
    n_prompts: int,
    max_tokens: int,
    engines: Mapping[str, Mapping[str, Any]],
    done: Iterable[str] = (),
    measured: Mapping[int, float] | None = None,
    gpu_name: str = "",
    fa2_compiled: bool = True,
    packing: Packing | None = None,
) -> Estimate:
    """Expected wall time of a matrix's unfinished cells.

    ``engines`` maps an engine key to ``{"cells": [{"cell_id", "batch"}...], "fa_version", "tp"}``
    (a run.json plan entry with its cells resolved, or the planner's); ``done`` are finished cells,
    which cost nothing; ``measured`` the run's own mean wave seconds per batch. With a ``packing``
    that runs engines side by side, the time is its schedule's (``packing.schedule``: engines
    sharing a GPU slow each other), the one-after-another time beside it.
    """
    table = SPEEDS.get((engine, device))
    finished = set(done)
    waves = tokens = 0
    known = table is not None
    per_key: dict[str, tuple[float, float]] = {}  # key -> (engine start, waves) seconds, alone
    for key, ep in engines.items():
        todo = [c for c in ep["cells"] if c["cell_id"] not in finished]
        if not todo:
            continue
        start = work = 0.0
        if table is not None:
            start += table.start_s
            if cuda_cache.needs_fa2_jit(ep.get("fa_version"), gpu_name) and not fa2_compiled:
                start += FA2_JIT_S
        for c in todo:
            n = wave_count(n_prompts, int(c["batch"]))
            waves += n
            tokens += n * int(c["batch"]) * max_tokens
            per = wave_seconds(table, int(c["batch"]), max_tokens, measured)
            if per is None:
                known = False
            else:
                work += n * per
        per_key[key] = (start, work)
    overhead = table.overhead_s if table is not None else 0.0
    seconds = sum(a + b for a, b in per_key.values()) + overhead
    sequential_s: float | None = None
    slots: tuple[Slot, ...] = ()
    if packing is not None and packing.concurrent and per_key:
        keys = [(k, int(engines[k].get("tp") or 1)) for k in per_key]
        slots = tuple(schedule(packing, keys, per_key))
        sequential_s, seconds = seconds, max(s.end_s for s in slots) + overhead
    if table is None and measured:
        basis = "from this run's own waves"
    elif table is None:
        basis = f"no measured speed for the {engine} engine on {device}; the progress line gives one once waves finish"
    else:
        basis = f"speeds measured on {table.where}" + (
            ", refined by this run's own waves" if measured else ""
        )
    return Estimate(
        seconds if known else None, waves, tokens, len(per_key), basis,
        sequential_s if known else None, slots,
    )  # fmt: skip


# The quick first run a long CPU run's warning offers: what `make run` runs (the Makefile's RUN_ARGS;
# tests/run/test_progress.py holds the two together). Its time is estimated as any run's is.
QUICK_RUN_ARGS = ("--limit", "8", "--batch", "8", "--cascade", "on,off", "--max-tokens", "32")
QUICK_RUN = {"limit": 8, "batch": [8], TWIN.spec_field: [True, False], "max_tokens": 32}


def warning_for(
    est: Estimate, device: str, reference_s: float | None = None, quick_s: float | None = None
) -> str | None:
    """The line a long CPU run prints before it starts: the matrix's time and the reference pass's
    (``reference_s``, None when it is off), and the quick first run beside it (``quick_s``: its
    estimate, matrix and reference, None when unknown)."""
    if device != "cpu" or est.seconds is None:
        return None
    total = est.seconds + (reference_s or 0.0)
    if total <= CPU_WARN_S:
        return None
    parts = f"the matrix about {fmt_duration(est.seconds)} over {plural(est.waves, 'wave')}"
    if reference_s:
        parts += f", the reference pass about {fmt_duration(reference_s)}"
    quick = f"a quick first run, `cascade-repro matrix {' '.join(QUICK_RUN_ARGS)}` (what `make run` runs)"
    if quick_s is not None:
        quick += f", takes about {fmt_duration(quick_s)}"
    return (
        f"this run takes about {fmt_duration(total)} on this CPU ({parts}); {quick}; "
        "Ctrl-C keeps every finished wave for a rerun of the same command"
    )


def run_device(engine: str, device: str) -> str:
    """``cpu`` or ``cuda``: where a matrix's engine will run (``auto`` asks torch, as the hf engine does)."""
    from cascade_repro.engines import get as engine_info

    if engine_info(engine).is_vllm:
        return "cuda"
    if not engine_info(engine).has_weights:  # the fake computes nothing on a device
        return "cpu"
    if device != "auto":
        return "cuda" if device.startswith("cuda") else device
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def for_plan(
    spec: MatrixSpec | Mapping[str, Any],
    n_prompts: int,
    engines: Mapping[str, Mapping[str, Any]],
    run_dir: Path | None = None,
    gpu_name: str = "",
    packing: Packing | None = None,
) -> Estimate:
    """The estimate of a planned matrix (``spec`` a MatrixSpec or its run.json form), refined by the
    run directory's samples when a run of the same id already has waves (a rerun resumes; finished
    cells are free)."""
    from cascade_repro.plan.matrix import MatrixSpec, spec_of
    from cascade_repro.rundir import layout, safety, sample_scan

    if not isinstance(spec, MatrixSpec):
        spec = spec_of(spec)

    done: set[str] = set()
    waves: list[dict[str, Any]] = []
    if run_dir is not None and run_dir.is_dir():
        # Read before any lock (a dry run, the estimate before a run starts): a planted link or
        # FIFO must be refused here, as the lock refuses it, not followed or blocked on.
        safety.refuse_run_links(run_dir)
        keys = sample_scan.prompt_ids(run_dir)
        for key in engines:
            prog = sample_scan.read_progress(layout.samples_path(run_dir, key), keys)
            done |= prog.done
            waves += [w for ws in prog.waves.values() for w in ws]
    compiled = True
    if any(cuda_cache.needs_fa2_jit(ep.get("fa_version"), gpu_name) for ep in engines.values()):
        # Only then is the compute cache worth looking at (apply() creates its folder).
        compiled = cuda_cache.fa2_compiled(cuda_cache.apply(dict(os.environ)), gpu_name)
    return estimate(
        spec.engine, run_device(spec.engine, spec.device), n_prompts, int(spec.max_tokens),
        engines, done, measured_wave_seconds(waves), gpu_name, compiled, packing,
    )  # fmt: skip


def for_run(m: Manifest, run_dir: Path | None = None) -> Estimate:
    """The estimate of a prepared run."""
    cells = m.plan.cell_map()
    engines = {
        k: {"cells": [{"cell_id": c, "batch": cells[c].batch} for c in ep.cells], "fa_version": ep.fa_version}
        for k, ep in m.plan.engines.items()
    }
    gpu = str(m.stack_env.get("gpu_name") or "")
    return for_plan(spec_of(m.spec_json), int(m.prompt_set.n), engines, run_dir, gpu)
