"""vLLM general plugin: count cascade-attention decisions and executions; force the flat arm; inject faults.

vLLM calls :func:`register` (entry point ``vllm.general_plugins`` -> ``cascade_repro_probe``) in every
process it starts: the ``LLM`` process (``EngineArgs.__post_init__``), the engine-core process
(``EngineCore.__init__``) and every tensor-parallel worker (``WorkerWrapperBase.init_worker``); see
``vllm/plugins/__init__.py``, ``vllm/engine/arg_utils.py``, ``vllm/v1/engine/core.py`` and
``vllm/v1/worker/worker_base.py`` in vLLM 0.26.0. It does nothing unless ``CASCADE_REPRO_PROBE``
names a directory; the vLLM engine (``engines/vllm.py``) sets it before importing vLLM, so the
spawned processes inherit it.

This module is the plugin's entry point: :func:`activate` starts the process's state and hooks each
patch on the module it patches; the probe's parts, each in a module of its own, are named here too
(the engine and the tests read them from ``probe``):

- ``probe_state.py``: the process's counters per wave, the control it last read, its counts file
  (the control protocol and the step timing are described there);
- ``probe_cascade.py``: FlashAttention's cascade path (the decision, the call, the merge's LSE
  faults, the FA version per layer);
- ``probe_steps.py``: the scheduler's steps and the model runner's CUDA-graph modes (every twin);
- ``probe_worker.py``: the sync and facts RPCs on ``WorkerWrapperBase``, and the out-scale fault;
- ``probe_control.py``: the engine's side: the control file written, the counts files read back.

The patches serve every twin from vLLM 0.10.2 to 0.34.0: ``vllm_surface.targets`` names each target
and the releases it applies to, and tests/vllm_surface checks them against every recorded release.
Cascade attention (removed in 0.32.0) is patched only where it exists.

The flash_attn module is not imported here: its class body evaluates ``get_flash_attn_version()``
at import time, under whatever vLLM config is current, so importing it earlier than vLLM does could
change its CUDA-graph support class. Instead a post-import hook (``sys.meta_path``) patches it right
after vLLM imports it (or at once if it is already imported).

Only the standard library is imported at module level, so this file loads without vLLM or torch.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from cascade_repro import vllm_surface
from cascade_repro.vllm_surface import flashinfer_cascade

# The probe's parts, named here for the engine and the tests (``probe.write_control``, ...).
from cascade_repro.vllm_surface.probe_cascade import (  # noqa: F401
    PREFIX_LSE_POS,
    REBIND,
    SUFFIX_LSE_POS,
    WRAPPERS,
    misread_lse,
    note_decode_shape,
    patch_flash_attn,
    wrap_cascade,
    wrap_decision,
    wrap_merge,
)
from cascade_repro.vllm_surface.probe_control import (  # noqa: F401
    aggregate,
    control_data,
    control_text,
    process_facts,
    read_count_files,
    write_control,
)
from cascade_repro.vllm_surface.probe_state import (  # noqa: F401
    CONTROL_FILE,
    COUNTER_KEYS,
    COUNTS_PREFIX,
    FLUSH_EVERY,
    KEEP_WAVES,
    MARK,
    STEP_CASCADE,
    STEP_FLAT,
    STEP_PREFILL,
    TIMING_KEYS,
    ProbeState,
    new_counters,
    original,
)
from cascade_repro.vllm_surface.probe_state import original as _original  # noqa: F401 - the tests' name
from cascade_repro.vllm_surface.probe_steps import (  # noqa: F401
    SCHEDULER_MODULE,
    patch_scheduler,
    patch_v1_graphs,
    patch_v2_graphs,
)
from cascade_repro.vllm_surface.probe_worker import (  # noqa: F401
    FACTS_METHOD,
    IMPL_OUTPUT_POS,
    RPC_METHOD,
    kv_cache_facts,
    patch_worker_base,
    patch_worker_facts,
    worker_facts,
    wrap_impl_forward,
)

ENV_VAR = "CASCADE_REPRO_PROBE"
FLASH_ATTN_MODULE = vllm_surface.FLASH_ATTN_MODULE
WORKER_BASE_MODULE = vllm_surface.WORKER_BASE_MODULE
WORKER_BASE_MODULES = vllm_surface.WORKER_BASE_MODULES

# --------------------------------------------------------------------------------------------
# Post-import hook
# --------------------------------------------------------------------------------------------


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then runs the hook on the freshly executed module."""

    def __init__(self, loader: Any, hook: Callable[[ModuleType], Any]) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        try:
            self._hook(module)
        except Exception as e:  # noqa: BLE001 - a failed patch must not fail vLLM's import
            print(
                f"cascade_repro.vllm_surface.probe: patching {module.__name__} failed: {e!r}", file=sys.stderr
            )

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.hooks: dict[str, list[Callable[[ModuleType], Any]]] = {}
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        hooks = self.hooks.get(fullname)
        if not hooks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        except (ImportError, ValueError):
            return None
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None

        def run_all(module: ModuleType) -> None:
            for hook in list(self.hooks.get(fullname, ())):
                hook(module)

        spec.loader = _PatchingLoader(spec.loader, run_all)
        return spec


_FINDER: _PostImportFinder | None = None


def when_imported(name: str, hook: Callable[[ModuleType], Any]) -> None:
    """Run ``hook(module)`` now if ``name`` is imported, else right after it is first imported."""
    global _FINDER
    mod = sys.modules.get(name)
    if mod is not None:
        hook(mod)
        return
    if _FINDER is None or _FINDER not in sys.meta_path:
        _FINDER = _PostImportFinder()
        sys.meta_path.insert(0, _FINDER)
    _FINDER.hooks.setdefault(name, []).append(hook)


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------

_STATE: ProbeState | None = None


def state() -> ProbeState | None:
    return _STATE


def activate(directory: str | os.PathLike[str]) -> ProbeState:
    """Start probing in this process (idempotent): counters, hooks on flash_attn and worker_base."""
    global _STATE
    if _STATE is not None and _STATE.dir == Path(directory) and _STATE.pid == os.getpid():
        return _STATE
    st = ProbeState(directory)
    _STATE = st
    st.flush()
    atexit.register(st.flush)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=st.after_fork)
    when_imported(FLASH_ATTN_MODULE, lambda m: patch_flash_attn(m, st))
    for name in WORKER_BASE_MODULES:  # the one this vLLM uses defines WorkerWrapperBase
        when_imported(name, lambda m: patch_worker_base(m, st))
        when_imported(name, lambda m: patch_worker_facts(m, st))
    when_imported(SCHEDULER_MODULE, lambda m: patch_scheduler(m, st))
    # FlashInfer's own cascade path (0.10.2), counted as cascade calls like FLASH_ATTN's.
    when_imported(flashinfer_cascade.MODULE, lambda m: flashinfer_cascade.patch(m, st))
    # Both runners' graph points: the one this vLLM runs is imported (0.34.0 has only the V2 one).
    when_imported(vllm_surface.V1_RUNNER_MODULE, lambda m: patch_v1_graphs(m, st))
    when_imported(vllm_surface.V2_GRAPHS_MODULE, lambda m: patch_v2_graphs(m, st))
    return st


def register() -> None:
    """vLLM general-plugin entry point. Inactive unless ``CASCADE_REPRO_PROBE`` is set."""
    directory = os.environ.get(ENV_VAR, "").strip()
    if not directory:
        return
    try:
        activate(directory)
    except Exception as e:  # noqa: BLE001 - never break vLLM's startup
        print(f"cascade_repro.vllm_surface.probe: not active: {e!r}", file=sys.stderr)
