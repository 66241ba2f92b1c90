"""Command-line interface: thin wrappers over library functions, one module per command group."""

from __future__ import annotations

from cascade_repro.cli import doctor_cmd, env_cmd, matrix_cmd, prompts_cmd, report_cmd  # noqa: F401 - registers commands
from cascade_repro.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point."""
    app()
