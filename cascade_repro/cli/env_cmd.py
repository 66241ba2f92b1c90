"""`cascade-repro env`: the environment capture, as reports show it."""

from __future__ import annotations

import typer

from cascade_repro import exit_codes
from cascade_repro.cli.app import app, out_console
from cascade_repro.cli.options import Json


@app.command(panels=False, epilog=exit_codes.epilog("env"))
def env(
    json_out: Json = False,
) -> None:
    """Print GPU, driver, CUDA, torch, vLLM, transformers and the VLLM_* variables (secrets redacted)."""
    import json

    from cascade_repro.run import envinfo

    info = envinfo.capture()
    if json_out:
        typer.echo(json.dumps(info, indent=2, sort_keys=True))
        return
    from rich.table import Table

    table = Table(show_header=False)
    for k, v in info.items():
        if k != "vllm_env":
            table.add_row(k, str(v))
    for k, v in info["vllm_env"].items():
        table.add_row(k, v)
    out_console().print(table)
