"""Command-line interface: thin wrappers over library functions, one module per command group."""

from __future__ import annotations

import errno
import io

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
from cascade_repro.cli.app import OutputClosed, app

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
    if sys.stdout is None:
        _closed_stdout()
    for stream in (sys.stdout, sys.stderr):
        enc = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if enc and not enc.startswith("utf") and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="replace")
            except (ValueError, OSError):  # a detached or closed stream: nothing to protect
                pass


class _ClosedStdout(io.TextIOBase):
    """Standard output when the command started with it closed (``>&-``): a write ends the command
    as a pipe closed early does, :data:`~cascade_repro.cli.app.EXIT_BROKEN_PIPE` (141), instead of
    exit 0 with its output lost."""

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return 1  # /dev/null by then: rich asks it whether output is a terminal

    def write(self, text: str) -> int:
        if not text:
            return 0
        raise OutputClosed(errno.EBADF, "standard output is closed")


def _closed_stdout() -> None:
    """Python leaves ``sys.stdout`` None when descriptor 1 is closed and drops every print without
    a word. Descriptor 1 gets /dev/null, or the next file this process opens would take it and
    receive whatever a child process writes to its standard output; ``sys.stdout`` refuses writes."""
    import os
    import sys

    try:
        os.fstat(1)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
        if fd != 1:
            os.dup2(fd, 1)
            os.close(fd)
    sys.stdout = _ClosedStdout()
