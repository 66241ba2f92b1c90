"""The engines a matrix can run, behind one registry (simonw/llm's plugin pattern, without plugins yet).

Every other module asks :func:`get` what an engine can do instead of comparing its name, so a new
engine is one entry here and one module beside this one. Engines are imported only when built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cascade_repro.errors import UsageError


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
    build: Callable[[dict[str, Any], dict[str, Any]], Any]


def _build_hf(run: dict[str, Any], eplan: dict[str, Any]) -> Any:
    from cascade_repro.engines.hf import HFEngine, default_threads

    spec = run["spec"]
    default_threads()
    return HFEngine(
        run["model_path"],
        dtype=eplan["dtype"],
        device=spec.get("device", "auto"),
        topk=spec["topk"],
        inject=spec.get("inject"),
        trust_remote_code=spec.get("trust_remote_code", False),
        seed=eplan["seed"],
        ignore_eos=bool(spec.get("ignore_eos", False)),
    )


def _build_vllm(run: dict[str, Any], eplan: dict[str, Any]) -> Any:
    from pathlib import Path

    from cascade_repro.engines.vllm import VLLMEngine

    return VLLMEngine(run["model_path"], run["spec"], eplan, run_dir=Path(run["run_dir"]))


ENGINES: dict[str, EngineInfo] = {
    "hf": EngineInfo(
        "hf", "transformers, CPU or GPU, with a reference cascade (prefix pass, suffix pass, LSE merge)",
        cost_model=False, attention_axes=False, tensor_parallel=False, is_vllm=False, build=_build_hf,
    ),
    "vllm": EngineInfo(
        "vllm", "vLLM's own cascade attention, counted and toggled by the probe plugin",
        cost_model=True, attention_axes=True, tensor_parallel=True, is_vllm=True, build=_build_vllm,
    ),
}  # fmt: skip


def get(name: str) -> EngineInfo:
    """The registry entry of ``name``; a one-line UsageError naming the known engines otherwise."""
    try:
        return ENGINES[str(name)]
    except KeyError:
        raise UsageError(f"unknown engine {name!r}; known: {', '.join(sorted(ENGINES))}") from None


def build(run: dict[str, Any], eplan: dict[str, Any]) -> Any:
    """Construct the engine named by the run's spec for one engine plan."""
    return get(run["spec"]["engine"]).build(run, eplan)
