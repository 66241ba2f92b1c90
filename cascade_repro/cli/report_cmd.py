"""`cascade-repro report`: re-render every report of a run from its saved data, offline."""

from __future__ import annotations

from typing import Annotated

import typer

from cascade_repro.cli.app import RunDirArg, app, err_console, print_outcome, user_errors


@app.command()
def report(
    run_dir: RunDirArg,
    rescore: Annotated[
        bool, typer.Option(help="Recompute the tables from samples/*.jsonl first (after a metrics change).")
    ] = False,
    fail_on: Annotated[str, typer.Option(help="Exit 1 on `regression`, `error` or `never`.")] = "regression",
) -> None:
    """Re-render report.md, report.html, summary.json and junit.xml from a run directory.

    Needs no GPU and no model: only the files the run saved. Exit code as for `matrix`.
    """
    with user_errors():
        from cascade_repro.outcome import outcome_of
        from cascade_repro.report import write_reports
        from cascade_repro.report.load import load_run

        if rescore:
            from cascade_repro.runner import finalize

            finalize(run_dir)
        paths = write_reports(run_dir)
        outcome = outcome_of(load_run(run_dir), fail_on)
    console = err_console()
    for p in paths.values():
        console.print(f"wrote {p}")
    print_outcome(console, outcome.headline, outcome.exit_code, outcome.reason)
    raise typer.Exit(outcome.exit_code)
