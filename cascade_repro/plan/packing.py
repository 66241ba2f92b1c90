"""How a matrix's engine keys share this machine: which GPUs each gets, how many run at once, and
the memory each engine may take.

An engine on a GPU holds, per GPU of its TP group (the model shards over them):

- its weights' share: the checkpoint's bytes in the dtype the engine runs, over ``tp``;
- its KV cache: a fixed budget (vLLM's ``kv_cache_memory_bytes``, per GPU), at least the minimum
  that holds a whole wave at once (largest batch x the longest prompt plus ``max_tokens``, rounded
  up to 256 tokens as vLLM's context is, in the model's KV bytes per token) and by default twice
  that, so a wave never waits for blocks (a preempted request is recomputed in another batch, and a
  batch's make-up can change its tokens); never under 1 GiB;
- an overhead for everything else (:data:`OVERHEAD_BYTES`, plus :data:`OVERHEAD_SHARE` of the
  weights' share): the CUDA context, cuBLAS and attention workspaces, the activations of a prefill
  step, the CUDA graphs' memory pool, NCCL buffers under TP. The embedded model (135M parameters,
  bf16) took a few GB per engine on the H200 with 6 GB of KV, which this model covers with margin.

Engines on one GPU together take at most :data:`USABLE` of its memory (vLLM's own default
``gpu_memory_utilization``), and at most ``--max-engines-per-gpu`` of them run on it at once. A
fixed KV budget also skips vLLM's free-memory profiling at start, which engines starting side by
side would break for each other; each engine's ``gpu_memory_utilization`` is set to its own share,
because vLLM refuses to start when less than that fraction of the GPU is free.

Keys start in plan order, each on the GPUs with the most room left (spread first, then packed); a
key that does not fit waits for a running one to end, and no later key overtakes it, so the order
of starts is the plan's. With one engine per GPU on a one-GPU machine that is exactly the sequential
run (nothing pinned, no budget passed). Engines without a GPU placement (the fake engine, the hf
engine) run ``--max-engines-per-gpu`` at once, 1 by default: the hf engine on a CPU uses every core.

Standard library only: ``--dry-run`` must answer fast.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cascade_repro.engines import GPU_SHARE_ENV, KV_BUDGET_ENV
from cascade_repro.errors import UsageError
from cascade_repro.plan.gpus import Inventory

if TYPE_CHECKING:
    from cascade_repro.plan.matrix import MatrixSpec
    from cascade_repro.rundir.manifest import Manifest

GIB = 1 << 30
MIB = 1 << 20
USABLE = 0.90
OVERHEAD_BYTES = int(2.5 * GIB)
OVERHEAD_SHARE = 0.10
MIN_KV_BYTES = 1 * GIB
KV_HEADROOM = 2.0  # the default budget: twice the minimum a whole wave needs
KV_ROUND = 256 * MIB
CONTEXT_ROUND = 256  # vLLM's max_model_len as the engine sets it: prompt + max_tokens + 1, rounded up
# Without --max-engines-per-gpu, at most this many vLLM engines share one GPU: each keeps about two
# CPU cores busy (its worker and its engine core's busy loop), and the H200 boxes this was measured
# on have 16 (nine engines side by side started 1.5x slower each than one alone).
AUTO_MAX_PER_GPU = 8
# The variables a worker is handed: engines/vllm.py reads the budget and the share.
ENV_KV_BYTES = KV_BUDGET_ENV
ENV_GPU_UTIL = GPU_SHARE_ENV
# vLLM's estimate of its CUDA graphs' memory during profiling: off, as the H200 evidence ran it
# (engines side by side would each measure the others' graphs).
PROFILER_ENV = {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"}


@dataclass(frozen=True)
class ModelMemory:
    """What the memory arithmetic needs of a model: its weights in bytes as run, and its KV cache's
    bytes per token per layer stack (K and V, every KV head, at the engine's dtype)."""

    weights_bytes: int
    kv_heads: int
    layers: int
    head_dim: int
    dtype_bytes: int

    def kv_bytes_per_token(self, tp: int) -> int:
        """One token's K and V on one GPU of a TP group (KV heads split over it, replicated where
        there are fewer heads than GPUs)."""
        heads = max(1, math.ceil(self.kv_heads / max(1, tp)))
        return 2 * self.layers * heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class EngineMemory:
    """One engine's memory on each GPU of its TP group, in bytes."""

    weights: int
    kv: int
    overhead: int
    min_kv: int
    kv_given: bool = False  # the user's kv_cache_memory_bytes (theirs wins over the computed budget)

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.overhead


@dataclass(frozen=True)
class Slot:
    """Where and when one engine key runs: its GPUs (positions in the inventory; empty without GPU
    placement), its turn (``wave``: 0 for the keys that start at once, 1 for those that start as
    the first end, ...) and, where the schedule was simulated, its expected start and end."""

    key: str
    gpus: tuple[int, ...]
    wave: int
    start_s: float = 0.0
    end_s: float = 0.0


@dataclass(frozen=True)
class Packing:
    """How a matrix's engine keys share this machine: ``mode`` ``gpu`` (engines pinned to GPUs,
    memory accounted) or ``slots`` (no placement: ``cap`` engines at once)."""

    mode: str
    cap: int  # engines per GPU at most (gpu), or engines at once (slots)
    inventory: Inventory
    memory: Mapping[int, EngineMemory] = field(default_factory=dict)  # per tp
    budget: bool = False  # a KV budget and a memory share are handed to each engine
    util_given: float | None = None  # the user's --gpu-memory-utilization: it wins, nothing injected
    notes: tuple[str, ...] = ()

    @property
    def concurrent(self) -> bool:
        """Whether more than one engine may run at once."""
        if self.mode == "slots":
            return self.cap > 1
        return self.cap > 1 or len(self.inventory) > 1

    def packer(self) -> Packer:
        return Packer(self)

    def env_for(self, tp: int, gpus: Sequence[int]) -> dict[str, str]:
        """The variables a worker on ``gpus`` gets: the GPUs it sees, and under a budget its KV bytes
        and memory share. Nothing in a sequential one-GPU run (today's behaviour exactly)."""
        if self.mode != "gpu" or not self.concurrent:
            return {}
        env = {"CUDA_VISIBLE_DEVICES": ",".join(self.inventory.gpus[i].cuda_id for i in gpus)}
        mem = self.memory.get(tp)
        if self.budget and mem is not None:
            env.update(PROFILER_ENV)
            if not mem.kv_given:
                env[ENV_KV_BYTES] = str(mem.kv)
            total = min(self.inventory.gpus[i].memory_bytes for i in gpus)
            env[ENV_GPU_UTIL] = f"{share_fraction(mem.total, total):.3f}"
        return env


def share_fraction(need: int, total: int) -> float:
    """An engine's ``gpu_memory_utilization``: its bytes over the GPU's, rounded up to 0.001 (vLLM
    refuses to start where less than this fraction is free; engines packed within :data:`USABLE`
    leave each at least its own)."""
    return min(1.0, math.ceil(need / total * 1000) / 1000)


class Packer:
    """Online placement: ``place`` a key on GPUs with room (None: it must wait), ``release`` it
    when its worker ends. The runner and the dry run's schedule both place through it."""

    def __init__(self, packing: Packing) -> None:
        self.p = packing
        n = len(packing.inventory)
        self.used = [0] * n  # bytes taken per GPU
        self.count = [0] * n  # engines per GPU
        self.running: dict[str, tuple[int, tuple[int, ...]]] = {}  # key -> (tp, gpus)

    def place(self, key: str, tp: int) -> tuple[int, ...] | None:
        p = self.p
        if p.mode == "slots":
            if len(self.running) >= p.cap:
                return None
            self.running[key] = (tp, ())
            return ()
        mem = p.memory.get(tp)
        need = mem.total if mem is not None else 0
        room = []
        for g in p.inventory.gpus:
            free = int(g.memory_bytes * USABLE) - self.used[g.index]
            if self.count[g.index] < p.cap and (mem is None or free >= need):
                room.append((-(p.cap - self.count[g.index]), -free, g.index))
        if len(room) < tp:
            return None
        gpus = tuple(sorted(i for *_, i in sorted(room)[:tp]))
        for i in gpus:
            self.used[i] += need
            self.count[i] += 1
        self.running[key] = (tp, gpus)
        return gpus

    def release(self, key: str) -> None:
        tp, gpus = self.running.pop(key)
        mem = self.p.memory.get(tp)
        for i in gpus:
            self.used[i] -= mem.total if mem is not None else 0
            self.count[i] -= 1

    def idle(self) -> bool:
        return not self.running


def engine_memory(
    model: ModelMemory,
    tp: int,
    tokens_per_seq: int,
    max_batch: int,
    kv_given: int | None = None,
    max_model_len: int | None = None,
) -> EngineMemory:
    """One engine's bytes per GPU at ``tp``: weights' share, KV budget (the user's where given),
    overhead; ``min_kv`` is what a whole wave of ``max_batch`` sequences needs, and at least one
    sequence of the user's ``--max-model-len`` (vLLM refuses to start with less)."""
    weights = math.ceil(model.weights_bytes / max(1, tp))
    seq = -(-tokens_per_seq // CONTEXT_ROUND) * CONTEXT_ROUND
    per_token = model.kv_bytes_per_token(tp)
    min_kv = max(MIN_KV_BYTES, max_batch * seq * per_token, int(max_model_len or 0) * per_token)
    if kv_given is not None:
        kv = int(kv_given)
    else:
        kv = -(-int(min_kv * KV_HEADROOM) // KV_ROUND) * KV_ROUND
    return EngineMemory(
        weights, kv, OVERHEAD_BYTES + int(OVERHEAD_SHARE * weights), min_kv, kv_given is not None
    )


def fit_kv(mem: EngineMemory, gpu_bytes: int) -> EngineMemory:
    """The budget cut to what one GPU holds beside the weights and overhead, never under the minimum
    (the refusal is :func:`refusal`'s); a user's budget is left as given."""
    if mem.kv_given:
        return mem
    room = int(gpu_bytes * USABLE) - mem.weights - mem.overhead
    if mem.total > gpu_bytes * USABLE and room >= mem.min_kv:
        return EngineMemory(mem.weights, room // KV_ROUND * KV_ROUND or room, mem.overhead, mem.min_kv)
    return mem


def gb(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def pack(
    tps: Sequence[int],
    inventory: Inventory,
    *,
    gpu_engine: bool,
    model: ModelMemory | None,
    tokens_per_seq: int,
    max_batch: int,
    max_per_gpu: int | None,
    kv_given: int | None = None,
    util_given: float | None = None,
    max_model_len: int | None = None,
) -> Packing:
    """The packing of keys with these TP sizes on ``inventory``; refused in one line (UsageError)
    where a TP group is larger than the GPUs or one engine does not fit a GPU.

    ``gpu_engine``: the engine is placed on GPUs (vLLM); otherwise ``max_per_gpu`` engines run at
    once (default 1). ``model`` None: its size is unknown (a Hub model not downloaded yet), so
    engines are counted, not measured. ``kv_given``/``util_given``: the user's
    ``kv_cache_memory_bytes`` / ``--gpu-memory-utilization``, which win over the computed budget.
    """
    if max_per_gpu is not None and max_per_gpu < 1:
        raise UsageError(f"--max-engines-per-gpu {max_per_gpu}: must be 1 or more")
    if not gpu_engine:
        return Packing("slots", max_per_gpu or 1, inventory)
    want = max(tps or [1])
    if want > len(inventory):
        raise UsageError(
            f"--tp {want} needs {want} GPUs, {len(inventory)} visible ({inventory.describe()}); "
            "a TP group runs on GPUs of one machine"
        )
    cap = max_per_gpu if max_per_gpu is not None else AUTO_MAX_PER_GPU
    notes: list[str] = []
    memory: dict[int, EngineMemory] = {}
    smallest = min(g.memory_bytes for g in inventory.gpus)
    if smallest <= 0:  # GPUs counted without their memory (gpus.counted): nothing to measure against
        model = None
    if model is not None:
        for tp in sorted(set(tps)):
            mem = engine_memory(model, tp, tokens_per_seq, max_batch, kv_given, max_model_len)
            mem = fit_kv(mem, smallest)
            if util_given is not None:  # vLLM takes the user's fraction of each GPU
                kv = max(0, int(util_given * smallest) - mem.weights - mem.overhead)
                mem = EngineMemory(mem.weights, kv, mem.overhead, mem.min_kv, True)
            if (why := refusal(mem, smallest, tp)) is not None:
                raise UsageError(why)
            memory[tp] = mem
            fits = int(smallest * USABLE) // mem.total if mem.total > 0 else cap
            if fits < cap and max_per_gpu is not None and max_per_gpu > 1:
                notes.append(
                    f"--max-engines-per-gpu {max_per_gpu}: {fits} engine{'s' if fits != 1 else ''} at tp {tp} "
                    f"fit{'s' if fits == 1 else ''} on a {gb(smallest)} GPU ({gb(mem.total)} each)"
                )
    else:
        # Nothing to size a budget by: vLLM profiles free memory at each start, which engines
        # starting side by side on one GPU would disturb. One per GPU unless asked for more.
        cap = max_per_gpu or 1
        why = (
            "the GPUs' memory is unknown"
            if smallest <= 0
            else "the model's size is unknown (not on disk yet)"
        )
        notes.append(f"{why}: memory not checked, {cap} engine{'s' if cap != 1 else ''} per GPU")
    # One engine per GPU needs no budget: it has the GPU to itself, as in a sequential run.
    budget = model is not None and cap > 1 and util_given is None
    if kv_given is not None and cap > 1:
        notes.append(f"kv_cache_memory_bytes={kv_given} is yours: it wins over the computed budget")
    if util_given is not None and cap > 1:
        notes.append(
            f"--gpu-memory-utilization {util_given:g} is yours: each engine takes that share of its GPU; "
            "without -E kv_cache_memory_bytes vLLM profiles free memory at each start, which engines "
            "starting side by side can disturb"
        )
    return Packing("gpu", cap, inventory, memory, budget, util_given, tuple(notes))


def refusal(mem: EngineMemory, gpu_bytes: int, tp: int) -> str | None:
    """The one line refusing an engine that cannot fit a GPU even alone, else None."""
    room = int(gpu_bytes * USABLE)
    need = mem.weights + mem.overhead + (mem.kv if mem.kv_given else mem.min_kv)
    if need <= room:
        return None
    kv = f"{gb(mem.kv)} KV cache (yours)" if mem.kv_given else f"{gb(mem.min_kv)} KV cache for a whole wave"
    return (
        f"one engine at tp {tp} needs {gb(need)} per GPU ({gb(mem.weights)} weights, {kv}, "
        f"{gb(mem.overhead)} overhead), more than the {gb(room)} a {gb(gpu_bytes)} GPU gives it: "
        "a larger --tp, a smaller --batch or --max-tokens, or a GPU with more memory"
    )


def schedule(
    packing: Packing,
    keys: Sequence[tuple[str, int]],
    seconds: Mapping[str, tuple[float, float]] | None = None,
) -> list[Slot]:
    """Every key's GPUs and turn as the runner will start them (plan order, no overtaking), with its
    expected start and end where ``seconds`` gives each key's (engine start, waves) seconds run alone.

    Engines sharing a GPU slow each other: an engine start by :data:`START_CONTENTION` per other
    engine running beside it (measured: nine embedded-model engines started at once on one H200 took
    95.7 s each against 63 s alone), and waves by the number of engines on the GPU (its compute is
    shared; a small model leaves it idle between steps, so this overestimates their waves)."""
    seconds = seconds or {}
    packer = packing.packer()
    out: list[Slot] = []
    running: list[tuple[float, str]] = []  # (end, key)
    now, wave, i = 0.0, 0, 0
    sharing = _sharing(packing, keys)
    while i < len(keys):
        key, tp = keys[i]
        gpus = packer.place(key, tp)
        if gpus is None:
            if not running:  # cannot happen past pack()'s refusals; never loop forever
                raise UsageError(f"engine key {key} fits on no GPU of {packing.inventory.describe()}")
            running.sort()
            end, done = running.pop(0)
            packer.release(done)
            now = max(now, end)
            wave += 1
            continue
        start_s, work_s = seconds.get(key, (0.0, 0.0))
        k = sharing
        took = start_s * (1 + START_CONTENTION * (k - 1)) + work_s * k
        running.append((now + took, key))
        out.append(Slot(key, gpus, wave, round(now, 1), round(now + took, 1)))
        i += 1
    return out


START_CONTENTION = 0.065


def _sharing(packing: Packing, keys: Sequence[tuple[str, int]]) -> int:
    """Engines expected to share one GPU at once: the cap, or fewer where fewer keys per GPU exist."""
    if packing.mode == "slots":
        return 1
    per_gpu = max(1, math.ceil(sum(tp for _, tp in keys) / max(1, len(packing.inventory))))
    fit = packing.cap
    smallest = min((g.memory_bytes for g in packing.inventory.gpus), default=0)
    for mem in packing.memory.values():
        fit = min(fit, max(1, int(smallest * USABLE) // max(1, mem.total)))
    return max(1, min(fit, per_gpu))


def for_spec(
    spec: MatrixSpec,
    tps: Sequence[int],
    max_batch: int,
    prompt_tokens_max: int | None,
    model_path: str,
    max_per_gpu: int | None,
    inventory: Inventory,
) -> Packing:
    """:func:`pack` for a matrix: its engine, its keys' TP sizes, its largest batch and longest
    prompt (None: not measured, so the model's memory is not checked), the model folder."""
    from cascade_repro.engines import get as engine_info
    from cascade_repro.plan.matrix import MatrixSpec as Spec

    vllm = engine_info(spec.engine).is_vllm
    model = None
    if vllm and prompt_tokens_max is not None and model_path:
        model = model_memory(model_path, spec.dtypes)
    kv = (spec.engine_args or {}).get("kv_cache_memory_bytes")
    util = spec.gpu_memory_utilization
    return pack(
        tps, inventory, gpu_engine=vllm, model=model,
        tokens_per_seq=int(prompt_tokens_max or 0) + int(spec.max_tokens) + 1, max_batch=max_batch,
        max_per_gpu=max_per_gpu, kv_given=int(kv) if isinstance(kv, int | float) and kv else None,
        util_given=None if util == Spec.gpu_memory_utilization else float(util),
        max_model_len=spec.max_model_len if vllm else None,
    )  # fmt: skip


def for_run(run: Manifest, max_per_gpu: int | None, inventory: Inventory) -> Packing:
    """:func:`for_spec` for a prepared run: its plan's keys and batches, its longest rendered prompt,
    its model folder."""
    from cascade_repro.plan.matrix import spec_of

    prompt_max = run.prompt_set.prompt_tokens_max if run.prompt_set is not None else None
    return for_spec(
        spec_of(run.spec_json),
        [ep.tp for ep in run.plan.engines.values()],
        max([c.batch for c in run.plan.cells] or [1]),
        int(prompt_max) if prompt_max is not None else None,
        run.model_path or "",
        max_per_gpu,
        inventory,
    )


def model_memory(model_path: str, dtypes: Sequence[str]) -> ModelMemory | None:
    """A local model folder's memory facts (config.json and the weight files' sizes) for the widest
    of the arms' dtypes; None where the folder or its config cannot be read (a Hub id not on disk)."""
    folder = Path(model_path) if model_path else None
    if folder is None or not (folder / "config.json").is_file():
        folder = _hub_snapshot(model_path)
    if folder is None:
        return None
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    cfg = {**cfg, **(cfg.get("text_config") or {})}
    try:
        heads = int(cfg["num_attention_heads"])
        layers = int(cfg["num_hidden_layers"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError):
        return None
    on_disk = sum(
        p.stat().st_size
        for p in folder.iterdir()
        if p.suffix in (".safetensors", ".bin", ".pt") and p.is_file()
    )
    stored = 4 if str(cfg.get("torch_dtype") or cfg.get("dtype") or "") == "float32" else 2
    run = 4 if any(d in ("float32", "float") for d in dtypes) else 2
    return ModelMemory(on_disk * run // stored, kv_heads, layers, head_dim, run)


def _hub_snapshot(model_id: str) -> Path | None:
    """The folder of a Hub model already in the local cache (nothing is downloaded), else None."""
    if not model_id or "/" not in model_id or Path(model_id).exists():
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, or no huggingface_hub: the size is unknown
        return None


def parallel(packing: Packing, tps: Sequence[int]) -> int:
    """How many engines run at once, about (the progress line's time left divides by it)."""
    if packing.mode == "slots":
        return max(1, min(packing.cap, len(tps)))
    keys = [("", tp) for tp in tps]
    per_gpu = _sharing(packing, keys)
    return max(1, min(len(tps), per_gpu * len(packing.inventory) // max(1, max(tps or [1]))))


def describe(packing: Packing) -> list[str]:
    """The dry run's lines on the packing: the machine, engines per GPU, each engine's memory."""
    if packing.mode == "slots":
        n = packing.cap
        return [f"engines: {n} at a time" + (" (--max-engines-per-gpu)" if n > 1 else ", one after another")]
    lines = [f"GPUs: {packing.inventory.describe()} ({packing.inventory.source}); at most {packing.cap} engine"
             f"{'s' if packing.cap != 1 else ''} per GPU"]  # fmt: skip
    for tp, mem in sorted(packing.memory.items()):
        kv = (
            "yours"
            if mem.kv_given
            else ("passed to vLLM" if packing.budget else "vLLM's own, from free memory")
        )
        lines.append(
            f"memory per engine at tp {tp}, per GPU: {gb(mem.total)} = {gb(mem.weights)} weights + "
            f"{gb(mem.kv)} KV ({kv}; a wave needs {gb(mem.min_kv)}) + {gb(mem.overhead)} overhead"
        )
    lines += [f"note: {n}" for n in packing.notes]
    return lines
