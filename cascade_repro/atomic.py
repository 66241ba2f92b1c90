"""Write a file whole or not at all: a temp file beside it, then a rename.

Standard library only, and imports nothing of the package but ``errors`` (itself standard library
only): the vLLM probe, which runs inside vLLM's process, writes its counts and control files
through it too.

The temp file is made by ``tempfile.mkstemp`` (``O_CREAT | O_EXCL``, mode 0600) in the target's
folder: a link planted under any name there is never opened, let alone written through, and two
writers of one file never share a temp file. A failed write removes its temp file and leaves the
old file as it was.
"""

from __future__ import annotations

import os
import tempfile
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
    ``mode``: the file's permissions (else the temp file's 0600); ``durable``: fsync before the
    rename, so a power loss cannot leave an empty file. The folder must exist. An OSError names
    ``path`` (``naming``), also one raised on the temp file.
    """
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
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


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
