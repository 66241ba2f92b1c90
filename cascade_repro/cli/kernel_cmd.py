"""`cascade-repro kernel`: vLLM's cascade kernels against float64 on synthetic inputs (GPU + vLLM)."""

from __future__ import annotations

from functools import partial
from typing import Annotated

import typer

from cascade_repro import exit_codes
from cascade_repro.cli.app import app, err_console, out_console, user_errors
from cascade_repro.cli.options import GRID as G
from cascade_repro.cli.options import OUTPUT as OUT
from cascade_repro.cli.options import Out, option, variant

# Typer shows these defaults itself (KernelOptions' own, which a test holds them to).
_opt = partial(option, show_default=True)

KernelOut = variant(
    Out,
    help="Directory for report.md, summary.json, junit.xml (the only files written; rewritten after every case). "
    "[default: results/kernel-YYYYmmdd-HHMMSS]",
)


@app.command(epilog=exit_codes.epilog("kernel"))
def kernel(
    quick: Annotated[
        bool, _opt("Run the quick subset (11 cases for FA2+FA3, under 2 minutes on an H200).", G, "--quick")
    ] = False,
    fa_version: Annotated[
        str, _opt("FlashAttention versions, comma-separated.", G, metavar="VERSIONS")
    ] = "2,3",
    dtype: Annotated[
        str, _opt("Model dtypes, comma-separated: bf16, fp16.", G, metavar="DTYPES")
    ] = "bf16,fp16",
    inject: Annotated[
        str | None,
        _opt(
            "Fault to inject into the cascade merge: `lse-layout` (the probe's transposed suffix LSE). [default: none]",
            G,
            show_default=False,
            metavar="FAULT",
        ),
    ] = None,  # fmt: skip
    factor: Annotated[
        float, _opt("`ok` when cascade's relative error <= FACTOR x the flat path's.", G, metavar="FACTOR")
    ] = 4.0,
    seed: Annotated[
        int, _opt("Base seed; each case derives its own from it and its shape.", G, metavar="N")
    ] = 0,
    max_seconds: Annotated[
        float | None,
        _opt(
            "Stop after this many seconds: cases not finished by then are `skipped` and the reports are "
            "complete. Set it below any hard limit the run is under. [default: no limit]",
            G,
            show_default=False,
            metavar="SECONDS",
        ),
    ] = None,  # fmt: skip
    case_timeout: Annotated[
        float,
        _opt(
            "A case running longer than this (seconds) is an `error`; the rest go on.", G, metavar="SECONDS"
        ),
    ] = 180.0,
    out: KernelOut = None,
    dry_run: Annotated[
        bool, _opt("List the cases and the time estimate; needs no GPU.", OUT, "--dry-run")
    ] = False,
) -> None:
    """Check vLLM's cascade-attention kernels against exact float64 attention, case by case.

    For every case of a grid (decode-only GQA batches with split-KV, mixed prefill+decode batches,
    shared prefixes of 256..8192 tokens, 8..256 requests, head dims 64/128, bf16/fp16, FA2/FA3) it
    builds paged KV caches with a shared prefix, calls vLLM's `cascade_attention` and the flat path
    (one `flash_attn_varlen_func` call) on the same inputs, and reports the error of each against
    float64. The cases run in a worker process: a case that crashes it, loses the CUDA context or
    hangs is an `error` row and a new worker runs the rest.

    Examples:

        cascade-repro kernel --quick

        cascade-repro kernel --fa-version 2,3 --inject lse-layout --out results/kernel-inject
    """
    from cascade_repro.kernel.session import KernelOptions, run_kernel

    opts = KernelOptions(quick=quick, fa_version=fa_version, dtype=dtype, inject=inject, factor=factor, seed=seed,
                         max_seconds=max_seconds, case_timeout=case_timeout, out=out, dry_run=dry_run)  # fmt: skip
    with user_errors():
        outcome = run_kernel(opts, err_console(), out_console())
    raise typer.Exit(outcome.exit_code)
