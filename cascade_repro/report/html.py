"""Self-contained HTML report: inline CSS and SVG, no JavaScript, every run-supplied string escaped."""

from __future__ import annotations

from html import escape
from typing import assert_never

from cascade_repro.report import headline, prose, reproduce, sections, summary, svg, tables, view
from cascade_repro.report import reference as ref
from cascade_repro.report.base import ReportFormatter
from cascade_repro.report.load import Example, RunData
from cascade_repro.report.text import Strong, clean, one_line
from cascade_repro.rundir import layout

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1f2328;background:#fff}
main{max-width:1280px;margin:0 auto;padding:16px 24px}
h1{font-size:22px;margin:8px 0;overflow-wrap:anywhere}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #d0d7de}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top;white-space:nowrap}
th{background:#f6f8fa;white-space:normal}
td.t{white-space:normal;overflow-wrap:anywhere;min-width:36em}
table.summary{width:100%}
table.summary td.t{min-width:12em;width:100%}
.scroll{overflow-x:auto;max-width:100%}
h1.ok{color:#1a7f37}h1.bad{color:#d1242f}h1.warn{color:#9a6700}
p.stack{margin:4px 0 8px;color:#59636e}p.stack code{color:#1f2328}
pre,code{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f8fa;padding:8px;border-radius:6px}
.warn li{color:#9a6700}.cap{color:#59636e;font-size:12px;margin-top:0}.nodata{color:#59636e;font-style:italic}
strong.v{color:#d1242f}
.sbs{display:grid;grid-template-columns:1fr 1fr;gap:12px}
.sbs>div{min-width:0}
summary{cursor:pointer;font-weight:600}
details.section>summary h2{display:inline-block;margin:16px 0 4px;border:0}
details.section{border-bottom:1px solid #d0d7de}
.figs{display:flex;flex-wrap:wrap;gap:8px 24px}.fig{max-width:640px;min-width:0}
.multiples{display:flex;flex-wrap:wrap;gap:8px}
svg.plot{max-width:100%;height:auto}
""".strip()
# No script may run from this file even if escaping were ever missed.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def html_table(table: view.Table, empty: str, css: str = "") -> str:
    """Render a table in a horizontally scrollable box, or a note when it has no rows.

    Numbers, ids and verdicts never break (a verdict split as "regre/ssion" was unreadable); only the
    table's free-text columns wrap, at spaces, and mid-word only for a word wider than the column.
    """
    if not table.rows:
        return f'<p class="nodata">{escape(empty)}</p>'

    def cell(v: str) -> str:
        text = escape(one_line(v))
        return f'<strong class="v">{text}</strong>' if isinstance(v, Strong) else text

    opens = ['<td class="t">' if h in table.wrap else "<td>" for h in table.headers]
    head = "".join(f"<th>{escape(h)}</th>" for h in table.headers)
    body = "\n".join(
        "<tr>" + "".join(f"{o}{cell(v)}</td>" for o, v in zip(opens, row, strict=False)) + "</tr>"
        for row in table.rows
    )
    cls = f' class="{css}"' if css else ""
    return f'<div class="scroll"><table{cls}>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table></div>'


def _pre(text: str | None) -> str:
    if text is None:
        return '<p class="nodata">sample text not found in samples/*.jsonl</p>'
    return f"<pre>{escape(clean(text))}</pre>"


def _example(ex: Example) -> str:
    return (
        f"<details>\n<summary>{escape(tables.example_title(ex))}</summary>\n"
        f"{html_table(tables.example_table(ex), 'no token data')}\n"
        '<div class="sbs">\n'
        f"<div><h4>{escape(ex.twin.test_label)} <code>{escape(ex.test_cell)}</code></h4>{_pre(ex.test_text)}</div>\n"
        f"<div><h4>{escape(ex.twin.ref_label)} <code>{escape(ex.ref_cell)}</code></h4>{_pre(ex.ref_text)}</div>\n"
        "</div>\n</details>"
    )


def _code(s: str) -> str:
    return f"<code>{escape(one_line(s))}</code>"


def _section(title: str, body: list[str], open_: bool = False) -> list[str]:
    """A collapsed section: its heading is the summary line, its body shown on a click."""
    return [
        f'<details class="section"{" open" if open_ else ""}>',
        f"<summary><h2>{escape(title)}</h2></summary>",
        *body,
        "</details>",
    ]


def _stack_line(data: RunData) -> str:
    facts = summary.stack_facts(data)
    return '<p class="stack">' + " · ".join(f"{escape(k)} {_code(v)}" for k, v in facts) + "</p>"


def _figure(plot: str, caption: str) -> list[str]:
    if not plot:
        return []
    return [
        '<div class="fig">',
        plot,
        *([f'<p class="cap">{escape(caption)}</p>'] if caption else []),
        "</div>",
    ]


def _plots(data: RunData) -> list[str]:
    """The evidence the verdicts test, as plots: the error ratios against the reference first where
    the run has one (what decides there), then the counts against their controls, the drift ratios,
    the error by decode step, and where outputs split."""
    # Where the reference decided, its evidence leads: each pair's error ratio, CI and minimum effect.
    out = _figure(svg.error_ratio_plot(data), svg.error_ratio_caption(data))
    out += [
        *_figure(svg.divergence_plot(data), svg.counts_caption(data)),
        *_figure(svg.topk_plot(data), svg.counts_caption(data)),
        *_figure(svg.forest_plot(data), svg.forest_caption(data)),
    ]
    if ref.has_reference(data):
        out += _figure(ref.by_step_plots(data), ref.BY_STEP_NOTE)
    out += [
        *_figure(svg.first_divergence_plot(data), svg.first_divergence_caption(data)),
        *_figure(svg.seq_rep_plot(data), svg.seq_rep_caption(data)),
    ]
    return ['<div class="figs">', *out, "</div>"]


class HtmlFormatter(ReportFormatter):
    """Render report.html: the headline, the stack in one line and a verdict per pair with the
    number that decided it fit one screen without scrolling sideways; the plots of that evidence
    follow, and every wide table and long block sits collapsed below."""

    name = "html"
    filename = layout.REPORT_HTML

    def render(self, data: RunData) -> str:
        """Return the HTML report."""
        title = escape(headline.headline(data))
        out = [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{title}</title>",
            f"<style>\n{CSS}\n</style>",
            "</head>",
            "<body><main>",
            f'<h1 class="{headline.headline_tone(data)}">{title}</h1>',
            _stack_line(data),
        ]
        if data.manifest.several:
            out += _several(data)
        else:
            out += _warnings(prose.warnings(data))
            out += _verdicts(data, "Verdicts", "h2")
            out += _sections(data)
        lines = reproduce.reproduce_lines(data)
        out += [
            "<h2>Reproduce</h2>",
            f"<p>{reproduce.reproduce_note(data, _code) or ''}</p><pre><code>{escape(chr(10).join(lines))}</code></pre>"
            if lines
            else '<p class="nodata">command not recorded in run.json</p>',
        ]
        for pair, script in data.repro_scripts if lines else []:
            out += [
                f"<details><summary>repro.py ({escape(pair)}): python repro.py</summary>"
                f"<pre><code>{escape(script)}</code></pre></details>"
            ]
        out += ["</main></body>", "</html>"]
        return "\n".join(out) + "\n"


def _warnings(warns: list[str]) -> list[str]:
    return ['<ul class="warn">', *(f"<li>{escape(w)}</li>" for w in warns), "</ul>"] if warns else []


def _verdicts(data: RunData, title: str, tag: str) -> list[str]:
    """The verdict table under ``title``, the rule's note, then the evidence's plots."""
    return [
        '<div class="summary">',
        f"<{tag}>{escape(title)}</{tag}>",
        html_table(summary.summary_table(data), f"no {data.twin.family} pairs", css="summary"),
        f'<p class="cap">{escape(ref.rule_note(data))}</p>',
        "</div>",
        "<h2>Evidence</h2>" if tag == "h2" else "<h3>Evidence</h3>",
        *_plots(data),
    ]


def _sections(data: RunData, run_wide: bool | None = None) -> list[str]:
    """The sections below the verdicts; ``run_wide``: only those of the run as a whole (True) or
    only a twin's own (False)."""
    out: list[str] = []
    for section in sections.sections(data):
        if run_wide is not None and (section.id in sections.RUN_WIDE) != run_wide:
            continue
        out += _section(section.title, [line for block in section.content(data) for line in _block(block)])
    return out


def _several(data: RunData) -> list[str]:
    """A run of several twins: the warnings every twin shares once, then each twin under its own
    heading as a run of it alone would show it, then the run's own sections (report.md's order)."""
    views = [data.for_twin(tw) for tw in data.twins]
    warns = [prose.warnings(v) for v in views]
    shared = [w for w in warns[0] if all(w in ws for ws in warns[1:])]
    out = _warnings(shared)
    for tw, twin_view, ws in zip(data.twins, views, warns, strict=True):
        out += [
            f"<h2>{escape(tw.name)}: {escape(tw.summary)}</h2>",
            f'<p class="{headline.headline_tone(twin_view)}"><b>{escape(headline.twin_line(twin_view))}</b></p>',
            *_warnings([w for w in ws if w not in shared]),
            *_verdicts(twin_view, "Verdicts", "h3"),
            *_sections(twin_view, run_wide=False),
        ]
    return [*out, "<h2>The whole run</h2>", *_sections(data, run_wide=True)]


def _block(block: sections.Block) -> list[str]:
    """One content block as HTML lines."""
    match block:
        case sections.TableBlock(table, empty) | sections.PairsBlock(table, empty):
            return [html_table(table, empty)]
        case sections.Note(text):
            return [f'<p class="cap">{escape(text)}</p>']
        case sections.Para(text):
            return [f"<p>{escape(text)}</p>"]
        case sections.CodedPara(make):
            return [f"<p>{make(_code)}</p>"]
        case sections.Bullets(lead, items):
            return [f"<p>{escape(lead)}</p>", "<ul>", *(f"<li>{escape(x)}</li>" for x in items), "</ul>"]
        case sections.Preformatted(text):
            return [f"<pre>{escape(text)}</pre>"]
        case sections.Examples(examples, missing):
            note = [f'<p class="nodata">{escape(missing)}</p>'] if missing else []
            return [*note, *(_example(ex) for ex in examples)]
        case _:
            assert_never(block)
