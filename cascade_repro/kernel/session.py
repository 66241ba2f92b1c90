"""`cascade-repro kernel` from its options to its reports: the library behind the thin command.

:func:`run_kernel` checks the options, builds the grid (``grid.py``) and either lists it
(``--dry-run``) or checks the machine and runs the cases in worker processes (``worker.py``), in
:func:`execution_order`. It prints one line per finished case and rewrites report.md, summary.json
and junit.xml (``report.py``) after every case, so a run killed from outside still leaves its
reports. The exit code is the summary's: 0 no mismatch, 1 a mismatch, an error or an unfinished run.
A bad option or a machine without a CUDA GPU or vLLM raises UsageError (the command's exit 2).
"""

from __future__ import annotations

import math
import os
import shlex
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cascade_repro import userpath
from cascade_repro.errors import UsageError
from cascade_repro.kernel import grid, report, run, worker
from cascade_repro.kernel.grid import KernelCase

# A case is 0.01-0.5 s once compiled; one far slower than that is a first call paying compilation.
SLOW_FIRST_CALL_S = 30.0


@dataclass
class KernelOptions:
    """What `cascade-repro kernel` was asked for, as the command line spells it."""

    quick: bool = False
    fa_version: str | None = "2,3"  # comma-separated FA versions
    dtype: str | None = "bf16,fp16"  # comma-separated dtypes
    inject: str | None = None
    factor: float = run.DEFAULT_FACTOR
    seed: int = 0
    max_seconds: float | None = None
    case_timeout: float = worker.DEFAULT_CASE_TIMEOUT
    out: Path | None = None  # default: $CASCADE_REPRO_RESULTS_DIR or results/, kernel-<time>[-<inject>]
    dry_run: bool = False


@dataclass
class KernelOutcome:
    exit_code: int
    summary: dict | None = None  # None after a dry run
    paths: list[Path] = field(default_factory=list)


def execution_order(cases: list[KernelCase]) -> list[KernelCase]:
    """FA3 first, then FA2 grouped by dtype and head dim (grid order within a group; reports keep grid order).

    On a fresh Hopper GPU each new FA2 configuration costs minutes on its first call and everything
    else under a second, so under --max-seconds this order finishes the most cases and pays each FA2
    compilation once, back to back.
    """

    def key(c: KernelCase) -> tuple[bool, str, int]:
        fa2 = c.fa_version == 2
        return fa2, c.dtype if fa2 else "", c.head_dim if fa2 else 0

    return sorted(cases, key=key)


def command_line(
    quick: bool, fa: tuple[int, ...], dtypes: tuple[str, ...], inject: str | None, factor: float, out: Path,
    seed: int, max_seconds: float | None = None,
) -> str:  # fmt: skip
    """The command that reproduces a run (the reports' Reproduce section)."""
    args = ["cascade-repro", "kernel"] + (["--quick"] if quick else [])
    args += ["--fa-version", ",".join(map(str, fa)), "--dtype", ",".join(dtypes)]
    args += ["--inject", inject] if inject else []
    args += ["--factor", f"{factor:g}", "--seed", str(seed)]
    args += ["--max-seconds", f"{max_seconds:g}"] if max_seconds is not None else []
    args += ["--out", str(out)]
    return shlex.join(args)


def _check_numbers(opts: KernelOptions) -> None:
    if not math.isfinite(opts.factor) or opts.factor <= 0:
        raise UsageError("--factor must be a positive number")
    if opts.max_seconds is not None and not (math.isfinite(opts.max_seconds) and opts.max_seconds > 0):
        raise UsageError("--max-seconds must be a positive number")
    if not math.isfinite(opts.case_timeout) or opts.case_timeout <= 0:
        raise UsageError("--case-timeout must be a positive number")


def _print(console: Any, text: str) -> None:
    console.print(text, highlight=False, markup=False, soft_wrap=True)


def run_kernel(opts: KernelOptions, console: Any = None, stdout: Any = None) -> KernelOutcome:
    """Check the options, then list the grid (dry run) or run it and write its reports.

    ``console`` (stderr) gets the progress lines and the verdict, ``stdout`` the tables.
    """
    from rich.console import Console

    console = console if console is not None else Console(stderr=True, soft_wrap=True, emoji=False)
    stdout = stdout if stdout is not None else Console(emoji=False)
    fa = grid.parse_fa_versions(opts.fa_version)
    dtypes = grid.parse_dtypes(opts.dtype)
    run.check_inject(opts.inject)
    _check_numbers(opts)
    cases = grid.build_grid(quick=opts.quick, fa_versions=fa, dtypes=dtypes, seed=opts.seed)
    if opts.dry_run:
        estimate = grid.estimate_seconds(cases)
        stdout.print(report.plan_table(cases))
        flops = sum(c.ref_flops() for c in cases)
        stdout.print(
            f"{len(cases)} cases; float64 reference {flops / 1e12:.1f} TFLOP; estimated at most {estimate:.0f} s "
            "on one H200 (vLLM import and CUDA start included)"
        )
        return KernelOutcome(0)

    run.require_gpu_and_vllm()
    started = datetime.now(UTC)
    out = userpath.resolve(opts.out, "--out") if opts.out is not None else None
    if out is None:
        root = userpath.resolve(
            os.environ.get("CASCADE_REPRO_RESULTS_DIR") or "results", "CASCADE_REPRO_RESULTS_DIR"
        )
        out = root / f"kernel-{started:%Y%m%d-%H%M%S}{'-' + opts.inject if opts.inject else ''}"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out}: {e.strerror or e}") from None
    console.print(
        f"cascade-repro kernel: {len(cases)} cases, vLLM {run.vllm_version()}, estimated "
        f"{grid.estimate_seconds(cases):.0f} s at most once FA2's kernels are compiled (a fresh H200 "
        f"spent 2-2.5 min on the first FA2 call of each configuration); writing report.md, summary.json and junit.xml to {out}",
        highlight=False,
        markup=False,
    )

    settings = {"quick": opts.quick, "fa_versions": list(fa), "dtypes": list(dtypes), "inject": opts.inject,
                "factor": opts.factor, "eps": run.DEFAULT_EPS, "seed": opts.seed, "n_cases": len(cases),
                "max_seconds": opts.max_seconds, "case_timeout": opts.case_timeout}  # fmt: skip
    command = command_line(opts.quick, fa, dtypes, opts.inject, opts.factor, out, opts.seed, opts.max_seconds)
    started_at = started.isoformat(timespec="seconds")
    order = {c.case_id: k for k, c in enumerate(cases)}
    t0 = time.perf_counter()
    done: list[run.CaseResult] = []
    env_now: dict[str, Any] = {}
    slow_noted = False

    def progress(res: run.CaseResult, i: int, n: int) -> None:
        nonlocal slow_noted
        ratio = "—" if res.ratio is None else f"{res.ratio:.2f}"
        why = f": {res.reason}" if res.reason and res.status != "ok" else ""
        _print(
            console,
            f"[{i + 1}/{n}] {res.case.case_id}: {res.status} (ratio {ratio}, {res.wall_s:.2f} s){why}",
        )
        if res.wall_s > SLOW_FIRST_CALL_S and not slow_noted:
            slow_noted = True
            _print(
                console,
                f"note: that case took {res.wall_s:.0f} s. On an H200 with vLLM 0.26 the first FA2 call of each "
                "configuration took 2-2.5 min (FA3 and later calls: 0.01 s), most likely the driver "
                "compiling FA2 kernels from PTX; the results stay in CUDA's compute cache (CUDA_CACHE_PATH), "
                "so a second run is fast. Give a fresh machine a larger --max-seconds.",
            )
        done.append(res)
        # Rewritten after every case, so a run killed from outside still leaves its reports.
        partial = report.summary(sorted(done, key=lambda r: order[r.case.case_id]), settings, env_now, started_at,
                                 time.perf_counter() - t0, command, total=len(cases))  # fmt: skip
        report.write_reports(partial, out)

    results, env = worker.run_grid_isolated(execution_order(cases), inject=opts.inject, factor=opts.factor,
                                            on_result=progress, case_timeout=opts.case_timeout,
                                            max_seconds=opts.max_seconds, env=env_now)  # fmt: skip
    results = sorted(results, key=lambda r: order[r.case.case_id])
    data = report.summary(results, settings, env, started_at, time.perf_counter() - t0, command)
    paths = report.write_reports(data, out)
    stdout.print(report.rich_table(data))
    if data.get("positive_control"):
        pc = data["positive_control"]
        console.print(
            f"positive control: {pc['decode_gqa_mismatches']}/{pc['decode_gqa_cases']} decode-GQA cases mismatch"
        )
    for p in paths:
        console.print(f"wrote {p}", highlight=False)
    console.print(f"{data['headline']}; exit {data['exit_code']} ({data['exit_reason']})", highlight=False)
    return KernelOutcome(data["exit_code"], data, paths)
