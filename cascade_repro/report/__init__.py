"""Reports rendered from the files of a run directory alone: markdown, HTML, JSON summary, JUnit."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import assert_never

from cascade_repro.errors import UsageError
from cascade_repro.plan.matrix import check_fail_on
from cascade_repro.report.base import ReportFormatter
from cascade_repro.report.html import HtmlFormatter
from cascade_repro.report.json import JsonFormatter
from cascade_repro.report.junit import JunitFormatter
from cascade_repro.report.load import Example, RunData, load_run
from cascade_repro.report.markdown import MarkdownFormatter
from cascade_repro.rundir import layout

__all__ = [
    "Example",
    "ReportFormat",
    "ReportFormatter",
    "RunData",
    "formatter_for",
    "load_run",
    "write_reports",
]


class ReportFormat(str, Enum):  # noqa: UP042 - the agreed CLI contract; StrEnum would change str(member)
    """Output formats of `cascade-repro report`."""

    markdown = "markdown"
    html = "html"
    json = "json"
    junit = "junit"


def formatter_for(fmt: ReportFormat) -> ReportFormatter:
    """Return the formatter of one format."""
    match fmt:
        case ReportFormat.markdown:
            return MarkdownFormatter()
        case ReportFormat.html:
            return HtmlFormatter()
        case ReportFormat.json:
            return JsonFormatter()
        case ReportFormat.junit:
            return JunitFormatter()
        case _:
            assert_never(fmt)


def write_reports(
    run_dir: Path,
    formats: Iterable[ReportFormat | str] = tuple(ReportFormat),
    n_examples: int = 3,
    fail_on: str | None = None,
    data: RunData | None = None,
) -> dict[ReportFormat, Path]:
    """Load run_dir once (or render ``data``, run_dir as loaded) and write one file per format into
    it, each replaced atomically.

    ``fail_on`` judges this rendering (summary.json's exit code) in place of the run's own
    ``--fail-on``; run.json is not changed, so a later plain ``report`` uses the run's again.
    """
    run_dir = Path(run_dir)
    if fail_on is not None:
        fail_on = str(getattr(fail_on, "value", fail_on))
        check_fail_on(fail_on)  # before anything is read or written
    if data is None:
        data = load_run(run_dir, n_examples=n_examples)
    if fail_on is not None:
        data.manifest.update(fail_on=fail_on)
    written: dict[ReportFormat, Path] = {}
    with data.settled():
        for fmt in dict.fromkeys(_parse_format(f) for f in formats):
            formatter = formatter_for(fmt)
            path = run_dir / formatter.filename
            # A reader (or a crash) sees the old file or the new one, never half of one.
            layout.write_text_atomic(path, formatter.render(data), durable=True)
            written[fmt] = path
    return written


def _parse_format(f: ReportFormat | str) -> ReportFormat:
    try:
        return ReportFormat(f)
    except ValueError:
        names = ", ".join(m.value for m in ReportFormat)
        raise UsageError(f"unknown report format {f!r}: expected one of {names}") from None
