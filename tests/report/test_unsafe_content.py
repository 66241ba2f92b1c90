"""Hostile prompts and model outputs render safely in every report (issue 7, item 5).

A run directory is written by hand (run.json, prompts.jsonl, samples JSONL, like a worker would)
with HTML/JS, Markdown table and fence breakers, control characters, a right-to-left override
and a 100,000-character line in the places run-supplied text reaches a report: model outputs,
prompts and their keys, a worker error, an environment variable, the model name and the command
line. `pipeline.finalize` then scores it and writes every report through the real pipeline.

Checked: report.md keeps every table row at its header's column count, the model text stays
inside its fence, no raw tag from the run escapes a fence; report.html carries no element or
attribute that did not come from the formatter; a headless Chromium (Debian's `chromium`, when
installed) runs no script, injects no element and keeps every section inside <main>.
`scripts/screenshot_report.py` renders the same run to docs/unsafe-content.png.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from support.browser import CHROMIUM, chromium

from cascade_repro.judge.verdicts import Thresholds
from cascade_repro.pipeline import finalize
from cascade_repro.plan.matrix import MatrixSpec, plan

SCRIPT = "<script>document.title='PWNED'</script>"
IMG = "<img src=x onerror=\"document.title='PWNED-IMG'\">"
BREAKOUT = "</pre></details></td></tr></table></main><h1 id=injected>INJECTED</h1><pre>"
MARKDOWN = "a | b || c\n| --- | --- |\n```\nfenced? ``` ```` `inline` ~~~\n<details><summary>fake</summary>"
CONTROL = "bell\x07 nul\x00 esc\x1b[31mred\x1b[0m cr\r vt\x0b ff\x0c del\x7f c1\x85\x9b"
RTL = "\u202eevil.exe\u202c \u2066isolate\u2069 \u200f"
LONG = "L" * 100_000
HOSTILE = f"{SCRIPT} {IMG}\n{BREAKOUT}\n{MARKDOWN}\n{CONTROL} {RTL}\n{LONG}\nend"
# Characters no report may contain, whatever the run holds (newline, tab and CR-less text are fine).
FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

KEY = "hf-tp1-auto-s0"
N = 4
PROMPT_KEYS = [f"key|{SCRIPT}", f"`tick`\n{IMG}", f"rtl{RTL}", "K" * 5000]
ERROR = f"RuntimeError: {SCRIPT}|{IMG}|`x`\x07 {BREAKOUT}"[:500]  # the worker keeps 500 characters


def _sample(cell: str, i: int, text: str, tokens: list[int]) -> dict:
    return {
        "type": "sample", "cell_id": cell, "wave": 0, "prompt_index": i, "prompt_key": PROMPT_KEYS[i],
        "prompt_hash": f"h{i}", "prompt_tokens": 300, "token_ids": tokens, "text": text,
        "finish_reason": "length", "logprobs": [-0.1] * len(tokens),
        "topk": [[[t, -0.1], [t + 1, -2.5]] for t in tokens],
    }  # fmt: skip


def build_unsafe_run(root: Path) -> Path:
    """Write the hostile run directory (no parquet, no report yet) and return it."""
    spec = MatrixSpec(limit=N, batch=[1, 8, 16], system_prompt="none", max_tokens=8, model=f"evil/{SCRIPT}")
    engines = plan(spec)
    cells = [c.to_json() for c in engines.cells]
    run_dir = root / "unsafe-content"
    (run_dir / "samples").mkdir(parents=True)
    run = {
        "run_id": "unsafe-content",
        "created_at": "2025-01-02T03:04:05+0000",
        "command": f"cascade-repro matrix --model 'evil/{SCRIPT}' --prompts 'x|y.jsonl' --batch 1,8,16 {RTL}",
        "tool_version": "0.1.0",
        "spec": spec.to_dict(),
        "spec_hash": "0" * 12,
        "model_path": "/nonexistent",
        "model_name": f"evil/{SCRIPT}",
        "prompt_set": {"name": f"set {IMG}", "source": "x|y.jsonl", "n": N, "system_prompt": "none",
                       "system_prompt_text": "", "shared_prefix_tokens": 288, "prompt_tokens_mean": 300.0,
                       "tokenizer": "evil", "min_cascade_prefix": 256},  # fmt: skip
        "env": {"python": "3.11.7", "torch": "2.13.0", "vllm": "not installed",
                "vllm_env": {"VLLM_EVIL": f"{SCRIPT}{CONTROL}{RTL}", "VLLM_LONG": LONG}},  # fmt: skip
        "plan": engines.to_json(),
        "arm_switch": "shared",
        "thresholds": Thresholds().to_dict(),
        "fail_on": "regression",
        "engines": {},
        "timings": {"total_s": 12.5},
    }
    (run_dir / "run.json").write_text(json.dumps(run, indent=2), encoding="utf-8")
    with open(run_dir / "prompts.jsonl", "w", encoding="utf-8") as f:
        for i, key in enumerate(PROMPT_KEYS):
            rec = {"key": key, "prompt": f"prompt {i}: {HOSTILE}", "instruction_id_list": [], "kwargs": [], "lang": ""}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    base = [100 + j for j in range(8)]
    lines: list[dict] = [{"type": "engine", "engine_key": KEY, "effective": {"engine": "hf", "note": SCRIPT},
                          "start_s": 1.0, "started_at": "t0"}]  # fmt: skip
    for c in cells:
        cid = c["cell_id"]
        lines.append({"type": "cell_start", "cell_id": cid})
        if cid == "tp1-b16-cascade":  # a failing cell: its reason reaches warnings and the cell table
            lines.append({"type": "cell_error", "cell_id": cid, "reason": ERROR})
            continue
        for i in range(N):
            diverge = c["arm"] == "cascade" and c["batch"] == 8
            tokens = base[:3] + [7 + i] + base[4:] if diverge else list(base)
            text = f"{'cascade' if diverge else 'flat'} output {i}: {HOSTILE}"
            lines.append(_sample(cid, i, text, tokens))
        fired = c["arm"] == "cascade" and c["batch"] >= 8
        lines.append({"type": "wave", "cell_id": cid, "wave": 0, "batch": c["batch"], "n_real": N,
                      "cascade_steps": 8 if fired else 0, "total_steps": 8, "cascade_calls": 240 if fired else 0,
                      "common_prefix_len": 288 if fired else 0, "wall_s": 1.0, "tokens": 8 * N})  # fmt: skip
        lines.append({"type": "cell_done", "cell_id": cid, "n_samples": N, "wall_s": 1.0})
    with open(run_dir / "samples" / f"{KEY}.jsonl", "w", encoding="utf-8") as f:
        for rec in lines:
            f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
    return run_dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    d = build_unsafe_run(tmp_path_factory.mktemp("unsafe"))
    finalize(d)
    return d


# --- report.md ------------------------------------------------------------------------------------


def _md_cells(row: str) -> list[str]:
    """Split a GFM table row on pipes that are not backslash-escaped (an even run of backslashes)."""
    cells, cur, i = [], "", 0
    body = row.strip()
    assert body.startswith("|") and body.endswith("|") and not body.endswith("\\|"), row[:200]
    body = body[1:-1]
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            cur += body[i : i + 2]
            i += 2
            continue
        if ch == "|":
            cells.append(cur)
            cur = ""
        else:
            cur += ch
        i += 1
    return [*cells, cur]


def _md_blocks(md: str) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """Return (lines outside fences, fenced blocks' lines, tables as lists of rows) of a markdown text.

    A fence closes only on a line of the same character, at least as long, and nothing else.
    """
    outside: list[str] = []
    fences: list[list[str]] = []
    tables: list[list[str]] = []
    fence: str | None = None
    for line in md.split("\n"):
        if fence is None:
            m = re.match(r"^(`{3,}|~{3,})", line)
            if m:
                fence = m.group(1)
                fences.append([])
                continue
            outside.append(line)
            if line.startswith("|"):
                if not tables or not outside[-2:-1] or not outside[-2].startswith("|"):
                    tables.append([])
                tables[-1].append(line)
        elif re.fullmatch(re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*", line):
            fence = None
        else:
            fences[-1].append(line)
    assert fence is None, "a fence is never closed"
    return outside, fences, tables


def test_markdown_tables_keep_their_column_count_on_every_row(run_dir):
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    _, _, tables = _md_blocks(md)
    assert len(tables) >= 3  # verdicts, noise floor, cells (and one per example)
    rows_seen = 0
    for table in tables:
        width = len(_md_cells(table[0]))
        assert re.fullmatch(r"\|(---\|)+", table[1]), table[1]
        assert table[1].count("---") == width
        for row in table[2:]:
            assert len(_md_cells(row)) == width, row[:300]
            rows_seen += 1
    # Every cell and every cascade pair has its row: nothing swallowed by a broken row.
    assert rows_seen >= 6 + 3 + 2


def test_markdown_keeps_model_text_inside_its_fence(run_dir):
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    outside, fences, _ = _md_blocks(md)
    texts = [b for b in fences if any("output" in ln for ln in b)]
    assert texts, "no sample text shown"
    for block in texts:
        body = "\n".join(block)
        # The text's own ``` lines and breakout tags are inside the block, not after it.
        assert "```" in body and "</pre></details>" in body and "<script>" in body
        assert "L" * 100 in body and "L" * 3001 not in body  # the long line is cut, not dropped
        assert "truncated" in body
    raw_tag = re.compile(r"<(?!/?(details|summary)>)[A-Za-z/!?]")
    for line in outside:
        # Outside fences, only the report's own <details>/<summary> tags are raw HTML.
        stripped = re.sub(r"`+[^`]*`+", "", line)  # inline code spans show text literally
        assert not raw_tag.search(stripped), line[:300]
    opened = sum(ln.startswith("<details>") for ln in outside)
    assert opened == sum(ln == "</details>" for ln in outside)
    # One folded block per divergent example (beside the report's own folded sections).
    assert sum(ln.startswith("<details>") and "first divergence" in ln for ln in outside) == len(texts) // 2


def test_markdown_has_no_control_or_bidi_characters_and_fits_a_github_issue(run_dir):
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    assert not FORBIDDEN.search(md), repr(FORBIDDEN.search(md))
    assert len(md) < 65_536, len(md)  # GitHub rejects issue bodies over 65,536 characters
    assert max(len(ln) for ln in md.split("\n")) <= 6000


# --- report.html ----------------------------------------------------------------------------------

FORMATTER_TAGS = {
    "html", "head", "meta", "title", "style", "body", "main", "h1", "h2", "h4", "p", "ul", "li", "table",
    "thead", "tbody", "tr", "th", "td", "strong", "details", "summary", "div", "pre", "code",
    # inline SVG plots
    "svg", "g", "line", "circle", "text", "rect", "path", "polyline", "polygon", "tspan",
}  # fmt: skip


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.stack: list[str] = []
        self.parents: dict[str, list[list[str]]] = {}
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.parents.setdefault(tag, []).append(list(self.stack))
        if tag not in ("meta", "br", "img", "link", "input", "hr"):
            self.stack.append(tag)
        self._in_title = tag == "title" and "svg" not in self.stack[:-1]

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.parents.setdefault(tag, []).append(list(self.stack))

    def handle_endtag(self, tag):
        if tag in self.stack:
            while self.stack.pop() != tag:
                pass
        self._in_title = False

    def handle_data(self, data):
        if self._in_title:
            self.title += data


def _parse(html: str) -> _Tags:
    p = _Tags()
    p.feed(html)
    p.close()
    return p


def _assert_no_injection(p: _Tags) -> None:
    names = {t for t, _ in p.tags}
    assert names <= FORMATTER_TAGS, names - FORMATTER_TAGS
    for tag, attrs in p.tags:
        assert not any(a.lower().startswith("on") for a in attrs), (tag, attrs)
        assert attrs.get("id") != "injected" and "javascript:" not in json.dumps(attrs).lower()
    # Every section heading is still inside <main>: no breakout closed it early.
    assert all("main" in chain for chain in p.parents["h2"])
    assert all("main" in chain for chain in p.parents.get("pre", []))


def test_html_carries_no_element_or_attribute_from_run_text(run_dir):
    html = (run_dir / "report.html").read_text(encoding="utf-8")
    p = _parse(html)
    _assert_no_injection(p)
    assert p.title.startswith("cascade-repro: ")
    assert "&lt;script&gt;document.title=" in html  # shown, as text
    assert "Content-Security-Policy" in html and "default-src 'none'" in html  # defence in depth
    assert not FORBIDDEN.search(html), repr(FORBIDDEN.search(html))
    for tag in ("pre", "details", "table", "main"):
        assert html.count(f"<{tag}") == html.count(f"</{tag}>"), tag


def test_summary_json_and_junit_stay_well_formed(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert summary["counts"]["error"] == 1
    ET.fromstring((run_dir / "junit.xml").read_text(encoding="utf-8"))  # no XML-invalid characters


# --- a real browser -----------------------------------------------------------------------------------

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no headless browser: apt-get install chromium (Debian) to run this check"
)


@needs_chromium
def test_the_browser_detects_a_script_that_runs(tmp_path):
    """Positive control: the method below sees a script's effect when one does run."""
    page = tmp_path / "control.html"
    page.write_text(f"<!DOCTYPE html><html><head><title>clean</title></head><body>{SCRIPT}</body></html>")
    res = chromium("--dump-dom", page.as_uri(), profile=tmp_path / "profile")
    assert res.returncode == 0, res.stderr[-2000:]
    assert _parse(res.stdout).title == "PWNED"


@needs_chromium
def test_the_browser_runs_no_script_and_keeps_the_layout(run_dir, tmp_path):
    page = run_dir / "report.html"
    res = chromium("--dump-dom", page.as_uri(), profile=tmp_path / "profile")
    assert res.returncode == 0, res.stderr[-2000:]
    dom = _parse(res.stdout)
    assert dom.title.startswith("cascade-repro: ") and "PWNED" not in dom.title
    _assert_no_injection(dom)  # the DOM as the browser built it, after error recovery
    expected = _parse(page.read_text(encoding="utf-8"))
    for tag in ("h2", "tr", "details", "pre", "svg"):
        assert len(dom.parents.get(tag, [])) == len(expected.parents.get(tag, [])), tag
    shot = tmp_path / "unsafe.png"
    res = chromium(f"--screenshot={shot}", "--window-size=1200,1600", "--hide-scrollbars", page.as_uri(),
                   profile=tmp_path / "profile2")  # fmt: skip
    assert res.returncode == 0 and shot.stat().st_size > 20_000, res.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
