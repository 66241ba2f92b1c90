"""`cascade-repro report`: re-render every report of a run from its saved data, offline."""

from __future__ import annotations

from typing import Annotated

import typer

from cascade_repro import exit_codes
from cascade_repro.cli.app import app, err_console, print_outcome, user_errors
from cascade_repro.cli.options import FailOn, RunDir, variant
from cascade_repro.plan.matrix import check_fail_on

# Not matrix's default: a report judges the run as its own matrix command asked, unless told.
ReportFailOn = variant(
    FailOn,
    help="Exit 1 on `regression`, `error` (regression or error cells) or `never`; summary.json follows. "
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
) -> None:
    """Re-render report.md, report.html, summary.json and junit.xml from a run directory.

    Needs no GPU and no model: only the files the run saved. Judged by the run's own --fail-on
    unless one is given.
    """
    with user_errors():
        if fail_on is not None:  # before anything is scored or written
            check_fail_on(fail_on)
        from contextlib import nullcontext

        from cascade_repro.report import write_reports
        from cascade_repro.report.content import run_fail_on
        from cascade_repro.report.load import load_run
        from cascade_repro.report.outcome import outcome_of
        from cascade_repro.run import runstore

        # The run's lock: a matrix still writing this directory would be scored half-way, and two
        # writers of the reports would interleave. Not a run directory: nothing to lock (and no
        # lock file to leave behind), the readers below say what is wrong.
        is_run = (run_dir / runstore.RUN_JSON).is_file()
        if is_run:  # a damaged run.json: one line, before the lock file is made
            run = runstore.read_manifest(run_dir)
        with runstore.RunLock(run_dir) if is_run else nullcontext():
            unscored = (
                is_run
                and not all((run_dir / t).is_file() for t in runstore.TABLES)
                # samples/ may not exist yet (cut during the first engine start): all cells pending
                and run.has("plan")
            )
            if unscored and not rescore:
                # Interrupted before scoring: score the cells it finished, so the report shows them
                # (and its headline says the run is not finished).
                from cascade_repro.run.runner import finalize

                _, data = finalize(run_dir)
            elif rescore:
                import shlex
                import sys

                from cascade_repro.run.runner import rescore as rescore_run

                command = " ".join(["cascade-repro", *map(shlex.quote, sys.argv[1:])])
                _, data = rescore_run(run_dir, command, allow_loss=allow_loss)
            else:
                data = load_run(run_dir)
            # Rendered from what was loaded (or scored): the samples are read once.
            paths = write_reports(run_dir, fail_on=fail_on, data=data)
        outcome = outcome_of(data, fail_on if fail_on is not None else run_fail_on(data))
    console = err_console()
    for p in paths.values():
        console.print(f"wrote {p}", highlight=False, markup=False)  # a path: "[x]" is no style tag
    print_outcome(console, outcome.headline, outcome.exit_code, outcome.reason)
    raise typer.Exit(outcome.exit_code)
