"""The engines a matrix can run, behind one registry (simonw/llm's plugin pattern, without plugins yet).

Every other module asks :func:`get` what an engine can do instead of comparing its name, so a new
engine is one entry here and one module beside this one. Engines are imported only when built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cascade_repro.errors import UsageError

if TYPE_CHECKING:
    from cascade_repro.manifest import EnginePlanRecord, Manifest  # noqa: F401 - annotations


@dataclass(frozen=True)
class EngineInfo:
    """What the planner, explain and the reports need to know about an engine."""

    name: str
    description: str
    # vLLM's cascade cost model decides per step (explain ports it); False: the hard conditions only.
    cost_model: bool
    # FlashAttention versions, attention backends and arm switching by engine restart exist.
    attention_axes: bool
    # Tensor parallelism beyond 1 is possible.
    tensor_parallel: bool
    # Runs vLLM itself (reports of other engines say first that vLLM was not run).
    is_vllm: bool
    # A wave's outputs do not depend on the engine start or the waves before it, so an interrupted
    # cell can keep its finished waves (hf: greedy, no state between waves). vLLM's engine starts
    # differ (flat b8 twice: 51/64 identical on the H200), so its cells resume whole.
    exact_wave_resume: bool
    # The worker writes a wave's records on a thread while the next wave runs (runstore.JsonlWriter
    # background=True): their JSON was 10-40 ms of a vLLM wave at b8-b64 on an H200. hf's waves take
    # seconds, its exact resume wants each wave on disk before the next, and a thread would take
    # a core from torch on a small CPU box: it writes in the foreground.
    background_writes: bool
    build: Callable[[Manifest, EnginePlanRecord, Path | None], Any]


def _build_hf(run: Manifest, eplan: EnginePlanRecord, run_dir: Path | None) -> Any:
    from cascade_repro.engines.hf import HFEngine, default_threads

    spec = run.spec
    default_threads()
    return HFEngine(
        run.model_path,
        dtype=eplan.dtype,
        device=spec.device,
        topk=spec.topk,
        inject=spec.inject,
        trust_remote_code=spec.trust_remote_code,
        seed=eplan.seed,
        ignore_eos=bool(spec.ignore_eos),
    )


def _build_vllm(run: Manifest, eplan: EnginePlanRecord, run_dir: Path | None) -> Any:
    from cascade_repro.engines.vllm import VLLMEngine

    return VLLMEngine(run.model_path, run.spec, eplan, run_dir=run_dir)


ENGINES: dict[str, EngineInfo] = {
    "hf": EngineInfo(
        "hf", "transformers, CPU or GPU, with a reference cascade (prefix pass, suffix pass, LSE merge)",
        cost_model=False, attention_axes=False, tensor_parallel=False, is_vllm=False, exact_wave_resume=True,
        background_writes=False, build=_build_hf,
    ),
    "vllm": EngineInfo(
        "vllm", "vLLM's own cascade attention, counted and toggled by the probe plugin",
        cost_model=True, attention_axes=True, tensor_parallel=True, is_vllm=True, exact_wave_resume=False,
        background_writes=True, build=_build_vllm,
    ),
}  # fmt: skip


def get(name: str) -> EngineInfo:
    """The registry entry of ``name``; a one-line UsageError naming the known engines otherwise."""
    try:
        return ENGINES[str(name)]
    except KeyError:
        raise UsageError(f"unknown engine {name!r}; known: {', '.join(sorted(ENGINES))}") from None


def build(
    run: Manifest | dict[str, Any], eplan: EnginePlanRecord | dict[str, Any], run_dir: Path | None = None
) -> Any:
    """Construct the engine named by the run's spec for one engine plan.

    ``run`` and ``eplan`` may come as their run.json form (converted here); ``run_dir`` defaults to
    a ``run_dir`` key such a dict carries.
    """
    from cascade_repro.manifest import EnginePlanRecord, as_manifest

    m = as_manifest(run)
    ep = eplan if isinstance(eplan, EnginePlanRecord) else EnginePlanRecord.from_json(eplan)
    if run_dir is None and m.extra.get("run_dir"):
        run_dir = Path(m.extra["run_dir"])
    return get(m.spec.engine).build(m, ep, run_dir)
