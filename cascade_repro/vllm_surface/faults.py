"""Why an engine died, from the lines its processes left in the worker's log.

vLLM's client raises ``EngineDeadError`` ("See stack trace (above) for the root cause") whatever
killed the engine core; the cause is only in the log the core process wrote. Two kinds matter to a
verdict:

- a kernel fault (a device-side assertion such as an index out of range, an illegal memory access):
  a software fault, tripped by what the engine computed, not by the machine it ran on;
- running out of memory: engines side by side share a GPU, so one arm can run out where its twin
  did not, and that says nothing about the setting.

A cell's error reason carries the cause as one suffix, written and read here only, so the reason
stays one line for the reports and the judge reads the kind back from it (judge/compare.py).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

KERNEL = "kernel fault"
MEMORY = "out of memory"
SUFFIX = "; engine log: "
# How much of a log's end is read: a dead core's assertion lines and its dump of the failing step
# come last, and the dump alone can be a few hundred kB of token ids.
TAIL_BYTES = 4 << 20

# torch's device-side assertion as a CUDA kernel prints it: FILE:LINE: ... Assertion `COND` failed.
_ASSERT = re.compile(r"([\w./-]{1,300}\.cu):(\d+):.{0,300}?Assertion `(.{1,200}?)` failed")
_KERNEL_TEXT = (
    "an illegal memory access was encountered",
    "misaligned address",
    "device-side assert triggered",
)
_MEMORY_TEXT = ("CUDA out of memory", "OutOfMemoryError")


@dataclass(frozen=True)
class Fault:
    """The cause a dead engine's log names: ``kind`` KERNEL or MEMORY, ``detail`` its first line's gist."""

    kind: str
    detail: str

    def text(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


def cause_from_log(text: str) -> Fault | None:
    """The cause a dead engine's log names, or None. Running out of memory anywhere wins over a
    kernel fault (an allocation that failed can trip later kernels); a kernel fault is named by its
    first assertion (file, line and condition) or, without one, by CUDA's own words."""
    if any(m in text for m in _MEMORY_TEXT):
        return Fault(MEMORY, "")
    # Only the lines that hold an assertion are matched (a log line can be megabytes of token ids).
    for line in (ln for ln in text.splitlines() if "Assertion `" in ln):
        if m := _ASSERT.search(line):
            return Fault(KERNEL, f"device-side assertion {Path(m.group(1)).name}:{m.group(2)} `{m.group(3)}`")
    for words in _KERNEL_TEXT:
        if words in text:
            return Fault(KERNEL, words)
    return None


def cause_from_file(path: Path, start: int = 0) -> Fault | None:
    """:func:`cause_from_log` over what ``path`` holds from byte ``start`` on (its last
    :data:`TAIL_BYTES` at most); None where it cannot be read or is a link (a run directory is
    untrusted: nothing in it is followed out of it). ``start``: where this attempt's lines begin in a
    log that earlier attempts appended to."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(start, f.tell() - TAIL_BYTES))
        return cause_from_log(f.read().decode("utf-8", "replace"))


def log_size(path: Path) -> int:
    """How many bytes ``path`` holds now (0 where it cannot be read): the ``start`` of the lines an
    attempt appends after it, for :func:`cause_from_file`."""
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def with_cause(reason: str, fault: Fault | None) -> str:
    """A cell's error reason with its engine's cause appended (unchanged without one)."""
    return reason if fault is None else f"{reason}{SUFFIX}{fault.text()}"


def kernel_fault(reason: str) -> str:
    """The kernel fault a cell's error reason names (:func:`with_cause`), or ''."""
    _, sep, cause = str(reason or "").rpartition(SUFFIX)
    if not sep or not cause.startswith(KERNEL):
        return ""
    return cause[len(KERNEL) :].removeprefix(": ") or KERNEL
