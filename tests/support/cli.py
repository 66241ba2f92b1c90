"""typer's ``CliRunner`` for in-process runs of the command line, with the app's Click command built once.

``CliRunner.invoke`` builds the Click command from the Typer app on every call: every command's
signature is read again and its string annotations evaluated, about 30 ms, more than most commands
a test runs take themselves. The app is complete once ``cascade_repro.cli`` is imported, and a built
command keeps no state from one invocation to the next (each gets its own Click context), so one
build per app serves every invocation of the process. Importing ``CliRunner`` from here is what
turns that on; the runner itself is typer's own.
"""

from __future__ import annotations

import functools

import typer.main
import typer.testing
from typer.testing import CliRunner

__all__ = ["CliRunner"]

# typer.testing calls the get_command it imported under this name; a typer without it builds per call.
if hasattr(typer.testing, "_get_command"):
    typer.testing._get_command = functools.cache(typer.main.get_command)
