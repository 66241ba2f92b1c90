"""run/ray_executor.py: `matrix --executor ray` on a local Ray started here (CPU, fake GPUs).

One Ray for the module (its start is seconds). The engine is the deterministic ``fake``: a Ray run
of a matrix must leave the run directory a local run of it leaves, timing aside.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from conftest import synthetic_run

from cascade_repro.errors import UsageError
from cascade_repro.pipeline import RunOptions, run_matrix
from cascade_repro.plan.matrix import MatrixSpec, plan
from cascade_repro.run.reference import ReferenceOptions
from cascade_repro.run.runner import Executor
from cascade_repro.rundir import codec, layout, manifest

pytestmark = pytest.mark.ray

ray = pytest.importorskip("ray")
from cascade_repro.run import ray_executor  # noqa: E402 - only where Ray is installed

PROMPTS = 8
# Two seeds: two engine keys, run side by side on the two CPUs.
SPEC = {"engine": "fake", "batch": [4, 8], "limit": PROMPTS, "max_tokens": 4, "seeds": [0, 1]}
KEYS = ["fake-tp1-auto-s0", "fake-tp1-auto-s1"]
CUT = "tp1-b4-flat-s1"  # the cell the kill strikes (at its second wave), in the second key
TIMING = {"wall_s", "start_s", "started_at", "tokens_per_s"}


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


def matrix(root: Path, run_id: str, executor: Executor | None = None):
    spec = MatrixSpec.from_dict(SPEC)
    opts = RunOptions(results_dir=root, run_id=run_id, progress=False, executor=executor or Executor())
    return run_matrix(spec, opts)


def samples(run_dir: Path, key: str) -> list[dict]:
    """A samples file's records, timing left out."""
    lines = layout.samples_path(run_dir, key).read_text(encoding="utf-8").splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def finished(run_dir: Path, key: str) -> list[dict]:
    """What the readers take of a samples file: each cell's finishing attempt (cell_start to cell_done)."""
    out, attempt = [], []
    for rec in samples(run_dir, key):
        if rec["type"] == codec.CELL_START:
            attempt = []
        attempt.append(rec)
        if rec["type"] == codec.CELL_DONE:
            out += attempt
    return out


def tables(run_dir: Path) -> dict[str, list[dict]]:
    import pandas as pd

    out = {}
    for name in layout.TABLES:
        df = pd.read_parquet(run_dir / name)
        out[name] = df.drop(columns=[c for c in df.columns if c in TIMING]).to_dict("records")
    return out


def same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN (the tables' unmeasured columns)."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("local")
    out = matrix(root, "local")
    return out


def test_a_ray_run_writes_the_run_directory_a_local_run_writes(tmp_path, local):
    out = matrix(tmp_path, "ray", Executor("ray"))
    assert (out.exit_code, out.counts, out.errors) == (local.exit_code, local.counts, local.errors)
    for key in KEYS:
        assert samples(out.run_dir, key) == samples(local.run_dir, key)
        assert layout.worker_log(out.run_dir, key).is_file()
    assert same(tables(out.run_dir), tables(local.run_dir))
    # A second invocation finds every cell done: nothing is submitted, nothing appended.
    before = {k: layout.samples_path(out.run_dir, k).read_bytes() for k in KEYS}
    again = matrix(tmp_path, "ray", Executor("ray"))
    assert again.exit_code == out.exit_code
    assert {k: layout.samples_path(out.run_dir, k).read_bytes() for k in KEYS} == before


def test_a_task_killed_mid_run_is_retried_and_the_result_is_the_same(tmp_path, local, monkeypatch):
    marker = tmp_path / "killed-once"
    # The worker SIGKILLs the Ray worker holding it (as a lost node would), on its first attempt only.
    monkeypatch.setenv("CASCADE_REPRO_FAULT", f"kill-parent:{CUT}:1")
    monkeypatch.setenv("CASCADE_REPRO_FAULT_ONCE", str(marker))
    out = matrix(tmp_path, "ray", Executor("ray", retries=1))
    # The first attempt died (the fault struck; without a retry its cells are errors, as the next
    # test shows), the second resumed from the lines the driver held and finished every cell.
    assert marker.is_file()
    assert out.errors == []
    for key in KEYS:
        assert finished(out.run_dir, key) == finished(local.run_dir, key)
    assert same(tables(out.run_dir), tables(local.run_dir))


def test_with_no_retries_a_killed_tasks_unfinished_cells_are_errors_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("CASCADE_REPRO_FAULT", f"kill-parent:{CUT}:1")
    monkeypatch.setenv("CASCADE_REPRO_FAULT_ONCE", str(tmp_path / "killed-once"))
    out = matrix(tmp_path, "ray", Executor("ray", retries=0))
    import pandas as pd

    cells = pd.read_parquet(out.run_dir / layout.CELLS).set_index("cell_id")
    bad = cells[cells["status"] == "error"]
    # The killed key's cells from the cut one on are errors (and any earlier cell whose lines the
    # task had not streamed yet when it died: up to half a second's); the other key finished.
    order = plan(MatrixSpec.from_dict(SPEC)).engines[KEYS[1]].cells
    assert list(bad.index) == order[order.index(bad.index[0]) :]
    assert CUT in bad.index
    assert set(cells.loc[cells["engine_key"] == KEYS[0], "status"]) == {"done"}
    assert all(e.startswith("Ray task died: WorkerCrashedError") for e in bad["error"]), list(bad["error"])
    assert len(out.errors) == len(bad)


@pytest.mark.slow
def test_the_hf_engine_through_ray_gives_the_local_tables(tmp_path, cut_model):
    """The hf engine on CPU (conftest's two-layer cut of the embedded model), both executors: the same
    samples and tables (timing aside)."""
    # No system prompt: short prompts, a wave in well under a second; what is compared is the plumbing.
    spec = MatrixSpec.from_dict(
        {"engine": "hf", "model": str(cut_model), "batch": [1, 4], "limit": 4, "max_tokens": 4,
         "system_prompt": "none"}
    )  # fmt: skip
    runs = {}
    for name in ("local", "ray"):
        opts = RunOptions(
            results_dir=tmp_path,
            run_id=name,
            progress=False,
            reference=ReferenceOptions("off"),  # the driver's own pass either way: not what differs
            executor=Executor(name),
        )
        runs[name] = run_matrix(spec, opts)
    local, out = runs["local"], runs["ray"]
    assert (out.exit_code, out.counts, out.errors) == (local.exit_code, local.counts, local.errors)
    for key in manifest.read_manifest(out.run_dir).plan.engines:
        assert samples(out.run_dir, key) == samples(local.run_dir, key)
    assert same(tables(out.run_dir), tables(local.run_dir))


def test_a_hung_worker_is_killed_after_the_engine_timeout_and_not_retried(tmp_path, monkeypatch):
    monkeypatch.setenv("CASCADE_REPRO_FAULT", f"hang:{CUT}:1")
    spec = MatrixSpec.from_dict({**SPEC, "engine_timeout": 2})
    opts = RunOptions(
        results_dir=tmp_path, run_id="hang", progress=False, executor=Executor("ray", retries=1)
    )
    out = run_matrix(spec, opts)
    import pandas as pd

    cells = pd.read_parquet(out.run_dir / layout.CELLS).set_index("cell_id")
    bad = cells[cells["status"] == "error"]
    assert CUT in bad.index and set(bad["engine_key"]) == {KEYS[1]}
    # The local executor's words, once: a hang would hang again, so no second attempt.
    assert set(bad["error"]) == {"timeout: no progress for 2s (--engine-timeout); worker killed"}
    starts = [r for r in samples(out.run_dir, KEYS[1]) if r["type"] == codec.ENGINE]
    assert len(starts) == 1


def test_without_ray_one_line_and_exit_2(monkeypatch):
    from support.cli import CliRunner

    from cascade_repro.cli import app

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(UsageError, match=r'^--executor ray needs Ray: pip install "ray>=2\.9"$'):
        ray_executor.import_ray()
    res = CliRunner().invoke(app, ["matrix", "--engine", "fake", "--executor", "ray", "--limit", "2"])
    assert res.exit_code == 2
    assert res.output.strip() == "error: --executor ray needs Ray: pip install \"ray>=2.9\""


def wait_for(predicate, what: str, limit_s: float = 60.0) -> None:
    """Ray's resource view is updated asynchronously: poll it (a deadline, not a measured time)."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"Ray never showed {what}")
        time.sleep(0.2)


def test_a_tp2_key_holds_two_gpus_of_one_node_and_a_tp4_key_fails_fast(tmp_path):
    from ray.util.placement_group import placement_group_table

    vllm = MatrixSpec.from_dict({"engine": "vllm", "tp": [1, 2], "batch": [8]})
    asks = {n.key: (n.gpus, n.cpus) for n in ray_executor.needs(vllm, plan(vllm).engines)}
    assert sorted(asks.values()) == [(1, 1), (2, 1)]  # tp GPUs each, one CPU

    run_dir = synthetic_run(tmp_path / "tp2", 4, "8", tp="2")  # finished: its worker exits at once
    key = next(iter(manifest.read_manifest(run_dir).plan.engines))
    need = ray_executor.KeyNeed(key, 2, 1)
    session = ray_executor.Session()
    a = session._submit(run_dir, key, need, 60.0)
    ray.get(a.pg.ready(), timeout=60)
    table = placement_group_table(a.pg)
    assert (table["strategy"], table["bundles"], table["state"]) == (
        "STRICT_PACK",
        {0: {"GPU": 2.0, "CPU": 1.0}},
        "CREATED",
    )
    wait_for(lambda: ray.available_resources().get("GPU", 0.0) == 0.0, "both GPUs held by the group")
    for ref in a.gen:  # read the task to its end
        ray.get(ref)
    session._release(a)
    wait_for(lambda: ray.available_resources().get("GPU", 0.0) == 2.0, "both GPUs free again")

    # Two GPUs on the one node: a tp=4 key could never be placed, and says so before anything runs.
    run4 = synthetic_run(tmp_path / "tp4", 4, "8", tp="4")
    keys = list(manifest.read_manifest(run4).plan.engines)
    with pytest.raises(
        UsageError, match=r"asks for 4 GPUs, 1 CPU on one node; the cluster's largest node has 2 GPUs"
    ):
        session.run_keys(run4, keys, 60.0, None, lambda *a: None)


def test_a_dry_run_says_what_each_key_asks_and_whether_the_cluster_has_it():
    vllm = MatrixSpec.from_dict({"engine": "vllm", "tp": [2, 4], "batch": [8]})
    lines = ray_executor.dry_run_lines(vllm, plan(vllm).engines, "auto")  # joins the Ray running here
    k2, k4 = plan(vllm).engines
    assert lines == [
        f"ray task {k2}: 2 GPUs, 1 CPU (STRICT_PACK placement group): the cluster has it",
        f"ray task {k4}: 4 GPUs, 1 CPU (STRICT_PACK placement group): cannot be placed "
        "(the cluster's largest node has 2 GPUs (1 node))",
        "cluster: 1 node(s), 2 GPUs, 2 CPUs",
    ]
