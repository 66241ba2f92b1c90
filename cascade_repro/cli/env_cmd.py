"""`cascade-repro env`: the environment capture, as reports show it."""

from __future__ import annotations

from typing import Annotated

import typer

from cascade_repro.cli.app import app


@app.command()
def env(
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Print GPU, driver, CUDA, torch, vLLM, transformers and the VLLM_* variables (secrets redacted)."""
    import json

    from cascade_repro import envinfo

    info = envinfo.capture()
    if json_out:
        typer.echo(json.dumps(info, indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=False)
    for k, v in info.items():
        if k != "vllm_env":
            table.add_row(k, str(v))
    for k, v in info["vllm_env"].items():
        table.add_row(k, v)
    Console().print(table)
