"""cascade_repro.run.runstore: append-only JSONL that survives crashes, resume bookkeeping, the run lock.

A worker can die at any byte (kill -9, OOM, a GPU fault). The rules these tests pin down:

* a last line without a newline is a torn write: readers ignore it, the next writer cuts it off;
* a cell counts only when its ``cell_done`` line is present, and only the samples written by the
  attempt that reached ``cell_done`` (after the last ``cell_start`` before it) belong to the cell.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cascade_repro.errors import RunLockedError, UsageError
from cascade_repro.plan.matrix import spec_of
from cascade_repro.rundir import codec, jsonl, layout, manifest, sample_scan
from cascade_repro.rundir.jsonl import JsonlWriter, iter_records, truncate_torn_tail
from cascade_repro.rundir.layout import write_json_atomic
from cascade_repro.rundir.manifest import read_run_json
from cascade_repro.rundir.runlock import RunLock
from cascade_repro.rundir.sample_scan import finished_spans, iter_samples, read_progress


def write_records(path: Path, records: list[dict]) -> None:
    w = JsonlWriter(path)
    for r in records:
        w.write(r)
    w.close()


def append_raw(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def sample(cell: str, i: int, attempt: int = 1) -> dict:
    return {
        "type": "sample",
        "cell_id": cell,
        "wave": 0,
        "prompt_index": i,
        "token_ids": [attempt, i],
        "text": "",
    }


# --- JsonlWriter and torn tails --------------------------------------------------------------------


def test_writer_writes_one_compact_json_object_per_line_type_first(tmp_path):
    path = tmp_path / "samples" / "k.jsonl"  # parent directories are created
    write_records(
        path, [{"type": "engine", "engine_key": "k"}, {"type": "cell_done", "cell_id": "c", "text": "한"}]
    )

    assert path.read_text(encoding="utf-8") == (
        '{"type":"engine","engine_key":"k"}\n{"type":"cell_done","cell_id":"c","text":"한"}\n'
    )


def test_flush_reaches_readers_without_fsync_and_sync_fsyncs(tmp_path, monkeypatch):
    import os

    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    path = tmp_path / "k.jsonl"
    w = JsonlWriter(path)
    w.write({"type": "wave", "cell_id": "a"})
    w.flush()  # per wave: visible to the runner's tail, no disk round trip
    assert path.read_text(encoding="utf-8") == '{"type":"wave","cell_id":"a"}\n'
    assert synced == []
    w.write({"type": "cell_done", "cell_id": "a"})
    w.sync()  # what resume trusts goes to the disk
    assert len(synced) == 1
    w.close()
    assert len(synced) == 2


def test_reopening_cuts_a_torn_last_line_and_appends_whole_lines(tmp_path):
    path = tmp_path / "k.jsonl"
    write_records(path, [{"type": "cell_start", "cell_id": "a"}, sample("a", 0)])
    whole = path.read_bytes()
    append_raw(path, b'{"type":"sample","cell_id":"a","wave":0,"prompt_in')  # crash mid-write

    w = JsonlWriter(path)
    assert path.read_bytes() == whole  # the partial line is gone before anything is appended
    w.write({"type": "cell_done", "cell_id": "a"})
    w.close()

    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # file ends with a newline
    assert [json.loads(x)["type"] for x in lines[:-1]] == ["cell_start", "sample", "cell_done"]


def test_torn_tail_longer_than_the_scan_chunk_is_cut(tmp_path):
    path = tmp_path / "k.jsonl"
    write_records(path, [{"type": "engine"}])
    whole = path.read_bytes()
    append_raw(path, b'{"type":"sample","text":"' + b"x" * 200_000)

    truncate_torn_tail(path)
    assert path.read_bytes() == whole


def test_a_file_that_is_all_torn_becomes_empty_and_clean_files_are_untouched(tmp_path):
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(b'{"type":"eng')
    truncate_torn_tail(torn)
    assert torn.read_bytes() == b""

    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(b'{"a":1}\n')
    truncate_torn_tail(clean)
    assert clean.read_bytes() == b'{"a":1}\n'

    truncate_torn_tail(tmp_path / "missing.jsonl")  # nothing to do
    assert not (tmp_path / "missing.jsonl").exists()


def test_iter_records_skips_a_torn_tail_and_undecodable_lines(tmp_path):
    path = tmp_path / "k.jsonl"
    path.write_bytes(b'{"n":1}\nnot json\n\xff\xfe\n{"n":2}\n{"n":3')

    assert list(iter_records(path)) == [{"n": 1}, {"n": 2}]
    assert list(iter_records(tmp_path / "missing.jsonl")) == []


# --- read_progress ---------------------------------------------------------------------------------


def test_read_progress_reports_done_errors_waves_and_engine(tmp_path):
    path = tmp_path / "k.jsonl"
    write_records(
        path,
        [
            {"type": "engine", "engine_key": "k", "effective": {"dtype": "float32"}},
            {"type": "cell_start", "cell_id": "a"},
            sample("a", 0),
            {"type": "wave", "cell_id": "a", "wave": 0, "cascade_steps": 3},
            {"type": "wave", "cell_id": "a", "wave": 1, "cascade_steps": 4},
            {"type": "cell_done", "cell_id": "a"},
            {"type": "cell_start", "cell_id": "b"},
            {"type": "cell_error", "cell_id": "b", "reason": "RuntimeError: boom"},
            {"type": "cell_start", "cell_id": "c"},
            {"type": "wave", "cell_id": "c", "wave": 0},
        ],
    )
    append_raw(path, b'{"type":"cell_done","cell_id":"c"')  # torn: c is not done

    prog = read_progress(path)
    assert prog.done == {"a"}
    assert prog.errors == {"b": "RuntimeError: boom"}
    assert [w["cascade_steps"] for w in prog.waves["a"]] == [3, 4]
    assert prog.waves["b"] == []
    assert [w["wave"] for w in prog.waves["c"]] == [0]
    assert prog.engine["effective"] == {"dtype": "float32"}


def test_a_new_cell_start_resets_that_cells_waves_only(tmp_path):
    path = tmp_path / "k.jsonl"
    write_records(
        path,
        [
            {"type": "cell_start", "cell_id": "a"},
            {"type": "wave", "cell_id": "a", "wave": 0, "attempt": 1},
            {"type": "wave", "cell_id": "a", "wave": 1, "attempt": 1},
            {"type": "cell_start", "cell_id": "b"},
            {"type": "wave", "cell_id": "b", "wave": 0, "attempt": 1},
            # resume: a starts over
            {"type": "cell_start", "cell_id": "a"},
            {"type": "wave", "cell_id": "a", "wave": 0, "attempt": 2},
            {"type": "cell_done", "cell_id": "a"},
        ],
    )
    prog = read_progress(path)
    assert [(w["wave"], w["attempt"]) for w in prog.waves["a"]] == [(0, 2)]
    assert [(w["wave"], w["attempt"]) for w in prog.waves["b"]] == [(0, 1)]
    assert prog.done == {"a"}


def test_cell_done_after_an_error_clears_the_error(tmp_path):
    path = tmp_path / "k.jsonl"
    write_records(
        path,
        [
            {"type": "cell_start", "cell_id": "a"},
            {"type": "cell_error", "cell_id": "a", "reason": "worker exited -9"},
            {"type": "cell_start", "cell_id": "a"},
            {"type": "cell_done", "cell_id": "a"},
        ],
    )
    prog = read_progress(path)
    assert prog.done == {"a"}
    assert prog.errors == {}


def test_a_new_cell_start_also_clears_the_previous_attempts_error(tmp_path):
    path = tmp_path / "k.jsonl"
    write_records(
        path,
        [
            {"type": "cell_start", "cell_id": "a"},
            {"type": "cell_error", "cell_id": "a", "reason": "CUDA error: out of memory"},
            {"type": "cell_start", "cell_id": "a"},  # resume retries the cell, then the worker is killed
            {"type": "wave", "cell_id": "a", "wave": 0},
        ],
    )
    assert "a" not in read_progress(path).errors


def test_read_progress_of_a_missing_file_is_empty(tmp_path):
    prog = read_progress(tmp_path / "missing.jsonl")
    assert (prog.done, prog.errors, prog.waves, prog.engine) == (set(), {}, {}, {})


# --- iter_samples ----------------------------------------------------------------------------------


def test_iter_samples_yields_only_the_attempt_that_finished_each_cell(tmp_path):
    path = tmp_path / "k.jsonl"
    write_records(
        path,
        [
            {"type": "engine", "engine_key": "k"},
            {"type": "cell_start", "cell_id": "a"},
            sample("a", 0, attempt=1),
            sample("a", 1, attempt=1),
        ],
    )
    append_raw(path, b'{"type":"sample","cell_id":"a","wave":0,"prompt_index":2,"tok')  # crash
    write_records(  # the resumed worker reopens the file: the torn line is cut
        path,
        [
            {"type": "engine", "engine_key": "k"},
            {"type": "cell_start", "cell_id": "a"},
            sample("a", 0, attempt=2),
            sample("a", 1, attempt=2),
            sample("a", 2, attempt=2),
            {"type": "cell_done", "cell_id": "a", "n_samples": 3},
            {"type": "cell_start", "cell_id": "b"},
            sample("b", 0, attempt=2),
        ],
    )  # b has no cell_done: unfinished

    got = list(iter_samples(path))
    assert [(s["cell_id"], s["prompt_index"], s["token_ids"][0]) for s in got] == [
        ("a", 0, 2),
        ("a", 1, 2),
        ("a", 2, 2),
    ]


def test_a_finished_cell_rerun_without_cell_done_keeps_the_finished_attempt(tmp_path):
    path = tmp_path / "k.jsonl"
    write_records(
        path,
        [
            {"type": "cell_start", "cell_id": "a"},
            sample("a", 0, attempt=1),
            {"type": "cell_done", "cell_id": "a"},
            {"type": "cell_start", "cell_id": "a"},
            sample("a", 0, attempt=2),
        ],
    )
    assert [s["token_ids"][0] for s in iter_samples(path)] == [1]


def test_iter_samples_filters_by_cell_and_yields_nothing_for_unfinished_cells(tmp_path):
    path = tmp_path / "k.jsonl"
    write_records(
        path,
        [
            {"type": "cell_start", "cell_id": "a"},
            sample("a", 0),
            {"type": "cell_done", "cell_id": "a"},
            {"type": "cell_start", "cell_id": "b"},
            sample("b", 0),
            {"type": "cell_done", "cell_id": "b"},
            {"type": "cell_start", "cell_id": "c"},
            sample("c", 0),
        ],
    )
    assert [s["cell_id"] for s in iter_samples(path)] == ["a", "b"]
    assert [s["cell_id"] for s in iter_samples(path, cells={"b", "c"})] == ["b"]
    assert list(iter_samples(path, cells={"c"})) == []
    assert list(iter_samples(tmp_path / "missing.jsonl")) == []
    assert finished_spans(path) == {"a": (0, 2), "b": (3, 5)}


# --- run.json and atomic writes --------------------------------------------------------------------


def test_write_json_atomic_replaces_the_file_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "run" / "run.json"
    write_json_atomic(path, {"b": 1, "a": Path("/x")})
    write_json_atomic(path, {"spec": {"batch": [1, 8]}})

    assert json.loads(path.read_text()) == {"spec": {"batch": [1, 8]}}
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.json"]
    assert read_run_json(path.parent) == {"spec": {"batch": [1, 8]}}


def test_write_json_atomic_keeps_the_old_file_and_no_temp_file_when_encoding_fails(tmp_path):
    path = tmp_path / "run.json"
    write_json_atomic(path, {"ok": True})
    with pytest.raises(ValueError):
        write_json_atomic(path, {"bad": float("nan"), "cycle": _cycle()})
    assert json.loads(path.read_text()) == {"ok": True}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def _cycle() -> list:
    x: list = []
    x.append(x)
    return x


def test_read_run_json_errors_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="not a cascade-repro run directory: .*missing run.json"):
        read_run_json(tmp_path)
    (tmp_path / "run.json").write_text('{"spec":\n  [1,,]}')
    with pytest.raises(UsageError, match="corrupt JSON at line 2"):
        read_run_json(tmp_path)


def test_paths_follow_the_documented_layout(tmp_path):
    assert layout.samples_path(tmp_path, "hf-tp1-auto-s0") == tmp_path / "samples" / "hf-tp1-auto-s0.jsonl"
    assert layout.worker_log(tmp_path, "hf-tp1-auto-s0") == tmp_path / "worker-hf-tp1-auto-s0.log"


# --- RunLock ---------------------------------------------------------------------------------------


def test_lock_file_holds_our_pid_and_release_removes_it(tmp_path):
    lock = RunLock(tmp_path / "run")
    lock.acquire()
    assert (tmp_path / "run" / ".lock").read_text() == str(os.getpid())
    lock.release()
    assert not (tmp_path / "run" / ".lock").exists()
    lock.release()  # releasing twice is harmless


def test_second_acquire_while_held_is_refused_with_a_clear_message(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunLockedError) as exc:
            RunLock(tmp_path).acquire()
        msg = str(exc.value)
        assert f"{tmp_path} is in use by another cascade-repro run (pid {os.getpid()})" in msg
        assert "--results-dir" in msg
        assert isinstance(exc.value, UsageError)  # the CLI turns it into exit 2
        assert (tmp_path / ".lock").exists()  # the refused attempt did not break the holder's lock
    assert not (tmp_path / ".lock").exists()


def test_a_refused_lock_does_not_delete_the_holders_file_on_release(tmp_path):
    holder = RunLock(tmp_path)
    holder.acquire()
    other = RunLock(tmp_path)
    with pytest.raises(RunLockedError):
        other.acquire()
    other.release()  # never held: must not remove the holder's lock
    assert (tmp_path / ".lock").read_text() == str(os.getpid())
    holder.release()


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(proc.stdout)
    (tmp_path / ".lock").write_text(str(dead_pid))

    with RunLock(tmp_path):
        assert (tmp_path / ".lock").read_text() == str(os.getpid())
    assert not (tmp_path / ".lock").exists()


@pytest.mark.parametrize("content", ["", "not a pid", "0"])
def test_an_unreadable_lock_file_is_treated_as_stale(tmp_path, content):
    (tmp_path / ".lock").write_text(content)
    with RunLock(tmp_path):
        assert (tmp_path / ".lock").read_text() == str(os.getpid())


def test_sample_line_layout_is_the_one_readers_expect(tmp_path):
    from cascade_repro.rundir import codec

    path = tmp_path / "s.jsonl"
    w = jsonl.JsonlWriter(path)
    w.write(codec.sample_record('c"é', 3, 17, {"token_ids": [1, 2], "text": "x"}))
    w.write({"type": codec.CELL_DONE, "cell_id": 'c"é'})
    w.close()
    sample, done = path.read_bytes().splitlines(keepends=True)
    assert codec.is_sample_line(sample) and not codec.is_sample_line(done)
    m = codec.SAMPLE_HEAD.match(sample)
    assert m and m.group(2) == b"17" and json.loads(b'"' + m.group(1) + b'"') == 'c"é'


def test_a_corrupt_record_in_the_middle_names_its_line_and_unfinishes_its_cell(tmp_path):
    import json as _json

    from cascade_repro.rundir import sample_scan

    p = tmp_path / "k.jsonl"
    lines = [
        {"type": "engine", "engine_key": "k"},
        {"type": "cell_start", "cell_id": "a"},
        {"type": "wave", "cell_id": "a", "wave": 0},
        {"type": "cell_done", "cell_id": "a"},
        {"type": "cell_start", "cell_id": "b"},
        {"type": "wave", "cell_id": "b", "wave": 0},
        {"type": "cell_done", "cell_id": "b"},
    ]
    text = [_json.dumps(x) for x in lines]
    text[5] = '{"type": "wave", "cell_id": "b", "wa\x00 garbage'  # a disk error in the middle of b
    p.write_text("\n".join(text) + "\n")
    prog = sample_scan.read_progress(p)
    assert prog.done == {"a"} and prog.corrupt == {"b": [6]}
    assert sample_scan.corrupt_reason("k", [6]) == (
        "unreadable record in samples/k.jsonl at line 6: the cell counts as unfinished; rerun the same command to redo it"
    )
    # A new attempt at b (the resume) rewrites it: done again, nothing corrupt left to report.
    with open(p, "a") as f:
        f.write("\n".join(_json.dumps(x) for x in lines[4:]) + "\n")
    prog = sample_scan.read_progress(p)
    assert prog.done == {"a", "b"} and prog.corrupt == {}


def test_a_torn_last_line_is_not_corruption(tmp_path):
    from cascade_repro.rundir import sample_scan

    p = tmp_path / "k.jsonl"
    p.write_bytes(b'{"type": "cell_start", "cell_id": "a"}\n{"type": "cell_do')
    assert sample_scan.read_progress(p).corrupt == {}


def test_fresh_deletes_only_what_a_run_wrote(tmp_path):
    import json as _json

    from cascade_repro.run.runner import PreparedRun
    from cascade_repro.rundir import layout, manifest
    from cascade_repro.rundir.manifest import Manifest

    run_dir = tmp_path / "results" / "r1"
    (run_dir / "samples").mkdir(parents=True)
    (run_dir / "samples" / "k.jsonl").write_text('{"type":"cell_start","cell_id":"a"}\n')
    (run_dir / "worker-k.log").write_text("log")
    (run_dir / "notes.txt").write_text("mine")  # the user's own files in the run directory
    (run_dir / "mine").mkdir()
    (run_dir / "mine" / "x.csv").write_text("1,2")
    old = {"run_id": "r1", "created_at": "2026-12-01T10:00:00+0000", "spec_hash": "old", "env": {}}
    (run_dir / layout.RUN_JSON).write_text(_json.dumps(old))
    new = {"run_id": "r1", "created_at": "2026-12-01T11:00:00+0000", "spec_hash": "new", "env": {}}
    new["invocations"] = [Manifest.from_json(new).own_invocation().to_json()]
    PreparedRun(run_dir, Manifest.from_json(new), [], fresh=True).write()
    assert not (run_dir / "samples" / "k.jsonl").exists() and not (run_dir / "worker-k.log").exists()
    assert (run_dir / "notes.txt").read_text() == "mine" and (run_dir / "mine" / "x.csv").read_text() == "1,2"
    assert manifest.read_run_json(run_dir)["spec_hash"] == "new"
    # Without --fresh, another matrix in the same directory is refused, nothing deleted.
    (run_dir / "worker-k.log").write_text("log")
    with pytest.raises(Exception, match="holds a different matrix"):
        PreparedRun(run_dir, Manifest.from_json({**new, "spec_hash": "other"}), [], fresh=False).write()
    assert (run_dir / "worker-k.log").exists()


# --- the typed manifest (run.json) and the typed records (samples files) ---


def _same_order(a, b, where="run.json"):
    """Equal, and every object's keys in the same order."""
    assert a == b, where
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _same_order(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same_order(x, y, f"{where}[{i}]")


def test_manifest_round_trips_a_synthetic_run_byte_for_byte(tmp_path):
    from conftest import synthetic_run

    from cascade_repro.rundir.manifest import Manifest

    run_dir = tmp_path / "synth"
    synthetic_run(run_dir, prompts=4, batch="1,8")
    raw = (run_dir / layout.RUN_JSON).read_bytes()
    m = manifest.read_manifest(run_dir)
    _same_order(m.to_json(), json.loads(raw))
    assert m.prompt_set.n == 4 and spec_of(m.spec_json).batch == [1, 8] and spec_of(m.spec_json).engine == "vllm"
    assert [c.cell_id for c in m.plan.cells] == [c for ep in m.plan.engines.values() for c in ep.cells]
    manifest.write_manifest(run_dir, m)
    assert (run_dir / layout.RUN_JSON).read_bytes() == raw
    assert Manifest.from_json(m.to_json()).to_json() == m.to_json()


OLD_RUN_JSON = {  # an early run.json: no invocations, predictions, tool_source or prompt_tokens_max
    "run_id": "old",
    "created_at": "2026-01-02T03:04:05+0000",
    "spec": {"engine": "hf", "batch": [1, 8], "max_tokens": 12, "retired_option": 3},
    "spec_hash": "abc",
    "model_name": "m",
    "prompt_set": {"name": "p", "n": 2, "system_prompt_text": "sys", "some_new_fact": [1]},
    "plan": {
        "engines": {"hf-tp1-auto-s0": {"key": "hf-tp1-auto-s0", "tp": 1, "cells": ["c1"], "note": "x"}},
        "cells": [{"cell_id": "c1", "engine_key": "hf-tp1-auto-s0", "batch": 8, "arm": "cascade"}],
    },
    "engines": {},
    "timings": {},
    "a_key_from_the_future": {"kept": True},
}


def test_manifest_of_an_old_run_json_defaults_missing_keys_and_keeps_unknown_ones(tmp_path):
    from cascade_repro.rundir.manifest import Manifest

    m = Manifest.from_json(OLD_RUN_JSON)
    assert spec_of(m.spec_json).engine == "hf" and spec_of(m.spec_json).topk == 5 and spec_of(m.spec_json).batch == [1, 8]  # retired key dropped
    assert m.prompt_set.system_prompt_text == "sys" and m.prompt_set.prompt_tokens_max == 0
    assert m.prompt_set.extra == {"some_new_fact": [1]} and m.extra == {"a_key_from_the_future": {"kept": True}}
    cell = m.plan.cells[0]
    assert cell.fa_version is None and cell.origin == "matrix" and not cell.has("inject")
    assert m.invocations is None and m.first_invocation().started_at == OLD_RUN_JSON["created_at"]
    _same_order(m.to_json(), OLD_RUN_JSON)  # nothing added, nothing lost, the stored spec as it was
    m.fail_on = "error"  # a field the file lacked is written once set
    m.timings.total_s = 1.5
    out = m.to_json()
    assert out["fail_on"] == "error" and out["timings"] == {"total_s": 1.5}
    assert {k: v for k, v in out.items() if k != "fail_on" and k != "timings"} == {
        k: v for k, v in OLD_RUN_JSON.items() if k != "timings"
    }
    (tmp_path / layout.RUN_JSON).write_text(json.dumps(OLD_RUN_JSON))
    assert manifest.read_manifest(tmp_path).run_id == "old"


def test_a_manifest_built_in_code_writes_its_fields_and_leaves_unset_optional_ones_out():
    from cascade_repro.rundir.manifest import Manifest

    out = Manifest(run_id="r").to_json()
    assert out["run_id"] == "r" and out["engines"] == {} and out["timings"] == {} and "spec" in out
    assert not {"shard", "predictions", "invocations", "mixed_stack", "vllm_collect_env"} & set(out)


def test_manifest_edits_write_what_the_same_dict_edits_wrote():
    from cascade_repro.plan.matrix import MatrixSpec, plan
    from cascade_repro.rundir.manifest import EngineRecord, Invocation, Manifest

    # of: exactly the fields given, a None among them (a pending engine's start_s).
    assert EngineRecord.of(effective={}, start_s=None, status="pending", error="").to_json() == {
        "effective": {}, "start_s": None, "status": "pending", "error": ""}  # fmt: skip
    assert Invocation.of(started_at="t", command="c", kind="merge").to_json() == {
        "started_at": "t", "command": "c", "kind": "merge"}  # fmt: skip
    # update writes a field the file lacked even at its default; drop removes one, as pop does.
    m = Manifest.from_json({"run_id": "r", "shard": "1/2", "spec": {"engine": "hf"}})
    m.update(fail_on="regression", engines={})
    m.drop("shard")
    assert m.to_json() == {"run_id": "r", "spec": {"engine": "hf"}, "fail_on": "regression", "engines": {}}
    # stored: what to_json writes under a key, None where it writes none (a dict's get).
    assert (m.stored("spec"), m.stored("fail_on"), m.stored("created_at"), m.stored("timings")) == (
        {"engine": "hf"}, "regression", None, None)  # fmt: skip
    # The planner's plan writes every field of its engines and cells, in field order, a None among
    # them (fa_version, an engine's arm, a clean cell's inject).
    planned = plan(MatrixSpec(seeds=[0, 1]))

    def every_field(x) -> dict:  # but the twins a cell or engine serves, written in a run of several only
        return {
            f.name: getattr(x, f.name)
            for f in dataclasses.fields(x)
            if f.name not in ("extra", "keys") and not (f.name in ("twin", "twins") and getattr(x, f.name) is None)
        }

    assert planned.to_json() == {
        "engines": {k: every_field(ep) for k, ep in planned.engines.items()},
        "cells": [every_field(c) for c in planned.cells],
    }
    cell, ep = planned.to_json()["cells"][0], planned.to_json()["engines"]["hf-tp1-auto-s0"]
    assert list(cell) == list(every_field(planned.cells[0])) and cell["inject"] is None
    assert ep["fa_version"] is None and ep["arm"] is None and ep["cells"][0] == cell["cell_id"]
    # Read back, it writes the same object, key order included.
    assert json.dumps(Manifest.from_json({"plan": planned.to_json()}).plan.to_json()) == json.dumps(planned.to_json())


def test_each_record_encodes_as_the_dict_writer_did_and_decodes_back():
    old = [  # what the worker and the runner wrote as dicts before the typed records
        {"type": "engine", "engine_key": "k", "effective": {"dtype": "bf16"}, "shared_prefix_tokens": 300,
         "start_s": 1.5, "started_at": "2026-01-02T03:04:05+0000"},
        {"type": "cell_start", "cell_id": "c"},
        {"type": "cell_start", "cell_id": "c", "kept_waves": 2},
        {"type": "sample", "cell_id": "c", "wave": 0, "prompt_index": 3, "prompt_key": "k3", "prompt_hash": "h",
         "prompt_tokens": 9, "token_ids": [1, 2], "text": "한국어", "finish_reason": "length",
         "logprobs": [-0.1, -0.2], "topk": [[[1, -0.1]], [[2, -0.2]]]},
        {"type": "wave", "cell_id": "c", "wave": 0, "batch": 8, "n_real": 8, "cascade_steps": 3, "total_steps": 4,
         "cascade_calls": 90, "cascade_decode_steps": None, "common_prefix_len": 300, "wall_s": 0.25, "tokens": 16},
        {"type": "wave", "cell_id": "c", "wave": 1, "batch": 8, "n_real": 8, "cascade_steps": 3, "total_steps": 4,
         "cascade_calls": 90, "cascade_decode_steps": 2, "common_prefix_len": 300, "wall_s": 0.25, "tokens": 16,
         "extra": {"steps": {"decode_cascade_n": 2}}},
        {"type": "cell_done", "cell_id": "c", "n_samples": 8, "wall_s": 1.0},
        {"type": "cell_error", "cell_id": "c", "reason": "RuntimeError: x"},
        {"type": "cell_done", "cell_id": "c", "n_samples": 8, "wall_s": 1.0, "from_the_future": 1},
    ]  # fmt: skip
    for d in old:
        line = json.dumps(d, ensure_ascii=False, separators=(",", ":"))
        rec = codec.decode(line.encode())
        assert codec.encode(rec) == line
        assert codec.decode(d) == rec
    sample = codec.decode(json.dumps(old[3]))
    assert isinstance(sample, codec.SampleRecord) and sample.token_ids == [1, 2]
    raw = codec.encode(sample).encode()
    assert codec.is_sample_line(raw) and codec.SAMPLE_HEAD.match(raw).groups() == (b"c", b"3")
    assert codec.decode(b'{"type":"unknown"}') is None


def test_the_writer_takes_typed_records(tmp_path):
    p = tmp_path / "s.jsonl"
    w = JsonlWriter(p)
    w.write(codec.CellStart("c"))
    w.write(codec.WaveRecord(cell_id="c", wave=0, batch=1, n_real=1, wall_s=0.1, tokens=2))
    w.write(codec.CellDone("c", n_samples=1, wall_s=0.2))
    w.close()
    prog = read_progress(p)
    assert prog.done == {"c"} and prog.waves["c"][0]["tokens"] == 2


def test_fresh_clears_everything_the_old_run_derived_from_its_samples(tmp_path):
    """A --fresh run cut before it scored once kept the old report.md, summary.json and a passing
    junit.xml beside its empty samples; minimize/ and the sweep table outlived their samples too."""
    from conftest import synthetic_run

    from cascade_repro.report import write_reports
    from cascade_repro.run.runner import PreparedRun

    run_dir = synthetic_run(tmp_path / "run", prompts=16, batch="8,16", max_tokens=64)
    write_reports(run_dir)
    (run_dir / layout.MINIMIZE).mkdir()
    (run_dir / layout.MINIMIZE / "repro.py").write_text("print()\n")
    (run_dir / layout.SWEEP_MD).write_text("| b |\n")
    layout.probe_dir(run_dir, "k").mkdir(parents=True)
    layout.worker_log(run_dir, "k").write_text("log\n")
    assert all((run_dir / name).exists() for name in (*layout.TABLES, *layout.REPORTS))

    run = manifest.read_manifest(run_dir)
    PreparedRun(run_dir, run, layout.read_prompts(run_dir), fresh=True).write()
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(
        [layout.RUN_JSON, layout.PROMPTS, layout.SAMPLES]
    )
    assert not list((run_dir / layout.SAMPLES).iterdir())


# --- SampleScan: one pass -------------------------------------------------------------------------


def test_one_scan_gives_what_progress_and_the_two_pass_reader_give(tmp_path):
    """Scoring's single pass keeps the attempt that finished each cell (known only at its end), the
    records a second cell_done confirms, the damage and the warnings of the two-pass reader."""
    path = tmp_path / "k.jsonl"
    write_records(
        path,
        [
            {"type": "engine", "engine_key": "k"},
            {"type": "cell_start", "cell_id": "a"},
            sample("a", 0, attempt=1),
            {"type": "cell_start", "cell_id": "a"},  # the cut attempt above never counts
            sample("a", 0, attempt=2),
            {"type": "cell_start", "cell_id": "b"},
            sample("b", 0, attempt=2),
            {"type": "cell_done", "cell_id": "a"},
            sample("a", 1, attempt=3),  # after a's cell_done: counts only once another closes it
            {"type": "cell_done", "cell_id": "a"},
            sample("b", 1, attempt=2),
            {"type": "cell_done", "cell_id": "b"},
            sample("b", 2, attempt=4),  # after b's last cell_done: never counts
            {"type": "cell_start", "cell_id": "c"},
            sample("c", 0),
        ],
    )
    append_raw(path, b'{"type":"sample","cell_id":"b","wave":0,"prompt_index":0,"token_ids":"x"}\n')
    append_raw(path, b'{"type":"cell_done","cell_id":"c"}\n')
    scan = sample_scan.SampleScan(path)
    got = list(scan)  # which attempt finished a cell is known once the pass is over
    kept = [(s, r["cell_id"], r["prompt_index"], r["token_ids"][0]) for s, r in got if scan.finished(s, r["cell_id"])]
    want = [("a", 0, 2), ("b", 0, 2), ("a", 1, 3), ("b", 1, 2), ("c", 0, 1)]
    assert sorted(k[1:] for k in kept) == sorted(want)
    assert sorted((r["cell_id"], r["prompt_index"], r["token_ids"][0]) for r in iter_samples(path)) == sorted(want)
    assert scan.progress == read_progress(path)
    assert scan.progress.done == {"a", "b"} and list(scan.progress.corrupt) == ["c"]  # c's damaged line
    warned: list[str] = []
    list(iter_samples(path, warn=warned.append))
    assert scan.warnings() == warned == [
        "samples/k.jsonl line 16: token_ids is not a list of whole numbers; skipped"
    ]


def test_finalize_reads_each_samples_file_once(tmp_path, monkeypatch):
    """Scoring reads each samples file once and hands down what it read: progress, the scored
    samples and the report's examples (it read each about 7 times)."""
    import builtins
    import collections

    from conftest import synthetic_run

    from cascade_repro.pipeline import finalize

    run_dir = synthetic_run(tmp_path / "r", prompts=40, batch="4,8")
    opened: collections.Counter[str] = collections.Counter()
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if str(file).endswith(".jsonl") and Path(file).parent.name == layout.SAMPLES:
            opened[Path(file).name] += 1
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    _, data = finalize(run_dir)
    assert data.examples and data.examples[0].test_text  # the examples came from what was read
    assert opened == {p.name: 1 for p in layout.samples_files(run_dir)}
