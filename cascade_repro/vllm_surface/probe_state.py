"""The vLLM probe's state in one process: its counters per wave, the control it last read, its counts file.

Control protocol (files under the probe directory; the engine's side is ``probe_control.py``):

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

Only the standard library is imported, so this file loads without vLLM or torch.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cascade_repro.atomic import write_atomic  # standard library only
from cascade_repro.vllm_surface import inject as inj  # standard library only, like this module
from cascade_repro.vllm_surface import splitkv

CONTROL_FILE = "control.json"
COUNTS_PREFIX = "counts-"
FLUSH_EVERY = 64  # decisions between two writes of the counts file
KEEP_WAVES = 8  # waves kept per process: the engine reads each wave right after it ran


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


# Every wrapper keeps the function it wraps under MARK: patching twice (a second engine start in the
# same process, a module imported again) wraps the original, never a wrapper.
MARK = "_cascade_repro_original"


def original(fn: Any) -> Any:
    """The function a probe wrapper wraps, or ``fn`` itself when it is not one."""
    return getattr(fn, MARK, fn)
