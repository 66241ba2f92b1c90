"""cascade_repro.judge.calibration and inject: the ladder's threshold and what the report says of it."""

from __future__ import annotations

import pytest

from cascade_repro.judge.calibration import detection_power, statement
from cascade_repro.vllm_surface import inject as inj


def _pair(x: float, verdict: str, batch: int = 64, kind: str = "calibration") -> dict:
    return {"pair_id": f"tp1-b{batch}-cascade-shift{x:g}~flat", "kind": kind, "inject": f"lse-shift={x:g}",
            "tp": 1, "batch": batch, "seed": 0, "dtype": "auto", "fa_version": "3", "backend": "FLASH_ATTN",
            "verdict": verdict, "drift_ratio": 1.0 + x, "n_diverged": 3, "n": 64}  # fmt: skip


def test_flags_from_is_where_every_larger_shift_is_flagged():
    # A lucky flag below an unflagged step does not count: 0.01 flagged, 0.03 not, 0.1 and up flagged.
    ladder = [
        _pair(0.01, "regression"),
        _pair(0.03, "within noise"),
        _pair(0.1, "regression"),
        _pair(1.0, "regression"),
    ]
    (e,) = detection_power(ladder)
    assert (e["flags_from"], e["max_tested"], e["n"]) == (0.1, 1.0, 64)
    assert [s["nats"] for s in e["ladder"]] == [0.01, 0.03, 0.1, 1.0]
    assert statement(e, 128) == "flags an LSE error of 0.1 nats at 64 prompts x 128 tokens (tp 1, batch 64)"


def test_an_unflagged_top_step_means_nothing_was_detected_and_one_nat_is_singular():
    (e,) = detection_power([_pair(0.1, "regression"), _pair(1.0, "within noise")])
    assert e["flags_from"] is None
    assert statement(e, 32) == "flags no LSE error up to 1 nat at 64 prompts x 32 tokens (tp 1, batch 64)"


def test_not_exercised_steps_decide_nothing_and_groups_are_per_batch():
    rows = [_pair(0.1, "regression", 8), _pair(1.0, "not exercised", 8), _pair(1.0, "regression", 64),
            _pair(0.5, "regression", 64, kind="cascade")]  # fmt: skip
    by_batch = {e["batch"]: e for e in detection_power(rows)}
    assert by_batch[8]["flags_from"] == 0.1  # the unexercised 1.0 step neither confirms nor breaks it
    assert (
        by_batch[64]["flags_from"] == 1.0 and len(by_batch[64]["ladder"]) == 1
    )  # cascade rows are not ladder steps


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("lse-layout", "lse-layout"),
        ("LSE-SHIFT=0.10", "lse-shift=0.1"),
        ("lse-shift=-2", "lse-shift=-2"),
        (None, None),
    ],
)
def test_inject_labels_are_canonical(text, label):
    got = inj.parse(text)
    assert (got.label if got else None) == label


@pytest.mark.parametrize(
    "bad", ["lse-shift", "lse-shift=", "lse-shift=nan", "lse-shift=0", "lse-shift=1e9", "bitflip"]
)
def test_bad_injections_are_named(bad):
    with pytest.raises(ValueError):
        inj.parse(bad)
    assert inj.try_parse(bad) is None


def test_ladders_parse_sorted_and_default():
    assert inj.parse_ladder("default") == list(inj.DEFAULT_LADDER)
    assert inj.parse_ladder("1, 0.1,0.3") == [0.1, 0.3, 1.0]
    for bad in ("0", "-1", "x", "", "0.1,0.1"):
        with pytest.raises(ValueError):
            inj.parse_ladder(bad)


def test_an_injection_may_start_mid_answer():
    from cascade_repro.vllm_surface import inject as inj

    late = inj.parse("lse-shift=0.1@48")
    assert (late.kind, late.nats, late.onset, late.label) == (inj.LSE_SHIFT, 0.1, 48, "lse-shift=0.1@48")
    assert not late.active(47) and late.active(48) and late.active(127)
    assert inj.parse("LSE-Layout@3").label == "lse-layout@3"
    assert inj.parse("lse-shift=0.3").active(0)  # no onset: every step
    for bad in ("lse-shift=0.1@", "lse-shift=0.1@-1", "lse-shift=0.1@x"):
        with pytest.raises(ValueError, match="onset after @"):
            inj.parse(bad)
