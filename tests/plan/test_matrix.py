"""cascade_repro.plan.matrix: the spec (flags or TOML) → cells grouped by the engine that serves them.

Reading guide: one engine key = one worker process = one model load. The hf engine toggles the
cascade arm inside one model, so every batch size and both arms share one engine; vLLM with
``arm_switch="restart"`` needs one engine per arm (``disable_cascade_attn`` is an engine flag).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cascade_repro.errors import UsageError
from cascade_repro.plan.matrix import (
    MatrixSpec,
    load_toml,
    parse_fa_list,
    parse_int_list,
    parse_onoff_list,
    plan,
    spec_hash,
)
from cascade_repro.plan.waves import waves


def cell_ids(spec: MatrixSpec) -> list[str]:
    return [c.cell_id for c in plan(spec).cells]


# --- plan(): cells and engine grouping -------------------------------------------------------


def test_default_hf_matrix_is_one_engine_serving_every_batch_and_both_arms():
    planned = plan(MatrixSpec())

    assert list(planned.engines) == ["hf-tp1-auto-s0"]
    ep = planned.engines["hf-tp1-auto-s0"]
    assert ep.arm is None  # serves both arms, toggled per cell
    assert ep.cells == [c.cell_id for c in planned.cells] == [
        "tp1-b1-cascade", "tp1-b1-flat",
        "tp1-b8-cascade", "tp1-b8-flat",
        "tp1-b16-cascade", "tp1-b16-flat",
    ]  # fmt: skip
    assert all(c.engine_key == "hf-tp1-auto-s0" for c in planned.cells)
    assert [(c.batch, c.arm, c.rerun) for c in planned.cells[:2]] == [(1, "cascade", 0), (1, "flat", 0)]


def test_hf_ignores_arm_switch_restart():
    engines = plan(MatrixSpec(engine="hf", arm_switch="restart", batch=[1, 8])).engines
    assert list(engines) == ["hf-tp1-auto-s0"]
    assert len(engines["hf-tp1-auto-s0"].cells) == 4


def test_vllm_toggle_shares_one_engine_restart_starts_one_per_arm():
    toggle = plan(MatrixSpec(engine="vllm", arm_switch="toggle", batch=[1, 8]))
    assert list(toggle.engines) == ["vllm-tp1-auto-fadefault-flashattn-s0"]

    restart = plan(MatrixSpec(engine="vllm", arm_switch="restart", batch=[1, 8], auto_controls=False))
    assert list(restart.engines) == [
        "vllm-tp1-auto-fadefault-flashattn-s0-cascade",
        "vllm-tp1-auto-fadefault-flashattn-s0-flat",
    ]
    cascade_ep = restart.engines["vllm-tp1-auto-fadefault-flashattn-s0-cascade"]
    flat_ep = restart.engines["vllm-tp1-auto-fadefault-flashattn-s0-flat"]
    assert (cascade_ep.arm, flat_ep.arm) == ("cascade", "flat")
    assert cascade_ep.cells == ["tp1-b1-cascade", "tp1-b8-cascade"]
    assert flat_ep.cells == ["tp1-b1-flat", "tp1-b8-flat"]
    # The plan's cells are grouped by engine, in run order (run.json's plan.cells).
    assert [c.cell_id for c in restart.cells] == [*cascade_ep.cells, *flat_ep.cells]
    # Same cells either way: only the grouping differs.
    assert sorted(cell_ids(MatrixSpec(engine="vllm", batch=[1, 8]))) == sorted(
        c.cell_id for c in restart.cells
    )
    # With the planner's controls, restart adds a third engine start for flat reruns (the control
    # that spans engine starts, as the twins do); it serves the flat arm.
    with_controls = plan(MatrixSpec(engine="vllm", arm_switch="restart", batch=[1, 8]))
    third = with_controls.engines["vllm-tp1-auto-fadefault-flashattn-s0-flat-r1"]
    assert third.arm == "flat"
    assert [(c.cell_id, c.origin) for c in with_controls.cells_of(third.key)] == [("tp1-b1-flat-r1", "control"), ("tp1-b8-flat-r1", "control")]


@pytest.mark.parametrize(
    ("axes", "keys", "example_cell"),
    [
        ({"seeds": [0, 1]}, ["vllm-tp1-auto-fadefault-flashattn-s0", "vllm-tp1-auto-fadefault-flashattn-s1"], "tp1-b8-cascade-s1"),
        ({"dtypes": ["float16", "bfloat16"]}, ["vllm-tp1-float16-fadefault-flashattn-s0", "vllm-tp1-bfloat16-fadefault-flashattn-s0"], "tp1-b8-flat-bfloat16"),
        ({"fa_versions": [None, 2]}, ["vllm-tp1-auto-fadefault-flashattn-s0", "vllm-tp1-auto-fa2-flashattn-s0"], "tp1-b8-flat-fa2"),
        ({"backends": ["FLASH_ATTN", "FLASHINFER"]}, ["vllm-tp1-auto-fadefault-flashattn-s0", "vllm-tp1-auto-fadefault-flashinfer-s0"], "tp1-b8-cascade-flashinfer"),
        ({"tp": [1, 2]}, ["vllm-tp1-auto-fadefault-flashattn-s0", "vllm-tp2-auto-fadefault-flashattn-s0"], "tp2-b8-cascade"),
    ],
)  # fmt: skip
def test_each_extra_axis_value_is_another_engine_key(axes, keys, example_cell):
    spec = MatrixSpec(engine="vllm", batch=[1, 8], **axes)
    engines = plan(spec).engines
    assert list(engines) == keys
    assert all(len(ep.cells) == 4 for ep in engines.values())  # 2 batches x 2 arms each
    # A varying axis shows up in the cell id, so cells of different keys never collide.
    assert example_cell in cell_ids(spec)


def test_single_valued_axes_stay_out_of_cell_ids():
    assert cell_ids(MatrixSpec(seeds=[3], dtypes=["float32"], batch=[4])) == [
        "tp1-b4-cascade", "tp1-b4-flat", "tp1-b32-flat",  # the last: the planner's noise control
    ]  # fmt: skip
    assert list(plan(MatrixSpec(seeds=[3], dtypes=["float32"], batch=[4])).engines) == ["hf-tp1-float32-s3"]


def test_rerun_adds_one_r1_cell_per_flat_cell_and_nothing_else():
    cells = plan(MatrixSpec(batch=[1, 8], rerun=True)).cells

    assert [c.cell_id for c in cells] == [
        "tp1-b1-cascade", "tp1-b1-flat", "tp1-b1-flat-r1",
        "tp1-b8-cascade", "tp1-b8-flat", "tp1-b8-flat-r1",
    ]  # fmt: skip
    reruns = [c for c in cells if c.rerun]
    assert [(c.arm, c.rerun) for c in reruns] == [("flat", 1), ("flat", 1)]
    assert len({c.engine_key for c in cells}) == 1  # reruns run in the same engine


def test_one_arm_only():
    assert cell_ids(MatrixSpec(batch=[8], cascade=[False])) == ["tp1-b8-flat"]
    assert cell_ids(MatrixSpec(batch=[8], cascade=[True])) == ["tp1-b8-cascade"]


def test_full_vllm_matrix_cell_ids_are_unique_and_counted():
    spec = MatrixSpec(
        engine="vllm", arm_switch="restart", tp=[1, 2], batch=[1, 8, 64], seeds=[0, 1],
        dtypes=["float16", "bfloat16"], fa_versions=[None, 2], backends=["FLASH_ATTN", "FLASHINFER"], rerun=True,
    )  # fmt: skip
    planned = plan(spec)
    engines = planned.engines
    ids = cell_ids(spec)

    combos = 2 * 2 * 2 * 2 * 2  # tp x seed x dtype x fa x backend
    assert len(engines) == combos * 3  # x (cascade, flat, flat rerun) engine starts (restart)
    assert len(ids) == combos * 3 * 3  # x batch x (cascade, flat, flat-r1)
    assert len(set(ids)) == len(ids)
    for ep in engines.values():
        cells = planned.cells_of(ep.key)
        assert [c.cell_id for c in cells] == ep.cells
        assert {c.engine_key for c in cells} == {ep.key}
        assert {c.arm for c in cells} == {ep.arm}
        assert ep.key.endswith("-r1") == all(c.rerun == 1 for c in cells)


@given(
    tp=st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=3, unique=True),
    batch=st.lists(st.integers(1, 128), min_size=1, max_size=4, unique=True),
    cascade=st.lists(st.booleans(), min_size=1, max_size=2, unique=True),
    seeds=st.lists(st.integers(0, 5), min_size=1, max_size=2, unique=True),
    fa=st.lists(st.sampled_from([None, 2, 3]), min_size=1, max_size=3, unique=True),
    rerun=st.booleans(),
    restart=st.booleans(),
)
def test_cell_ids_are_unique_for_any_vllm_matrix(tp, batch, cascade, seeds, fa, rerun, restart):
    spec = MatrixSpec(
        engine="vllm", tp=tp, batch=batch, cascade=cascade, seeds=seeds, fa_versions=fa, rerun=rerun,
        arm_switch="restart" if restart else "toggle",
    )  # fmt: skip
    spec.validate()
    ids = cell_ids(spec)
    assert len(ids) == len(set(ids))
    n_arms = len(cascade) + (1 if rerun and False in cascade else 0)
    per_config = len(batch) * n_arms
    if len(cascade) == 2:  # the planner's noise controls
        per_config += (0 if rerun else len(batch)) if restart else (1 if len(batch) == 1 else 0)
    assert len(ids) == len(tp) * len(seeds) * len(fa) * per_config


def test_backends_differing_only_in_case_do_not_make_duplicate_cells():
    spec = MatrixSpec(engine="vllm", batch=[8], backends=["FLASH_ATTN", "flash_attn"])
    try:
        spec.validate()
    except UsageError:
        return  # rejecting the duplicate is a fine answer too
    ids = cell_ids(spec)
    assert len(ids) == len(set(ids))


# --- waves(): exact-B waves ------------------------------------------------------------------


def test_waves_top_up_the_last_wave_with_fillers_from_the_start():
    assert waves(5, 4) == [
        [(0, True), (1, True), (2, True), (3, True)],
        [(4, True), (0, False), (1, False), (2, False)],
    ]


def test_waves_fillers_cycle_when_batch_exceeds_prompts():
    assert waves(2, 5) == [[(0, True), (1, True), (0, False), (1, False), (0, False)]]


def test_waves_without_fillers_when_batch_divides_prompts():
    assert waves(4, 2) == [[(0, True), (1, True)], [(2, True), (3, True)]]
    assert waves(3, 1) == [[(0, True)], [(1, True)], [(2, True)]]


def test_waves_of_nothing():
    assert waves(0, 8) == []
    assert waves(8, 0) == []


@given(n=st.integers(1, 300), b=st.integers(1, 70))
def test_waves_property_every_prompt_once_every_wave_exactly_b(n, b):
    ws = waves(n, b)

    assert len(ws) == -(-n // b)
    assert all(len(w) == b for w in ws)
    real = [i for w in ws for i, is_real in w if is_real]
    assert real == list(range(n))  # each real index exactly once, in order
    for w in ws[:-1]:
        assert all(is_real for _, is_real in w)  # fillers only in the last wave
    assert all(0 <= i < n for w in ws for i, _ in w)


# --- MatrixSpec.validate ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"batch": [0]}, r"batch values must be positive integers, got 0"),
        ({"batch": [8, -1]}, r"batch values must be positive integers, got -1"),
        ({"batch": []}, r"batch must be a non-empty list"),
        ({"batch": [8, 8]}, r"batch has duplicate values"),
        ({"tp": [2]}, r"hf engine runs on one device: use tp = 1 \(tensor parallelism needs engine = \"vllm\"\)"),
        ({"dtypes": ["fp8"]}, r"dtype must be one of auto, float32, float16, bfloat16, not 'fp8'"),
        ({"inject": "bit-flip"}, r"inject: expected lse-layout, lse-shift=X \(X in nats\) or out-scale=E, each optionally @STEP, got 'bit-flip'"),
        ({"inject": "lse-shift=abc"}, r"inject: lse-shift needs a number of nats"),
        ({"inject": "lse-shift=0"}, r"inject: lse-shift must be a non-zero number"),
        ({"calibrate": [0.1, -1]}, r"calibrate must be a list of shifts in \(0, 100\] nats"),
        ({"calibrate": [0.1], "inject": "lse-layout"}, r"calibrate runs its own ladder"),
        ({"calibrate": [0.1], "cascade": [False]}, r"calibrate needs the cascade arm"),
        ({"engine": "sglang"}, r"engine must be one of hf, vllm, fake, not 'sglang'"),
        ({"fa_versions": [1]}, r"fa_version must be 2, 3, 4 or default, not 1"),
        ({"topk": 0}, r"topk must be between 1 and 20, got 0"),
        ({"limit": 0}, r"limit must be a positive integer, got 0"),
        ({"max_tokens": 0}, r"max_tokens must be a positive integer, got 0"),
        ({"arm_switch": "swap"}, r"arm_switch must be one of toggle, restart, not 'swap'"),
        ({"cascade": ["on"]}, r"cascade values must be on/off"),
        ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization must be in \(0, 1\]"),
    ],
)
def test_validate_names_the_bad_field(changes, message):
    spec = MatrixSpec(**changes)
    with pytest.raises(UsageError, match=message) as exc:
        spec.validate("my.toml")
    assert str(exc.value).startswith("my.toml: ")
    assert "\n" not in str(exc.value)


def test_validate_accepts_the_defaults_and_tp_on_vllm():
    MatrixSpec().validate()
    MatrixSpec(engine="vllm", tp=[1, 2, 4], fa_versions=[None, 2, 3]).validate()


def test_validate_rejects_non_numeric_timeouts_with_a_usage_error():
    with pytest.raises(UsageError, match="^--engine-timeout must be a number, got '10m'$"):
        MatrixSpec(engine_timeout="10m").validate()


def test_from_dict_rejects_unknown_keys_naming_them_and_the_source():
    with pytest.raises(UsageError, match=r"^run\.toml: unknown key\(s\) batches, colour \(did you mean batch\?\); known: .*batch"):
        MatrixSpec.from_dict({"batches": [1], "colour": "red"}, source="run.toml")


# --- load_toml ----------------------------------------------------------------------------------


def write(tmp_path: Path, text: str, name: str = "matrix.toml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_load_toml_top_level_keys(tmp_path):
    values = load_toml(write(tmp_path, 'engine = "vllm"\ntp = [1, 2]\nbatch = 8\nmax_tokens = 32\n'))
    assert values == {"engine": "vllm", "tp": [1, 2], "batch": [8], "max_tokens": 32}
    spec = MatrixSpec.from_dict(values)
    assert (spec.engine, spec.tp, spec.batch, spec.max_tokens) == ("vllm", [1, 2], [8], 32)


def test_load_toml_matrix_table_with_cli_style_aliases(tmp_path):
    text = """
[matrix]
seed = 7
dtype = "bfloat16"
fa-version = ["default", 2]
backend = "FLASH_ATTN"
max-tokens = 16
"""
    values = load_toml(write(tmp_path, text))
    assert values == {
        "seeds": [7],
        "dtypes": ["bfloat16"],
        "fa_versions": [None, 2],
        "backends": ["FLASH_ATTN"],
        "max_tokens": 16,
    }


@pytest.mark.parametrize(
    ("toml_value", "expected"),
    [
        ('"on"', [True]),
        ('"off"', [False]),
        ('["on", "off"]', [True, False]),
        ("[true, false]", [True, False]),
        ('["cascade", "flat"]', [True, False]),
        ('"YES"', [True]),
    ],
)
def test_load_toml_cascade_on_off(tmp_path, toml_value, expected):
    assert load_toml(write(tmp_path, f"cascade = {toml_value}\n")) == {"cascade": expected}


def test_load_toml_bad_cascade_value_names_the_file(tmp_path):
    p = write(tmp_path, 'cascade = "maybe"\n')
    with pytest.raises(UsageError, match=r"matrix\.toml: cascade: expected on/off, got 'maybe'"):
        load_toml(p)


def test_load_toml_passes_unknown_keys_on_for_from_dict_to_reject(tmp_path):
    p = write(tmp_path, "batch = [1]\nbogus = 1\n")
    values = load_toml(p)
    assert values == {"batch": [1], "bogus": 1}
    with pytest.raises(UsageError, match=r"unknown key\(s\) bogus"):
        MatrixSpec.from_dict(values, source=str(p))


def test_load_toml_invalid_toml_names_the_file(tmp_path):
    p = write(tmp_path, "batch = [1, 8\n", name="bad.toml")
    with pytest.raises(UsageError, match=r"bad\.toml: invalid TOML") as exc:
        load_toml(p)
    assert str(p) in str(exc.value)


def test_load_toml_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(UsageError, match=r"config file not found: .*nope\.toml"):
        load_toml(tmp_path / "nope.toml")
    p = tmp_path / "latin1.toml"
    p.write_bytes(b'model = "caf\xe9"\n')
    with pytest.raises(UsageError, match=r"latin1\.toml: not UTF-8 at byte 12"):
        load_toml(p)


def test_load_toml_matrix_must_be_a_table(tmp_path):
    with pytest.raises(UsageError, match=r"\[matrix\] must be a table"):
        load_toml(write(tmp_path, "matrix = 3\n"))


# --- flag parsers --------------------------------------------------------------------------------


def test_parse_int_list_accepts_spaces_and_refuses_empty_parts():
    assert parse_int_list("1, 8, 16 ", "batch") == [1, 8, 16]
    # "8,,16" is a value the user meant to type: skipping it ran another matrix than asked for.
    for text in ("1, 8,,16", "8,16,", ",8"):
        with pytest.raises(UsageError, match=f"^--batch: empty item in {text!r}$"):
            parse_int_list(text, "batch")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x", r"^--batch: 'x' is not an integer$"),
        ("1,8.5", r"^--batch: '8\.5' is not an integer$"),
        ("0", r"^--batch: values must be positive, got 0$"),
        ("8,-1", r"^--batch: values must be positive, got -1$"),
        ("", r"^--batch: give at least one value$"),
        (" , ", r"^--batch: give at least one value$"),
    ],
)
def test_parse_int_list_errors_are_one_line_and_name_the_flag(text, message):
    with pytest.raises(UsageError, match=message):
        parse_int_list(text, "batch")


def test_parse_onoff_and_fa_lists():
    assert parse_onoff_list("on, off", "cascade") == [True, False]
    with pytest.raises(UsageError, match="--cascade: expected on/off, got 'sometimes'"):
        parse_onoff_list("on,sometimes", "cascade")
    assert parse_fa_list("default,2,fa3") == [None, 2, 3]
    with pytest.raises(UsageError, match="--fa-version: expected 2, 3, 4 or default, got '5'"):
        parse_fa_list("5")


# --- spec_hash -------------------------------------------------------------------------------


def test_spec_hash_is_short_hex_equal_for_equal_specs_and_changes_with_any_field():
    h = spec_hash(MatrixSpec())
    assert len(h) == 12 and all(ch in "0123456789abcdef" for ch in h)
    assert spec_hash(MatrixSpec()) == h
    # Key order in the source does not matter.
    a = MatrixSpec.from_dict({"batch": [1, 8], "max_tokens": 8})
    b = MatrixSpec.from_dict({"max_tokens": 8, "batch": [1, 8]})
    assert spec_hash(a) == spec_hash(b)
    assert spec_hash(MatrixSpec(max_tokens=65)) != h
    assert spec_hash(MatrixSpec(batch=[8, 1])) != spec_hash(MatrixSpec(batch=[1, 8]))


def test_spec_hash_is_stable_across_processes():
    """A resumed run recomputes the hash in a new interpreter (new hash seed): it must not change."""
    code = (
        "from cascade_repro.plan.matrix import MatrixSpec, spec_hash; print(spec_hash(MatrixSpec(batch=[1, 8])))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2")
    }  # fmt: skip
    assert outs == {spec_hash(MatrixSpec(batch=[1, 8]))}


def test_force_cascade_is_for_engines_with_a_cost_model():
    import pytest

    from cascade_repro.errors import UsageError
    from cascade_repro.plan.matrix import MatrixSpec

    assert MatrixSpec(engine="vllm", force_cascade=True).force_cascade is True
    MatrixSpec(engine="vllm", force_cascade=True).validate()
    with pytest.raises(UsageError, match="the hf engine has none"):
        MatrixSpec(engine="hf", force_cascade=True).validate()
    with pytest.raises(UsageError, match="force_cascade must be true or false"):
        MatrixSpec.from_dict({"engine": "vllm", "force_cascade": "yes"})


def test_a_field_at_its_default_does_not_change_the_hash():
    # A release that adds a field must not change the run id of a matrix users already run.
    import dataclasses

    from cascade_repro.plan.matrix import MatrixSpec, spec_hash

    spec = MatrixSpec(batch=[1, 8], max_tokens=32)
    assert spec_hash(spec) == spec_hash(dataclasses.replace(spec, force_cascade=False, engine_args={}))
    assert spec_hash(spec) != spec_hash(dataclasses.replace(spec, ignore_eos=True))
    assert spec_hash(MatrixSpec()) == spec_hash(MatrixSpec(batch=[1, 8, 16]))  # the default batch, spelled out


# --- batches at or above the prompt count, controls of the same wave -------------------------------


def _batches(p, origin: str = "matrix") -> list[int]:
    return sorted({c.batch for c in p.cells if c.origin == origin})


def test_batches_at_or_above_the_prompts_repeat_the_smallest_such_wave() -> None:
    from cascade_repro.plan.waves import repeated_batches

    assert repeated_batches([8, 64, 128, 256], 64) == [128, 256]
    assert repeated_batches([8, 100, 128], 64) == [128]  # 100 holds every prompt first: kept
    assert repeated_batches([128], 64) == []  # at least one is kept
    assert repeated_batches([8, 16], 64) == []
    assert repeated_batches([8, 64, 128], None) == []  # no prompt count: nothing dropped


def test_plan_drops_the_repeated_batch_and_says_so() -> None:
    from cascade_repro.plan.matrix import plan_warnings

    spec = MatrixSpec(engine="fake", batch=[8, 64, 128])
    assert _batches(plan(spec)) == [8, 64, 128]  # without the prompt count nothing is dropped
    assert _batches(plan(spec, 64)) == [8, 64]
    [warning] = plan_warnings(spec, 64)
    assert warning.startswith("--batch 128: at or above the 64 prompts, it runs every prompt in one wave")
    assert "repeat batch 64's wave: dropped from the plan" in warning
    assert plan_warnings(spec, 200) == [] and _batches(plan(spec, 200)) == [8, 64, 128]


def test_a_dropped_batch_leaves_one_whose_control_the_planner_adds() -> None:
    spec = MatrixSpec(engine="fake", batch=[64, 128])
    p = plan(spec, 64)
    assert _batches(p) == [64] and _batches(p, "control") == [8]


def test_a_control_of_the_same_wave_moves_off_it() -> None:
    from cascade_repro.plan.matrix import plan_warnings
    from cascade_repro.plan.waves import noise_control_batch

    # batch 4 over 4 prompts: the usual control (x8 = 32) would be the same one wave of every prompt.
    assert noise_control_batch(4, 4) == 1 and noise_control_batch(4, 100) == 32
    assert noise_control_batch(512, 64) == 8  # 512 and 64 both hold all 64: 64 / 8 instead
    assert noise_control_batch(64, 64) == 8  # the usual control already splits the prompts
    assert noise_control_batch(8, 1) is None  # one prompt: every batch is the same wave
    spec = MatrixSpec(engine="fake", batch=[4])
    assert _batches(plan(spec, 4), "control") == [1]
    [warning] = plan_warnings(spec, 4)
    assert warning.startswith("noise control at batch 1, not 32: batch 32 and batch 4 both run all 4 prompts")


def test_one_prompt_has_no_control_and_says_the_minimum_effect_has_none() -> None:
    from cascade_repro.plan.matrix import plan_warnings

    spec = MatrixSpec(engine="fake", batch=[1, 8])
    p = plan(spec, 1)
    assert _batches(p) == [1] and _batches(p, "control") == []
    assert [w.split(":")[0] for w in plan_warnings(spec, 1)] == ["--batch 8", "no noise control"]
    assert "the minimum effect has no control" in plan_warnings(spec, 1)[1]
    assert plan_warnings(MatrixSpec(engine="fake", batch=[1], auto_controls=False), 1) == []


def test_a_batch_twin_keeps_its_arms() -> None:
    from cascade_repro.plan.matrix import plan_warnings

    spec = MatrixSpec(engine="fake", twin="batch=1:64")
    assert plan_warnings(spec, 8) == []
    assert sorted({c.batch for c in plan(spec, 8).cells}) == sorted({c.batch for c in plan(spec).cells})


def test_dry_run_shows_the_dropped_batch() -> None:
    from support.cli import CliRunner

    from cascade_repro.cli import app

    res = CliRunner().invoke(app, ["matrix", "--engine", "fake", "--limit", "8", "--batch", "1,8,16", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "warning: --batch 16: at or above the 8 prompts" in " ".join(res.stderr.split())
    assert "tp1-b16-" not in res.stdout and "tp1-b8-cascade" in res.stdout


def test_the_topk_default_is_one_constant_and_a_new_one_never_resumes_an_old_run() -> None:
    import inspect

    from cascade_repro.engines import fake
    from cascade_repro.engines.base import DEFAULT_TOPK
    from cascade_repro.plan import matrix

    assert MatrixSpec().topk == DEFAULT_TOPK
    assert inspect.signature(fake.FakeEngine).parameters["topk"].default == DEFAULT_TOPK
    # The run id of every run made so far hashed topk 5 as "left out": it still does...
    assert spec_hash(MatrixSpec(topk=5)) == spec_hash(MatrixSpec(topk=matrix.HASHED_TOPK))
    # ...and top-20 (the default once switched) hashes with topk in, so it never resumes a top-5 run.
    assert spec_hash(MatrixSpec(topk=20)) != spec_hash(MatrixSpec(topk=5))
