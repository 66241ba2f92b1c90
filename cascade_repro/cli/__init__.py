"""Command-line interface: thin wrappers over library functions, one module per command group."""

from __future__ import annotations

from cascade_repro.cli import (  # noqa: F401 - importing a command module registers its commands
    doctor_cmd,
    env_cmd,
    explain_cmd,
    kernel_cmd,
    matrix_cmd,
    merge_cmd,
    minimize_cmd,
    prompts_cmd,
    report_cmd,
)
from cascade_repro.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point."""
    app()
