"""cascade-repro: reproduce and guard against vLLM's cascade-attention repetition bug.

Library entry points (the CLI is a thin layer over these)::

    from cascade_repro import MatrixSpec, RunOptions, run_matrix, write_reports
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["MatrixSpec", "RunOptions", "run_matrix", "write_reports", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so `import cascade_repro` (and `--help`) never pulls in torch or pandas.
    if name == "MatrixSpec":
        from cascade_repro.plan.matrix import MatrixSpec

        return MatrixSpec
    if name in ("RunOptions", "run_matrix"):
        from cascade_repro import pipeline

        return getattr(pipeline, name)
    if name == "write_reports":
        from cascade_repro.report import write_reports

        return write_reports
    raise AttributeError(name)
