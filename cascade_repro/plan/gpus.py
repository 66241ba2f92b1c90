"""The GPUs this machine has, as the packing reads them: a name and a memory size per GPU.

Read from ``nvidia-smi --query-gpu`` (no CUDA context is made in this process: a worker started
after it must find the GPU untouched), restricted to ``CUDA_VISIBLE_DEVICES`` as CUDA would be.
``CASCADE_REPRO_GPUS`` stands in for the machine (``8x141``, ``2x80``, ``24,80``, ``none``): the
tests fake 1, 2 and 8 GPUs of 24, 80 and 141 GiB with it, and a user plans (``--dry-run``) for a
machine they are not on. Standard library only: ``--dry-run`` must answer fast.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

from cascade_repro.errors import UsageError

ENV = "CASCADE_REPRO_GPUS"
# Memory is said in GiB throughout: nvidia-smi counts MiB (an H200's 143,771 MiB are 140 GiB, the
# "141 GB" of its data sheet), and an override's "141" means 141 GiB.
GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class Gpu:
    """One visible GPU: its place among the visible ones, the id ``CUDA_VISIBLE_DEVICES`` names it
    by (what a worker pinned to it is given), its name and its memory in bytes."""

    index: int
    cuda_id: str
    name: str
    memory_bytes: int

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


@dataclass(frozen=True)
class Inventory:
    """The GPUs a run can place engines on, and where that list came from."""

    gpus: tuple[Gpu, ...]
    source: str  # "nvidia-smi", "CASCADE_REPRO_GPUS=8x141", "none found"

    def __len__(self) -> int:
        return len(self.gpus)

    def describe(self) -> str:
        """``1 x NVIDIA H200 (140 GiB)``, ``2 x A100 (80 GiB) + 1 x L4 (22 GiB)``, ``no GPU``."""
        if not self.gpus:
            return "no GPU"
        groups: list[tuple[str, int, int]] = []
        for g in self.gpus:
            if groups and groups[-1][0] == g.name and groups[-1][1] == g.memory_bytes:
                groups[-1] = (g.name, g.memory_bytes, groups[-1][2] + 1)
            else:
                groups.append((g.name, g.memory_bytes, 1))
        return " + ".join(f"{n} x {name} ({mem / GIB:.0f} GiB)" for name, mem, n in groups)


def parse(text: str) -> Inventory:
    """An inventory from ``CASCADE_REPRO_GPUS``'s spelling: ``none``, or comma-separated entries
    ``[N x]GiB`` (``8x141``; ``24,80``: one of each). Refused in one line otherwise."""
    source = f"{ENV}={text}"
    text = text.strip().lower()
    if text in ("", "none", "0"):
        return Inventory((), source)
    gpus: list[Gpu] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(?:(\d+)\s*x\s*)?(\d+(?:\.\d+)?)\s*(?:gib|gb)?\s*", part)
        if m is None or float(m.group(2)) <= 0 or (m.group(1) is not None and int(m.group(1)) < 1):
            raise UsageError(
                f"{ENV}={text!r}: give `none` or GPUs as [N x]GiB, comma-separated (8x141, 24,80)"
            )
        for _ in range(int(m.group(1) or 1)):
            i = len(gpus)
            gb = float(m.group(2))
            gpus.append(Gpu(i, str(i), "GPU", int(gb * GIB)))
    return Inventory(tuple(gpus), source)


def counted(n: int, source: str) -> Inventory:
    """``n`` GPUs whose memory is not known (a count without nvidia-smi's query): placed, not measured."""
    return Inventory(tuple(Gpu(i, str(i), "GPU", 0) for i in range(n)), source)


def detect() -> Inventory:
    """This machine's visible GPUs: ``CASCADE_REPRO_GPUS`` where set, else nvidia-smi's (none where
    nvidia-smi is missing or fails)."""
    if (given := os.environ.get(ENV)) is not None:
        return parse(given)
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return Inventory((), "none found (no nvidia-smi)")
    return from_query(out, os.environ.get("CUDA_VISIBLE_DEVICES"))


def from_query(out: str, visible: str | None) -> Inventory:
    """nvidia-smi's CSV (index, uuid, name, memory.total in MiB) as CUDA shows it under
    ``visible`` (``CUDA_VISIBLE_DEVICES``: indices or UUIDs, in its order; None: all)."""
    rows: list[tuple[str, str, str, int]] = []
    for line in out.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 4 or not cols[0].isdigit():
            continue
        try:
            mib = int(float(cols[-1]))
        except ValueError:
            continue
        rows.append((cols[0], cols[1], ",".join(cols[2:-1]), mib))
    if visible is not None:
        picked = []
        for want in (v.strip() for v in visible.split(",")):
            if not want or want == "-1":
                break  # CUDA stops at the first invalid entry
            match = [
                r for r in rows if want in (r[0], r[1]) or (want.startswith("GPU-") and r[1].startswith(want))
            ]
            if not match:
                break
            picked.append(match[0])
        rows = picked
    gpus = tuple(Gpu(i, r[0], r[2], r[3] * MIB) for i, r in enumerate(rows))
    return Inventory(gpus, "nvidia-smi" if gpus else "none found")
