"""Errors that end a command with a one-line message instead of a traceback."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from os import PathLike


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
        # A copy names its source first and its destination second (shutil): a full disk refused
        # the destination.
        full = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) and e.filename2 is not None
        path = e.filename2 if full else (e.filename if e.filename is not None else "")
        what = e.strerror or type(e).__name__
        return cls(f"{doing + ': ' if doing else ''}{path}{': ' if path else ''}{what}")


@contextmanager
def naming(path: str | PathLike[str]) -> Iterator[None]:
    """Give an OSError raised inside without a file name the name ``path``.

    Python names the path an ``open`` failed on, never the file a ``write``, ``flush`` or ``close``
    failed on: a full disk would be said as "No space left on device" alone. A writer wraps its
    writes in this, so the one-line error says which file could not be written.
    """
    try:
        yield
    except OSError as e:
        name_oserror(e, path)
        raise


def name_oserror(e: BaseException, path: str | PathLike[str]) -> BaseException:
    """``e`` itself, named ``path`` when it is an OSError without a file name (see :func:`naming`)."""
    if isinstance(e, OSError) and e.filename is None and not isinstance(e, BrokenPipeError):
        e.filename = str(path)
    return e
