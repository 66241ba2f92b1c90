"""`matrix --shard i/n` and `cascade-repro merge`: assignment, merge errors, and shard+merge == unsharded.

The assignment and error tests build run directories by hand (no model). The end-to-end test runs
the embedded model on CPU three times (unsharded, shard 1/2, shard 2/2) and merges the shards.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from support.cli import CliRunner

import cascade_repro.cli.merge_cmd  # noqa: F401 - registers `merge` (cli/__init__.py may not import it yet)
from cascade_repro.cli import app
from cascade_repro.errors import UsageError
from cascade_repro.pipeline import merge
from cascade_repro.plan.matrix import MatrixSpec, plan, spec_hash
from cascade_repro.plan.shard import Shard, assign, empty_warning, keys_for, restrict
from cascade_repro.run.merge import check_shards
from cascade_repro.rundir import layout, manifest

WIDE = {"COLUMNS": "250"}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=WIDE)


def one_error_line(res) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in res.output
    return lines[0]


# --- parsing --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expect", [("1/2", (1, 2)), (" 2 / 3 ", (2, 3)), ("1/1", (1, 1)), ("04/10", (4, 10))]
)
def test_parse_shard(text, expect):
    s = Shard.parse(text)
    assert (s.index, s.count) == expect
    assert str(s) == f"{expect[0]}/{expect[1]}"


@pytest.mark.parametrize("text", ["3/2", "0/2", "1/0", "0/0", "2", "a/b", "1/2/3", "-1/2", "", "1 2"])
def test_parse_shard_rejects(text):
    with pytest.raises(UsageError, match="--shard"):
        Shard.parse(text)


def test_shard_out_of_range_is_a_usage_error():
    with pytest.raises(UsageError, match="between 1 and n"):
        Shard(3, 2)


# --- assignment -----------------------------------------------------------------------------------

SPECS = [
    MatrixSpec(seeds=[0, 1]),
    MatrixSpec(seeds=[0, 1, 2, 3, 4], dtypes=["float32", "bfloat16"]),
    MatrixSpec(engine="vllm", tp=[1, 2], fa_versions=[2, 3], batch=[1, 8, 32]),
    MatrixSpec(engine="vllm", arm_switch="restart", rerun=True, seeds=[0, 1, 2], batch=[1, 8, 16, 64]),
    MatrixSpec(),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.engine}-{len(plan(s).engines)}keys")
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 16])
def test_every_engine_key_is_in_exactly_one_shard(spec, n):
    engines = plan(spec).engines
    shards = assign(engines, n)
    assert len(shards) == n
    flat = [k for s in shards for k in s]
    assert sorted(flat) == sorted(engines)  # each key once, none lost
    for s in shards:  # plan order inside a shard
        assert s == [k for k in engines if k in s]
    for i in range(1, n + 1):
        assert keys_for(engines, Shard(i, n)) == shards[i - 1]
    # Balanced: no shard exceeds another by more than the heaviest engine key.
    loads = [sum(len(engines[k].cells) for k in s) for s in shards]
    assert max(loads) - min(loads) <= max(len(ep.cells) for ep in engines.values())


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.engine}-{len(plan(s).engines)}keys")
def test_assignment_is_deterministic_and_reads_run_json_form(spec):
    engines = plan(spec).engines
    as_json = json.loads(json.dumps({k: ep.to_json() for k, ep in engines.items()}))
    for n in (2, 3):
        assert assign(engines, n) == assign(as_json, n) == assign(plan(spec).engines, n)


def test_equal_keys_go_round_robin_over_sorted_keys():
    engines = plan(MatrixSpec(seeds=[0, 1, 2, 3])).engines
    assert assign(engines, 2) == [["hf-tp1-auto-s0", "hf-tp1-auto-s2"], ["hf-tp1-auto-s1", "hf-tp1-auto-s3"]]


def test_unequal_keys_balance_cell_counts():
    # restart + rerun: each flat engine has 2x the cells of its cascade engine (flat reruns).
    engines = plan(
        MatrixSpec(engine="vllm", arm_switch="restart", rerun=True, seeds=[0, 1], batch=[1, 8], calibrate=[0.1])
    ).engines
    weights = {k: len(ep.cells) for k, ep in engines.items()}
    # cascade engines: 2 clean + 2 calibration cells; flat: 2; flat reruns (own engine start): 2
    assert sorted(weights.values()) == [2, 2, 2, 2, 4, 4]
    loads = [sum(weights[k] for k in s) for s in assign(engines, 2)]
    assert loads == [8, 8]


def test_more_shards_than_keys_leaves_empty_shards_with_a_warning():
    engines = plan(MatrixSpec(seeds=[0, 1])).engines
    shards = assign(engines, 3)
    assert [len(s) for s in shards] == [1, 1, 0]
    assert empty_warning(engines, Shard(1, 3)) is None
    warning = empty_warning(engines, Shard(3, 3))
    assert warning and "shard 3/3 has nothing to run" in warning and "2 engine keys" in warning


def test_restrict_keeps_only_the_shards_cells():
    from cascade_repro.rundir.manifest import Manifest

    spec = MatrixSpec(seeds=[0, 1])
    run = {"plan": plan(spec).to_json()}
    whole = Manifest.from_json(run)
    assert restrict(whole) is whole  # unsharded: untouched
    sharded = Manifest.from_json({**run, "shard": "2/2"})
    r = restrict(sharded).to_json()
    assert list(r["plan"]["engines"]) == ["hf-tp1-auto-s1"]
    assert {c["engine_key"] for c in r["plan"]["cells"]} == {"hf-tp1-auto-s1"}
    assert len(sharded.plan.cells) == 12  # the original is not modified


# --- CLI: matrix --shard --------------------------------------------------------------------------


def test_matrix_shard_option_is_in_the_output_panel():
    res = invoke("matrix", "--help")
    out = res.stdout
    assert "--shard" in out
    assert out.index("\nOutput:\n") < out.index("--shard") < out.index("\nVerdicts:\n")


def test_matrix_dry_run_shows_only_the_shards_cells():
    res = invoke("matrix", "--dry-run", "--seed", "0,1", "--shard", "2/2", "--limit", "16")
    assert res.exit_code == 0, res.output
    assert "hf-tp1-auto-s1" in res.stdout
    assert "hf-tp1-auto-s0" not in res.stdout
    assert "6 cells, 1 engine start" in res.stdout
    assert "shard 2/2" in res.stdout


def test_matrix_dry_run_empty_shard_warns():
    res = invoke("matrix", "--dry-run", "--shard", "2/2", "--limit", "4")
    assert res.exit_code == 0, res.output
    assert "shard 2/2 has nothing to run" in " ".join(res.stderr.split())
    assert "0 cells" in res.stdout


@pytest.mark.parametrize("value", ["3/2", "0/1", "x"])
def test_matrix_bad_shard_is_one_line_usage_error(value):
    res = invoke("matrix", "--dry-run", "--shard", value)
    assert res.exit_code == 2
    assert "--shard" in one_error_line(res)


# --- merge errors (hand-made shard directories) ---------------------------------------------------


def fake_shard(
    path: Path, shard: str | None, spec: MatrixSpec | None = None, prompts: str = '{"key": "a"}\n'
) -> Path:
    spec = spec or MatrixSpec(seeds=[0, 1], limit=8)
    run = {"run_id": path.name, "spec": spec.to_dict(), "spec_hash": spec_hash(spec), "plan": plan(spec).to_json()}
    if shard:
        run["shard"] = shard
    path.mkdir(parents=True)
    layout.write_json_atomic(path / layout.RUN_JSON, run)
    (path / "prompts.jsonl").write_text(prompts, encoding="utf-8")
    return path


def test_merge_rejects_a_different_matrix(tmp_path):
    a = fake_shard(tmp_path / "a", "1/2")
    b = fake_shard(tmp_path / "b", "2/2", MatrixSpec(seeds=[0, 1], limit=9))
    with pytest.raises(UsageError, match="different matrix"):
        check_shards([a, b])


def test_merge_rejects_a_duplicate_shard(tmp_path):
    a = fake_shard(tmp_path / "a", "1/2")
    b = fake_shard(tmp_path / "b", "1/2")
    with pytest.raises(UsageError, match="duplicate shard 1/2"):
        check_shards([a, b])


def test_merge_rejects_different_shard_counts(tmp_path):
    a = fake_shard(tmp_path / "a", "1/2")
    b = fake_shard(tmp_path / "b", "2/3")
    with pytest.raises(UsageError, match="use the same n"):
        check_shards([a, b])


def test_merge_rejects_an_unsharded_run(tmp_path):
    a = fake_shard(tmp_path / "a", "1/2")
    b = fake_shard(tmp_path / "b", None)
    with pytest.raises(UsageError, match="not a shard"):
        check_shards([a, b])


def test_merge_rejects_different_prompts(tmp_path):
    a = fake_shard(tmp_path / "a", "1/2")
    b = fake_shard(tmp_path / "b", "2/2", prompts='{"key": "b"}\n')
    with pytest.raises(UsageError, match="different prompts"):
        check_shards([a, b])


def test_merge_rejects_different_plans(tmp_path):
    a = fake_shard(tmp_path / "a", "1/2")
    b = fake_shard(tmp_path / "b", "2/2")
    run = manifest.read_run_json(b)
    run["plan"]["cells"] = run["plan"]["cells"][:-1]
    layout.write_json_atomic(b / layout.RUN_JSON, run)
    with pytest.raises(UsageError, match="different plans"):
        check_shards([a, b])


def test_merge_rejects_a_directory_that_is_no_run(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="missing run.json"):
        check_shards([tmp_path / "empty"])
    with pytest.raises(UsageError, match="not a directory"):
        check_shards([tmp_path / "nope"])


def test_a_missing_shard_is_a_usage_error(tmp_path):
    a = fake_shard(tmp_path / "a", "1/3")
    with pytest.raises(UsageError) as exc:
        check_shards([a])
    assert str(exc.value) == (
        "shard 2/3 is missing (6 of the matrix's 12 cells): give every shard's directory "
        "(or --allow-partial: the missing cells then show as pending and their pairs as error)"
    )
    c = fake_shard(tmp_path / "c", "3/3")
    with pytest.raises(UsageError, match=r"^shards 1/3, 2/3 are missing \(12 of the matrix's 12 cells\)"):
        check_shards([c])


def test_allow_partial_makes_missing_shards_a_warning(tmp_path):
    a = fake_shard(tmp_path / "a", "1/3")
    shards, warnings = check_shards([a], allow_partial=True)
    assert [str(s.shard) for s in shards] == ["1/3"]
    assert warnings == [
        "shard 2/3 is missing: its 6 cells show as pending",
        "shard 3/3 is missing: it holds no engine key (the matrix has 2), so nothing is pending",
    ]


def test_a_missing_shard_without_cells_is_only_a_warning(tmp_path):
    """More shards than engine keys: the empty shard's directory loses nothing when it is missing."""
    a, b = fake_shard(tmp_path / "a", "1/3"), fake_shard(tmp_path / "b", "2/3")
    _, warnings = check_shards([a, b])
    assert warnings == ["shard 3/3 is missing: it holds no engine key (the matrix has 2), so nothing is pending"]


def test_merge_cli_refuses_a_missing_shard_before_writing_anything(tmp_path):
    a = fake_shard(tmp_path / "a", "1/2")
    res = invoke("merge", str(tmp_path / "out"), str(a))
    assert res.exit_code == 2
    assert one_error_line(res) == (
        "error: shard 2/2 is missing (6 of the matrix's 12 cells): give every shard's directory "
        "(or --allow-partial: the missing cells then show as pending and their pairs as error)"
    )
    assert not (tmp_path / "out").exists()


def test_merge_warnings_show_no_python_repr(tmp_path):
    a, b = fake_shard(tmp_path / "a", "1/2"), fake_shard(tmp_path / "b", "2/2")
    for path, alpha in ((a, 0.01), (b, 0.05)):
        run = manifest.read_run_json(path)
        run["thresholds"] = {"alpha": alpha, "drift_min": 2.0}
        layout.write_json_atomic(path / layout.RUN_JSON, run)
    _, warnings = check_shards([a, b])
    assert warnings == [
        'shards differ in thresholds: {"alpha": 0.01, "drift_min": 2.0}, {"alpha": 0.05, "drift_min": 2.0}'
    ]


def test_merge_refuses_an_output_dir_holding_something_else(tmp_path):
    a = fake_shard(tmp_path / "a", "1/2")
    b = fake_shard(tmp_path / "b", "2/2")
    with pytest.raises(UsageError, match="is one of the shards"):
        merge(a, [a, b])
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("x")
    with pytest.raises(UsageError, match="not empty"):
        merge(tmp_path / "busy", [a, b])
    other = fake_shard(tmp_path / "other", None)
    with pytest.raises(UsageError, match="not a merge of this matrix"):
        merge(other, [a, b])
    with pytest.raises(UsageError, match="--fail-on"):
        merge(tmp_path / "new", [a, b], fail_on="sometimes")


@pytest.mark.parametrize(
    "case,message",
    [("dup", "duplicate shard 1/2"), ("other", "different matrix"), ("unsharded", "not a shard")],
)
def test_merge_cli_errors_are_one_line(tmp_path, case, message):
    a = fake_shard(tmp_path / "a", "1/2")
    b = {
        "dup": lambda: fake_shard(tmp_path / "b", "1/2"),
        "other": lambda: fake_shard(tmp_path / "b", "2/2", MatrixSpec(seeds=[0, 1], limit=3)),
        "unsharded": lambda: fake_shard(tmp_path / "b", None),
    }[case]()
    res = invoke("merge", str(tmp_path / "out"), str(a), str(b))
    assert res.exit_code == 2
    assert message in one_error_line(res)
    assert not (tmp_path / "out").exists()  # nothing half-made


def test_merge_cli_needs_shard_dirs(tmp_path):
    res = invoke("merge", str(tmp_path / "out"))
    assert res.exit_code == 2


# --- end to end: shard 1/2 + shard 2/2, merged, equals the unsharded run ----------------------------

TIMING = ["wall_s", "tokens_per_s"]
# The deterministic fake engine: sharding and merging do not depend on what a model computes.
TINY = dict(engine="fake", limit=8, batch=[1, 8], max_tokens=6, seeds=[0, 1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from cascade_repro.pipeline import RunOptions, run_matrix

    root = tmp_path_factory.mktemp("shards")
    out = {"whole": run_matrix(MatrixSpec(**TINY), RunOptions(results_dir=root / "whole", progress=False))}
    for i in (1, 2):
        opts = RunOptions(results_dir=root / f"m{i}", run_id="ci-1", progress=False, shard=Shard(i, 2))
        out[f"shard{i}"] = run_matrix(MatrixSpec(**TINY), opts)
    res = invoke("merge", str(root / "merged"), str(out["shard2"].run_dir), str(out["shard1"].run_dir))
    out["merge_cli"] = res
    out["merged"] = root / "merged"
    out["root"] = root
    return out


def _table(run_dir: Path, name: str, key: str) -> pd.DataFrame:
    df = pd.read_parquet(run_dir / f"{name}.parquet")
    return df.drop(columns=[c for c in TIMING if c in df.columns]).sort_values(key).reset_index(drop=True)


@pytest.mark.parametrize("name,key", [("cells", "cell_id"), ("pairs", "pair_id")])
def test_merged_tables_equal_the_unsharded_run(runs, name, key):
    assert runs["merge_cli"].exit_code == runs["whole"].exit_code == 0, runs["merge_cli"].output
    whole = _table(runs["whole"].run_dir, name, key)
    merged = _table(runs["merged"], name, key)
    assert list(merged.columns) == list(whole.columns)
    pd.testing.assert_frame_equal(merged, whole, check_exact=True)


def test_merged_comparisons_and_verdicts_equal_the_unsharded_run(runs):
    cols = ["pair_id", "prompt_index"]
    whole = (
        pd.read_parquet(runs["whole"].run_dir / "comparisons.parquet")
        .sort_values(cols)
        .reset_index(drop=True)
    )
    merged = pd.read_parquet(runs["merged"] / "comparisons.parquet").sort_values(cols).reset_index(drop=True)
    pd.testing.assert_frame_equal(merged, whole, check_exact=True)
    pairs = pd.read_parquet(runs["merged"] / "pairs.parquet").set_index("pair_id")
    # The matrix really exercised cascade in both seeds' engines, so equality is not vacuous.
    for s in (0, 1):
        assert pairs.loc[f"tp1-b8-cascade-s{s}~flat", "cascade_steps"] > 0
        assert pairs.loc[f"tp1-b8-cascade-s{s}~flat", "verdict"] in ("identical", "within noise")
    assert runs["merge_cli"].exit_code == 0
    for f in ("report.md", "report.html", "summary.json", "junit.xml"):
        assert (runs["merged"] / f).is_file()


def test_shards_share_the_matrix_and_hold_only_their_engine_keys(runs):
    s1, s2 = (manifest.read_run_json(runs[f"shard{i}"].run_dir) for i in (1, 2))
    whole = manifest.read_run_json(runs["whole"].run_dir)
    assert s1["shard"] == "1/2" and s2["shard"] == "2/2" and "shard" not in whole
    assert s1["spec_hash"] == s2["spec_hash"] == whole["spec_hash"]
    assert s1["plan"] == s2["plan"] == whole["plan"]
    assert sorted(p.name for p in (runs["shard1"].run_dir / "samples").iterdir()) == ["fake-tp1-auto-s0.jsonl"]
    assert sorted(p.name for p in (runs["shard2"].run_dir / "samples").iterdir()) == ["fake-tp1-auto-s1.jsonl"]
    # A shard scores its own cells only.
    cells1 = pd.read_parquet(runs["shard1"].run_dir / "cells.parquet")
    assert set(cells1["engine_key"]) == {"fake-tp1-auto-s0"}
    assert (cells1["status"] == "done").all()


def test_merged_run_json_lists_every_shard(runs):
    merged = manifest.read_run_json(runs["merged"])
    assert "shard" not in merged
    assert [s["shard"] for s in merged["shards"]] == ["1/2", "2/2"]
    assert [s["engine_keys"] for s in merged["shards"]] == [["fake-tp1-auto-s0"], ["fake-tp1-auto-s1"]]
    assert all(isinstance(s["env"], dict) and s["env"].get("torch") for s in merged["shards"])
    assert merged["shards_missing"] == []
    assert set(merged["engines"]) == {"fake-tp1-auto-s0", "fake-tp1-auto-s1"}
    assert all(e["status"] == "done" and e["effective"] for e in merged["engines"].values())
    assert "--shard" not in merged["command"]
    assert merged["run_id"] == "merged"
    assert sorted(p.name for p in (runs["merged"] / "samples").iterdir()) == [
        "fake-tp1-auto-s0.jsonl",
        "fake-tp1-auto-s1.jsonl",
    ]
    assert (runs["merged"] / "worker-fake-tp1-auto-s1.log").is_file()


def test_merge_again_into_the_same_directory(runs):
    res = invoke("merge", str(runs["merged"]), str(runs["shard1"].run_dir), str(runs["shard2"].run_dir))
    assert res.exit_code == 0, res.output
    pd.testing.assert_frame_equal(_table(runs["merged"], "pairs", "pair_id"),
                                  _table(runs["whole"].run_dir, "pairs", "pair_id"))  # fmt: skip


def test_merge_with_a_missing_shard_fails_unless_partial_is_allowed(runs):
    out = runs["root"] / "partial"
    res = invoke("merge", str(out), str(runs["shard1"].run_dir))
    assert res.exit_code == 2, res.output  # a CI guard must not pass with half the matrix absent
    assert "shard 2/2 is missing (4 of the matrix's 8 cells)" in one_error_line(res)
    assert not out.exists()
    res = invoke("merge", str(out), str(runs["shard1"].run_dir), "--allow-partial")
    assert res.exit_code == 0, res.output  # fail_on=regression: pending is not a regression
    assert "shard 2/2 is missing: its 4 cells show as pending" in " ".join(res.stderr.split())
    assert "cascade-repro: partial merge (4 of 8 cells: shard 2/2 missing); so far: " in " ".join(res.stderr.split())
    cells = pd.read_parquet(out / "cells.parquet").set_index("cell_id")
    assert (cells.loc[cells["seed"] == 1, "status"] == "pending").all()
    assert (cells.loc[cells["seed"] == 0, "status"] == "done").all()
    pairs = pd.read_parquet(out / "pairs.parquet").set_index("pair_id")
    assert pairs.loc["tp1-b8-cascade-s1~flat", "verdict"] == "error"
    assert manifest.read_run_json(out)["shards_missing"] == ["2/2"]
    res = invoke("merge", str(runs["root"] / "partial2"), str(runs["shard1"].run_dir), "--fail-on", "error",
                 "--allow-partial")  # fmt: skip
    assert res.exit_code == 1


def test_a_shard_dir_cannot_be_reused_for_another_shard(runs):
    from cascade_repro.pipeline import RunOptions, run_matrix

    shard1 = runs["shard1"].run_dir
    opts = RunOptions(results_dir=shard1.parent, run_id=shard1.name, progress=False, shard=Shard(2, 2))
    with pytest.raises(
        UsageError, match="holds shard 1/2 of this matrix, not shard 2/2: one --run-id per shard"
    ):
        run_matrix(MatrixSpec(**TINY), opts)


def test_empty_shard_runs_nothing_and_merges(runs, tmp_path):
    from cascade_repro.pipeline import RunOptions, run_matrix

    spec = MatrixSpec(**TINY)
    outcome = run_matrix(
        spec, RunOptions(results_dir=tmp_path, run_id="e", progress=False, shard=Shard(3, 3))
    )
    assert outcome.exit_code == 0
    assert manifest.read_run_json(outcome.run_dir)["shard"] == "3/3"
    assert not list((outcome.run_dir / "samples").iterdir())


@pytest.mark.parametrize("shard", ["shard1", "shard2"])
def test_rerunning_a_finished_shard_counts_its_cells_once(runs, shard):
    """Resuming a shard counts its own finished cells; the plan was once cut twice and shard 2/2
    of this two-key matrix then counted none of its cells and said nothing about resuming."""
    import io

    from rich.console import Console

    from cascade_repro.plan.shard import restrict
    from cascade_repro.run.runner import execute

    run_dir = runs[shard].run_dir
    n = len(restrict(manifest.read_manifest(run_dir)).plan.cells)
    buf = io.StringIO()
    assert execute(run_dir, show_progress=False, console=Console(file=buf, width=300)) == []
    assert buf.getvalue().splitlines()[0] == (
        f"resuming {run_dir.name}: {n} of {n} cells already done, running the other 0 (--fresh starts over)"
    )


def test_a_shards_results_dir_holding_one_run_stands_for_it(runs):
    """Issue 45 item 7: `merge OUT shard-1/ shard-2/` (each a downloaded --results-dir) said "missing run.json"."""
    m1, m2 = runs["root"] / "m1", runs["root"] / "m2"
    res = invoke("merge", str(runs["root"] / "from-results"), str(m1), str(m2))
    assert res.exit_code == 0, res.output
    err = " ".join(res.stderr.split())
    assert f"{m1}: merging the one run it holds, ci-1" in err and f"{m2}: merging the one run it holds, ci-1" in err
    pd.testing.assert_frame_equal(_table(runs["root"] / "from-results", "pairs", "pair_id"),
                                  _table(runs["whole"].run_dir, "pairs", "pair_id"))  # fmt: skip


def test_a_results_dir_holding_several_runs_is_one_line_naming_them(tmp_path):
    fake_shard(tmp_path / "res" / "run-a", "1/2")
    fake_shard(tmp_path / "res" / "run-b", "2/2")
    res = invoke("merge", str(tmp_path / "out"), str(tmp_path / "res"))
    assert res.exit_code == 2
    assert one_error_line(res) == (
        f"error: {tmp_path / 'res'} holds 2 runs (run-a, run-b), not one shard: give the shard's run directory"
    )
    assert not (tmp_path / "out").exists()
