"""The Typer app, its command classes, and what every command prints through (consoles, errors, the
verdict). The options several commands share are in ``options.py``."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from typer.core import TyperArgument, TyperCommand, TyperGroup

from cascade_repro import exit_codes
from cascade_repro.plan.matrix import MatrixSpec


class _NamedArgument(TyperArgument):
    """An argument with a metavar (``RUN_DIR``): help shows that name alone, not a type after it."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


def _plain_placeholders(params: list[Any]) -> None:
    """A flag takes no value, so help shows none (Typer would print ``<bool>``); an argument with a
    metavar shows that name without ``<Path>`` or ``<str>`` beside it."""
    for p in params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
        elif isinstance(p, TyperArgument) and p.metavar is not None and type(p) is TyperArgument:
            p.__class__ = _NamedArgument


class _PlainPlaceholders:
    """The placeholders above for a command's or a group's parameters, its help option included."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _plain_placeholders(self.params)  # type: ignore[attr-defined]

    def get_params(self, ctx: Any) -> Any:
        params = super().get_params(ctx)  # type: ignore[misc]
        _plain_placeholders(params)  # also the shell-completion flags Typer appends after __init__
        return params

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            _plain_placeholders([option])
        return option


class Command(_PlainPlaceholders, TyperCommand):
    """Every command of this app: Typer's, with the placeholders above, and its help rendered by
    Click's formatter, which wraps at any width and never cuts a word (Typer's four-column table cut
    flag names, defaults and env vars to ``--tensor-pa…`` / ``CASCADE_REPRO_MOD…`` at 80 columns)."""

    panels = True  # the options' help panels (a shared option brings the one it is declared in)
    short = False  # --help: each option's first sentence, :attr:`rare` left to --help-all
    rare: frozenset[str] = frozenset()  # the parameters shown under --help-all only
    # (panel title, the short text, the full text) after the options
    more_help: Any = staticmethod(lambda: [])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.panels:
            for p in self.params:
                p.rich_help_panel = None

    def format_help(self, ctx: Any, formatter: Any) -> None:
        everything = not self.short or bool(ctx.meta.get(HELP_ALL))
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        panels: dict[str, list[tuple[str, str]]] = {}
        for p in self.get_params(ctx):
            if getattr(p, "hidden", False) or (p.name in self.rare and not everything):
                continue
            record = click_help_record(p, ctx)
            if record is None:
                continue
            name, text = record
            if not everything:
                text = first_sentence(text)
            row = (name.replace("-", _HYPHEN), text.replace("-", _HYPHEN))
            panels.setdefault(getattr(p, "rich_help_panel", None) or "Options", []).append(row)
        arguments = [
            record
            for p in self.get_params(ctx)
            if getattr(p, "param_type_name", "") == "argument" and (record := p.get_help_record(ctx))
        ]
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl([(n, t.replace("`", "").replace("-", _HYPHEN)) for n, t in arguments])
        for title, rows in panels.items():
            with formatter.section(title):
                formatter.write_dl(rows)
        for title, short, full in self.more_help():
            with formatter.section(title):
                formatter.write_text((full if everything else short).replace("-", _HYPHEN))
        if self.short and not everything:
            formatter.write_paragraph()
            formatter.write_text(f"{len(self.rare)} more options, and every text in full: --help-all")
        self.format_epilog(ctx, formatter)

    def format_help_text(self, ctx: Any, formatter: Any) -> None:
        # Markdown's code backticks, as rich's help dropped them: plain help shows the words alone.
        help_text = self.help
        self.help = help_text.replace("`", "") if help_text else help_text
        try:
            _click_command().format_help_text(self, ctx, formatter)
        finally:
            self.help = help_text

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        """The epilog line by line (the exit-code table), each wrapped on its own."""
        if self.epilog:
            formatter.write_paragraph()
            with formatter.indentation():
                for line in self.epilog.splitlines():
                    if not line.strip():
                        formatter.write_paragraph()
                        continue
                    line = "• " + line[2:] if line.startswith("- ") else line  # a list item, as rich shows it
                    formatter.write_text(line.replace("-", _HYPHEN))

    def get_help(self, ctx: Any) -> str:
        return super().get_help(ctx).replace(_HYPHEN, "-")


class ShortHelpCommand(Command):
    """A command with many options (`matrix`): ``--help`` lists the common ones by panel, each with
    its first sentence; ``--help-all`` every option with its whole text and :attr:`more_help`'s
    panels in full."""

    short = True


def _click_command() -> Any:
    """Click's Command class as this Typer uses it (its own copy from 0.24, or click's)."""
    return next(c for c in TyperCommand.__mro__[1:] if c.__name__ == "Command")


HELP_ALL = "help_all"
# Click's wrapping breaks a line after any hyphen (--output-/path, ENGINE-/MODEL-HASH): the help is
# laid out with a hyphen it does not break at, and the real one put back in the text it returns.
_HYPHEN = "\u2011"


def click_help_record(p: Any, ctx: Any) -> tuple[str, str] | None:
    """An option's flags and text as plain help shows them (backticks dropped: no markdown here)."""
    record = p.get_help_record(ctx) if getattr(p, "param_type_name", "") == "option" else None
    if record is None:
        return None
    return record[0], record[1].replace("`", "")


def first_sentence(text: str) -> str:
    """An option's text cut to its first sentence, its ``[default: X]`` kept."""
    import re

    parts = re.split(r"(?<!e\.g)(?<!i\.e)\. ", text, maxsplit=1)
    if len(parts) == 1:
        return text
    head, tail = parts
    default = tail[tail.rfind("[default:") :] if "[default:" in tail else ""
    return head + "." + (" " + default if default else "")


def show_all_help(ctx: Any, _param: Any, value: bool) -> None:
    """``--help-all``: the command's help with every option and text."""
    if not value or ctx.resilient_parsing:
        return
    ctx.meta[HELP_ALL] = True
    typer.echo(ctx.get_help())
    ctx.exit()


class UngroupedCommand(Command):
    """A command with few options: help lists them all under Options."""

    panels = False


class Group(_PlainPlaceholders, TyperGroup):
    """The app and its command groups, with the placeholders above and the one error path."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        """The one error path of every command. Click's own usage errors (an unknown flag, a value of
        the wrong type, a missing argument) as one line and exit code 2, like the tool's own: Typer
        draws them as a five-line box. Ctrl-C, SIGTERM and SIGHUP are 130; any other exception is a bug: one line and
        :data:`EXIT_INTERNAL` (never 1, which CI reads as a regression), the traceback with --debug."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        global _debug
        _debug = False  # set by --debug while the app's options are read (tests run many commands)
        # Click's exceptions, wherever this Typer takes them from (click, or its own copy from 0.24).
        # Abort and Exit are not among them in the copy: those come from typer itself, which
        # re-exports click's where it has no copy.
        exc = sys.modules[typer.BadParameter.__module__]
        no_args = getattr(exc, "NoArgsIsHelpError", ())  # Click >= 8.2: a bare group asks for help
        from cascade_repro.run.supervise import sigterm_as_interrupt

        try:
            # SIGTERM (`timeout`, a cancelled CI job) ends the command as Ctrl-C does, in every phase:
            # locks released, temp folders removed, exit 130 with the resume line.
            with sigterm_as_interrupt():
                code = super().main(*args, standalone_mode=False, **kwargs)
        except no_args as e:
            # Typer's rich help prints itself (to stdout) and returns ""; plain help is returned.
            if text := (e.ctx.get_help() if e.ctx is not None else str(e)):
                typer.echo(text)
            sys.exit(e.exit_code)
        except exc.UsageError as e:
            where = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
            message = " ".join(e.format_message().split())  # one line, however Click wrapped it
            err_console().print(f"[bold red]error:[/] {shown(message)}{shown(where)}", highlight=False)
            sys.exit(e.exit_code)
        except exc.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except (typer.Abort, KeyboardInterrupt):  # Click < 8.2 turns Ctrl-C into Abort
            err_console().print("interrupted", highlight=False)
            sys.exit(EXIT_INTERRUPTED)
        except (BrokenPipeError, OutputClosed):
            # Where SIGPIPE is ignored (main() restores its default, a parent may not), a pipe closed
            # early ends the command quietly, as a SIGPIPE would, and never as 1.
            try:  # nothing more reaches the closed pipe, not even the interpreter's last flush
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):  # stdout without a file descriptor (a test runner's)
                pass
            sys.exit(EXIT_BROKEN_PIPE)
        except Exception as e:  # noqa: BLE001 - every unexpected error ends here, once
            sys.exit(internal_error(e))
        sys.exit(code if isinstance(code, int) else 0)


class OutputClosed(OSError):
    """A write to a standard output that was closed before the command started (``>&-``). Not a
    BrokenPipeError, which rich and Click each turn into exit 1 before the app's handler sees it."""


EXIT_INTERNAL = exit_codes.INTERNAL
EXIT_INTERRUPTED = exit_codes.INTERRUPTED
EXIT_BROKEN_PIPE = exit_codes.BROKEN_PIPE
DEBUG_ENV = "CASCADE_REPRO_DEBUG"
_debug = False  # --debug of this invocation


def debugging() -> bool:
    """--debug, or CASCADE_REPRO_DEBUG set to anything but empty, 0, false, no or off."""
    return _debug or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def internal_error(e: BaseException) -> int:
    """Say an unexpected exception in one line on stderr (with --debug, its traceback instead);
    return :data:`EXIT_INTERNAL`."""
    if debugging():
        import traceback

        traceback.print_exception(e)
    else:
        message = " ".join(str(e).split())  # one line, however the exception wrapped it
        message = message[:300] + "..." if len(message) > 300 else message
        what = f"{type(e).__name__}: {message}" if message else type(e).__name__
        err_console().print(
            f"[bold red]error:[/] internal error: {shown(what)} (a bug in cascade-repro; "
            f"--debug or {DEBUG_ENV}=1 shows the traceback)",
            highlight=False,
            soft_wrap=True,
        )
    return EXIT_INTERNAL


class Typer(typer.Typer):
    """A Typer app whose commands and groups are the classes above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("cls", Group)
        super().__init__(*args, **kwargs)

    def command(self, *args: Any, cls: Any = None, panels: bool = True, **kwargs: Any) -> Any:
        """``panels=False``: every option under Options, whatever panel a shared option names."""
        return super().command(*args, cls=cls or (Command if panels else UngroupedCommand), **kwargs)


app = Typer(
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
    # --install-completion / --show-completion (bash, zsh, fish, PowerShell), as every Typer app.
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from cascade_repro import __version__

        try:
            installed = version("cascade-repro")
        except PackageNotFoundError:  # run from a checkout that was never installed
            installed = __version__
        typer.echo(f"cascade-repro {installed}")
        raise typer.Exit()


@app.callback()
def _app_options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", help="Print the version and exit.", is_eager=True, callback=_print_version
        ),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help=f"On an internal error (exit {EXIT_INTERNAL}), print its traceback instead of one line "
            f"(or set {DEBUG_ENV}=1).",
        ),
    ] = False,
) -> None:
    """Options of the app itself (before any command)."""
    global _debug
    _debug = debug


# A run id as runner.default_run_id names a run: ENGINE-MODEL-HASH (this one: MatrixSpec()'s, which a
# test holds it to).
EXAMPLE_RUN_DIR = "results/hf-embedded-44136fa355b3"


# The defaults --help shows are MatrixSpec's own: a new default changes every command's help with it.
SPEC = MatrixSpec()
RESULTS_DIR = Path("results")


def default(value: Any) -> str:
    """`` [default: X]`` for a help text, X as the flag would be typed."""
    return f" [default: {as_typed(value)}]"


def spec_default(field: str) -> str:
    """`` [default: X]`` of a MatrixSpec field."""
    return default(getattr(SPEC, field))


def as_typed(value: Any) -> str:
    """A value as it is typed on the command line: ``1,8,16`` for a list, ``on``/``off`` for a switch,
    ``default`` for an unset FlashAttention version, ``1800`` for 1800.0."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "default"
    if isinstance(value, list | tuple):
        return ",".join(as_typed(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a UsageError into one line on stderr and exit code 2, a failure of the machine (a
    permission, a full disk, an I/O error) into one line naming the path and exit code 6; Ctrl-C
    into a resume hint. Anything else is a bug, said once by ``Group.main`` (exit 70)."""
    from cascade_repro.errors import EnvironmentFailure, UsageError

    try:
        yield
    except UsageError as e:
        err_console().print(f"[bold red]error:[/] {shown(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except (EnvironmentFailure, OSError) as e:
        if isinstance(e, BrokenPipeError | OutputClosed):
            raise
        msg = str(e) if isinstance(e, EnvironmentFailure) else str(EnvironmentFailure.from_oserror(e))
        err_console().print(f"[bold red]error:[/] {shown(msg)}", highlight=False, soft_wrap=True)
        raise typer.Exit(EnvironmentFailure.exit_code) from None
    except KeyboardInterrupt:
        err_console().print("interrupted: finished cells are kept; rerun the same command to resume")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def command_line() -> str:
    """This invocation as run.json's invocation record holds it: ``cascade-repro`` and the
    arguments, each quoted as a shell would need it."""
    import shlex

    return " ".join(["cascade-repro", *map(shlex.quote, sys.argv[1:])])


# Where output is not a terminal (a pipe, a CI log) rich assumes 80 columns: tables are squeezed
# and cell ids broken mid-word. There a table gets this width unless COLUMNS says otherwise.
PIPE_WIDTH = 200


# COLUMNS=0 (or 00) is a width rich takes as given: every line it prints is then empty.
FALLBACK_WIDTH = 80


def out_console(stderr: bool = False):
    """The console a command prints through: messages never wrapped (soft_wrap, so a report path or
    a cell id stays whole), tables at their natural width when output is not a terminal, 80
    columns where COLUMNS says 0. Emoji codes are off: ``:smile:`` in a path or a prompt, or
    ``tp=1:1`` in a message, is text (markup is escaped where data enters a message: ``shown``)."""
    from rich.console import Console

    settings: dict[str, Any] = {"stderr": stderr, "soft_wrap": True, "emoji": False}
    columns = os.environ.get("COLUMNS")
    if columns is not None and columns.strip().isdigit() and int(columns) < 1:
        return Console(**settings, width=FALLBACK_WIDTH)
    console = Console(**settings)
    if not console.is_terminal and columns is None:
        console = Console(**settings, width=PIPE_WIDTH)
    return console


def shown(text: str) -> str:
    """Data (a path, a prompt, a key) for a rich console message: control characters dropped, as the
    reports drop them (an escape sequence in a prompt file would retitle, clear or write the
    clipboard of the terminal), and markup escaped ("[x]" prints as is)."""
    from cascade_repro.report.text import clean

    return escape(clean(text))


def err_console():
    return out_console(stderr=True)


def print_summary_json(run_dir: Path, exit_code: int) -> None:
    """``--json``: the run's directory, exit code and summary.json on stdout as one JSON object (the
    summary just written; null where the run scored nothing, as an empty shard)."""
    import json

    from cascade_repro.rundir import layout

    path = Path(run_dir) / layout.SUMMARY_JSON
    summary = None
    # The file this command just wrote; a link there would be no report of this run.
    if path.is_file() and not path.is_symlink():
        summary = json.loads(path.read_text(encoding="utf-8"))
    doc = {"run_dir": str(run_dir), "exit_code": exit_code, "summary": summary}
    sys.stdout.write(json.dumps(doc, ensure_ascii=False, sort_keys=True) + "\n")
    sys.stdout.flush()


def print_outcome(console: Any, headline: str, exit_code: int, reason: str) -> None:
    """The verdict on stderr: the report's headline (red on a regression or a failing exit), then why."""
    style = "bold green" if exit_code == 0 else "bold red"
    console.print(f"[{style}]{escape(headline)}[/]", highlight=False, soft_wrap=True)
    if exit_code != 0:
        console.print(f"exit {exit_code}: {escape(reason)}", highlight=False, soft_wrap=True)
