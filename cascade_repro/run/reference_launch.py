"""Launch the reference pass from the runner: the dtypes it is judged against (``arm_dtypes``,
``planned_dtypes``), what it will cost before a run (``reference_cost``, ``quick_run_seconds``), the
pass itself in a process of its own under watch (``run_reference``), and run.json's record of every
pass (``merged_reference``). The pass's own code is ``run/reference.py``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from cascade_repro.engines import get as engine_info
from cascade_repro.plan.matrix import MatrixSpec, plan, spec_of
from cascade_repro.plan.shard import restrict
from cascade_repro.run import pool, preparation, supervise
from cascade_repro.run.preparation import RunSetup
from cascade_repro.run.reference import ReferenceOptions
from cascade_repro.rundir import layout, manifest, sample_scan
from cascade_repro.rundir.manifest import (
    Manifest,
)

POLL_S = pool.POLL_S


def arm_dtypes(run_dir: Path, run: Manifest) -> list[str]:
    """The dtypes the arms ran in, as their engines reported them (the plan's where none did)."""
    out = []
    for key, ep in run.plan.engines.items():
        eff = (
            sample_scan.read_progress(layout.samples_path(run_dir, key), samples=False).engine.get(
                "effective"
            )
            or {}
        )
        out.append(str(eff.get("dtype") or ep.dtype).replace("torch.", ""))
    return out


def planned_dtypes(spec: MatrixSpec, model_path: str | None = None) -> list[str]:
    """The dtypes the arms will run in, before any engine has said (``auto`` resolved as the engines do:
    float32 for the hf engine on a CPU, the model's bf16/fp16 on a GPU; vLLM never runs float32 for
    ``auto``)."""
    info = engine_info(spec.engine)
    cpu = spec.device == "cpu" or (
        spec.device == "auto" and not info.is_vllm and preparation.visible_gpus() == 0
    )
    return [
        d if d != "auto" else ("float32" if cpu and not info.is_vllm else "bfloat16") for d in spec.dtypes
    ]


def quick_run_seconds(
    spec: MatrixSpec, opts: RunSetup, model_path: str | None, n_prompts: int
) -> float | None:
    """The estimate of the quick first run (``estimate.QUICK_RUN``) with this run's other settings
    (model, prompts, device, reference): the matrix and its reference pass; None when unknown."""
    import dataclasses

    from cascade_repro.plan import estimate

    quick = dataclasses.replace(spec, **estimate.QUICK_RUN)
    planned = plan(quick)
    n = min(n_prompts, int(estimate.QUICK_RUN["limit"]))
    engines = {
        k: {"cells": [{"cell_id": c.cell_id, "batch": c.batch} for c in planned.cells_of(k)], "fa_version": ep.fa_version}
        for k, ep in planned.engines.items()
    }  # fmt: skip
    est = estimate.for_plan(quick, n, engines)
    if est.seconds is None:
        return None
    cost = reference_cost(quick, opts.reference, n * len(planned.cells), model_path)
    return est.seconds + (cost.est_s if cost is not None else 0.0)


def reference_cost(
    spec: MatrixSpec, ref: ReferenceOptions, samples: int, model_path: str | None = None
) -> Any:
    """What the reference pass of this matrix will take (``reference.Cost``), None when it is off."""
    from cascade_repro.plan.models import resolve_model
    from cascade_repro.run import reference as refpass

    precision = ref.resolve(planned_dtypes(spec))
    if precision is None or not engine_info(spec.engine).has_weights:
        return None
    path = model_path or resolve_model(spec.model)[0]
    return refpass.cost(path, precision, ref.device, samples, float(spec.max_tokens))


def run_reference(
    run_dir: Path, ref: ReferenceOptions, timeout: float, console: Any = None
) -> dict[str, Any]:
    """Run the reference pass in a process of its own (the engines have exited); return run.json's record.

    A failed pass is not fatal: the verdicts fall back to the arm-vs-arm rule, and the report says so.
    """
    from cascade_repro.run import reference as refpass
    from cascade_repro.rundir.reference import count_records

    run = restrict(manifest.read_manifest(run_dir))
    precision = ref.resolve(arm_dtypes(run_dir, run))
    if precision is None:
        return {"precision": "off", "status": "off"}
    if not engine_info(
        spec_of(run.spec_json).engine
    ).has_weights:  # nothing to teacher-force: the arm-vs-arm rule
        return {"precision": "off", "status": "no weights"}
    device = refpass.pick_device(ref.device)
    record: dict[str, Any] = {"precision": precision, "device": device}
    log_path = run_dir / layout.REFERENCE_LOG
    before = count_records(run_dir)
    t0 = time.time()
    seen = log_path.stat().st_size if log_path.exists() else 0

    def check() -> str | None:
        nonlocal seen
        if log_path.exists() and log_path.stat().st_size > seen:
            with open(log_path, "rb") as f:
                f.seek(seen)
                chunk = f.read()
            cut = chunk.rfind(b"\n") + 1
            seen += cut
            for line in chunk[:cut].decode("utf-8", "replace").splitlines():
                if line.startswith("reference:") and console is not None:
                    console.print(line, highlight=False, markup=False)
            w.mark_active()
        if w.idle_s() > timeout:
            return f"timeout: no progress for {timeout:.0f}s (--engine-timeout); reference pass killed"
        return None

    argv = [sys.executable, "-m", "cascade_repro.run.reference", str(run_dir), precision, device]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with supervise.Worker(argv, env=env, log_path=log_path) as w:
        stopped = supervise.watch(w, check, POLL_S)
    rc = w.returncode
    record["wall_s"] = round(time.time() - t0, 2)
    on_disk = count_records(run_dir)
    record["sequences"] = on_disk - before
    if stopped is not None or rc != 0:
        why = stopped or f"exited with code {rc}" + (
            f": {line}" if (line := supervise.last_error_line(log_path)) else ""
        )
        record["status"] = f"error: {why}"
        if console is not None:
            console.print(
                f"warning: reference pass failed ({why}); verdicts fall back to the arm-vs-arm rule",
                highlight=False,
                markup=False,
            )
    else:
        record["status"] = "done"
        # Scored over every pass (docs/summary-json.md): an earlier pass that was killed kept its
        # records, and this one, finding them, may score none itself.
        record["sequences"] = on_disk
    return record


def merged_reference(old: Any, new: dict[str, Any]) -> dict[str, Any]:
    """run.json's ``reference`` after another pass: a resumed run adds its seconds to the earlier
    passes' (a resume that found everything scored must not erase what the first pass cost); a done
    pass's ``sequences`` already counts every pass's records."""
    same = isinstance(old, dict) and all(old.get(k) == new.get(k) for k in ("precision", "device"))
    if not same or old.get("status") != "done" or new.get("status") != "done":
        return new
    return {
        **new,
        "wall_s": round(float(old.get("wall_s") or 0) + float(new.get("wall_s") or 0), 2),
        "passes": int(old.get("passes") or 1) + 1,
    }
