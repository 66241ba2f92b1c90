"""The reference records' arm ids (``arm_ids``/``arm_lp``): which sequences a pass must (re)score, and
how a record that travelled is checked. On the fake engine's samples (no weights are loaded: only
what the pass would score is asked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cascade_repro.pipeline import RunOptions, run_matrix
from cascade_repro.plan.matrix import MatrixSpec
from cascade_repro.run.reference import needed
from cascade_repro.rundir import layout, manifest, sample_scan
from cascade_repro.rundir.reference import RECORD, RefRow, _valid, fingerprint, read_reference


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fake")
    spec = MatrixSpec(engine="fake", limit=4, batch=[1, 4], max_tokens=6)
    return run_matrix(spec, RunOptions(results_dir=out, progress=False)).run_dir


def _samples(run_dir: Path) -> list[dict]:
    keys = list(manifest.read_manifest(run_dir).plan.engines)
    return [r for k in keys for r in sample_scan.iter_samples(layout.samples_path(run_dir, k))]


def _record(row: RefRow, fp: str) -> dict:
    rec = {
        "type": RECORD,
        "fp": fp,
        "n": len(row.lp),
        "lp": row.lp,
        "top_ids": row.top_ids,
        "top_lp": row.top_lp,
    }
    if row.arm_ids is not None:
        rec.update(arm_ids=row.arm_ids, arm_lp=row.arm_lp)
    return rec


def test_a_shared_sequence_is_scored_once_for_the_union_of_its_arms_ids(fake_run):
    keys = list(manifest.read_manifest(fake_run).plan.engines)
    samples = _samples(fake_run)
    todo = [t for ts in needed(fake_run, keys, {}).values() for t in ts]
    fps = {fingerprint(r["prompt_hash"], r["token_ids"]) for r in samples}
    assert len(todo) == len(fps) < len(samples)  # the fake's arms agree: each content once
    for t in todo:
        ids = [set() for _ in t.token_ids]
        for r in samples:
            if fingerprint(r["prompt_hash"], r["token_ids"]) == t.fp:
                for i, step in enumerate(r["topk"]):
                    ids[i] |= {e[0] for e in step}
        assert t.want == ids and all(ids)


def test_a_stored_record_is_rescored_only_when_it_lacks_an_id_a_sample_needs(fake_run):
    keys = list(manifest.read_manifest(fake_run).plan.engines)
    todo = [t for ts in needed(fake_run, keys, {}).values() for t in ts]
    t0, t1, t2 = todo[:3]

    def row(t, arm_ids):
        n = len(t.token_ids)
        lps = None if arm_ids is None else [[-1.0] * len(a) for a in arm_ids]
        return RefRow([-0.5] * n, [[1]] * n, [[-0.1]] * n, arm_ids, lps)

    have = {
        t0.fp: row(t0, [sorted(w) for w in t0.want]),  # covers every id: kept
        t1.fp: row(t1, None),  # an older record, without the arms' ids: rescored
        t2.fp: row(t2, [sorted(w)[:-1] for w in t2.want]),  # one id short at each step: rescored
    }
    again = {t.fp for ts in needed(fake_run, keys, have).values() for t in ts}
    assert t0.fp not in again and {t1.fp, t2.fp} <= again
    assert len(again) == len(todo) - 1


def test_records_with_and_without_arm_ids_load_and_damaged_ones_are_refused(tmp_path):
    n = 2
    base = {"type": RECORD, "fp": "a", "n": n, "lp": [-0.5, -0.25], "top_ids": [[3, 4], [5, 6]],
            "top_lp": [[-0.1, -2.0], [-0.2, -3.0]]}  # fmt: skip
    old = _valid(base)
    assert (
        old is not None
        and old.arm_ids is None
        and old.arm_logprobs() == [{3: -0.1, 4: -2.0}, {5: -0.2, 6: -3.0}]
    )
    new = _valid({**base, "arm_ids": [[4, 9], [7]], "arm_lp": [[-2.0, -5.5], [-4.0]]})
    assert new is not None and new.arm_logprobs()[0] == {3: -0.1, 4: -2.0, 9: -5.5}
    assert new.covers([{4, 9}, {7}]) and not new.covers([{4, 9}, {8}])
    for bad in (
        {"arm_ids": [[4, 9], [7]]},  # ids without their logprobs
        {"arm_ids": [[4, 9]], "arm_lp": [[-2.0, -5.5]]},  # fewer steps than tokens
        {"arm_ids": [[4, 9], [7]], "arm_lp": [[-2.0], [-4.0]]},  # a step's lists of unequal length
        {"arm_ids": [[4, "9"], [7]], "arm_lp": [[-2.0, -5.5], [-4.0]]},  # an id that is not an int
        {"arm_ids": [[4, True], [7]], "arm_lp": [[-2.0, -5.5], [-4.0]]},
        {"arm_ids": [[4, -1], [7]], "arm_lp": [[-2.0, -5.5], [-4.0]]},
        {"arm_ids": [[4, 9], [7]], "arm_lp": [[-2.0, "x"], [-4.0]]},
        {"arm_ids": {"0": [4]}, "arm_lp": [[-2.0, -5.5], [-4.0]]},
    ):
        assert _valid({**base, **bad}) is None, bad
    # read_reference skips a damaged record (the next pass recomputes it) and keeps the good ones.
    path = layout.reference_path(tmp_path, "k")
    path.parent.mkdir(parents=True)
    lines = [base, {**base, "fp": "b", "arm_ids": [[1]], "arm_lp": [[-1.0]]}, {**base, "fp": "c", "arm_ids": [[1], [2]], "arm_lp": [[-1.0], [-2.0]]}]  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows, _ = read_reference(tmp_path)
    assert set(rows) == {"a", "c"} and rows["c"].arm_lp == [[-1.0], [-2.0]]
