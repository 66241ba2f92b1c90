"""judge/outcome.py: the verdict names, the pair kinds and the exit policy, declared once and
decided without the report."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cascade_repro import exit_codes
from cascade_repro.errors import UsageError
from cascade_repro.judge import outcome
from cascade_repro.rundir.manifest import Manifest

PACKAGE = Path(__file__).resolve().parents[2] / "cascade_repro"
# Names only a verdict or a pair kind spells ("error" and "regression" are also a cell status,
# a --fail-on value and JUnit's failure types).
OWN_NAMES = {"not exercised", "inconclusive", "within noise", "identical", "noise-batch", "noise-restart",
             "noise-rerun"}  # fmt: skip
KEEPS_ITS_OWN = {"judge/outcome.py"}


def test_verdict_and_kind_names_are_spelled_only_in_outcome():
    found = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in KEEPS_ITS_OWN:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in OWN_NAMES:
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    assert found == []


def test_the_order_counts_are_reported_in():
    # summary.json's "counts" keys follow this order: worst first.
    assert outcome.VERDICTS == ("regression", "error", "not exercised", "inconclusive", "within noise", "identical")
    assert set(outcome.EXERCISED) == set(outcome.VERDICTS) - {"error", "not exercised"}
    twins = ("cascade", "prefix-caching", "chunked-prefill", "cuda-graphs", "async-scheduling", "kv-cache-dtype",
             "attention-backend", "tp", "batch")  # fmt: skip
    assert outcome.PAIR_KINDS == (*twins, "calibration", "noise-batch", "noise-restart", "noise-rerun")
    assert outcome.verdict_counts(["identical", "odd", "identical"]) == {
        "regression": 0, "error": 0, "not exercised": 0, "inconclusive": 0, "within noise": 0, "identical": 2,
        "odd": 1,
    }  # fmt: skip


@dataclass
class Scored:
    """A scored run as the policy reads it, with no report in between."""

    manifest: Manifest
    tables: dict[str, list[dict]] = field(default_factory=dict)

    def rows(self, table: str) -> list[dict]:
        return [dict(r) for r in self.tables.get(table, [])]


def _run(verdicts: list[str], cells: list[dict] | None = None, **run_json) -> Scored:
    pairs = [{"pair_id": f"p{i}", "kind": "cascade", "verdict": v} for i, v in enumerate(verdicts)]
    pairs.append({"pair_id": "cal", "kind": "calibration", "verdict": "regression"})  # never counts
    done = [{"cell_id": "c", "status": "done", "arm": "cascade", "batch": 4}]
    return Scored(Manifest.from_json(run_json), {"pairs": pairs, "cells": cells if cells is not None else done})


@pytest.mark.parametrize(
    ("verdicts", "fail_on", "code", "reason"),
    [
        (["identical", "within noise"], "regression", exit_codes.OK, "no regression (fail_on=regression)"),
        (["regression", "regression", "identical"], "regression", exit_codes.REGRESSION,
         "2 regressions (fail_on=regression)"),
        (["regression"], "never", exit_codes.OK, "fail_on=never: the run never fails"),
        (["error", "error"], "regression", exit_codes.REGRESSION,
         "every cascade pair errored: nothing was measured (fail_on=regression)"),
        (["identical", "error"], "error", exit_codes.REGRESSION, "errors in the run (fail_on=error)"),
        (["identical", "inconclusive"], "regression", exit_codes.INCONCLUSIVE,
         "1 inconclusive: no noise control measured (no usable control pair)"),
        (["not exercised"], "regression", exit_codes.NOTHING_EXERCISED,
         "nothing exercised: cascade never fired in its only pair (every batch size is below 8 requests)"),
        ([], "regression", exit_codes.NOTHING_EXERCISED,
         "nothing exercised: the run has no cascade pairs (no cascade cell has a finished flat twin)"),
    ],
)  # fmt: skip
def test_exit_policy(verdicts, fail_on, code, reason):
    assert outcome.exit_status(_run(verdicts), fail_on) == (code, reason)


def test_an_unfinished_run_is_inconclusive_unless_a_regression_is_already_found():
    cells = [{"cell_id": "a", "status": "done"}, {"cell_id": "b", "status": "pending", "engine_key": "k"},
             {"cell_id": "cal", "status": "pending", "origin": "calibration"}]  # fmt: skip
    assert outcome.exit_status(_run(["identical"], cells), "regression") == (
        exit_codes.INCONCLUSIVE,
        "not finished: 1 of 2 cells never ran; rerun the same command",
    )
    assert outcome.exit_status(_run(["regression"], cells), "regression")[0] == exit_codes.REGRESSION


def test_why_cascade_never_fired_comes_from_the_run():
    run = _run(["not exercised"], prompt_set={"shared_prefix_tokens": 100},
               engines={"k": {"effective": {"disable_cascade_attn": "True"}}})  # fmt: skip
    assert outcome.never_fired_because(run) == (
        "every batch size is below 8 requests; shared prefix 100 tokens < 256; "
        "vLLM ran with disable_cascade_attn=True"
    )


def test_fail_on():
    assert outcome.run_fail_on(Manifest.from_json({"fail_on": "error"})) == "error"
    assert outcome.run_fail_on(Manifest.from_json({"fail_on": "sometimes"})) == "regression"
    assert outcome.run_fail_on(Manifest.from_json({})) == "regression"
    with pytest.raises(UsageError, match="unknown fail_on 'always'"):
        outcome.exit_status(_run([]), "always")


def test_a_refused_matrix_exits_4_only_when_this_vllm_lacks_the_setting():
    # A vLLM without the twin's setting can exercise nothing (4, as a run that never fired); a box
    # without vLLM, a GPU or enough GPUs is the command's to change (2).
    from cascade_repro.plan.flags import VllmCheck

    assert outcome.refusal_status(VllmCheck("this vLLM has no cascade", setting_missing=True)) == 4
    assert outcome.refusal_status(VllmCheck("--engine vllm needs an NVIDIA GPU")) == exit_codes.USAGE


def _depths(*pairs: tuple[str, str]) -> Scored:
    run = _run([v for v, _ in pairs])
    for row, (_, d) in zip(run.tables["pairs"], pairs, strict=False):
        row["depth"] = d
    return run


def test_a_run_that_ran_cascade_on_prefill_only_is_not_a_pass():
    # Every exercised pair on prefill only: not tested in decode, where the field bug lived (exit 4).
    run = _depths(("within noise", "prefill only"), ("identical", "prefill only"), ("not exercised", "none"))
    assert [r["pair_id"] for r in outcome.prefill_only_pairs(run)] == ["p0", "p1"]
    assert outcome.exit_status(run, "regression") == (
        exit_codes.NOTHING_EXERCISED,
        "not tested in decode: cascade ran on prefill steps only in all 2 exercised pairs (decode steps run "
        "cascade from a batch size vLLM's rule picks: see `cascade-repro explain`)",
    )
    assert outcome.exit_status(run, "never")[0] == exit_codes.OK
    # One pair in decode tests it: a pass; a regression on prefill is still one (exit 1).
    assert outcome.exit_status(_depths(("within noise", "prefill only"), ("identical", "decode")), "regression")[0] == 0
    assert outcome.exit_status(_depths(("regression", "prefill only")), "regression")[0] == exit_codes.REGRESSION
    # Depth unknown (a run before the probe counted decode steps, another twin): no claim either way.
    assert outcome.prefill_only_pairs(_depths(("within noise", "?"), ("identical", ""))) == []
