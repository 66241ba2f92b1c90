"""vLLM general plugin: count cascade-attention decisions and executions; force the flat arm; inject faults.

vLLM calls :func:`register` (entry point ``vllm.general_plugins`` -> ``cascade_repro_probe``) in every
process it starts: the ``LLM`` process (``EngineArgs.__post_init__``), the engine-core process
(``EngineCore.__init__``) and every tensor-parallel worker (``WorkerWrapperBase.init_worker``); see
``vllm/plugins/__init__.py``, ``vllm/engine/arg_utils.py``, ``vllm/v1/engine/core.py`` and
``vllm/v1/worker/worker_base.py`` in vLLM 0.26.0. It does nothing unless ``CASCADE_REPRO_PROBE``
names a directory; the vLLM engine (``engines/vllm.py``) sets it before importing vLLM, so the
spawned processes inherit it.

What is patched (vLLM 0.26.0, ``vllm/v1/attention/backends/flash_attn.py``):

- ``use_cascade_attention`` (module function). The model runner decides per step through
  ``attn_metadata_builder.use_cascade_attention(...)`` (``vllm/v1/worker/gpu_model_runner.py``,
  ``_compute_cascade_attn_prefix_len``), and ``FlashAttentionMetadataBuilder.use_cascade_attention``
  calls the module-level function by its global name, so replacing the module attribute covers it.
  It is only called when the scheduler reports shared prefix blocks. The wrapper counts decisions
  and, when the control file says ``force_off``, returns False without asking the heuristic (the
  flat arm of an engine that serves both arms).
- ``cascade_attention`` (module function, called by ``FlashAttentionImpl.forward`` by its global
  name; ``flash_attn_diffkv.py`` imports it by name, which the patch also replaces): counts
  executions (once per attention layer per cascade step) and records ``fa_version``.
- ``merge_attn_states`` as imported into that module (from ``vllm/v1/attention/ops/merge_attn_states.py``;
  ``cascade_attention`` calls it by its global name): only inside ``cascade_attention``, with
  ``inject == "lse-layout"`` the suffix LSE is handed over in the transposed memory layout (see
  :func:`misread_lse`); with ``inject == "lse-shift=X"`` the prefix LSE is handed over plus X nats.
- ``FlashAttentionImpl.__init__``: records the FlashAttention version each layer really uses.
- ``WorkerWrapperBase`` (``vllm/v1/worker/worker_base.py``; ``vllm/worker/worker_base.py`` in
  0.10.2, so both are hooked) gains the method
  ``cascade_repro_probe_sync`` so the engine can flush and read the counters of every worker
  synchronously with ``LLM.collective_rpc`` (``run_method`` resolves a string with ``getattr`` on
  the wrapper, ``vllm/v1/serial_utils.py`` and ``vllm/v1/executor/multiproc_executor.py``).

Every twin (vLLM 0.10.2 to 0.34.0; ``vllm_surface.targets`` names each target and the releases
it applies to, tests/vllm_surface checks them against every recorded release):

- ``Scheduler.schedule`` (``vllm/v1/core/sched/scheduler.py``): steps, prefill chunks, the most
  requests in one step, and steps scheduled by an ``AsyncScheduler``.
- The step's CUDA-graph mode: the V1 model runner's ``_determine_batch_execution_and_padding``
  (0.26.0 to 0.33.0) or the V2 runner's ``CudaGraphManager.run_fullgraph`` / ``run_pw_graph``
  (``vllm/v1/worker/gpu/cudagraph_utils.py``, the only runner in 0.34.0).
- The facts RPC: the model runner's class, each attention layer's implementation class and KV
  cache dtype, the TP world size; and the out-scale fault on each implementation's ``forward``.

Cascade attention (removed in 0.32.0) is patched only where it exists.

The flash_attn module is not imported here: its class body evaluates ``get_flash_attn_version()``
at import time, under whatever vLLM config is current, so importing it earlier than vLLM does could
change its CUDA-graph support class. Instead a post-import hook (``sys.meta_path``) patches it right
after vLLM imports it (or at once if it is already imported).

Control protocol (files under the probe directory):

- ``control.json`` (written by the engine, atomically): ``{"wave": str|null, "force_off": bool,
  "force_on": bool, "inject": null|"lse-layout"|"lse-shift=X", "seq": int}``. ``force_on`` turns a
  decode step the cost model declined into a cascade step when vLLM's hard conditions hold (the
  spec's ``force_cascade``). The decision wrapper re-reads it when its
  ``(inode, mtime_ns, size)`` changes; a ``null`` wave means "do not count" (the warm-up request).
- ``counts-<pid>.json`` (written by each process, atomically): process facts plus counters of the
  last ``KEEP_WAVES`` waves; written on a wave change, every ``FLUSH_EVERY`` decisions, on the sync
  RPC and at exit.
- The file's size has the parity of its ``seq`` (one space of padding when needed), so two
  consecutive controls always differ in size: a worker's ``stat`` sees the change even when the
  file system's mtime is too coarse to and the new file got the old inode number. The engine
  therefore needs no round trip to make a new control take effect before a wave.
- The sync RPC may carry the next control itself (``sync(wave, control)``): the engine reads a
  wave's counters and switches every worker back to "not counting" in one round trip.

Step timing: every decision is stamped (``time.perf_counter``); the time from one decision to the
next of the same wave is charged to the first one's kind (a decode step that ran cascade, a decode
step that ran flat, a step with prefill tokens). vLLM decides once per scheduled step, before the
step's forward, so these intervals are the steps' wall times as the engine paid them (scheduling
and sampling included); the last step of a wave has no successor and is not timed.

Only the standard library is imported at module level, so this file loads without vLLM or torch.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.util
import inspect
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from cascade_repro import vllm_surface
from cascade_repro.atomic import write_atomic  # standard library only
from cascade_repro.vllm_surface import flashinfer_cascade, preemption, splitkv
from cascade_repro.vllm_surface import inject as inj  # standard library only, like this module

ENV_VAR = "CASCADE_REPRO_PROBE"
FLASH_ATTN_MODULE = vllm_surface.FLASH_ATTN_MODULE
WORKER_BASE_MODULE = vllm_surface.WORKER_BASE_MODULE
WORKER_BASE_MODULES = vllm_surface.WORKER_BASE_MODULES
RPC_METHOD = "cascade_repro_probe_sync"
CONTROL_FILE = "control.json"
COUNTS_PREFIX = "counts-"
FLUSH_EVERY = 64  # decisions between two writes of the counts file
KEEP_WAVES = 8  # waves kept per process: the engine reads each wave right after it ran
_MARK = "_cascade_repro_original"

COUNTER_KEYS = (
    "decisions_true",
    "decisions_true_decode",
    "decisions_false",
    "forced_off",
    "cascade_calls",
    "last_common_prefix_len",
    "max_common_prefix_len",
    "seen_prefix_len_max",
    "max_reqs",
    "inject_calls",
    # Decode-step cascade calls (one query token per request), the longest own part (KV after the
    # shared prefix) seen in them, and those whose FA2 suffix call takes the split-KV path by FA2's
    # own heuristic on these very shapes (splitkv.py): the branch of the field bug.
    "decode_cascade_calls",
    "max_decode_suffix",
    "fa2_split_calls",
    # Decode steps the cost model declined and the control's force_on turned into cascade steps.
    "forced_on",
    # The scheduler's steps (any twin: the hook on Scheduler.schedule, in the engine-core process)
    # and the requests it scheduled a part of their prompt for, leaving the rest to a later step:
    # the chunked-prefill twin's proof of effect.
    "sched_steps",
    "prefill_chunks",
    # Attention layer calls whose output the out-scale fault scaled (a twin's positive control).
    "scaled_calls",
    # The most requests one scheduler step scheduled (the batch twin's proof that a wave's requests
    # ran together), and the steps an AsyncScheduler scheduled (the async-scheduling twin's).
    "max_sched_reqs",
    "async_sched_steps",
    # Model-runner steps by CUDA-graph mode as the runner ran them (the cuda-graphs twin's proof):
    # a FULL graph replayed, PIECEWISE graphs, or eager (the V1 runner's decision says so; the V2
    # runner's eager steps call the model directly and are not counted).
    "graph_full_steps",
    "graph_piecewise_steps",
    "graph_eager_steps",
    # Requests the scheduler preempted (KV cache full: blocks freed, recomputed later; preemption.py).
    "preempted_reqs",
)
# Step wall times (seconds, float) and the number of steps each sum covers; see the docstring.
TIMING_KEYS = (
    "decode_cascade_s",
    "decode_cascade_n",
    "decode_flat_s",
    "decode_flat_n",
    "prefill_s",
    "prefill_n",
)
STEP_CASCADE, STEP_FLAT, STEP_PREFILL = "decode_cascade", "decode_flat", "prefill"


def new_counters() -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(COUNTER_KEYS, 0)
    out.update(dict.fromkeys(TIMING_KEYS, 0))
    for k in TIMING_KEYS[::2]:
        out[k] = 0.0
    out["fa_versions"] = []
    return out


# --------------------------------------------------------------------------------------------
# Per-process state
# --------------------------------------------------------------------------------------------


class ProbeState:
    """Counters of one process, the control values it last read, and its counts file."""

    def __init__(self, directory: str | os.PathLike[str], flush_every: int = FLUSH_EVERY) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pid = os.getpid()
        self.control_path = self.dir / CONTROL_FILE
        self.counts_path = self.dir / f"{COUNTS_PREFIX}{self.pid}.json"
        self.flush_every = flush_every
        self.wave: str | None = None
        self.force_off = False
        self.force_on = False
        self.inject: inj.Injection | None = None
        self.seq = 0
        self.waves: dict[str, dict[str, Any]] = {}
        self.fa_versions: set[int] = set()
        self.attn_impls: set[str] = set()
        self.patched: list[str] = []
        self.errors: list[str] = []
        self.in_cascade = False
        self.num_sms: int | None = None  # the GPU's multiprocessors, read at the first decode call
        self._ctl_sig: tuple[int, int, int] | None = None
        self._since_flush = 0
        self._dirty = True  # the first flush announces the process
        self._last_step: tuple[float, str] | None = None  # (stamp, kind) of this wave's last decision
        # Decode steps of this wave so far: the generated token the current step produces (the
        # prefill produced token 0), what an injection's @STEP onset is counted in.
        self.token_index = 0
        self.clock: Callable[[], float] = time.perf_counter

    def after_fork(self) -> None:
        """In a forked child (vLLM may fork the engine core): own counts file, fresh counters.

        A forked child does not run ``register()`` again (vLLM's ``plugins_loaded`` flag is
        inherited), so the state carried over from the parent is re-based here. The patches and the
        import hook are inherited with the memory image.
        """
        self.pid = os.getpid()
        self.counts_path = self.dir / f"{COUNTS_PREFIX}{self.pid}.json"
        self.waves = {}
        self.fa_versions = set()
        self.attn_impls = set()
        self.errors = []
        self.in_cascade = False
        self._since_flush = 0
        self._dirty = True
        self._last_step = None
        self.token_index = 0

    # control ------------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        """Re-read control.json if it changed since the last read (one stat call otherwise)."""
        try:
            st = os.stat(self.control_path)
        except OSError:
            return
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        if sig == self._ctl_sig and not force:
            return
        try:
            with open(self.control_path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return  # retried on the next call (the signature is not stored)
        self._ctl_sig = sig
        self.apply(data)

    def apply(self, data: dict[str, Any]) -> None:
        """Take a control (the file's content, or one handed over by the sync RPC)."""
        wave = data.get("wave")
        wave = None if wave is None else str(wave)
        if wave != self.wave:
            self.flush()
            self.wave = wave
            self._last_step = None
            self.token_index = 0
        self.force_off = bool(data.get("force_off", False))
        self.force_on = bool(data.get("force_on", False))
        self.inject = inj.try_parse(data.get("inject"))
        self.seq = int(data.get("seq", 0) or 0)

    def _forget_old_waves(self) -> None:
        # Bounded memory and counts files: a long matrix runs thousands of waves in one engine.
        extra = len(self.waves) - KEEP_WAVES
        if extra > 0:
            for k in [k for k in self.waves if k != self.wave][:extra]:
                del self.waves[k]

    def counters(self) -> dict[str, Any] | None:
        if self.wave is None:
            return None
        c = self.waves.get(self.wave)
        if c is None:
            c = self.waves[self.wave] = new_counters()
            self._forget_old_waves()
        return c

    # recording (hot paths: keep them cheap) ---------------------------------------------------
    def record_decision(
        self,
        use: bool,
        forced: bool,
        common_prefix_len: int,
        num_reqs: int,
        decode: bool = False,
        forced_on: bool = False,
    ) -> None:
        c = self.counters()
        if decode:
            self.token_index += 1
        if c is not None:
            if forced_on:
                c["forced_on"] += 1
            now = self.clock()
            kind = (STEP_CASCADE if use else STEP_FLAT) if decode else STEP_PREFILL
            last = self._last_step
            if last is not None:
                c[last[1] + "_s"] += now - last[0]
                c[last[1] + "_n"] += 1
            self._last_step = (now, kind)
            if use:
                c["decisions_true"] += 1
                if decode:
                    c["decisions_true_decode"] += 1
                c["last_common_prefix_len"] = common_prefix_len
                if common_prefix_len > c["max_common_prefix_len"]:
                    c["max_common_prefix_len"] = common_prefix_len
            else:
                c["decisions_false"] += 1
            if forced:
                c["forced_off"] += 1
            if common_prefix_len > c["seen_prefix_len_max"]:
                c["seen_prefix_len_max"] = common_prefix_len
            if num_reqs > c["max_reqs"]:
                c["max_reqs"] = num_reqs
            self._dirty = True
        self._since_flush += 1
        if self._since_flush >= self.flush_every:
            self.flush()

    def record_call(self, fa_version: Any) -> None:
        c = self.counters()
        if c is not None:
            c["cascade_calls"] += 1
            if isinstance(fa_version, int) and fa_version not in c["fa_versions"]:
                c["fa_versions"].append(fa_version)
            self._dirty = True

    def record_decode_call(
        self, num_reqs: int, suffix: int, q_heads: int, kv_heads: int, head_dim: int, fa_version: Any
    ) -> None:
        c = self.counters()
        if c is None:
            return
        c["decode_cascade_calls"] += 1
        if suffix > c["max_decode_suffix"]:
            c["max_decode_suffix"] = suffix
        if (
            fa_version == 2
            and self.num_sms
            and splitkv.buggy_decode(num_reqs, q_heads, kv_heads, head_dim, suffix, self.num_sms)
        ):
            c["fa2_split_calls"] += 1
        self._dirty = True

    def record_schedule(self, chunks: int, reqs: int = 0, is_async: bool = False, preempted: int = 0) -> None:
        c = self.counters()
        if c is not None:
            c["sched_steps"] += 1
            c["prefill_chunks"] += chunks
            c["preempted_reqs"] += preempted
            if reqs > c["max_sched_reqs"]:
                c["max_sched_reqs"] = reqs
            if is_async:
                c["async_sched_steps"] += 1
            self._dirty = True

    def record_graph_step(self, mode: str) -> None:
        """One model-runner step run with CUDA-graph mode ``mode`` (FULL, PIECEWISE or NONE)."""
        key = {
            "FULL": "graph_full_steps",
            "PIECEWISE": "graph_piecewise_steps",
            "NONE": "graph_eager_steps",
        }.get(mode)
        c = self.counters()
        if c is not None and key is not None:
            c[key] += 1
            self._dirty = True

    def record_scaled(self) -> None:
        c = self.counters()
        if c is not None:
            c["scaled_calls"] += 1
            self._dirty = True

    def record_inject(self) -> None:
        c = self.counters()
        if c is not None:
            c["inject_calls"] += 1
            self._dirty = True

    def note_impl(self, name: str, fa_version: Any) -> None:
        new = name not in self.attn_impls or (
            isinstance(fa_version, int) and fa_version not in self.fa_versions
        )
        self.attn_impls.add(name)
        if isinstance(fa_version, int):
            self.fa_versions.add(fa_version)
        if new:
            self._dirty = True
            self.flush()

    # output -------------------------------------------------------------------------------
    def snapshot(self, wave: str | None = None, all_waves: bool = True) -> dict[str, Any]:
        if all_waves:
            waves = self.waves
        else:
            waves = {wave: self.waves[wave]} if wave is not None and wave in self.waves else {}
        return {
            "pid": self.pid,
            "ppid": os.getppid(),
            "updated": time.time(),
            "wave": self.wave,
            "seq": self.seq,
            "force_off": self.force_off,
            "inject": self.inject.label if self.inject else None,
            "fa_versions": sorted(self.fa_versions),
            "attn_impls": sorted(self.attn_impls),
            "patched": list(self.patched),
            "errors": self.errors[-5:],
            "waves": {k: dict(v, fa_versions=list(v["fa_versions"])) for k, v in waves.items()},
        }

    def flush(self) -> None:
        self._since_flush = 0
        if not self._dirty:
            return
        try:
            write_atomic(self.counts_path, json.dumps(self.snapshot(), sort_keys=True))
            self._dirty = False
        except OSError as e:  # a full or vanished directory must not stop generation
            self._note_error(f"flush: {e}")

    def sync(self, wave: str | None = None, control: dict[str, Any] | None = None) -> dict[str, Any]:
        """Return ``wave``'s counters; then take ``control`` (or re-read the control file) and flush.

        The snapshot is taken before the new control applies, so a wave read here is complete.
        """
        snap = self.snapshot(wave, all_waves=False)
        if control is not None:
            self.apply(control)
        else:
            self.refresh(force=True)
        self._dirty = True
        self.flush()
        return snap

    def _note_error(self, msg: str) -> None:
        if len(self.errors) < 50:
            self.errors.append(msg)


# --------------------------------------------------------------------------------------------
# Wrappers and patching (work on any module object that has the same function names)
# --------------------------------------------------------------------------------------------


def misread_lse(lse: Any) -> Any:
    """Return the LSE as the merge reads it when the kernel wrote it token-major (the FA2 split-KV bug).

    vLLM's LSEs are ``[num_heads, num_tokens]`` and ``merge_attn_states``'s CUDA kernel indexes the
    raw buffer as ``lse[head * num_tokens + token]`` (``csrc/attention/merge_attn_states.cu``), ignoring
    strides. The result is a *contiguous* ``[H, T]`` tensor whose memory holds the values in
    token-major order (``t * H + h``), so the kernel reads the wrong value for almost every
    (head, token). This is the same reinterpretation as
    ``cascade_attention.transpose_lse_layout`` for one batch row. (A strided ``.t()`` view would not
    do: the kernel ignores strides and would read the original memory unchanged.)
    """
    if getattr(lse, "dim", None) is None or lse.dim() != 2:
        return lse
    h, t = lse.shape
    return lse.t().contiguous().view(h, t)


def _original(fn: Any) -> Any:
    return getattr(fn, _MARK, fn)


def _hard_conditions(arguments: dict[str, Any], common: int, n_reqs: int) -> bool:
    """vLLM's conditions that no cost model overrides: cascade can run this step at all."""
    if common < vllm_surface.MIN_COMMON_PREFIX or n_reqs < vllm_surface.MIN_REQUESTS:
        return False
    if any(bool(arguments.get(k)) for k in ("use_alibi", "use_sliding_window", "use_local_attention")):
        return False
    try:
        return int(arguments.get("dcp_world_size", 1) or 1) <= 1
    except (TypeError, ValueError):
        return False


def wrap_decision(orig: Callable[..., Any], state: ProbeState) -> Callable[..., Any]:
    orig = _original(orig)
    try:
        signature: inspect.Signature | None = inspect.signature(orig)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(orig)
    def use_cascade_attention(*args: Any, **kwargs: Any) -> Any:
        state.refresh()
        common = kwargs.get("common_prefix_len", args[0] if args else 0)
        query_lens = kwargs.get("query_lens", args[1] if len(args) > 1 else ())
        try:
            common_i = int(common)
            n_reqs = len(query_lens)
            # A pure decode step (one query token per request) is where FA2's split-KV path ran.
            decode = n_reqs > 0 and int(max(query_lens)) <= 1
        except (TypeError, ValueError):
            common_i, n_reqs, decode = 0, 0, False
        if state.force_off:
            state.record_decision(False, True, common_i, n_reqs, decode)
            return False
        result = orig(*args, **kwargs)
        if not result and state.force_on and decode and signature is not None:
            try:
                arguments = signature.bind(*args, **kwargs).arguments
            except TypeError:
                arguments = None
            if arguments is not None and _hard_conditions(arguments, common_i, n_reqs):
                state.record_decision(True, False, common_i, n_reqs, decode, forced_on=True)
                return True
        state.record_decision(bool(result), False, common_i, n_reqs, decode)
        return result

    setattr(use_cascade_attention, _MARK, orig)
    return use_cascade_attention


def _sm_count(tensor: Any) -> int | None:
    try:
        if tensor.device.type != "cuda":
            return None
        import torch  # already loaded in every process that runs attention

        return int(torch.cuda.get_device_properties(tensor.device).multi_processor_count)
    except Exception:  # noqa: BLE001 - bookkeeping only
        return None


def note_decode_shape(state: ProbeState, args: tuple, kwargs: dict[str, Any]) -> None:
    """Record a decode-step cascade call's shape: requests, own-part length, heads (no GPU sync).

    ``cascade_attention(output, query, key_cache, value_cache, *, cu_query_lens, max_query_len,
    max_kv_len, common_prefix_len, fa_version, ...)`` as FlashAttentionImpl calls it in 0.10.2 and
    0.26.0: ``query`` is [tokens, query heads, head dim], ``key_cache`` [..., KV heads, head dim],
    and the suffix call's ``max_seqlen_k`` is ``max_kv_len - common_prefix_len``.
    """
    try:
        if int(kwargs.get("max_query_len", 0)) != 1:
            return
        query = args[1] if len(args) > 1 else kwargs["query"]
        key_cache = args[2] if len(args) > 2 else kwargs["key_cache"]
        n = int(kwargs["cu_query_lens"].shape[0]) - 1
        suffix = int(kwargs["max_kv_len"]) - int(kwargs["common_prefix_len"])
        q_heads, head_dim = int(query.shape[1]), int(query.shape[2])
        kv_heads = int(key_cache.shape[-2])
    except Exception:  # noqa: BLE001 - an unexpected call shape: count nothing, break nothing
        return
    if state.num_sms is None:
        state.num_sms = _sm_count(query)
    state.record_decode_call(n, suffix, q_heads, kv_heads, head_dim, kwargs.get("fa_version"))


def wrap_cascade(orig: Callable[..., Any], state: ProbeState) -> Callable[..., Any]:
    orig = _original(orig)

    @functools.wraps(orig)
    def cascade_attention(*args: Any, **kwargs: Any) -> Any:
        state.record_call(kwargs.get("fa_version"))
        note_decode_shape(state, args, kwargs)
        state.in_cascade = True
        try:
            return orig(*args, **kwargs)
        finally:
            state.in_cascade = False

    setattr(cascade_attention, _MARK, orig)
    return cascade_attention


# merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, ...)
PREFIX_LSE_POS, SUFFIX_LSE_POS = 2, 4


def _replace_arg(args: tuple, kwargs: dict[str, Any], pos: int, name: str, fn: Callable[[Any], Any]) -> tuple:
    """Apply ``fn`` to one argument, passed by keyword or by position; return the new args."""
    if name in kwargs:
        kwargs[name] = fn(kwargs[name])
    elif len(args) > pos:
        args = (*args[:pos], fn(args[pos]), *args[pos + 1 :])
    return args


def wrap_merge(orig: Callable[..., Any], state: ProbeState) -> Callable[..., Any]:
    orig = _original(orig)

    @functools.wraps(orig)
    def merge_attn_states(*args: Any, **kwargs: Any) -> Any:
        fault = state.inject
        if state.in_cascade and fault is not None and fault.active(state.token_index):
            if fault.kind == inj.LSE_LAYOUT:
                args = _replace_arg(args, kwargs, SUFFIX_LSE_POS, "suffix_lse", misread_lse)
            elif fault.kind == inj.LSE_SHIFT:
                # The prefix weighed e**X times too much against the suffix (a new tensor: vLLM's is
                # not modified in place).
                args = _replace_arg(args, kwargs, PREFIX_LSE_POS, "prefix_lse", lambda t: t + fault.nats)
            state.record_inject()
        return orig(*args, **kwargs)

    setattr(merge_attn_states, _MARK, orig)
    return merge_attn_states


def _wrap_impl_init(cls: type, state: ProbeState) -> None:
    orig = _original(cls.__dict__.get("__init__", cls.__init__))

    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        try:
            state.note_impl(type(self).__name__, getattr(self, "vllm_flash_attn_version", None))
        except Exception as e:  # noqa: BLE001 - bookkeeping must never break model construction
            state._note_error(f"note_impl: {e}")

    setattr(__init__, _MARK, orig)
    cls.__init__ = __init__


WRAPPERS: dict[str, Callable[[Callable[..., Any], ProbeState], Callable[..., Any]]] = {
    "use_cascade_attention": wrap_decision,
    "cascade_attention": wrap_cascade,
    "merge_attn_states": wrap_merge,
}


# Names other modules may have imported from flash_attn and that must see the wrapper too.
# merge_attn_states is deliberately not rebound elsewhere: other backends import the same function
# from vllm/v1/attention/ops/merge_attn_states.py and must stay untouched.
REBIND = ("use_cascade_attention", "cascade_attention")


def patch_flash_attn(
    module: ModuleType, state: ProbeState, rebind: Iterable[ModuleType] | None = None
) -> list[str]:
    """Replace the cascade functions of ``module`` with counting wrappers; return what was patched.

    Other modules that imported ``use_cascade_attention`` or ``cascade_attention`` by name
    (``rebind``; by default every loaded ``vllm.*`` module, e.g. ``flash_attn_diffkv``) get the
    wrapper too. Patching twice wraps the originals, not the wrappers.
    """
    done: list[str] = []
    replaced: dict[int, tuple[Any, Any]] = {}
    mod_name = getattr(module, "__name__", "?")
    for name, make in WRAPPERS.items():
        fn = module.__dict__.get(name)
        if fn is None:
            continue
        orig = _original(fn)
        wrapper = make(orig, state)
        setattr(module, name, wrapper)
        replaced[id(orig)] = (orig, wrapper)
        done.append(f"{mod_name}.{name}")
    impl = module.__dict__.get("FlashAttentionImpl")
    if isinstance(impl, type):
        _wrap_impl_init(impl, state)
        done.append(f"{mod_name}.FlashAttentionImpl.__init__")
    if rebind is None:
        rebind = [
            m for n, m in list(sys.modules.items()) if n.startswith("vllm.") and isinstance(m, ModuleType)
        ]
    for other in rebind:
        d = getattr(other, "__dict__", None)
        if other is module or not isinstance(d, dict):
            continue
        for name in REBIND:
            val = d.get(name)
            if val is None:
                continue
            hit = replaced.get(id(_original(val)))
            if hit is not None and hit[0] is _original(val):
                setattr(other, name, hit[1])
                done.append(f"{getattr(other, '__name__', '?')}.{name}")
    state.patched.extend(done)
    return done


def patch_worker_base(module: ModuleType, state: ProbeState) -> list[str]:
    """Give ``WorkerWrapperBase`` the sync method the engine calls through ``collective_rpc``."""
    cls = module.__dict__.get("WorkerWrapperBase")
    if not isinstance(cls, type):
        return []

    def cascade_repro_probe_sync(
        self: Any, wave: str | None = None, control: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        snap = state.sync(wave, control)
        snap["rpc_rank"] = getattr(self, "rpc_rank", None)
        snap["global_rank"] = getattr(self, "global_rank", None)
        return snap

    setattr(cls, RPC_METHOD, cascade_repro_probe_sync)
    state.patched.append(f"{module.__name__}.WorkerWrapperBase.{RPC_METHOD}")
    return [RPC_METHOD]


FACTS_METHOD = "cascade_repro_probe_facts"


def _attention_layers(worker: Any) -> list[Any]:
    runner = getattr(getattr(worker, "worker", worker), "model_runner", None)
    get = getattr(runner, "get_model", None)
    model = get() if callable(get) else getattr(runner, "model", None)
    modules = getattr(model, "modules", None)
    if not callable(modules):
        return []
    return [m for m in modules() if getattr(m, "impl", None) is not None]


def _impl_classes(worker: Any) -> list[type]:
    return list({type(m.impl) for m in _attention_layers(worker)})


# AttentionImpl.forward(self, layer, query, key, value, kv_cache, attn_metadata, output, ...): the
# position of ``output`` after self, in every backend the twins use (0.26.0 to 0.34.0).
IMPL_OUTPUT_POS = 6


def wrap_impl_forward(cls: type, state: ProbeState) -> bool:
    """Scale the attention output of ``cls.forward`` by ``1 + E`` while the control says
    ``out-scale=E`` (a twin's positive control, in whatever backend runs). Python-level: a step
    replayed from a full CUDA graph keeps what was captured, so the count of scaled calls
    (``scaled_calls``) is the proof that it ran."""
    fwd = cls.__dict__.get("forward")
    if not callable(fwd) or getattr(fwd, _MARK, None) is not None:
        return False
    orig = fwd

    @functools.wraps(orig)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, *args, **kwargs)
        f = state.inject
        # The buffer the layer reads the result from: the ``output`` argument where one is handed
        # over (vLLM's unified_attention_with_output ignores forward's return from 0.26.0 on), else
        # what forward returned.
        target = kwargs.get("output")
        if target is None and len(args) > IMPL_OUTPUT_POS:
            target = args[IMPL_OUTPUT_POS]
        if target is None or not hasattr(target, "mul_"):
            target = out
        if f is not None and f.kind == inj.OUT_SCALE and state.wave is not None and target is not None:
            try:
                target.mul_(1.0 + f.nats)
                state.record_scaled()
            except Exception as e:  # noqa: BLE001 - never break the forward
                state._note_error(f"out-scale: {e!r}"[:200])
        return out

    setattr(forward, _MARK, orig)
    cls.forward = forward
    state.patched.append(f"{cls.__module__}.{cls.__name__}.forward")
    return True


def kv_cache_facts(layers: list[Any]) -> dict[str, Any]:
    """What the attention layers store their KV cache as: the dtype each was built with
    (``layer.kv_cache_dtype``: "auto", "fp8", ...) and the bound cache tensors' dtypes and bytes per
    element (an FP8 cache is stored in 1-byte elements, as uint8 or a float8 dtype)."""
    names: set[str] = set()
    tensors: set[str] = set()
    sizes: set[int] = set()
    for layer in layers:
        d = getattr(layer, "kv_cache_dtype", None)
        if d is not None:
            names.add(str(d))
        cache = getattr(layer, "kv_cache", None)
        for t in cache if isinstance(cache, list | tuple) else [cache]:
            if getattr(t, "numel", None) is not None and t.numel() > 0:
                tensors.add(str(t.dtype).replace("torch.", ""))
                sizes.add(int(t.element_size()))
    return {"layer_kv_cache_dtypes": sorted(names), "kv_cache_tensor_dtypes": sorted(tensors),
            "kv_cache_element_bytes": sorted(sizes)}  # fmt: skip


def worker_facts(worker: Any, state: ProbeState | None = None) -> dict[str, Any]:
    """What a model worker reads back of its own setup: its model runner's class, the attention
    implementation classes its layers were built with (any backend), what they store the KV cache as
    and the tensor-parallel world size it joined. With ``state``, each class's forward also gets the
    out-scale fault (:func:`wrap_impl_forward`)."""
    out: dict[str, Any] = {"pid": os.getpid()}
    runner = getattr(getattr(worker, "worker", worker), "model_runner", None)
    if runner is not None:
        out["model_runner"] = f"{type(runner).__module__}.{type(runner).__name__}"
    try:
        out.update(kv_cache_facts(_attention_layers(worker)))
    except Exception as e:  # noqa: BLE001 - a fact not read is reported, never raised inside vLLM
        out["kv_cache_error"] = f"{type(e).__name__}: {e}"[:200]
    try:
        classes = _impl_classes(worker)
        out["attn_impl_classes"] = sorted(c.__name__ for c in classes)
        if state is not None:
            out["out_scale_wrapped"] = sorted(c.__name__ for c in classes if wrap_impl_forward(c, state))
    except Exception as e:  # noqa: BLE001 - a fact not read is reported, never raised inside vLLM
        out["attn_impl_error"] = f"{type(e).__name__}: {e}"[:200]
    try:
        from vllm.distributed import parallel_state

        out["tp_world_size"] = int(parallel_state.get_tensor_model_parallel_world_size())
    except Exception as e:  # noqa: BLE001
        out["tp_error"] = f"{type(e).__name__}: {e}"[:200]
    return out


def patch_worker_facts(module: ModuleType, state: ProbeState) -> list[str]:
    """Give ``WorkerWrapperBase`` the facts method (:func:`worker_facts`) for ``collective_rpc``."""
    cls = module.__dict__.get("WorkerWrapperBase")
    if not isinstance(cls, type):
        return []

    def cascade_repro_probe_facts(self: Any) -> dict[str, Any]:
        return worker_facts(self, state)

    setattr(cls, FACTS_METHOD, cascade_repro_probe_facts)
    state.patched.append(f"{module.__name__}.WorkerWrapperBase.{FACTS_METHOD}")
    return [FACTS_METHOD]


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
    orig = _original(cls.schedule)

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

    setattr(schedule, _MARK, orig)
    cls.schedule = schedule
    done = [f"{module.__name__}.Scheduler.schedule"]
    state.patched.extend(done)
    return done


SCHEDULER_MODULE = vllm_surface.SCHEDULER_MODULE


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
    orig = _original(cls.__dict__[name])

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

    setattr(decide, _MARK, orig)
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
        orig = _original(fn)

        def make(orig: Callable[..., Any], mode: str) -> Callable[..., Any]:
            @functools.wraps(orig)
            def run(self: Any, *args: Any, **kwargs: Any) -> Any:
                state.refresh()
                if state.wave is not None:
                    state.record_graph_step(mode)
                return orig(self, *args, **kwargs)

            setattr(run, _MARK, orig)
            return run

        setattr(cls, name, make(orig, mode))
        done.append(f"{module.__name__}.CudaGraphManager.{name}")
    state.patched.extend(done)
    return done


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


# --------------------------------------------------------------------------------------------
# Engine side: control file, reading counts back
# --------------------------------------------------------------------------------------------


def control_data(
    wave: str | None, force_off: bool, inject: str | None, seq: int, force_on: bool = False
) -> dict[str, Any]:
    return {
        "wave": wave,
        "force_off": bool(force_off),
        "force_on": bool(force_on),
        "inject": inject,
        "seq": int(seq),
    }


def control_text(data: dict[str, Any]) -> str:
    """The control file's text, padded so that its size has the parity of ``seq`` (see the docstring)."""
    text = json.dumps(dict(data, engine_pid=os.getpid()), sort_keys=True)
    if len(text.encode()) % 2 != int(data.get("seq", 0)) % 2:
        text += " "
    return text


def write_control(
    directory: str | os.PathLike[str],
    wave: str | None,
    force_off: bool,
    inject: str | None,
    seq: int,
    force_on: bool = False,
) -> dict[str, Any]:
    """Write the control file atomically; return the control (the sync RPC can hand it over too)."""
    data = control_data(wave, force_off, inject, seq, force_on)
    path = Path(directory) / CONTROL_FILE
    write_atomic(path, control_text(data))
    return data


def read_count_files(
    directory: str | os.PathLike[str], exclude_pid: int | None = None
) -> list[dict[str, Any]]:
    """Return the snapshots in ``counts-*.json`` (unreadable files skipped)."""
    out = []
    for p in sorted(Path(directory).glob(f"{COUNTS_PREFIX}*.json")):
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("pid") != exclude_pid:
            out.append(data)
    return out


def aggregate(snapshots: Iterable[dict[str, Any] | None], wave: str) -> dict[str, Any]:
    """Combine the counters of ``wave`` over processes.

    Every tensor-parallel rank takes the same decisions and runs ``cascade_attention`` for its own
    shard of every layer, so the per-rank value (the maximum over processes) is what a step count
    means; sums are kept under ``*_sum`` for the record. Processes without this wave (the LLM
    process, the engine core when workers are separate) do not count.
    """
    per = [
        s["waves"][wave] for s in snapshots if s and isinstance(s.get("waves"), dict) and wave in s["waves"]
    ]
    out: dict[str, Any] = {"procs": len(per)}
    for k in COUNTER_KEYS:
        vals = [int(c.get(k, 0) or 0) for c in per]
        out[k] = max(vals) if vals else 0
        if k in ("decisions_true", "decisions_false", "cascade_calls"):
            out[k + "_sum"] = sum(vals)
    # Step times: the ranks step in lockstep, so the slowest rank's clock is the step's.
    for k in TIMING_KEYS:
        vals = [c.get(k, 0) or 0 for c in per]
        out[k] = max(vals) if vals else 0
    fas: set[int] = set()
    for c in per:
        fas.update(v for v in c.get("fa_versions", []) if isinstance(v, int))
    out["fa_versions"] = sorted(fas)
    return out


def process_facts(snapshots: Iterable[dict[str, Any] | None]) -> dict[str, Any]:
    """FlashAttention versions and attention implementations seen by any process, and patch status."""
    fas: set[int] = set()
    impls: set[str] = set()
    patched: set[str] = set()
    errors: list[str] = []
    n = 0
    for s in snapshots:
        if not s:
            continue
        n += 1
        fas.update(v for v in s.get("fa_versions", []) if isinstance(v, int))
        impls.update(str(v) for v in s.get("attn_impls", []))
        patched.update(str(v) for v in s.get("patched", []))
        errors.extend(str(v) for v in s.get("errors", []))
    return {
        "procs": n,
        "fa_versions": sorted(fas),
        "attn_impls": sorted(impls),
        "patched": sorted(patched),
        "errors": errors[:5],
    }
