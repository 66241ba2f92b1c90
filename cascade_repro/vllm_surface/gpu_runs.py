"""Where each twin last ran on a GPU, per vLLM release: the committed evidence behind every claim.

One row per (vLLM release, twin as ``--twin`` spells it): the day of the newest run of that twin
on that release and the run directory under ``docs/evidence/`` that holds it (its ``run.json``
names both; a run of several twins is the row of each). Only what ran: a twin that never ran on a
release has no row. ``doctor`` lists these per twin, the README's "vLLM release x twin" table is
rendered from them (:func:`readme_table`), and ``tests/vllm_surface/test_gpu_runs.py`` checks every
row against its folder's ``run.json`` and keeps the README equal to the table.

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from cascade_repro.twin import CASCADE
from cascade_repro.vllm_surface import version_tuple


@dataclass(frozen=True)
class GpuRun:
    """One twin's newest GPU run on one vLLM release."""

    release: str
    twin: str
    date: str  # YYYY-MM-DD, the run's created_at day (UTC)
    folder: str  # the run directory, relative to the repository root


_TWINS_0_26 = "docs/evidence/2026-12-03-h200-twins"
_TWINS_0_34 = "docs/evidence/2026-12-03-h200-vllm0.34"
_REAL_BUGS = "docs/evidence/2026-12-03-h200-real-bugs"
_TWIN_ALL_0_26 = "docs/evidence/2026-12-03-h200-topk-packing/twins-side-4"  # --twin all, one run

GPU_RUNS: tuple[GpuRun, ...] = (
    GpuRun("0.10.2", CASCADE.name, "2026-12-04", f"{_REAL_BUGS}/field"),
    GpuRun("0.10.2", "prefix-caching", "2026-12-04", f"{_REAL_BUGS}/prefixneg"),
    GpuRun("0.11.0", "async-scheduling", "2026-12-04", f"{_REAL_BUGS}/preempt"),
    GpuRun("0.26.0", CASCADE.name, "2026-12-04", _TWIN_ALL_0_26),
    GpuRun("0.26.0", "prefix-caching", "2026-12-04", _TWIN_ALL_0_26),
    GpuRun("0.26.0", "chunked-prefill", "2026-12-04", _TWIN_ALL_0_26),
    GpuRun("0.26.0", "cuda-graphs", "2026-12-04", _TWIN_ALL_0_26),
    GpuRun("0.26.0", "async-scheduling", "2026-12-04", _TWIN_ALL_0_26),
    GpuRun("0.26.0", "kv-cache-dtype=fp8", "2026-12-04", _TWIN_ALL_0_26),
    GpuRun("0.26.0", "attention-backend=FLASH_ATTN:TRITON_ATTN", "2026-12-04", _TWIN_ALL_0_26),
    GpuRun("0.26.0", "attention-backend=FLASH_ATTN:FLASHINFER", "2026-12-03", f"{_TWINS_0_26}/flashinfer"),
    GpuRun("0.26.0", "batch=1:64", "2026-12-04", _TWIN_ALL_0_26),
    GpuRun("0.34.0", "prefix-caching", "2026-12-03", f"{_TWINS_0_34}/prefix"),
    GpuRun("0.34.0", "chunked-prefill", "2026-12-03", f"{_TWINS_0_34}/chunked"),
    GpuRun("0.34.0", "cuda-graphs", "2026-12-03", f"{_TWINS_0_34}/graphs"),
    GpuRun("0.34.0", "async-scheduling", "2026-12-03", f"{_TWINS_0_34}/async"),
    GpuRun("0.34.0", "kv-cache-dtype=fp8", "2026-12-03", f"{_TWINS_0_34}/fp8"),
    GpuRun("0.34.0", "attention-backend=FLASH_ATTN:TRITON_ATTN", "2026-12-03", f"{_TWINS_0_34}/triton"),
    GpuRun("0.34.0", "attention-backend=FLASH_ATTN:FLASHINFER", "2026-12-03", f"{_TWINS_0_34}/flashinfer"),
    GpuRun("0.34.0", "batch=1:64", "2026-12-03", f"{_TWINS_0_34}/batch"),
)


def _family(twin: str) -> str:
    return twin.partition("=")[0]


def releases() -> list[str]:
    """The releases with a GPU run, oldest first."""
    return sorted({r.release for r in GPU_RUNS}, key=lambda v: version_tuple(v) or ())


def twins() -> list[str]:
    """The twins with a GPU run, in the order of the table."""
    return list(dict.fromkeys(r.twin for r in GPU_RUNS))


def runs_of(family: str) -> list[GpuRun]:
    """Every GPU run of a twin family (``attention-backend`` holds both backend pairs), newest
    release first."""
    out = [r for r in GPU_RUNS if _family(r.twin) == family]
    return sorted(out, key=lambda r: version_tuple(r.release) or (), reverse=True)


def ran_on(family: str) -> str:
    """Where a twin family ran, for doctor: ``0.26.0 (2026-12-03), 0.10.2 (2026-12-01)``; the
    spelled twin when a family ran with several arms; "never on a GPU" when it did not run."""
    runs = runs_of(family)
    if not runs:
        return "never on a GPU"
    several = len({r.twin for r in runs}) > 1
    return ", ".join(
        f"{r.release}{' ' + r.twin.partition('=')[2] if several else ''} ({r.date})" for r in runs
    )


def fully_ran(release: str, families: list[str]) -> bool:
    """Whether every one of ``families`` ran on ``release``."""
    ran = {_family(r.twin) for r in GPU_RUNS if r.release == release}
    return set(families) <= ran


def readme_table() -> str:
    """The README's "vLLM release x twin" table: a row per twin, a column per release, each cell
    the date and evidence folder of the run behind it, or blank."""
    cols = releases()
    cell = {
        (r.twin, r.release): f"{r.date} [{r.folder.removeprefix('docs/evidence/')}]({r.folder})"
        for r in GPU_RUNS
    }
    lines = ["| twin | " + " | ".join(f"vLLM {v}" for v in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for tw in twins():
        lines.append(f"| `{tw}` | " + " | ".join(cell.get((tw, v), "") for v in cols) + " |")
    return "\n".join(lines)
