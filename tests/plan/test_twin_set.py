"""Several twins in one run: `--twin a,b,c` and `--twin all` parsed and expanded for the engine, the
installed vLLM and the GPUs; the plan of each twin merged, a cell two twins share run once; what this
box cannot run refused in one line."""

from __future__ import annotations

import json

import pytest

from cascade_repro import twin as twins
from cascade_repro.errors import UsageError
from cascade_repro.judge.verdicts import Thresholds
from cascade_repro.plan import twin_set
from cascade_repro.plan.flags import MatrixOptions
from cascade_repro.plan.matrix import MatrixSpec, plan

TH = Thresholds()
# matrix's run settings at their defaults (tests/plan/test_flags.py's).
RUN_DEFAULTS = {
    "fail_on": "regression", "alpha": TH.alpha, "rep_delta": TH.rep_delta,
    "min_topk_violations": TH.min_topk_violations, "drift_min": TH.drift_min, "reference": "auto",
    "reference_device": "auto", "results_dir": "results", "run_id": None, "shard": None, "allow_mixed": False,
    "quiet": False, "executor": "local", "ray_address": None, "retries": 1, "max_engines_per_gpu": None,
}  # fmt: skip

# --- parsing --------------------------------------------------------------------------------------


def test_a_list_resolves_each_name_once_in_order():
    axes = twins.resolve_list(" prefix-caching , cascade,tp=1:2")
    assert [t.name for t in axes] == ["prefix-caching", "cascade", "tp=1:2"]
    assert twins.resolve_list("cuda-graphs") == (twins.CUDA_GRAPHS,)
    assert twins.resolve_list(None) == (twins.CASCADE,)


@pytest.mark.parametrize(
    "text, message",
    [
        ("prefix-caching,cuda-graph", "got 'cuda-graph' (did you mean cuda-graphs?)"),
        ("cascade,prefix-caching,cascade", "--twin names cascade twice"),
        ("cascade,,prefix-caching", "empty name"),
        ("cascade,all", "--twin all names every twin: give it alone"),
        ("cascade,tp", "--twin tp takes its arms: tp=A:B"),
    ],
)
def test_a_bad_list_is_one_line_with_suggestions(text, message):
    with pytest.raises(ValueError) as e:
        twins.resolve_list(text)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_all_is_what_the_engine_can_serve_and_says_what_it_left_out():
    fake = twin_set.expand_all("fake", [1, 8, 16])
    assert fake.names == (
        "cascade", "prefix-caching", "chunked-prefill", "cuda-graphs", "async-scheduling", "kv-cache-dtype=fp8",
        "attention-backend=FLASH_ATTN:TRITON_ATTN", "batch=1:16",
    )  # fmt: skip
    assert fake.left_out == "--twin all leaves out tp=1:2 (the fake engine runs on one device)"
    hf = twin_set.expand_all("hf", [8])
    assert hf.names == ("cascade", "batch=1:8")
    assert hf.left_out is not None and hf.left_out.startswith(
        "--twin all leaves out prefix-caching, chunked-prefill"
    )
    assert hf.left_out.endswith("(the hf engine cannot serve them)")


def test_all_on_vllm_follows_the_release_and_the_gpus():
    old = twin_set.expand_all("vllm", [8], "0.26.0", gpus=1)
    assert "cascade" in old.names and "tp=1:2" not in old.names
    assert old.left_out == "--twin all leaves out tp=1:2 (2 GPUs needed, 1 visible)"
    two = twin_set.expand_all("vllm", [8], "0.26.0", gpus=2)
    assert "tp=1:2" in two.names and two.left_out is None
    gone = twin_set.expand_all("vllm", [8], "0.34.0", gpus=2)
    assert (
        "cascade" not in gone.names
        and gone.left_out == "--twin all leaves out cascade (vLLM 0.34.0 cannot test them)"
    )
    big = twin_set.expand_all("vllm", [256], "0.26.0", gpus=2)
    assert "chunked-prefill" not in big.names and "batch 256 > the 128-token prefill step" in (
        big.left_out or ""
    )


def test_all_that_leaves_nothing_is_refused(monkeypatch):
    monkeypatch.setattr(twins, "FIXED", {"prefix-caching": twins.PREFIX_CACHING})
    monkeypatch.setattr(twins, "PARAMETERISED", {})
    with pytest.raises(
        ValueError, match=r"^--twin all: the hf engine can test no twin here \(--twin all leaves out"
    ):
        twin_set.expand("all", "hf", [8])


def test_a_spec_keeps_the_expanded_names_never_all():
    spec = MatrixSpec(engine="hf", twin="all", batch=[8])
    spec.validate()
    assert spec.twin == "cascade,batch=1:8" and [t.name for t in spec.twin_axes] == ["cascade", "batch=1:8"]
    assert spec.twin_axis is twins.CASCADE
    one = MatrixSpec(engine="fake", twin="prefix-caching")
    one.validate()
    assert one.twin == "prefix-caching" and len(one.twin_axes) == 1


def test_each_twin_of_a_list_is_checked_against_the_spec():
    with pytest.raises(UsageError, match="--twin prefix-caching needs the vllm engine"):
        MatrixSpec(engine="hf", twin="cascade,prefix-caching").validate()
    with pytest.raises(UsageError, match="--twin chunked-prefill prefills in 128-token steps"):
        MatrixSpec(engine="fake", twin="cascade,chunked-prefill", batch=[256]).validate()


# --- planning -------------------------------------------------------------------------------------


def _plan(twin: str, **kw):
    spec = MatrixSpec(engine="fake", twin=twin, batch=[8], **kw)
    spec.validate()
    return plan(spec)


def test_a_cell_two_twins_share_runs_once_and_serves_both():
    # chunked-prefill's reference arm and the backend twin's are both disable_cascade_attn=True on
    # FLASH_ATTN: one cell (and its restart control) serves both.
    p = _plan("chunked-prefill,attention-backend=FLASH_ATTN:TRITON_ATTN")
    cells = {c.cell_id: c for c in p.cells}
    assert list(cells) == [
        "tp1-b8-chunked",
        "tp1-b8-unchunked",
        "tp1-b8-unchunked-r1",
        "tp1-b8-attn-tritonattn",
    ]
    both = {"chunked-prefill": "unchunked", "attention-backend=FLASH_ATTN:TRITON_ATTN": "attn-flashattn"}
    assert cells["tp1-b8-unchunked"].twins == both and cells["tp1-b8-unchunked-r1"].twins == both
    assert cells["tp1-b8-attn-tritonattn"].twins == {
        "attention-backend=FLASH_ATTN:TRITON_ATTN": "attn-tritonattn"
    }
    assert {k: ep.twin for k, ep in p.engines.items()} == {
        "fake-tp1-auto-s0-chunked": "chunked-prefill",
        "fake-tp1-auto-s0-unchunked": "chunked-prefill",
        "fake-tp1-auto-s0-unchunked-r1": "chunked-prefill",
        "fake-tp1-auto-s0-attn-tritonattn": "attention-backend=FLASH_ATTN:TRITON_ATTN",
    }
    # Each twin's view reads the shared cells under its own arm names.
    view = p.for_twin("attention-backend=FLASH_ATTN:TRITON_ATTN")
    assert [(c.cell_id, c.arm) for c in view.cells] == [
        ("tp1-b8-unchunked", "attn-flashattn"), ("tp1-b8-unchunked-r1", "attn-flashattn"),
        ("tp1-b8-attn-tritonattn", "attn-tritonattn"),
    ]  # fmt: skip


def test_arms_with_other_settings_are_not_shared():
    p = _plan("prefix-caching,cuda-graphs")
    assert all(len(c.twins or {}) == 1 for c in p.cells)
    assert len(p.cells) == 6 and len(p.engines) == 6


def test_toggled_twins_each_get_their_own_engine():
    p = _plan("cascade,batch=1:8")
    keys = list(p.engines)
    assert keys == [
        "fake-tp1-auto-s0-cascade+flat",
        "fake-tp1-auto-s0-batch8+batch1",
        "fake-tp1-auto-s0-batch1-r1",
    ]
    assert [c.cell_id for c in p.cells_of(keys[0])] == ["tp1-b8-cascade", "tp1-b8-flat", "tp1-b1-flat"]


def test_calibration_ladders_and_controls_are_each_twins_own():
    p = _plan("cascade,prefix-caching", calibrate=[0.5])
    calibration = {c.cell_id: c.inject for c in p.cells if c.origin == "calibration"}
    assert calibration == {
        "tp1-b8-cascade-shift0.5": "lse-shift=0.5",
        "tp1-b8-prefix-on-scale0.5": "out-scale=0.5",
    }
    controls = [c.cell_id for c in p.cells if c.origin == "control"]
    assert controls == ["tp1-b1-flat", "tp1-b8-prefix-off-r1"]


def test_one_twin_plans_as_before():
    # Nothing of a run of several is written for a run of one: run.json's plan keeps its bytes.
    text = json.dumps(_plan("chunked-prefill").to_json())
    assert '"twins"' not in text and '"twin"' not in text
    assert json.dumps(_plan("cascade").to_json()) == json.dumps(
        plan(MatrixSpec(engine="fake", batch=[8])).to_json()
    )


# --- what this box refuses ------------------------------------------------------------------------


def _request(twin: str, **kw):
    given = {**RUN_DEFAULTS, "engine": "vllm", "config": None, "twin": twin, **kw}
    return MatrixOptions.from_cli(given, defaulted=lambda name: True, gpus=lambda: 1)


def test_a_tp_twin_in_a_list_needs_its_gpus():
    check = _request("prefix-caching,tp=1:2").check_vllm("0.26.0", 1, "c")
    assert check.refusal == (
        "--twin tp=1:2 needs 2 GPUs for its test arm; this machine has 1 (run it where that many are visible)"
    )
    assert not check.setting_missing


def test_all_on_this_box_leaves_tp_out_and_says_so():
    notes: list[str] = []
    given = {**RUN_DEFAULTS, "engine": "vllm", "config": None, "twin": "all"}
    request = MatrixOptions.from_cli(given, defaulted=lambda name: True, gpus=lambda: 1, on_note=notes.append)
    assert "tp=1:2" not in request.spec.twin.split(",") and "prefix-caching" in request.spec.twin.split(",")
    assert "--twin all leaves out tp=1:2 (2 GPUs needed, 1 visible)" in notes


def test_a_config_file_names_several_twins_as_a_list_or_a_text(tmp_path):
    from cascade_repro.plan.matrix import load_toml

    for line in ('twin = ["cascade", "prefix-caching"]', 'twin = "cascade,prefix-caching"'):
        path = tmp_path / "m.toml"
        path.write_text(f'engine = "fake"\n{line}\n')
        spec = MatrixSpec.from_dict(load_toml(path), source=str(path))
        assert spec.twin == "cascade,prefix-caching"


def test_beside_other_twins_an_axis_list_is_theirs():
    spec = MatrixSpec(engine="fake", twin="all", batch=[8, 64])
    spec.validate()
    p = plan(spec)
    batches = {c.batch for c in p.cells if (c.twins or {}).get("batch=1:64")}
    assert batches == {1, 64}
    assert {c.batch for c in p.cells if "prefix-caching" in (c.twins or {})} == {8, 64}
    with pytest.raises(UsageError, match="--twin batch=1:64 sets the batch of each arm"):
        MatrixSpec(engine="fake", twin="batch=1:64", batch=[8, 64]).validate()


def test_the_planners_warnings_of_several_twins_are_said_once():
    from cascade_repro.plan.matrix import plan_warnings

    spec = MatrixSpec(engine="fake", twin="cascade,prefix-caching", batch=[8, 16])
    spec.validate()
    one = plan_warnings(spec.for_twin("cascade"), 4)
    assert one and plan_warnings(spec, 4) == list(
        dict.fromkeys([*one, *plan_warnings(spec.for_twin("prefix-caching"), 4)])
    )
    assert sum("--batch 16" in w for w in plan_warnings(spec, 4)) == 1
    assert {c.batch for c in plan(spec, 4).cells} == {
        8,
        1,
    }  # 16 dropped for both twins; cascade's control at 1
