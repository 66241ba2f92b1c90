"""`cascade-repro kernel`: vLLM's cascade kernels against float64 on synthetic inputs (GPU + vLLM)."""

from __future__ import annotations

import math
import os
import shlex
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from cascade_repro.cli.app import app, err_console, user_errors

G, OUT = "Grid", "Output"


def _opt(help: str, panel: str, *decls: str, **kw: Any) -> Any:
    return typer.Option(*decls, help=help, rich_help_panel=panel, **kw)


def _command(quick: bool, fa: tuple[int, ...], dtypes: tuple[str, ...], inject: str | None, factor: float,
             out: Path, seed: int, max_seconds: float | None = None) -> str:  # fmt: skip
    args = ["cascade-repro", "kernel"] + (["--quick"] if quick else [])
    args += ["--fa-version", ",".join(map(str, fa)), "--dtype", ",".join(dtypes)]
    args += ["--inject", inject] if inject else []
    args += ["--factor", f"{factor:g}", "--seed", str(seed)]
    args += ["--max-seconds", f"{max_seconds:g}"] if max_seconds is not None else []
    args += ["--out", str(out)]
    return shlex.join(args)


def execution_order(cases: list[Any]) -> list[Any]:
    """FA3 first, then FA2 grouped by dtype and head dim (grid order within a group; reports keep grid order).

    On a fresh H200 each new FA2 configuration cost 2-2.5 min on its first call and everything
    else 0.01-0.5 s, so under --max-seconds this order finishes the most cases and pays each FA2
    compilation once, back to back.
    """

    def key(c: Any) -> tuple[bool, str, int]:
        fa2 = c.fa_version == 2
        return fa2, c.dtype if fa2 else "", c.head_dim if fa2 else 0

    return sorted(cases, key=key)


# A case is 0.01-0.5 s once compiled; one far slower than that is a first call paying compilation.
SLOW_FIRST_CALL_S = 30.0


@app.command()
def kernel(
    quick: Annotated[
        bool, _opt("Run the quick subset (11 cases for FA2+FA3, under 2 minutes on an H200).", G)
    ] = False,
    fa_version: Annotated[str, _opt("FlashAttention versions, comma-separated.", G)] = "2,3",
    dtype: Annotated[str, _opt("Model dtypes, comma-separated: bf16, fp16.", G)] = "bf16,fp16",
    inject: Annotated[
        str | None,
        _opt(
            "Fault to inject into the cascade merge: `lse-layout` (the probe's transposed suffix LSE).",
            G,
            show_default=False,
        ),
    ] = None,  # fmt: skip
    factor: Annotated[
        float, _opt("`ok` when cascade's relative error <= factor x the flat path's.", G)
    ] = 4.0,
    seed: Annotated[int, _opt("Base seed; each case derives its own from it and its shape.", G)] = 0,
    max_seconds: Annotated[
        float | None,
        _opt(
            "Stop after this many seconds: cases not finished by then are `skipped` and the reports are "
            "complete. Set it below any hard limit the run is under.",
            G,
            show_default=False,
        ),
    ] = None,  # fmt: skip
    case_timeout: Annotated[
        float, _opt("A case running longer than this (seconds) is an `error`; the rest go on.", G)
    ] = 180.0,
    out: Annotated[
        Path | None,
        _opt(
            "Directory for report.md, summary.json, junit.xml (the only files written; rewritten after "
            "every case). [default: results/kernel-YYYYmmdd-HHMMSS]",
            OUT,
            show_default=False,
        ),
    ] = None,  # fmt: skip
    dry_run: Annotated[bool, _opt("List the cases and the time estimate; needs no GPU.", OUT)] = False,
) -> None:
    """Check vLLM's cascade-attention kernels against exact float64 attention, case by case.

    For every case of a grid (decode-only GQA batches with split-KV, mixed prefill+decode batches,
    shared prefixes of 256..8192 tokens, 8..256 requests, head dims 64/128, bf16/fp16, FA2/FA3) it
    builds paged KV caches with a shared prefix, calls vLLM's `cascade_attention` and the flat path
    (one `flash_attn_varlen_func` call) on the same inputs, and reports the error of each against
    float64. The cases run in a worker process: a case that crashes it, loses the CUDA context or
    hangs is an `error` row and a new worker runs the rest. Exit code 1 on any mismatch or error,
    2 without a CUDA GPU or vLLM.

    Examples:

        cascade-repro kernel --quick

        cascade-repro kernel --fa-version 2,3 --inject lse-layout --out results/kernel-inject
    """
    with user_errors():
        from cascade_repro.errors import UsageError
        from cascade_repro.kernel.grid import build_grid, estimate_seconds, parse_dtypes, parse_fa_versions
        from cascade_repro.kernel.run import check_inject

        fa = parse_fa_versions(fa_version)
        dtypes = parse_dtypes(dtype)
        check_inject(inject)
        if not math.isfinite(factor) or factor <= 0:
            raise UsageError("--factor must be a positive number")
        if max_seconds is not None and not (math.isfinite(max_seconds) and max_seconds > 0):
            raise UsageError("--max-seconds must be a positive number")
        if not math.isfinite(case_timeout) or case_timeout <= 0:
            raise UsageError("--case-timeout must be a positive number")
        cases = build_grid(quick=quick, fa_versions=fa, dtypes=dtypes, seed=seed)
        if dry_run:
            _print_plan(cases, estimate_seconds(cases))
            return
        from cascade_repro.kernel.run import require_gpu_and_vllm, vllm_version

        require_gpu_and_vllm()
        started = datetime.now(UTC)
        if out is None:
            root = Path(os.environ.get("CASCADE_REPRO_RESULTS_DIR") or "results")
            out = root / f"kernel-{started:%Y%m%d-%H%M%S}{'-' + inject if inject else ''}"
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--out {out}: {e.strerror or e}") from None
    console = err_console()
    console.print(
        f"cascade-repro kernel: {len(cases)} cases, vLLM {vllm_version()}, estimated "
        f"{estimate_seconds(cases):.0f} s at most once FA2's kernels are compiled (a fresh H200 "
        f"spent 2-2.5 min on the first FA2 call of each configuration); writing report.md, summary.json and junit.xml to {out}",
        highlight=False,
        markup=False,
    )

    from cascade_repro.kernel.report import rich_table, summary, write_reports
    from cascade_repro.kernel.run import DEFAULT_EPS
    from cascade_repro.kernel.worker import run_grid_isolated

    settings = {"quick": quick, "fa_versions": list(fa), "dtypes": list(dtypes), "inject": inject,
                "factor": factor, "eps": DEFAULT_EPS, "seed": seed, "n_cases": len(cases),
                "max_seconds": max_seconds, "case_timeout": case_timeout}  # fmt: skip
    command = _command(quick, fa, dtypes, inject, factor, out, seed, max_seconds)
    t0 = time.perf_counter()
    done: list[Any] = []
    slow_noted = False

    def progress(res: Any, i: int, n: int) -> None:
        nonlocal slow_noted
        ratio = "—" if res.ratio is None else f"{res.ratio:.2f}"
        why = f": {res.reason}" if res.reason and res.status != "ok" else ""
        console.print(f"[{i + 1}/{n}] {res.case.case_id}: {res.status} (ratio {ratio}, {res.wall_s:.2f} s){why}",
                      highlight=False, markup=False, soft_wrap=True)  # fmt: skip
        if res.wall_s > SLOW_FIRST_CALL_S and not slow_noted:
            slow_noted = True
            console.print(
                f"note: that case took {res.wall_s:.0f} s. On an H200 with vLLM 0.26 the first FA2 call of each "
                "configuration took 2-2.5 min (FA3 and later calls: 0.01 s), most likely the driver "
                "compiling FA2 kernels from PTX; the results stay in CUDA's compute cache (CUDA_CACHE_PATH), "
                "so a second run is fast. Give a fresh machine a larger --max-seconds.",
                highlight=False, markup=False, soft_wrap=True,
            )  # fmt: skip
        done.append(res)
        # Rewritten after every case, so a run killed from outside still leaves its reports.
        write_reports(summary(sorted(done, key=lambda r: order[r.case.case_id]), settings, env_now,
                              started.isoformat(timespec="seconds"), time.perf_counter() - t0, command,
                              total=len(cases)), out)  # fmt: skip

    order = {c.case_id: k for k, c in enumerate(cases)}
    env_now: dict[str, Any] = {}
    with user_errors():
        results, env = run_grid_isolated(execution_order(cases), inject=inject, factor=factor, on_result=progress,
                                         case_timeout=case_timeout, max_seconds=max_seconds,
                                         env=env_now)  # fmt: skip
    results = sorted(results, key=lambda r: order[r.case.case_id])
    data = summary(results, settings, env, started.isoformat(timespec="seconds"), time.perf_counter() - t0,
                   command)  # fmt: skip
    paths = write_reports(data, out)
    from rich.console import Console

    Console().print(rich_table(data))
    if data.get("positive_control"):
        pc = data["positive_control"]
        console.print(
            f"positive control: {pc['decode_gqa_mismatches']}/{pc['decode_gqa_cases']} decode-GQA cases mismatch"
        )
    for p in paths:
        console.print(f"wrote {p}", highlight=False)
    console.print(f"{data['headline']}; exit {data['exit_code']} ({data['exit_reason']})", highlight=False)
    raise typer.Exit(data["exit_code"])


def _print_plan(cases: list[Any], estimate: float) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"cascade-repro kernel: {len(cases)} cases")
    table.add_column("case", overflow="fold")
    for col in ("seqs", "tokens", "prefix", "max seq", "heads", "d", "dtype", "FA", "splits"):
        table.add_column(col, no_wrap=True)
    for c in cases:
        table.add_row(
            escape(c.case_id), str(c.num_seqs), str(c.num_tokens), str(c.prefix_len),
            str(max(c.seq_lens)), c.heads, str(c.head_dim), c.dtype, str(c.fa_version), str(c.max_num_splits),
        )  # fmt: skip
    console = Console()
    console.print(table)
    flops = sum(c.ref_flops() for c in cases)
    console.print(
        f"{len(cases)} cases; float64 reference {flops / 1e12:.1f} TFLOP; estimated at most {estimate:.0f} s "
        "on one H200 (vLLM import and CUDA start included)"
    )
