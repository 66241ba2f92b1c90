"""`cascade-repro kernel`: vLLM's cascade kernels on synthetic serving-like inputs, against float64.

The model is out of the picture: for each grid case (``grid.py``) the harness builds paged KV caches
with a shared prefix (``reference.py``), calls vLLM's own ``cascade_attention`` and, on the same
inputs, the one ``flash_attn_varlen_func`` call of vLLM's non-cascade forward (``run.py``), and
compares both with exact attention computed in float64. ``report.py`` renders the verdicts.
``worker.py`` runs the cases in a child process, so a crash, a lost CUDA context or a hang costs
one case, not the run; ``session.py`` is the command's library side (options, plan, progress,
reports after every case).

Only ``run.py`` imports vLLM, and only inside its functions (in the worker process); everything
else runs on a CPU.
"""

from __future__ import annotations
