"""The Typer app and options shared by several commands."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

app = typer.Typer(
    name="cascade-repro",
    help=(
        "Reproduce and guard against vLLM's cascade-attention repetition bug.\n\n"
        "Runs the same prompts behind a long shared system prompt with cascade attention on and off, "
        "across tensor-parallel sizes and batch sizes, and judges each cascade run against its flat twin "
        "and a measured flat-vs-flat noise floor. Start with `cascade-repro matrix --dry-run`."
    ),
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

RunDirArg = Annotated[
    Path,
    typer.Argument(
        help="A run directory, e.g. results/hf-smollm2-135m-instruct-1a2b3c4d5e6f.", show_default=False
    ),
]


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a UsageError into one line on stderr and exit code 2, a failure of the machine (a
    permission, a full disk, an I/O error) into one line naming the path and exit code 6; Ctrl-C
    into a resume hint."""
    from cascade_repro.errors import EnvironmentFailure, UsageError

    try:
        yield
    except UsageError as e:
        err_console().print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except (EnvironmentFailure, OSError) as e:
        if isinstance(e, BrokenPipeError):
            raise
        msg = str(e) if isinstance(e, EnvironmentFailure) else str(EnvironmentFailure.from_oserror(e))
        err_console().print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
        raise typer.Exit(EnvironmentFailure.exit_code) from None
    except KeyboardInterrupt:
        err_console().print("interrupted: finished cells are kept; rerun the same command to resume")
        raise typer.Exit(130) from None


def err_console():
    from rich.console import Console

    # soft_wrap: a message is one line however wide, so a report path or a cell id is never split
    # where output is not a terminal (rich wraps at 80 columns there).
    return Console(stderr=True, soft_wrap=True)


def print_outcome(console: Any, headline: str, exit_code: int, reason: str) -> None:
    """The verdict on stderr: the report's headline (red on a regression or a failing exit), then why."""
    style = "bold green" if exit_code == 0 else "bold red"
    console.print(f"[{style}]{escape(headline)}[/]", highlight=False, soft_wrap=True)
    if exit_code != 0:
        console.print(f"exit {exit_code}: {escape(reason)}", highlight=False, soft_wrap=True)
