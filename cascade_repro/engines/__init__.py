"""The engines a matrix can run, behind one registry (simonw/llm's plugin pattern, without plugins yet).

Every other module asks :func:`get` what an engine can do instead of comparing its name, so a new
engine is one entry here and one module beside this one. The table is data: an engine's builder is
named by a ``module:function`` path (as an entry point names it) and imported only when an engine
is built: the planner reads this table, so nothing here may import the planner, and neither do the
engines: ``worker.build_engine`` builds from a run, handing the builder the run's spec and
``plan/models`` (how to read the model's tokenizer and config).
"""

from __future__ import annotations

import importlib
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
    # A wave's outputs do not depend on the engine start or the waves before it, so an interrupted
    # cell can keep its finished waves (hf: greedy, no state between waves). Two vLLM engine starts
    # can give one wave different tokens, so its cells resume whole.
    exact_wave_resume: bool
    # The worker writes a wave's records on a thread while the next wave runs (runstore.JsonlWriter
    # background=True): their JSON is a visible share of a vLLM wave at large batches. hf's waves take
    # seconds, its exact resume wants each wave on disk before the next, and a thread would take
    # a core from torch on a small CPU box: it writes in the foreground.
    background_writes: bool
    # ``module:function`` of the builder, called as ``builder(run: Manifest, eplan: EnginePlan,
    # run_dir: Path | None, spec: MatrixSpec, models: base.ModelLoader)`` (the worker hands over the
    # spec and plan/models, so that no engine imports the planner); a path, not the function, so
    # that reading the table imports no engine.
    builder: str
    # ``module:function`` of the tokenizer of an engine that loads no weights (the fake), called with
    # no arguments. Such an engine's run resolves no model and has no reference pass (there is nothing
    # to teacher-force): it is judged by the arm-vs-arm rule. Empty: the model's own tokenizer.
    tokenizer: str = ""

    def load_builder(self) -> Callable[..., Any]:
        """Import the engine's module and return its builder."""
        return _load(self.builder)

    @property
    def has_weights(self) -> bool:
        """Whether the engine loads the run's model (False: it brings its own tokenizer, no reference)."""
        return not self.tokenizer

    def own_tokenizer(self) -> Any:
        """The tokenizer of an engine without weights (``tokenizer``'s function, called)."""
        return _load(self.tokenizer)()


def _load(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


ENGINES: dict[str, EngineInfo] = {
    "hf": EngineInfo(
        "hf", "transformers, CPU or GPU, with a reference cascade (prefix pass, suffix pass, LSE merge)",
        cost_model=False, attention_axes=False, tensor_parallel=False, is_vllm=False, exact_wave_resume=True,
        background_writes=False, builder="cascade_repro.engines.hf:build",
    ),
    "vllm": EngineInfo(
        "vllm", "vLLM's own cascade attention, counted and toggled by the probe plugin",
        cost_model=True, attention_axes=True, tensor_parallel=True, is_vllm=True, exact_wave_resume=False,
        background_writes=True, builder="cascade_repro.engines.vllm:build",
    ),
    # The suite's engine for everything around the model (runner, resume, merge, shard, report), and a
    # user's way to see the whole pipeline in seconds; lm-evaluation-harness registers its `dummy` model
    # the same way. In the package, not only in tests: the worker is a process of its own
    # (`python -m cascade_repro.run.worker`), and an entry a test added here would not exist there.
    "fake": EngineInfo(
        "fake", "deterministic fake without weights, for testing the harness (its numbers mean nothing)",
        cost_model=False, attention_axes=False, tensor_parallel=False, is_vllm=False, exact_wave_resume=True,
        background_writes=False, builder="cascade_repro.engines.fake:build",
        tokenizer="cascade_repro.engines.fake:tokenizer",
    ),
}  # fmt: skip


def get(name: str) -> EngineInfo:
    """The registry entry of ``name``; a one-line UsageError naming the known engines otherwise."""
    try:
        return ENGINES[str(name)]
    except KeyError:
        raise UsageError(f"unknown engine {name!r}; known: {', '.join(sorted(ENGINES))}") from None
