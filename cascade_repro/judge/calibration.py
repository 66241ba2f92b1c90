"""Detection power: the smallest injected LSE error a run's own setup flags.

``matrix --calibrate`` adds, next to every clean cascade cell, cascade cells with the prefix LSE
shifted by each ``X`` of a ladder (``inject.py``). They pair with the same flat twin and the same
noise control as the clean cell, and are judged by the same verdict rule, but as ``calibration``
pairs: they are positive controls, so they never change the run's headline or exit code. What they
give is a statement no output comparison can make about itself: what it could have missed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from cascade_repro.judge.outcome import CALIBRATION, EXERCISED, REGRESSION
from cascade_repro.vllm_surface import inject as inj

GROUP_AXES = ("tp", "batch", "seed", "dtype", "fa_version", "backend")
FLAGGED = REGRESSION


def shift_of(label: Any) -> float | None:
    """Return X of an ``lse-shift=X`` label, else None."""
    i = inj.try_parse(label if isinstance(label, str) else None)
    return i.nats if i is not None and i.kind in inj.GRADED else None


def detection_power(pairs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (tp, batch, other axes) with a calibration ladder, sorted by tp and batch.

    Each entry: the axes, ``n`` (prompts compared at the largest shift), ``ladder`` (one row per
    shift: ``nats, pair_id, verdict, drift_ratio, ref_ratio, rule, n_diverged, n``), ``flags_from`` (the smallest
    shift from which every larger shift on the ladder is flagged; None when the largest is not) and
    ``max_tested``. Shifts whose pair was not exercised or errored are listed but decide nothing.
    """
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in pairs:
        if r.get("kind") != CALIBRATION:
            continue
        x = shift_of(r.get("inject"))
        if x is None:
            continue
        groups.setdefault(tuple(str(r.get(a)) for a in GROUP_AXES), []).append({**r, "_x": x})
    out = []
    for rows in groups.values():
        rows.sort(key=lambda r: r["_x"])
        ladder = [
            {
                "nats": r["_x"],
                "pair_id": r.get("pair_id"),
                "verdict": r.get("verdict"),
                "drift_ratio": _num(r.get("drift_ratio")),
                "ref_ratio": _num(r.get("ref_ratio")),
                "rule": r.get("rule") or "",
                "n_diverged": _int(r.get("n_diverged")),
                "n": _int(r.get("n")),
            }
            for r in rows
        ]
        judged = [s for s in ladder if s["verdict"] in EXERCISED]
        flags_from = None
        for s in reversed(judged):
            if s["verdict"] != FLAGGED:
                break
            flags_from = s["nats"]
        first = rows[0]
        entry = {
            **{a: first.get(a) for a in GROUP_AXES},
            "n": ladder[-1]["n"],
            "ladder": ladder,
            "flags_from": flags_from,
            "max_tested": ladder[-1]["nats"],
        }
        fault = inj.try_parse(first.get("inject"))
        if fault is not None and fault.kind != inj.LSE_SHIFT:
            # Another twin's ladder (its rungs scale the attention output); cascade's keeps its keys.
            entry["fault"] = fault.kind
        out.append(entry)
    return sorted(out, key=lambda e: (_int(e["tp"]) or 0, _int(e["batch"]) or 0, str(e)))


# What each ladder's fault is called in the reports.
FAULT_WORDS = {inj.LSE_SHIFT: "LSE error", inj.OUT_SCALE: "attention-output scale"}


def statement(entry: dict[str, Any], max_tokens: Any) -> str:
    """``flags an LSE error of 0.05 nats at 64 prompts x 128 tokens (tp 1, batch 64; reference rule)``."""
    rules = {s.get("rule") for s in entry.get("ladder") or [] if s.get("rule")}
    rule = f"; {'reference' if rules == {'reference'} else 'arm-vs-arm'} rule" if rules else ""
    where = f"{entry.get('n')} prompts x {max_tokens} tokens (tp {entry.get('tp')}, batch {entry.get('batch')}{rule})"
    if entry.get("fault") == inj.OUT_SCALE:
        words = FAULT_WORDS[inj.OUT_SCALE]
        if entry.get("flags_from") is None:
            return f"flags no {words} up to 1 + {entry['max_tested']:g} at {where}"
        return f"flags an {words} of 1 + {entry['flags_from']:g} at {where}"
    words = FAULT_WORDS[inj.LSE_SHIFT]
    if entry.get("flags_from") is None:
        return f"flags no {words} up to {_nats(entry['max_tested'])} at {where}"
    return f"flags an {words} of {_nats(entry['flags_from'])} at {where}"


def _nats(x: float) -> str:
    return f"{x:g} nat" + ("" if x == 1 else "s")


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _int(v: Any) -> int | None:
    f = _num(v)
    return int(f) if f is not None else None
