"""Write a file whole or not at all: a temp file beside it, then a rename.

Standard library only, and imports nothing of the package but ``errors`` (itself standard library
only): the vLLM probe, which runs inside vLLM's process, writes its counts and control files
through it too.

The temp file is made with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a random name in the target's
folder: a link planted under any name there is never opened, let alone written through, and two
writers of one file never share a temp file. Its mode is 0666 less the process's umask, as any
file ``open`` creates (``mkstemp``'s fixed 0600 made run directories unreadable to a teammate or a
CI job re-rendering them as another user). A failed write removes its temp file and leaves the old
file as it was.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

from cascade_repro.errors import naming


def write_atomic(
    path: str | os.PathLike[str],
    content: str | bytes | Callable[[Path], None],
    *,
    mode: int | None = None,
    durable: bool = False,
) -> None:
    """Replace ``path`` with ``content`` in one rename, so a reader never sees half a file.

    ``content``: text (UTF-8, newlines as given), bytes, or a function that writes the file at the
    path it is given (for writers that take a path: ``DataFrame.to_parquet``, ``torch.save``).
    ``mode``: the file's permissions (else 0666 less the umask, as ``open`` gives); ``durable``: fsync before the
    rename, so a power loss cannot leave an empty file. The folder must exist. An OSError names
    ``path`` (``naming``), also one raised on the temp file.
    """
    path = Path(path)
    fd, tmp = _create_temp(path)
    name = str(tmp)
    try:
        with naming(path):
            if callable(content):
                os.close(fd)
                content(tmp)
                if durable:
                    _fsync(tmp)
            else:
                with os.fdopen(fd, "wb") as f:
                    f.write(content.encode("utf-8") if isinstance(content, str) else content)
                    if durable:
                        f.flush()
                        os.fsync(f.fileno())
            if mode is not None:
                os.chmod(tmp, mode)
            os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename == name:
            e.filename = str(path)  # the temp file's random name would tell the user nothing
        raise


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new, empty file beside ``path`` (``O_EXCL``: never an existing name or a link), mode 0666
    less the umask."""
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temp file name beside {path}")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
