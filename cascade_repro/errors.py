"""Errors that end a command with a one-line message instead of a traceback."""

from __future__ import annotations


class UsageError(Exception):
    """A user mistake (bad flag, missing file, malformed record). The CLI prints it and exits 2."""


class RunLockedError(UsageError):
    """Another process holds the results directory."""
