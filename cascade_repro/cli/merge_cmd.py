"""`cascade-repro merge`: combine the run directories of `matrix --shard i/n` into one scored run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from cascade_repro import exit_codes
from cascade_repro.cli.app import (
    app,
    command_line,
    err_console,
    print_outcome,
    print_summary_json,
    user_errors,
)
from cascade_repro.cli.options import FailOn, SummaryJson
from cascade_repro.plan.matrix import FAIL_ON_DEFAULT
from cascade_repro.userpath import display


@app.command(panels=False, epilog=exit_codes.epilog("merge"))
def merge(
    out_dir: Annotated[Path, typer.Argument(help="The merged run directory to write (new, or an earlier merge of the same matrix).", show_default=False, metavar="OUT_DIR")],
    shard_dirs: Annotated[list[Path], typer.Argument(help="The shard run directories (`matrix --shard i/n`), in any order; a results directory holding one run stands for that run.", show_default=False, metavar="SHARD_DIR...")],
    fail_on: FailOn = FAIL_ON_DEFAULT,
    link: Annotated[bool, typer.Option("--link", help="Hard-link samples and logs instead of copying (same filesystem only).")] = False,
    allow_partial: Annotated[bool, typer.Option("--allow-partial", help="Merge even when a shard's directory is missing: its cells show as `pending` and its pairs as `error` (a warning, and the exit code per --fail-on). Without it a missing shard is a usage error (exit 2) and nothing is written.")] = False,
    json_out: SummaryJson = False,
) -> None:  # fmt: skip
    """Merge shard directories of one matrix into OUT_DIR, then score it and write every report.

    The shards must come from the same matrix (same spec hash and plan, same prompts) and be
    different shards, all of them: a missing shard is an error (exit 2, nothing written), so a CI
    guard cannot pass with part of the matrix absent; `--allow-partial` merges what is there (its
    cells show as `pending`, its pairs as `error`). Samples and worker logs are copied, run.json
    lists every shard with its environment, and the merged run is scored exactly like an
    unsharded one.

    Example (two CI runners, artifacts downloaded into shards/):

        cascade-repro merge results/ci-1234 shards/shard-1 shards/shard-2
    """
    console = err_console()
    with user_errors():
        from cascade_repro.pipeline import merge as merge_shards

        outcome = merge_shards(
            out_dir,
            shard_dirs,
            fail_on=fail_on,
            link=link,
            command=command_line(),
            allow_partial=allow_partial,
        )
    for note in outcome.notes:
        console.print(note, highlight=False, markup=False, soft_wrap=True)
    for w in outcome.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)
    print_outcome(console, outcome.headline, outcome.exit_code, outcome.reason)
    console.print(
        f"report: {display(outcome.run_dir / 'report.md')}  (html: {display(outcome.run_dir / 'report.html')})",
        highlight=False,
        markup=False,
    )
    if json_out:
        print_summary_json(outcome.run_dir, outcome.exit_code)
    raise typer.Exit(outcome.exit_code)
