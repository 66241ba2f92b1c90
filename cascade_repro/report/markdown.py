"""GitHub-flavoured markdown report, ready for `gh issue create --body-file report.md`."""

from __future__ import annotations

import html
from typing import assert_never

from cascade_repro.judge import outcome
from cascade_repro.report import headline, prose, reproduce, sections, summary, tables, view
from cascade_repro.report import reference as ref
from cascade_repro.report.base import ReportFormatter
from cascade_repro.report.load import Example, RunData
from cascade_repro.report.text import clean, fence_for, md_inline, md_table_rows, one_line
from cascade_repro.rundir import layout

# GitHub rejects issue bodies over 65536 characters; keep each sample text well below that.
MAX_TEXT = 3000
# The whole report: GitHub's limit less room for a sentence the user adds around it.
GITHUB_LIMIT = 60_000
# What a report too long for an issue leaves out, in this order (all of it stays in report.html).
SHORTENINGS = ("examples", "cells", "environment", "noise", "speed", "verdict rows")
MAX_VERDICT_ROWS = 40
# The sections each shortening leaves out.
DROPS = {"examples": {"examples"}, "cells": {"cells"}, "environment": {"environment", "collect_env"},
         "noise": {"noise"}, "speed": {"speed"}}  # fmt: skip
# Sections shown under a heading, not folded: each divergent prompt is folded on its own.
UNFOLDED = {"examples"}


def dropped_sections(drop: set[str]) -> set[str]:
    """The ids of the sections a shortening to ``drop`` leaves out."""
    return {sid for d in drop for sid in DROPS.get(d, ())}


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
        if data.manifest.several:
            out += _several(data, drop)
        else:
            out += _verdicts(data, drop, prose.warnings(data))
            out += _sections(data, drop, "###")
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


def _verdicts(data: RunData, drop: set[str], warns: list[str]) -> list[str]:
    """The verdict table, the warnings, the shortening note and the rule's note."""
    verdicts = summary.summary_table(data)
    if "verdict rows" in drop:
        verdicts = _worst_rows(verdicts, MAX_VERDICT_ROWS)
    out = [*md_table(verdicts, f"no {data.twin.family} pairs"), ""]
    if warns:
        out += [*(f"- **warning:** {md_text(w)}" for w in warns), ""]
    if drop:
        out += [f"_{md_text(shortened_note(drop))}_", ""]
    return out + [f"_{md_text(ref.rule_note(data))}_", ""]


def _sections(data: RunData, drop: set[str], heading: str, run_wide: bool | None = None) -> list[str]:
    """The sections below the verdicts, each folded or (``UNFOLDED``) under a ``heading``;
    ``run_wide``: only those of the run as a whole (True) or only a twin's own (False)."""
    out: list[str] = []
    for section in sections.sections(data):
        if section.id in dropped_sections(drop):
            continue
        if run_wide is not None and (section.id in sections.RUN_WIDE) != run_wide:
            continue
        body = [line for block in section.content(data) for line in _block(block, drop)]
        if section.id in UNFOLDED:
            out += [f"{heading} {section.title}", "", *body]
        else:
            out += _collapsed(section.title, body)
    return out


def _several(data: RunData, drop: set[str]) -> list[str]:
    """A run of several twins: the warnings every twin shares once, then each twin under its own
    heading (its one-line verdict, its verdict table, its own warnings and its sections), as a run
    of that twin alone would show them."""
    views = [data.for_twin(tw) for tw in data.twins]
    warns = [prose.warnings(v) for v in views]
    shared = [w for w in warns[0] if all(w in ws for ws in warns[1:])]
    out = [*(f"- **warning:** {md_text(w)}" for w in shared), ""] if shared else []
    for tw, twin_view, ws in zip(data.twins, views, warns, strict=True):
        out += [f"### {md_text(tw.name)}: {md_text(tw.summary)}", ""]
        out += [f"**{md_text(headline.twin_line(twin_view))}**", ""]
        out += _verdicts(twin_view, drop, [w for w in ws if w not in shared])
        out += _sections(twin_view, drop, "####", run_wide=False)
    return out + ["### The whole run", "", *_sections(data, drop, "####", run_wide=True)]


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


def _block(block: sections.Block, drop: set[str]) -> list[str]:
    """One content block as markdown lines, a blank line after it."""
    match block:
        case sections.TableBlock(table, empty):
            return [*md_table(table, empty), ""]
        case sections.PairsBlock(table, empty):
            return _pairs(table, empty, "verdict rows" in drop)
        case sections.Note(text):
            return [f"_{md_text(text)}_", ""]
        case sections.Para(text):
            return [md_text(text), ""]
        case sections.CodedPara(make):
            return [make(md_code), ""]
        case sections.Bullets(lead, items):
            return [md_text(lead), "", *(f"- {md_text(x)}" for x in items), ""]
        case sections.Preformatted(text):
            return [*fenced(text, "text"), ""]
        case sections.Examples(examples, missing):
            note = [f"_{md_text(missing)}_", ""] if missing else []
            return [*note, *(line for ex in examples for line in _example(ex))]
        case _:
            assert_never(block)


def _pairs(table: view.Table, empty: str, worst_only: bool) -> list[str]:
    """Each pair's evidence as a two-column table (every number the verdict weighed), then its
    reasons in words."""
    if worst_only:
        table = _worst_rows(table, MAX_VERDICT_ROWS)
    if not table.rows:
        return [f"_{empty}_", ""]
    out: list[str] = []
    reasons = table.headers.index("reasons")
    for row in table.rows:
        if not any(row[1:]):  # the "… more pairs" line of a shortened table
            out += [md_text(str(row[0])), ""]
            continue
        fields = [[h, v] for h, v in zip(table.headers[1:], row[1:], strict=True) if h != "reasons"]
        out += [f"#### {md_text(str(row[0]))}", "", *md_table_rows(["evidence", "value"], fields), ""]
        out += [md_text(str(row[reasons])), ""]
    return out
