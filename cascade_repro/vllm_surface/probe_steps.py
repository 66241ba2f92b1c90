"""The probe's step counters for the twins other than cascade: what the scheduler scheduled and how the
model runner ran each step.

- ``Scheduler.schedule`` (``vllm/v1/core/sched/scheduler.py``): steps, prefill chunks, the most
  requests in one step, and steps scheduled by an ``AsyncScheduler``.
- The step's CUDA-graph mode: the V1 model runner's ``_determine_batch_execution_and_padding``
  (0.26.0 to 0.33.0) or the V2 runner's ``CudaGraphManager.run_fullgraph`` / ``run_pw_graph``
  (``vllm/v1/worker/gpu/cudagraph_utils.py``, the only runner in 0.34.0).

``vllm_surface.targets`` names each target and the releases it applies to. Only the standard
library is imported, so this file loads without vLLM or torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from cascade_repro import vllm_surface
from cascade_repro.vllm_surface import preemption
from cascade_repro.vllm_surface.probe_state import MARK, ProbeState, original

SCHEDULER_MODULE = vllm_surface.SCHEDULER_MODULE


def patch_scheduler(module: ModuleType, state: ProbeState) -> list[str]:
    """Count the scheduler's steps and prefill chunks per wave (``Scheduler.schedule``, vLLM V1).

    A request is a chunk in a step when the tokens computed before the step plus those scheduled in
    it fall short of its prompt: its prefill goes on in a later step. Read from the scheduler's own
    ``requests`` (``num_computed_tokens``, ``num_prompt_tokens``) and the output's
    ``num_scheduled_tokens``; a release that names them otherwise counts steps only.
    """
    cls = module.__dict__.get("Scheduler")
    if not isinstance(cls, type) or not callable(getattr(cls, "schedule", None)):
        return []
    orig = original(cls.schedule)

    @functools.wraps(orig)
    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        state.refresh()
        if state.wave is None:
            return orig(self, *args, **kwargs)
        reqs = getattr(self, "requests", None) or {}
        before = {rid: getattr(r, "num_computed_tokens", None) for rid, r in reqs.items()}
        status = preemption.statuses(reqs)
        out = orig(self, *args, **kwargs)
        chunks = evicted = 0
        try:
            evicted = preemption.preempted(status, reqs)
            for rid, n in (getattr(out, "num_scheduled_tokens", None) or {}).items():
                r, done = reqs.get(rid), before.get(rid)
                prompt = getattr(r, "num_prompt_tokens", None)
                if (
                    isinstance(done, int)
                    and isinstance(prompt, int)
                    and done < prompt
                    and done + int(n) < prompt
                ):
                    chunks += 1
        except Exception as e:  # noqa: BLE001 - never break vLLM's scheduler
            state._note_error(f"schedule: {e!r}"[:200])
        n_reqs = len(getattr(out, "num_scheduled_tokens", None) or ())
        state.record_schedule(chunks, n_reqs, _is_async(self), evicted)
        return out

    setattr(schedule, MARK, orig)
    cls.schedule = schedule
    done = [f"{module.__name__}.Scheduler.schedule"]
    state.patched.extend(done)
    return done


def _is_async(scheduler: Any) -> bool:
    return any(c.__name__ == vllm_surface.ASYNC_SCHEDULER for c in type(scheduler).__mro__)


def _mode_name(mode: Any) -> str:
    """A CUDAGraphMode's name (``CUDAGraphMode.FULL`` -> ``FULL``)."""
    name = getattr(mode, "name", None)
    return str(name if isinstance(name, str) else mode).rpartition(".")[2].upper()


def patch_v1_graphs(module: ModuleType, state: ProbeState) -> list[str]:
    """Count each step's CUDA-graph mode as the V1 model runner decides it (``GPUModelRunner.
    _determine_batch_execution_and_padding`` returns the mode first; 0.26.0 to 0.33.0)."""
    cls = module.__dict__.get("GPUModelRunner")
    name = vllm_surface.V1_GRAPH_DECISION
    if not isinstance(cls, type) or not callable(cls.__dict__.get(name)):
        return []
    orig = original(cls.__dict__[name])

    @functools.wraps(orig)
    def decide(self: Any, *args: Any, **kwargs: Any) -> Any:
        state.refresh()  # a worker process of TP > 1 learns of a new wave here (one stat a step)
        out = orig(self, *args, **kwargs)
        if state.wave is not None:
            try:
                state.record_graph_step(_mode_name(out[0]))
            except Exception as e:  # noqa: BLE001 - never break the model runner
                state._note_error(f"graph mode: {e!r}"[:200])
        return out

    setattr(decide, MARK, orig)
    setattr(cls, name, decide)
    done = [f"{module.__name__}.GPUModelRunner.{name}"]
    state.patched.extend(done)
    return done


def patch_v2_graphs(module: ModuleType, state: ProbeState) -> list[str]:
    """Count the V2 model runner's graph steps: ``CudaGraphManager.run_fullgraph`` replays a FULL
    graph, ``run_pw_graph`` runs PIECEWISE ones (``vllm/v1/worker/gpu/cudagraph_utils.py``).
    Patched on the base class: ``ModelCudaGraphManager.run_fullgraph`` calls it through super()."""
    cls = module.__dict__.get("CudaGraphManager")
    if not isinstance(cls, type):
        return []
    done = []
    for name, mode in vllm_surface.V2_GRAPH_RUNS.items():
        fn = cls.__dict__.get(name)
        if not callable(fn):
            continue
        orig = original(fn)

        def make(orig: Callable[..., Any], mode: str) -> Callable[..., Any]:
            @functools.wraps(orig)
            def run(self: Any, *args: Any, **kwargs: Any) -> Any:
                state.refresh()
                if state.wave is not None:
                    state.record_graph_step(mode)
                return orig(self, *args, **kwargs)

            setattr(run, MARK, orig)
            return run

        setattr(cls, name, make(orig, mode))
        done.append(f"{module.__name__}.CudaGraphManager.{name}")
    state.patched.extend(done)
    return done
