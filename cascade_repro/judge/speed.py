"""Was cascade worth it? Decode speed of a cell and of a cascade cell against its flat twin.

Pure functions over the ``wave`` records of a run (standard library only). The probe stamps every
``use_cascade_attention`` decision and charges the time to the next decision of the same wave to
the step it started (``vllm_surface/probe_state.py``): ``wave["extra"]["steps"]`` holds, per wave,
the summed wall time and the count of decode steps that ran cascade, decode steps that ran flat, and
steps with prefill tokens. The warm-up request and the gap between waves are never counted; a wave's
last step has no successor and is left out.

The cell's figure is its decode step time (milliseconds per decode step, cascade and flat steps
together, prefill apart): what a user of that batch size pays per generated token of every request.
A cascade cell is compared with its flat twin wave by wave (the same prompts in the same wave of
both cells), so the ratio's spread over waves is the honest error bar; the two arms' outputs drift
apart, so a wave's step count and context lengths differ a little between them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

NAN = float("nan")
# A cascade cell slower than its twin by more than this (median over waves, and in every wave)
# counts as the heuristic having picked cascade where it lost.
SLOWER_BY = 0.03
FLAG_SLOWER = "heuristic chose cascade; it was slower"
FLAG_FASTER = "heuristic declined cascade; forced, it was faster"


def wave_steps(wave: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The probe's step timing of one wave record, or None (no vLLM probe, or an older run)."""
    extra = wave.get("extra")
    steps = extra.get("steps") if isinstance(extra, Mapping) else None
    return steps if isinstance(steps, Mapping) else None


def _num(steps: Mapping[str, Any], key: str) -> float:
    v = steps.get(key, 0)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def decode_step_ms(wave: Mapping[str, Any]) -> float | None:
    """Mean wall time of one decode step of this wave, in ms; None when no decode step was timed."""
    steps = wave_steps(wave)
    if steps is None:
        return None
    n = _num(steps, "decode_cascade_n") + _num(steps, "decode_flat_n")
    if n <= 0:
        return None
    return 1000.0 * (_num(steps, "decode_cascade_s") + _num(steps, "decode_flat_s")) / n


def _ratio_ms(waves: Sequence[Mapping[str, Any]], kind: str) -> float:
    s = n = 0.0
    for w in waves:
        steps = wave_steps(w)
        if steps is not None:
            s += _num(steps, f"decode_{kind}_s")
            n += _num(steps, f"decode_{kind}_n")
    return 1000.0 * s / n if n > 0 else NAN


def cell_speed(waves: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per cell: ``decode_step_ms`` (median over waves), the mean ms of its cascade and of its flat
    decode steps, and ``decode_tok_s``: tokens generated in decode steps per second of decode.

    A wave's untimed last step is counted at the wave's mean step time for the tokens/s figure.
    All NaN when no wave carries step timing.
    """
    per = [ms for w in waves if (ms := decode_step_ms(w)) is not None]
    dec_tokens = dec_s = 0.0
    for w in waves:
        steps = wave_steps(w)
        if steps is None:
            continue
        n = _num(steps, "decode_cascade_n") + _num(steps, "decode_flat_n")
        s = _num(steps, "decode_cascade_s") + _num(steps, "decode_flat_s")
        if n <= 0:
            continue
        # Every request's first token comes out of its prefill step; the rest out of decode steps.
        dec_tokens += max(0.0, float(w.get("tokens", 0) or 0) - float(w.get("n_real", 0) or 0))
        dec_s += s * (n + 1) / n
    return {
        "decode_step_ms": statistics.median(per) if per else NAN,
        "cascade_step_ms": _ratio_ms(waves, "cascade"),
        "flat_step_ms": _ratio_ms(waves, "flat"),
        "decode_tok_s": dec_tokens / dec_s if dec_s > 0 else NAN,
    }


def paired_speed(
    test_waves: Iterable[Mapping[str, Any]], ref_waves: Iterable[Mapping[str, Any]]
) -> dict[str, float | int]:
    """Test decode step time over ref's, wave by wave: median, min, max and the waves paired.

    Waves pair by their index in the cell (the same prompts); a wave without timing on either side
    is skipped. Above 1: the test cell (cascade) was slower.
    """
    ref_waves = list(ref_waves)
    ref = {int(w["wave"]): ms for w in ref_waves if (ms := decode_step_ms(w)) is not None and "wave" in w}
    ref_wall = {
        int(w["wave"]): float(w["wall_s"]) for w in ref_waves if _pos(w.get("wall_s")) and "wave" in w
    }
    ratios, walls = [], []
    for w in test_waves:
        i = int(w.get("wave", -1))
        ms = decode_step_ms(w)
        r = ref.get(i)
        if ms is not None and r:
            ratios.append(ms / r)
            if _pos(w.get("wall_s")) and i in ref_wall:
                walls.append(float(w["wall_s"]) / ref_wall[i])
    if not ratios:
        return {"speed_ratio": NAN, "speed_ratio_lo": NAN, "speed_ratio_hi": NAN, "speed_waves": 0,
                "wall_ratio": NAN}  # fmt: skip
    return {
        "speed_ratio": statistics.median(ratios),
        "speed_ratio_lo": min(ratios),
        "speed_ratio_hi": max(ratios),
        "speed_waves": len(ratios),
        # The whole wave as the client saw it (engine steps plus vLLM's output processing, which at
        # large batches with top-k logprobs overlaps and can hide the engine's steps).
        "wall_ratio": statistics.median(walls) if walls else NAN,
    }


def _pos(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v > 0


def predicted_speedup(cost: Mapping[str, Any] | None) -> float:
    """The heuristic's own view of a decode step: flash-decoding cost over cascade cost (> 1: cascade
    should win), from the cost model's two numbers as ``explain`` records them; NaN if none."""
    if not isinstance(cost, Mapping):
        return NAN
    c, f = cost.get("cascade"), cost.get("flash_decoding")
    if not isinstance(c, int | float) or not isinstance(f, int | float) or c <= 0:
        return NAN
    return float(f) / float(c)


def speed_flag(
    ratio: float, lo: float, n_waves: int, cascade_decode_steps: Any, forced_steps: Any = 0, hi: float = NAN
) -> str:
    """Where the heuristic's choice and the measurement disagree, else "".

    ``FLAG_SLOWER``: cascade ran decode steps the heuristic chose (more than the ones forced) and the
    cell was slower than its flat twin: the median ratio above ``1 + SLOWER_BY`` and, with two waves
    or more, every wave slower. ``FLAG_FASTER``: under ``--force-cascade`` the heuristic declined the
    decode steps (all cascade decode steps were forced) and cascade was faster by the same margin.
    """
    try:
        chose = int(cascade_decode_steps) - int(forced_steps or 0)
        forced = int(forced_steps or 0)
    except (TypeError, ValueError):
        return ""
    if n_waves <= 0 or math.isnan(ratio):
        return ""
    if chose > 0 and ratio > 1.0 + SLOWER_BY and (n_waves < 2 or lo > 1.0):
        return FLAG_SLOWER
    spread_hi = ratio if math.isnan(hi) else hi
    if chose <= 0 < forced and ratio < 1.0 - SLOWER_BY and (n_waves < 2 or spread_hi < 1.0):
        return FLAG_FASTER
    return ""


def fmt_speed(ratio: Any) -> str:
    """``"21% slower"``, ``"8% faster"``, ``"same"`` (within 1%), ``"-"`` when unmeasured."""
    if not isinstance(ratio, int | float) or isinstance(ratio, bool) or math.isnan(ratio):
        return "-"
    pct = (ratio - 1.0) * 100.0
    if abs(pct) < 1.0:
        return "same"
    return f"{abs(pct):.0f}% {'slower' if pct > 0 else 'faster'}"
