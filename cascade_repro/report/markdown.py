"""GitHub-flavoured markdown report, ready for `gh issue create --body-file report.md`."""

from __future__ import annotations

import html
import re

from cascade_repro import runstore
from cascade_repro.report import content as c
from cascade_repro.report.base import ReportFormatter
from cascade_repro.report.load import Example, RunData
from cascade_repro.report.text import clean, fence_for, md_cell, md_escape_html, one_line

# GitHub rejects issue bodies over 65536 characters; keep each sample text well below that.
MAX_TEXT = 3000
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|])")


def md_text(s: str) -> str:
    """Escape run-supplied text for a markdown paragraph or list item."""
    return _MD_SPECIAL.sub(r"\\\1", md_escape_html(one_line(s)))


def md_code(s: str) -> str:
    """Wrap s in an inline code span whose delimiter no backtick run inside can close."""
    s = one_line(s)
    delim = fence_for(s, minimum=1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{delim}{pad}{s}{pad}{delim}"


def md_table(table: c.Table, empty: str) -> list[str]:
    """Render a table, or an italic note when it has no rows."""
    if not table.rows:
        return [f"_{empty}_"]

    def cell(v: str) -> str:
        return f"**{md_cell(v)}**" if isinstance(v, c.Strong) else md_cell(v, limit=300)

    lines = ["| " + " | ".join(md_cell(h) for h in table.headers) + " |", "|" + "---|" * len(table.headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.rows]
    return lines


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
        f"<details><summary>{html.escape(c.example_title(ex))}</summary>",
        "",
        *md_table(c.example_table(ex), "no token data"),
        "",
        *_sample("cascade (test)", ex.test_cell, ex.test_text),
        *_sample("flat (ref)", ex.ref_cell, ex.ref_text),
        "</details>",
        "",
    ]


def _detection_power(data: RunData) -> list[str]:
    entries = c.detection_power(data)
    if not entries:
        return [c.not_calibrated(md_code), ""]
    out = []
    for e in entries:
        out += [md_text(e["statement"]), "", *md_table(c.ladder_table(data, e), "no shifts"), ""]
    return out


class MarkdownFormatter(ReportFormatter):
    """Render report.md."""

    name = "markdown"
    filename = runstore.REPORT_MD

    def render(self, data: RunData) -> str:
        """Return the markdown report."""
        out = [f"## {md_text(c.headline(data))}", "", c.intro(data, md_code), ""]
        if warns := c.warnings(data):
            out += ["### Warnings", "", *(f"- **warning:** {md_text(w)}" for w in warns), ""]
        out += ["### Verdicts", "", *md_table(c.verdict_table(data), "no cascade pairs"), ""]
        for note in (c.drift_note(data), c.if_note(data)):
            if note:
                out += [f"_{md_text(note)}_", ""]
        if c.has_speed(data):
            out += ["### Decode speed", "", *md_table(c.speed_table(data), "no timed pairs"), ""]
            out += [f"_{md_text(c.SPEED_NOTE)}_", ""]
        out += ["### Detection power", "", *_detection_power(data)]
        out += ["### Noise floor", "", *md_table(c.noise_table(data), "no control pairs"), ""]
        out += ["### Cells", "", *md_table(c.cell_table(data), "no cells"), ""]
        if data.examples:
            out += ["### Most divergent prompts", ""]
            for ex in data.examples:
                out += _example(ex)
        if (inv := c.invocations_table(data)) is not None:
            out += ["### Invocations", "", *md_table(inv, "one invocation"), ""]
        env = "\n".join(f"{k}: {v}" for k, v in c.env_lines(data))
        out += ["### Environment", "", *fenced(env, "text"), ""]
        out += ["### Reproduce", ""]
        cmd = c.command(data)
        if cmd:
            version = data.run.get("tool_version")
            lines = ([f"# cascade-repro {one_line(str(version))}"] if version else []) + [cmd]
            out += fenced("\n".join(lines), "bash")
        else:
            out.append("_command not recorded in run.json_")
        return "\n".join(out).rstrip("\n") + "\n"
