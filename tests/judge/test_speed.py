"""speed.py: decode step times from the probe's wave records, and cascade against its flat twin."""

from __future__ import annotations

import math

from cascade_repro.judge import speed


def wave(w, cs=0.0, cn=0, fs=0.0, fn=0, tokens=0, n_real=0, wall=None):
    steps = {"decode_cascade_s": cs, "decode_cascade_n": cn, "decode_flat_s": fs, "decode_flat_n": fn,
             "prefill_s": 0.5, "prefill_n": 1}  # fmt: skip
    out = {"wave": w, "tokens": tokens, "n_real": n_real, "extra": {"steps": steps}}
    if wall is not None:
        out["wall_s"] = wall
    return out


def test_decode_step_ms_mixes_both_kinds_and_leaves_prefill_out():
    assert speed.decode_step_ms(wave(0, cs=0.3, cn=10, fs=0.1, fn=10)) == 20.0
    assert speed.decode_step_ms(wave(0)) is None  # nothing timed
    assert speed.decode_step_ms({"wave": 0}) is None  # hf engine, older runs


def test_cell_speed():
    ws = [
        wave(0, cs=0.3, cn=10, fs=0.1, fn=10, tokens=84, n_real=4),
        wave(1, fs=0.1, fn=10, tokens=44, n_real=4),
    ]
    got = speed.cell_speed(ws)
    assert got["decode_step_ms"] == 15.0  # median of 20 and 10
    assert got["cascade_step_ms"] == 30.0 and math.isclose(got["flat_step_ms"], 10.0)
    # decode tokens 80 + 40 over decode time with each wave's untimed last step added back:
    assert math.isclose(got["decode_tok_s"], 120 / (0.4 * 21 / 20 + 0.1 * 11 / 10))
    assert all(math.isnan(v) for v in speed.cell_speed([{"wave": 0}]).values())


def test_paired_speed_pairs_waves_by_index():
    test = [wave(0, cs=0.12, cn=10, wall=2.2), wave(1, cs=0.11, cn=10, wall=2.4), wave(2, cs=1.0, cn=10)]
    ref = [wave(0, fs=0.1, fn=10, wall=2.0), wave(1, fs=0.1, fn=10, wall=2.0)]  # wave 2 of the twin: untimed
    got = speed.paired_speed(test, ref)
    assert got["speed_waves"] == 2
    assert math.isclose(got["speed_ratio"], 1.15) and math.isclose(got["speed_ratio_lo"], 1.1)
    assert math.isclose(got["speed_ratio_hi"], 1.2)
    assert math.isclose(got["wall_ratio"], 1.15)  # the waves' wall times: 1.1 and 1.2
    assert speed.paired_speed([], ref)["speed_waves"] == 0


def test_speed_flag_needs_cascade_decode_steps_and_every_wave_slower():
    assert speed.speed_flag(1.2, 1.1, 3, 40) == speed.FLAG_SLOWER
    assert speed.speed_flag(1.2, 0.99, 3, 40) == ""  # one wave was faster: not a clear loss
    assert speed.speed_flag(1.2, 1.2, 1, 40) == speed.FLAG_SLOWER  # one wave: the median decides
    assert speed.speed_flag(1.02, 1.01, 3, 40) == ""  # within 3 %
    assert speed.speed_flag(1.5, 1.4, 3, 0) == ""  # cascade never ran a decode step
    assert speed.speed_flag(float("nan"), float("nan"), 0, 40) == ""
    assert speed.speed_flag(1.5, 1.4, 3, None) == ""
    # Every cascade step forced (the heuristic declined them all): slower is what it predicted ...
    assert speed.speed_flag(1.5, 1.4, 3, 40, forced_steps=40) == ""
    # ... faster is the heuristic's mistake the other way.
    assert speed.speed_flag(0.8, 0.7, 3, 40, forced_steps=40, hi=0.9) == speed.FLAG_FASTER
    assert speed.speed_flag(0.8, 0.7, 3, 40, forced_steps=40, hi=1.01) == ""  # one wave was not faster
    assert speed.speed_flag(0.8, 0.7, 3, 40, forced_steps=2, hi=0.9) == ""  # the heuristic chose most
    assert speed.speed_flag(1.5, 1.4, 3, 40, forced_steps=2) == speed.FLAG_SLOWER


def test_predicted_speedup_and_formatting():
    assert speed.predicted_speedup({"cascade": 17, "flash_decoding": 34}) == 2.0
    assert math.isnan(speed.predicted_speedup(None)) and math.isnan(speed.predicted_speedup({"cascade": 0}))
    assert speed.fmt_speed(1.21) == "21% slower" and speed.fmt_speed(0.92) == "8% faster"
    assert (
        speed.fmt_speed(1.004) == "same"
        and speed.fmt_speed(float("nan")) == "-"
        and speed.fmt_speed(None) == "-"
    )
