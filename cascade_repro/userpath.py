"""Paths the user names (flags, environment variables, config keys, arguments), resolved once.

A leading ``~`` is expanded as a shell would (``~`` and ``~/x`` to the home folder, ``~name`` to
that user's), then the path is made absolute against the current folder, before any file is read or
written. pandas, pyarrow and the Hub's libraries expand ``~`` on their own while ``open`` and
``Path`` do not: a ``~`` left in a path would write one folder (``./~``) and read another
(``$HOME``). An absolute path has no leading ``~`` left for any library to expand.

Standard library only; imports nothing of the package but ``errors``.
"""

from __future__ import annotations

import os
from pathlib import Path

from cascade_repro.errors import UsageError


def resolve(path: str | os.PathLike[str], what: str = "") -> Path:
    """``path`` with a leading ``~`` expanded and made absolute (links are not resolved: a run
    directory that is a link stays the user's choice). A ``~name`` naming no user is a UsageError
    naming ``what`` (the flag, variable or key the path came from)."""
    text = os.fspath(path)
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        user = expanded.split(os.sep, 1)[0]
        where = f"{what} " if what else ""
        raise UsageError(f"{where}{text}: {user} names no user on this machine, so it cannot be expanded")
    return Path(expanded).absolute()


def display(path: str | os.PathLike[str]) -> str:
    """A resolved path as a message shows it: relative to the current folder when it lies below it
    (``results/r/report.md``), absolute otherwise."""
    p = Path(path)
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)
