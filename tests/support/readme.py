"""The README's worked example, read as data: its section, its Markdown tables, numbers masked."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")

# Columns whose numbers depend on the machine's floating point (threads, CPU): compared with every
# number masked.
MASKED = {"reasons"}


def worked_example() -> str:
    """The README's "Worked example" section, up to its first subsection."""
    return README[README.index("## Worked example") :].split("\n### ", 1)[0]


def markdown_table(text: str) -> tuple[list[str], list[list[str]]]:
    """The first Markdown table in the text: its header and rows."""
    lines = []
    for line in text[text.index("\n|") + 1 :].splitlines():
        if not line.startswith("|"):
            break
        lines.append(line)
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]
    assert len(cells) >= 3 and set(lines[1]) <= set("|-"), text[:500]
    return cells[0], cells[2:]


def masked(text: str) -> str:
    return re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", "#", text)
