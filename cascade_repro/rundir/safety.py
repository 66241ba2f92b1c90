"""Path safety in a run directory: no link followed, none of its own files a link, a FIFO or a
device; what ``--fresh`` removes, removed without following a link."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from cascade_repro.errors import UsageError
from cascade_repro.rundir.layout import (
    LOCK,
    MERGING,
    MINIMIZE,
    PROBE,
    PROMPTS,
    REFERENCE,
    REFERENCE_LOG,
    REPORTS,
    RUN_JSON,
    SAMPLES,
    SWEEP_MD,
    TABLES,
    shown,
)


def clear_derived(run_dir: Path) -> None:
    """Remove what a run made from its engines' output (``--fresh``): samples, worker logs, probe
    counters, the tables, every report, ``minimize/`` and the sweep table.

    The reports go with the samples: a ``--fresh`` run cut before it scored would otherwise leave
    the old run's verdict (a passing junit.xml) beside samples that no longer hold it. A link among
    them is refused (:func:`refuse_links`), and a folder that cannot be removed is an error: a
    ``--fresh`` that quietly kept the old samples would resume the old run instead.
    """
    run_dir = Path(run_dir)
    for name in (SAMPLES, REFERENCE, PROBE, MINIMIZE):
        remove_tree(run_dir, name)
    for name in (*TABLES, *REPORTS, SWEEP_MD, REFERENCE_LOG):
        (run_dir / name).unlink(missing_ok=True)
    for p in run_dir.glob("worker-*.log"):
        p.unlink(missing_ok=True)


def remove_tree(run_dir: Path, name: str) -> None:
    """Delete the folder ``name`` of a run directory, if there is one; a link there is refused."""
    import shutil

    path = Path(run_dir) / name
    refuse_links(run_dir, [path])
    if path.is_dir():
        shutil.rmtree(path)


# --- links in a run directory ----------------------------------------------------------------------
# A run directory is input from elsewhere (a CI artifact, a tarball, a copy): a symbolic link
# planted in it, .lock -> ~/.bashrc or samples/k.jsonl -> /etc/passwd, would make a command
# truncate, append to, delete or copy a file outside it. Every command that writes in a run
# directory or copies out of one refuses it first (the lock, --fresh, merge, minimize), and the
# files it appends to are opened with O_NOFOLLOW. The run directory itself may be a link: that is
# the user's own choice, not the directory's content.


def owned_paths(run_dir: Path) -> list[Path]:
    """Every path of a run directory some command opens for writing, truncates, deletes or copies:
    the fixed names, the worker logs, and everything under samples/, reference/, probe/ and minimize/."""
    run_dir = Path(run_dir)
    out = [
        run_dir / n for n in (LOCK, MERGING, RUN_JSON, PROMPTS, *TABLES, *REPORTS, SWEEP_MD, REFERENCE_LOG)
    ]
    out += sorted(run_dir.glob("worker-*.log"))
    for name in (SAMPLES, REFERENCE, PROBE, MINIMIZE):
        top = run_dir / name
        out.append(top)
        if top.is_dir() and not top.is_symlink():
            for root, dirs, files in os.walk(top):  # a link to a folder is listed, never entered
                out += [Path(root) / n for n in sorted((*dirs, *files))]
    return out


def refuse_links(run_dir: Path, paths: Iterable[Path | str]) -> None:
    """Raise a one-line UsageError naming the first of ``paths``, or a folder on the way to it from
    ``run_dir``, that is a symbolic link (or is neither a file nor a folder: a FIFO would hang a
    reader, a device node is no record). ``paths`` lie in ``run_dir`` (or are relative to it); a
    path not there yet is fine."""
    run_dir = Path(run_dir)
    for p in paths:
        p = Path(p)
        rel = p.relative_to(run_dir) if p.is_relative_to(run_dir) else p
        if rel.is_absolute() or ".." in rel.parts:
            raise ValueError(f"{p} is not inside {run_dir}")
        cur = run_dir
        for part in rel.parts:
            cur = cur / part
            try:
                st = os.lstat(cur)
            except (FileNotFoundError, NotADirectoryError):
                break
            if stat.S_ISLNK(st.st_mode):
                raise UsageError(_link_message(cur))
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise UsageError(
                    f"{shown(cur)} is neither a file nor a folder: refusing it in a run directory; remove it"
                )


def refuse_run_links(run_dir: Path) -> None:
    """:func:`refuse_links` over :func:`owned_paths`: what a command checks before it writes in a
    run directory, or copies out of one."""
    refuse_links(run_dir, owned_paths(run_dir))


def safe_open(path: Path, flags: int, mode: int = 0o666) -> int:
    """``os.open`` that never follows a symbolic link at ``path`` (O_NOFOLLOW): a planted link is a
    UsageError naming it, not a write into the file it points at. A file it creates gets ``mode``
    less the umask, as every file of a run directory does."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(path):
            raise UsageError(_link_message(Path(path))) from None
        raise


def _link_message(path: Path) -> str:
    try:
        target = f" (to {shown(os.readlink(path))})"
    except OSError:
        target = ""
    return (
        f"{shown(path)} is a symbolic link{target}: refusing to follow a link in a run directory; remove it"
    )
