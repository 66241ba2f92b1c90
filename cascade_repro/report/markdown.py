"""GitHub-flavoured markdown report, ready for `gh issue create --body-file report.md`."""

from __future__ import annotations

import html

from cascade_repro.judge import outcome
from cascade_repro.report import (
    environment,
    headline,
    power,
    prose,
    reproduce,
    speed_table,
    summary,
    tables,
    verdict_table,
    view,
)
from cascade_repro.report import reference as ref
from cascade_repro.report.base import ReportFormatter
from cascade_repro.report.load import Example, RunData
from cascade_repro.report.text import clean, fence_for, md_inline, md_table_rows, one_line, terminal_output
from cascade_repro.rundir import layout

# GitHub rejects issue bodies over 65536 characters; keep each sample text well below that.
MAX_TEXT = 3000
# The whole report: GitHub's limit less room for a sentence the user adds around it.
GITHUB_LIMIT = 60_000
# What a report too long for an issue leaves out, in this order (all of it stays in report.html).
SHORTENINGS = ("examples", "cells", "environment", "noise", "speed", "verdict rows")
MAX_VERDICT_ROWS = 40


def shortened_note(dropped: set[str]) -> str:
    parts = [p for p in SHORTENINGS if p in dropped]
    what = {"examples": "the most divergent prompts", "cells": "the cell table", "environment": "the environment block",
            "noise": "the noise-floor table", "speed": "the decode-speed table",
            "verdict rows": f"verdict rows beyond the {MAX_VERDICT_ROWS} that matter most"}  # fmt: skip
    return (
        f"Shortened to fit a GitHub issue (65,536 characters): left out {', '.join(what[p] for p in parts)}; "
        f"{layout.REPORT_HTML} and summary.json in the run directory have everything."
    )


def _worst_rows(table: view.Table, n: int) -> view.Table:
    """Keep the n rows a reader needs first: regressions, errors, then the rest in order."""
    rank = {outcome.REGRESSION: 0, outcome.ERROR: 1, outcome.INCONCLUSIVE: 2}
    i = table.headers.index("verdict") if "verdict" in table.headers else None
    order = sorted(
        range(len(table.rows)), key=lambda k: (rank.get(str(table.rows[k][i]), 3) if i is not None else 3, k)
    )
    keep = sorted(order[:n])
    rows = [table.rows[k] for k in keep]
    if len(table.rows) > n:
        rows.append(
            [
                f"… {len(table.rows) - n} more pairs in {layout.REPORT_HTML}",
                *[""] * (len(table.headers) - 1),
            ]
        )
    return view.Table(table.headers, rows, table.wrap)


def _cut(text: str) -> str:
    """Last resort: the first GITHUB_LIMIT characters, ending on a whole line, with a pointer."""
    note = f"\n\n_… cut to fit a GitHub issue: {layout.REPORT_HTML} has the whole report._\n"
    head = text[: GITHUB_LIMIT - len(note)]
    return head[: head.rfind("\n") if "\n" in head else len(head)] + note


def md_text(s: str) -> str:
    """Escape run-supplied text for a markdown paragraph or list item."""
    return md_inline(one_line(s))


def md_code(s: str) -> str:
    """Wrap s in an inline code span whose delimiter no backtick run inside can close."""
    s = one_line(s)
    delim = fence_for(s, minimum=1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{delim}{pad}{s}{pad}{delim}"


def md_table(table: view.Table, empty: str) -> list[str]:
    """Render a table, or an italic note when it has no rows."""
    if not table.rows:
        return [f"_{empty}_"]
    return md_table_rows(table.headers, table.rows)


def fenced(text: str, info: str) -> list[str]:
    """Put text in a fenced block whose fence no backtick run inside can close."""
    fence = fence_for(text)
    return [f"{fence}{info}", *text.split("\n"), fence]


def _sample(label: str, cell: str, text: str | None) -> list[str]:
    head = f"**{label}** {md_code(cell)}:"
    if text is None:
        return [head, "", "_sample text not found in samples/*.jsonl_", ""]
    text = clean(text)
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + f"\n… [truncated: {len(text) - MAX_TEXT} more characters]"
    return [head, "", *fenced(text, "text"), ""]


def _example(ex: Example) -> list[str]:
    return [
        f"<details><summary>{html.escape(tables.example_title(ex))}</summary>",
        "",
        *md_table(tables.example_table(ex), "no token data"),
        "",
        *_sample(ex.twin.test_label, ex.test_cell, ex.test_text),
        *_sample(ex.twin.ref_label, ex.ref_cell, ex.ref_text),
        "</details>",
        "",
    ]


def _detection_power(data: RunData) -> list[str]:
    entries = power.detection_power(data)
    if not entries:
        return [power.not_calibrated(data, md_code), ""]
    out = []
    for e in entries:
        out += [md_text(e["statement"]), "", *md_table(power.ladder_table(data, e), "no shifts"), ""]
    return out


class MarkdownFormatter(ReportFormatter):
    """Render report.md."""

    name = "markdown"
    filename = layout.REPORT_MD

    def render(self, data: RunData) -> str:
        """Return the markdown report, shortened step by step until it fits GitHub's limit."""
        with data.settled():  # a long run renders up to len(SHORTENINGS) + 1 times: tables converted once
            for level in range(len(SHORTENINGS) + 1):
                text = self._render(data, level)
                if len(text) <= GITHUB_LIMIT:
                    return text
            return _cut(text)

    def _render(self, data: RunData, level: int) -> str:
        drop = set(SHORTENINGS[:level])
        # What a maintainer reads in an issue without a click: the headline, the stack in one line,
        # the verdicts in a table that fits the column, the warnings; everything else is collapsed.
        out = [f"## {md_text(headline.headline(data))}", "", facts_line(data), ""]
        verdicts = summary.summary_table(data)
        if "verdict rows" in drop:
            verdicts = _worst_rows(verdicts, MAX_VERDICT_ROWS)
        out += [*md_table(verdicts, f"no {data.twin.family} pairs"), ""]
        if warns := prose.warnings(data):
            out += [*(f"- **warning:** {md_text(w)}" for w in warns), ""]
        if drop:
            out += [f"_{md_text(shortened_note(drop))}_", ""]
        out += [f"_{md_text(ref.rule_note(data))}_", ""]
        out += _collapsed("What this run compares", [prose.intro(data, md_code)])
        out += _collapsed("Evidence per pair", _evidence(data, "verdict rows" in drop))
        if ref.has_reference(data):
            body = [
                *md_table(ref.reference_table(data), "no pair scored"),
                "",
                f"_{md_text(ref.REFERENCE_NOTE)}_",
            ]
            if lines := ref.by_step_lines(data):
                body += [
                    "",
                    "Error against the reference by decode step:",
                    "",
                    *(f"- {md_text(x)}" for x in lines),
                ]
            out += _collapsed("Against the reference", body)
        if speed_table.has_speed(data) and "speed" not in drop:
            body = [
                *md_table(speed_table.speed_table(data), "no timed pairs"),
                "",
                f"_{md_text(speed_table.SPEED_NOTE)}_",
            ]
            out += _collapsed("Decode speed", body)
        out += _collapsed("Detection power", _detection_power(data))
        if "noise" not in drop:
            out += _collapsed("Noise floor", md_table(tables.noise_table(data), "no control pairs"))
        if "cells" not in drop:
            out += _collapsed("Cells", md_table(tables.cell_table(data), "no cells"))
        if data.examples and "examples" not in drop:
            out += ["### Most divergent prompts", ""]
            for ex in data.examples:
                out += _example(ex)
        if (inv := tables.invocations_table(data)) is not None:
            out += _collapsed("Invocations", md_table(inv, "one invocation"))
        env = "\n".join(f"{k}: {v}" for k, v in environment.env_lines(data))
        if "environment" not in drop:
            out += _collapsed("Environment", fenced(env, "text"))
            collected = data.manifest.vllm_collect_env
            if isinstance(collected, str) and collected.strip():
                out += _collapsed("vLLM's collect_env", fenced(terminal_output(collected), "text"))
        out += ["### Reproduce", ""]
        lines = reproduce.reproduce_lines(data)
        if lines:
            out += [reproduce.reproduce_note(data, md_code) or "", ""]
            out += fenced("\n".join(lines), "bash")
            for pair, script in data.repro_scripts:
                out += [
                    "",
                    *_collapsed(
                        f"repro.py ({pair}): python repro.py", fenced(clean(script).rstrip("\n"), "python")
                    ),
                ]
        else:
            out.append("_command not recorded in run.json_")
        return "\n".join(out).rstrip("\n") + "\n"


def facts_line(data: RunData) -> str:
    """`**model** `m` · **dtype** bfloat16 · ...`: the stack on one line, every value escaped."""
    return " · ".join(f"**{label}** {md_code(value)}" for label, value in summary.stack_facts(data))


def _collapsed(summary: str, body: list[str]) -> list[str]:
    """A section GitHub shows folded: its summary, then the markdown body (blank lines around it
    let GitHub render the markdown inside the HTML block)."""
    while body and not body[-1]:
        body = body[:-1]
    return [
        f"<details><summary>{html.escape(summary, quote=False)}</summary>",
        "",
        *body,
        "",
        "</details>",
        "",
    ]


def _evidence(data: RunData, worst_only: bool) -> list[str]:
    """Each cascade pair's evidence as a two-column table (every number the verdict weighed) and
    its reasons in words; the notes that explain the columns below them."""
    table = verdict_table.verdict_table(data)
    if worst_only:
        table = _worst_rows(table, MAX_VERDICT_ROWS)
    if not table.rows:
        return [f"_no {data.twin.family} pairs_"]
    out: list[str] = []
    reasons = table.headers.index("reasons")
    for row in table.rows:
        if not any(row[1:]):  # the "… more pairs" line of a shortened table
            out += [md_text(str(row[0])), ""]
            continue
        fields = [[h, v] for h, v in zip(table.headers[1:], row[1:], strict=True) if h != "reasons"]
        out += [f"#### {md_text(str(row[0]))}", "", *md_table_rows(["evidence", "value"], fields), ""]
        out += [md_text(str(row[reasons])), ""]
    for note in (prose.drift_note(data), prose.if_note(data), prose.unscored_note(data)):
        if note:
            out += [f"_{md_text(note)}_", ""]
    return out[:-1]
