"""Command-line interface: thin wrappers over library functions, one module per command group."""

from __future__ import annotations

from cascade_repro.cli import (  # noqa: F401 - importing a command module registers its commands
    doctor_cmd,
    env_cmd,
    explain_cmd,
    kernel_cmd,
    matrix_cmd,
    merge_cmd,
    minimize_cmd,
    prompts_cmd,
    report_cmd,
)
from cascade_repro.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point."""
    _streams_for_this_terminal()
    app()


def _streams_for_this_terminal() -> None:
    """Output that cannot break the command: a pipe closed early, a terminal that is not UTF-8.

    ``| head -1`` closes the pipe after one line; Python would turn that into a BrokenPipeError and
    Click into exit 1, this tool's "regression". The Unix default (end quietly on SIGPIPE) is what
    every pipeline expects. Under an ASCII locale (``LC_ALL=C``), Korean prompts and box drawing
    would raise UnicodeEncodeError: such streams replace what they cannot encode instead.
    """
    import signal
    import sys

    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    for stream in (sys.stdout, sys.stderr):
        enc = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if enc and not enc.startswith("utf") and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="replace")
            except (ValueError, OSError):  # a detached or closed stream: nothing to protect
                pass
