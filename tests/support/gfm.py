"""report.md as GitHub shows it: rendered by cmark-gfm (GitHub's own renderer, through the
``cmarkgfm`` bindings), then read back as the facts a reader sees: the headline's text, every
strikethrough, and the width of each table shown without a click."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

import cmarkgfm
from cmarkgfm.cmark import Options


@dataclass
class Rendered:
    headline: str = ""
    struck: list[str] = field(default_factory=list)  # text inside <del>/<s>
    # (rows of cell texts) per table, with whether it sits inside a <details>
    tables: list[tuple[bool, list[list[str]]]] = field(default_factory=list)

    def widths(self, *, folded: bool) -> list[int]:
        """Each row's characters of cell text, over the tables shown open (folded=False) or folded."""
        return [sum(len(c) for c in row) for inside, rows in self.tables if inside == folded for row in rows]


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out = Rendered()
        self.details = 0
        self.h2: list[str] | None = None
        self.struck: list[str] | None = None
        self.rows: list[list[str]] | None = None
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "details":
            self.details += 1
        elif tag == "h2" and not self.out.headline and self.h2 is None:
            self.h2 = []
        elif tag in ("del", "s"):
            self.struck = []
        elif tag == "table":
            self.rows = []
        elif tag == "tr" and self.rows is not None:
            self.rows.append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "details":
            self.details -= 1
        elif tag == "h2" and self.h2 is not None:
            self.out.headline = "".join(self.h2)
            self.h2 = None
        elif tag in ("del", "s") and self.struck is not None:
            self.out.struck.append("".join(self.struck))
            self.struck = None
        elif tag == "table" and self.rows is not None:
            self.out.tables.append((self.details > 0, self.rows))
            self.rows = None
        elif tag in ("td", "th") and self.cell is not None and self.rows:
            self.rows[-1].append("".join(self.cell))
            self.cell = None

    def handle_data(self, data: str) -> None:
        for part in (self.h2, self.struck, self.cell):
            if part is not None:
                part.append(data)


def render(markdown: str) -> Rendered:
    """Render markdown as GitHub does (raw HTML kept: GitHub keeps <details>) and read it back."""
    html = cmarkgfm.github_flavored_markdown_to_html(markdown, options=Options.CMARK_OPT_UNSAFE)
    reader = _Reader()
    reader.feed(html)
    reader.close()
    return reader.out
