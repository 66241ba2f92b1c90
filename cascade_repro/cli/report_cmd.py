"""`cascade-repro report`: re-render every report of a run from its saved data, offline."""

from __future__ import annotations

from typing import Annotated

import typer

from cascade_repro import exit_codes
from cascade_repro.cli.app import (
    app,
    command_line,
    err_console,
    print_outcome,
    print_summary_json,
    user_errors,
)
from cascade_repro.cli.options import FailOn, RunDir, SummaryJson, variant

# Not matrix's default: a report judges the run as its own matrix command asked, unless told.
ReportFailOn = variant(
    FailOn,
    help="Exit 1 on `regression`, `error` (regression or error cells), `expected` (also where the twin changes "
    "results by design) or `never`; summary.json follows. "
    "[default: the run's own --fail-on]",
)


@app.command(panels=False, epilog=exit_codes.epilog("report"))
def report(
    run_dir: RunDir,
    rescore: Annotated[
        bool,
        typer.Option(
            "--rescore", help="Recompute the tables from samples/*.jsonl first (after a metrics change)."
        ),
    ] = False,
    fail_on: ReportFailOn = None,
    allow_loss: Annotated[
        bool,
        typer.Option(
            "--allow-loss",
            help="With --rescore: write the new tables even where they lose what the old ones hold "
            "(finished cells whose samples are gone, IFEval scores without prompts.jsonl).",
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Rewrite report.md and report.html even where samples/ is gone and they would lose the "
            "divergent prompts' texts and top-k tables.",
        ),
    ] = False,
    json_out: SummaryJson = False,
) -> None:
    """Re-render report.md, report.html, summary.json and junit.xml from a run directory.

    Needs no GPU and no model: only the files the run saved. Judged by the run's own --fail-on
    unless one is given.
    """
    with user_errors():
        from cascade_repro.pipeline import rerender

        done = rerender(
            run_dir,
            fail_on,
            rescore_first=rescore,
            allow_loss=allow_loss,
            command=command_line(),
            force=force,
        )
    console = err_console()
    if done.newer:
        console.print(f"note: {done.newer}", highlight=False, markup=False)
    if done.note:
        console.print(f"note: {done.note}", highlight=False, markup=False)
    for p in done.paths.values():
        console.print(f"wrote {p}", highlight=False, markup=False)  # a path: "[x]" is no style tag
    print_outcome(console, done.outcome.headline, done.outcome.exit_code, done.outcome.reason)
    if json_out:
        print_summary_json(done.run_dir or run_dir, done.outcome.exit_code)
    raise typer.Exit(done.outcome.exit_code)
