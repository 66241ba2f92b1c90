"""`cascade-repro doctor`: check that cascade attention can fire here and that the probe can see it."""

from __future__ import annotations

from typing import Annotated

import typer

from cascade_repro import exit_codes
from cascade_repro.cli.app import SPEC, app, out_console, spec_default, user_errors
from cascade_repro.cli.options import Json, Model, Prompts, SystemPrompt, TrustRemoteCode, variant

STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}

# Only the prefix is measured with the set: what it is for here, not what a set can be.
MeasuredPrompts = variant(
    Prompts, help="Prompt set whose shared prefix is measured." + spec_default("prompts")
)


@app.command(panels=False, epilog=exit_codes.epilog("doctor"))
def doctor(
    model: Model = SPEC.model,
    tp: Annotated[int, typer.Option(help="Tensor-parallel size to check.", metavar="SIZE")] = SPEC.tp[0],
    system_prompt: SystemPrompt = SPEC.system_prompt,
    prompts: MeasuredPrompts = SPEC.prompts,
    hf_overrides: Annotated[
        str | None,
        typer.Option(
            help="JSON object of config overrides, as for `matrix`. [default: none]",
            show_default=False,
            metavar="JSON",
        ),
    ] = None,
    trust_remote_code: TrustRemoteCode = SPEC.trust_remote_code,
    json_out: Json = False,
) -> None:
    """Check vLLM, GPUs, tensor parallelism, FlashAttention, env switches, prefix length and model config.

    Every check is ok, warn or fail, with a fix hint; a failing check means this box cannot run the
    GPU matrix.
    """
    import json

    with user_errors():
        from cascade_repro.doctor import doctor as run_doctor
        from cascade_repro.plan.matrix import parse_hf_overrides

        overrides = parse_hf_overrides(hf_overrides) if hf_overrides is not None else None
        checks, code = run_doctor(
            model=model,
            tp=tp,
            system_prompt=system_prompt,
            prompts=prompts,
            hf_overrides=overrides,
            trust_remote_code=trust_remote_code,
        )
    if json_out:
        typer.echo(json.dumps({"checks": [c.to_dict() for c in checks], "exit_code": code}, indent=2))
        raise typer.Exit(code)
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="cascade-repro doctor", show_lines=False)
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row(
            escape(c.name), f"[{STYLE.get(c.status, '')}]{c.status}[/]", escape(c.detail), escape(c.fix)
        )
    console = out_console()
    console.print(table)
    n_fail = sum(c.status == "fail" for c in checks)
    n_warn = sum(c.status == "warn" for c in checks)
    console.print(f"{n_fail} fail, {n_warn} warn, {len(checks) - n_fail - n_warn} ok")
    raise typer.Exit(code)
