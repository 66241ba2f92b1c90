"""`matrix --dry-run`: the plan, where and when each engine key runs, and what it will take.

The cells' table (or, with ``--json``, one JSON object on stdout), then the packing: the GPUs
found, each engine's memory, which GPU each key runs on and in which turn, and the expected wall
time with engines side by side beside the same work one after another (``plan/packing.py``,
``plan/estimate.py``). Nothing is run and nothing is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.markup import escape

from cascade_repro.cli.app import out_console
from cascade_repro.errors import UsageError
from cascade_repro.rundir import safety


def dry_run(request: Any, opts: Any) -> None:
    """--dry-run: the model and run id checked, then the plan's table (or JSON), packing, estimate
    and (under Ray) needs."""
    from cascade_repro.engines import get as engine_info
    from cascade_repro.plan.models import check_model, quiet_progress
    from cascade_repro.run.runner import check_run_id, default_run_id

    if request.json_out and opts.executor.name == "ray":
        raise UsageError("--dry-run --json plans the local executor; drop --json to see a Ray cluster's asks")
    spec = request.spec
    if opts.run_id is not None:
        check_run_id(opts.run_id)
    if engine_info(spec.engine).has_weights:
        check_model(spec.model)  # a typo in --model fails now, not after the plan looked fine
    # The plan is the dry run's output: a tokenizer or model load's bars are noise in it.
    with quiet_progress():
        _print_plan(
            spec,
            opts.shard,
            opts.results_dir / (opts.run_id or default_run_id(spec)),
            opts.reference,
            max_per_gpu=opts.max_engines_per_gpu,
            as_json=request.json_out,
        )
    if opts.executor.name == "ray":
        _print_ray_needs(spec, opts.shard, opts.executor.ray_address)


def _print_ray_needs(spec: Any, shard: Any, address: str | None) -> None:
    """`--dry-run --executor ray`: what each engine key's task asks of the cluster, and whether the
    cluster (joined only where --ray-address or RAY_ADDRESS names one) can place it."""
    from cascade_repro.plan.matrix import plan
    from cascade_repro.plan.shard import keys_for
    from cascade_repro.run.ray_executor import dry_run_lines

    engines = plan(spec).engines
    if shard is not None:
        keep = set(keys_for(engines, shard))
        engines = {k: ep for k, ep in engines.items() if k in keep}
    for line in dry_run_lines(spec, engines, address):
        out_console().print(line, highlight=False, markup=False)


def _check_rendered(spec: Any, system_text: str, records: list[Any]) -> tuple[str | None, int | None, str]:
    """What the run's own checks of the rendered prompts say, said by the dry run where the model's
    tokenizer is on disk already (a local folder, the embedded model once converted): a Hub id is
    not fetched and the embedded model not converted just to plan. A prompt that with --max-tokens
    does not fit the model's context is refused (UsageError); a shared prefix too short for cascade
    is returned as a warning, with the longest rendered prompt in tokens and the model's folder (the
    packing's memory arithmetic; None and "" where the prompts were not rendered)."""
    from cascade_repro.engines import get as engine_info
    from cascade_repro.plan.models import check_model, embedded_converted, load_tokenizer, resolve_model
    from cascade_repro.prompts.chat import check_lengths, measure_lengths
    from cascade_repro.run.runner import context_limit_of

    info = engine_info(spec.engine)
    limit = None
    path = ""
    if not info.has_weights:  # the fake: its own tokenizer, no model and so no context to check
        tok = info.own_tokenizer()
    else:
        kind = check_model(spec.model)
        if not (kind == "local" or (kind == "embedded" and embedded_converted())):
            return None, None, ""
        path, name = resolve_model(spec.model)
        tok = load_tokenizer(path, spec.trust_remote_code)
        limit = context_limit_of(spec, path, name)
    measured = measure_lengths(tok, system_text, records, _rendering_progress(len(records)))
    if limit is not None:
        check_lengths(measured.lengths, [r.key for r in records], int(spec.max_tokens), *limit)
    return measured.warning(), max(measured.lengths or [0]), path


PROGRESS_EVERY_S = 10.0  # a dry run over a large prompt set says how far its tokenizer got


def _rendering_progress(n: int) -> Any:
    """A callback for ``measure_lengths``: a line on stderr every :data:`PROGRESS_EVERY_S` seconds
    while the prompts are rendered (100,000 prompts through an hf tokenizer take minutes)."""
    import time

    last = time.monotonic()

    def tick(done: int) -> None:
        nonlocal last
        if (now := time.monotonic()) - last >= PROGRESS_EVERY_S:
            last = now
            out_console(stderr=True).print(
                f"rendering the prompts to plan: {done:,} of {n:,}", highlight=False, markup=False
            )

    return tick


NARROW = 120  # columns below which the dry-run table heads each engine's cells with its key


def _packing(spec: Any, engines: dict[str, Any], max_batch: int, prompt_max: int | None, path: str,
             max_per_gpu: int | None) -> tuple[Any, str | None]:  # fmt: skip
    """The packing this machine would run the keys with, and the warning a real run's refusal would
    be (a dry run plans for any machine, so it warns instead: ``CASCADE_REPRO_GPUS`` plans for
    another); (None, warning) where it would refuse."""
    from cascade_repro.engines import get as engine_info
    from cascade_repro.plan import gpus, packing
    from cascade_repro.run.runner import machine_gpus

    vllm = engine_info(spec.engine).is_vllm
    inventory = machine_gpus() if vllm else gpus.Inventory((), "not placed on GPUs")
    if vllm and not inventory.gpus:  # planned on a box without GPUs: where it runs decides (no word)
        return None, None
    try:
        tps = [ep.tp for ep in engines.values()]
        return packing.for_spec(spec, tps, max_batch, prompt_max, path, max_per_gpu, inventory), None
    except UsageError as e:
        return None, f"this machine would refuse the run: {e}"


def _print_plan(
    spec: Any,
    shard: Any = None,
    run_dir: Path | None = None,
    reference: Any = None,
    *,
    max_per_gpu: int | None = None,
    as_json: bool = False,
) -> None:
    """Print every cell (of the shard, if given), its engine and wave count; then the engine-start
    count, the packing and the time estimate (refined by ``run_dir``'s waves when that run already
    has some). ``as_json``: all of it as one JSON object on stdout, warnings on stderr."""
    from rich.table import Table

    from cascade_repro.plan import packing as packings
    from cascade_repro.plan.matrix import plan, plan_warnings
    from cascade_repro.prompts.promptsets import load_prompt_set, load_system_prompt

    if run_dir is not None and run_dir.is_dir():  # the estimate reads it: a link or FIFO, before the table
        safety.refuse_run_links(run_dir)
    system_text = load_system_prompt(spec.system_prompt)  # a bad --system-prompt fails here, not hours later
    records = load_prompt_set(spec.prompts, spec.limit, spec.prompt_field, spec.key_field).records
    n = len(records)
    matrix_plan = plan(spec, n)
    engines = matrix_plan.engines
    warning, prompt_max, model_path = _check_rendered(
        spec, system_text, records
    )  # a refusal before the table
    err = out_console(stderr=True)
    title = f"{spec.engine} matrix over {n} prompts"
    if shard is not None:
        from cascade_repro.plan.shard import empty_warning, keys_for

        if shard_warning := empty_warning(engines, shard):
            err.print(f"[yellow]warning:[/] {escape(shard_warning)}", highlight=False)
        keep = set(keys_for(engines, shard))
        engines = {k: ep for k, ep in engines.items() if k in keep}
        title += f", shard {shard}"
    console = out_console()
    why = {"matrix": "", "control": "noise control (added)", "calibration": "calibration"}
    cells_of = {key: matrix_plan.cells_of(key) for key in engines}

    def role(c: Any) -> str:
        if c.origin == "calibration":
            return f"calibration ({c.inject})"
        return f"inject {c.inject}" if c.inject else why.get(c.origin, c.origin)

    several = len(spec.twin_axes) > 1
    if not as_json:
        table = Table(title=title)
        # The cell id stays whole (it is what a user copies); the rest fold, never "…". Under 120
        # columns each engine key heads its cells instead of filling a column (tp and batch are in the id).
        narrow = console.width < NARROW
        cols = (
            ("cell", "arm", "waves", "why")
            if narrow
            else ("cell", "engine key", "tp", "batch", "arm", "waves", "why")
        )
        if several:  # which twins each cell serves (a cell two twins share runs once), and as which arm
            cols = (*cols[:-1], "twins", cols[-1])
        for col in cols:
            table.add_column(col, no_wrap=col == "cell", overflow="fold")
        for key, cells in cells_of.items():
            if narrow:
                table.add_row(f"[bold]{escape(key)}[/]")
            for c in cells:
                waves = str(-(-n // c.batch))
                row = (
                    [escape(c.cell_id), c.arm, waves]
                    if narrow
                    else [escape(c.cell_id), escape(key), str(c.tp), str(c.batch), c.arm, waves]
                )
                if several:
                    row.append(
                        escape(
                            ", ".join(f"{t} as {a}" if a != c.arm else t for t, a in (c.twins or {}).items())
                        )
                    )
                table.add_row(*row, role(c))
            if narrow:
                table.add_section()
        console.print(table)
    for planned_warning in [*plan_warnings(spec, n), *([warning] if warning is not None else [])]:
        err.print(f"[yellow]warning:[/] {escape(planned_warning)}", highlight=False)
    cells = sum(len(ep.cells) for ep in engines.values())
    added = sum(1 for cs in cells_of.values() for c in cs if c.origin == "control")
    max_batch = max([c.batch for cs in cells_of.values() for c in cs] or [1])
    packing, refusal = _packing(spec, engines, max_batch, prompt_max, model_path, max_per_gpu)
    if refusal is not None:
        err.print(f"[yellow]warning:[/] {escape(refusal)}", highlight=False)
    from cascade_repro.engines import get as engine_info
    from cascade_repro.plan import estimate

    gpu = ""
    if engine_info(spec.engine).is_vllm:
        from cascade_repro.run.envinfo import gpu_info

        gpu = gpu_info().get("gpu_name", "")
    planned = {
        k: {
            "cells": [{"cell_id": c.cell_id, "batch": c.batch} for c in cells_of[k]],
            "fa_version": ep.fa_version,
            "tp": ep.tp,
        }
        for k, ep in engines.items()
    }
    est = estimate.for_plan(spec.to_dict(), n, planned, run_dir, gpu, packing)
    cost = None
    if reference is not None:
        from cascade_repro.run.runner import reference_cost

        cost = reference_cost(spec, reference, n * cells)
    if as_json:
        print(json.dumps(_as_json(spec, n, cells_of, role, packing, est, cost), indent=2))
    else:
        line = f"{cells} cells, {len(engines)} engine start{'s' if len(engines) != 1 else ''}"
        if added:
            line += f"; {added} noise-control cell{'s' if added != 1 else ''} added by the planner (--no-auto-controls to drop)"
        console.print(line, highlight=False, markup=False)
        if several:
            console.print(_per_twin_line(spec, [c for cs in cells_of.values() for c in cs]), highlight=False,
                          markup=False)  # fmt: skip
        if packing is not None and packing.concurrent:
            for text in packings.describe(packing):
                console.print(text, highlight=False, markup=False)
            console.print(_schedule_table(packing, est.slots, engines), highlight=False)
        console.print(est.line(), highlight=False, markup=False)
        if cost is not None:
            console.print(cost.line(), highlight=False, markup=False)
    if cost is not None and not cost.fits:
        raise UsageError(cost.refusal(spec.model))
    if run_dir is not None and not as_json:
        from cascade_repro.plan.matrix import spec_hash
        from cascade_repro.report.power_estimate import previous_run_lines

        for text in previous_run_lines(run_dir, spec_hash(spec)):
            console.print(text, highlight=False, markup=False)
    if spec.engine_args and not as_json:
        from cascade_repro.plan.engine_args import known_fields

        shown = ", ".join(
            f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in spec.engine_args.items()
        )
        console.print(
            f"vLLM engine arguments, both arms: {escape(shown)} (checked against {escape(known_fields().where)})",
            highlight=False,
        )
    if spec.sampling and not as_json:
        from cascade_repro.vllm_surface import sampling

        console.print(
            f"sampling penalties, every arm: {sampling.describe(spec.sampling)} (greedy; logprobs after the "
            "penalties, which the reference applies too)",
            highlight=False,
            markup=False,
        )


def _schedule_table(packing: Any, slots: Any, engines: dict[str, Any]) -> Any:
    """Which key runs where and when: its GPUs, its turn, its expected start and end."""
    from rich.table import Table

    from cascade_repro.plan import estimate
    from cascade_repro.plan import packing as packings

    table = Table(title="engines side by side")
    for col in ("engine key", "GPU", "turn", "memory", "starts", "ends"):
        table.add_column(col, overflow="fold")
    by_key = {s.key: s for s in slots}
    if not by_key:  # no speed to simulate with: the order of starts alone
        by_key = {s.key: s for s in packings.schedule(packing, [(k, ep.tp) for k, ep in engines.items()])}
    for key, ep in engines.items():
        s = by_key.get(key)
        if s is None:  # finished in an earlier invocation
            continue
        mem = packing.memory.get(ep.tp)
        where = ",".join(str(g) for g in s.gpus) or "-"
        if slots:  # simulated with the speed table: expected times
            times = (f"after {estimate.fmt_duration(s.start_s)}" if s.start_s else "at once",
                     f"after {estimate.fmt_duration(s.end_s)}")  # fmt: skip
        else:
            times = ("at once" if s.wave == 0 else "as a running one ends", "")
        table.add_row(escape(key), where, str(s.wave), packings.gb(mem.total) if mem else "", *times)
    return table


def _per_twin_line(spec: Any, cells: list[Any]) -> str:
    """`cells per twin: cascade 3, prefix-caching 3 (1 shared)`: each twin's cells, and how many of
    them another twin's run too."""
    parts = []
    for tw in spec.twin_axes:
        mine = [c for c in cells if tw.name in (c.twins or {})]
        shared = sum(1 for c in mine if len(c.twins or {}) > 1)
        parts.append(f"{tw.name} {len(mine)}" + (f" ({shared} shared)" if shared else ""))
    return "cells per twin: " + ", ".join(parts)


def _as_json(spec: Any, n: int, cells_of: dict[str, list[Any]], role: Any, packing: Any, est: Any,
             cost: Any) -> dict[str, Any]:  # fmt: skip
    """The dry run as one JSON object (docs/summary-json.md's neighbour: plain keys, bytes and
    seconds as numbers)."""
    slots = {s.key: s for s in est.slots}
    if packing is not None and not slots:
        from cascade_repro.plan import packing as packings

        tps = [(k, cs[0].tp if cs else 1) for k, cs in cells_of.items()]
        slots = {s.key: s for s in packings.schedule(packing, tps)}
    engines = {}
    for key, cells in cells_of.items():
        tp = cells[0].tp if cells else 1
        s = slots.get(key)
        mem = packing.memory.get(tp) if packing is not None else None
        engines[key] = {
            "tp": tp,
            "cells": [c.cell_id for c in cells],
            "gpus": list(s.gpus) if s is not None else None,
            "turn": s.wave if s is not None else None,
            "start_s": s.start_s if s is not None and est.slots else None,
            "end_s": s.end_s if s is not None and est.slots else None,
            "memory_bytes": None if mem is None else {
                "weights": mem.weights, "kv_cache": mem.kv, "overhead": mem.overhead, "total": mem.total,
                "kv_cache_minimum": mem.min_kv, "kv_cache_yours": mem.kv_given,
            },
        }  # fmt: skip
    return {
        "engine": spec.engine,
        "prompts": n,
        "cells": [
            {
                "cell_id": c.cell_id,
                "engine_key": key,
                "tp": c.tp,
                "batch": c.batch,
                "arm": c.arm,
                "waves": -(-n // c.batch),
                "why": role(c),
            }
            for key, cells in cells_of.items()
            for c in cells
        ],  # fmt: skip
        "engines": engines,
        "packing": None
        if packing is None
        else {
            "mode": packing.mode,
            "max_engines_per_gpu": packing.cap,
            "side_by_side": packing.concurrent,
            "kv_budget_passed": packing.budget,
            "gpus": [
                {"index": g.index, "name": g.name, "memory_bytes": g.memory_bytes}
                for g in packing.inventory.gpus
            ],
            "gpus_from": packing.inventory.source,
            "notes": list(packing.notes),
        },  # fmt: skip
        "estimate": {
            "seconds": est.seconds,
            "sequential_seconds": est.sequential_s if est.sequential_s is not None else est.seconds,
            "waves": est.waves,
            "generated_tokens_max": est.tokens,
            "engine_starts": est.starts,
            "basis": est.basis,
        },
        "reference": None if cost is None else {"seconds": cost.est_s, "fits": cost.fits},
    }
