"""Errors that end a command with a one-line message instead of a traceback."""

from __future__ import annotations


class UsageError(Exception):
    """A user mistake (bad flag, missing file, malformed record). The CLI prints it and exits 2."""


class RunLockedError(UsageError):
    """Another process holds the results directory."""


class EnvironmentFailure(Exception):
    """The machine refused (permissions, full disk, I/O error): one line naming the path, exit 6.

    Not a UsageError: the command was right, and exit 2 would send the user looking for a typo.
    Not 1 either, which a CI guard reads as "regression".
    """

    exit_code = 6

    @classmethod
    def from_oserror(cls, e: OSError, doing: str = "") -> EnvironmentFailure:
        path = e.filename if e.filename is not None else ""
        what = e.strerror or type(e).__name__
        return cls(f"{doing + ': ' if doing else ''}{path}{': ' if path else ''}{what}")
