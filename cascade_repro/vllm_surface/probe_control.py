"""The engine's side of the probe's control protocol (``probe_state.py`` describes it): write the
control file, read the processes' counts files back, and combine a wave's counters over processes.

Only the standard library is imported, so this file loads without vLLM or torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cascade_repro.atomic import write_atomic  # standard library only
from cascade_repro.vllm_surface.probe_state import CONTROL_FILE, COUNTER_KEYS, COUNTS_PREFIX, TIMING_KEYS


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
