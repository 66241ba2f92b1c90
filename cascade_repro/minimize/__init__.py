"""`cascade-repro minimize`: from a `regression` pair to the smallest case, a script and an issue."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cascade_repro import userpath
from cascade_repro.errors import UsageError
from cascade_repro.minimize.search import CRITERIA, MIN_REQUESTS, MinimizeResult, Oracle, Trial, search
from cascade_repro.plan.matrix import spec_of
from cascade_repro.rundir import layout, manifest, safety
from cascade_repro.rundir.cells import EnginePlan
from cascade_repro.rundir.manifest import Manifest
from cascade_repro.vllm_surface import inject as inj

__all__ = ["CRITERIA", "MinimizeOutput", "minimize_run"]

OUTPUTS = ("minimized.json", "repro.py", "issue.md")  # what minimize writes into its folder


@dataclass
class MinimizeOutput:
    result: MinimizeResult
    out_dir: Path
    files: dict[str, Path]


def _load_prompts(run_dir: Path) -> list[dict[str, Any]]:
    if not layout.prompts_path(run_dir).is_file():
        raise UsageError(f"{run_dir} has no {layout.PROMPTS}")
    from cascade_repro.run.worker import load_prompts

    return load_prompts(run_dir)


def minimize_run(
    run_dir: Path,
    pair_id: str | None = None,
    out_dir: Path | None = None,
    criterion: str = "topk",
    max_tests: int = 64,
    confirm: int = 3,
    on_trial: Callable[[Trial], None] | None = None,
    engine_factory: Callable[[Manifest, EnginePlan], Any] | None = None,
) -> MinimizeOutput:
    """Search the smallest failing case of one pair of ``run_dir`` on one engine; write its files.

    The engine is built as the pair's engine key was, with both arms on it (the flat arm toggled
    off through the probe, as `--arm-switch toggle` does), whatever arm switch the run used.
    ``engine_factory`` gets the run (its ``extra`` holding ``run_dir``) and that engine plan.
    """
    from cascade_repro.minimize.render import render_issue, render_repro, repro_engine_args, safe_dirname
    from cascade_repro.minimize.search import pick_pair, start_case
    from cascade_repro.prompts.chat import measure_prefix

    run_dir = userpath.resolve(run_dir, "RUN_DIR")
    out_dir = userpath.resolve(out_dir, "--out") if out_dir else None
    if criterion not in CRITERIA:
        raise UsageError(f"--criterion must be one of {', '.join(CRITERIA)}, not {criterion!r}")
    if max_tests < 1:
        raise UsageError("--max-tests must be at least 1")
    if confirm < 1:
        raise UsageError("--confirm must be at least 1")
    # Its prompts end up in repro.py and issue.md, its minimize/ is written: nothing through a link.
    safety.refuse_run_links(run_dir)
    run = manifest.read_manifest(run_dir)
    spec = spec_of(run.spec_json)
    if (fault := inj.try_parse(spec.inject)) is not None and fault.kind != inj.LSE_LAYOUT:
        # repro.py carries the lse-layout fault only; a graded shift is a calibration, not a bug to file.
        raise UsageError(f"minimize reproduces lse-layout injections only, not {fault.label}")
    pair = pick_pair(run_dir, pair_id)
    test_cell = run.plan.cell_map()[pair["test_cell"]]
    eplan = run.plan.engines[test_cell.engine_key]
    # arm None: both arms on one engine
    eplan = replace(eplan, arm=None, key=f"{eplan.key or test_cell.engine_key}-minimize")
    start = start_case(run, run_dir, pair, criterion)
    if not start.prompt_indices:
        raise UsageError(f"pair {pair['pair_id']} has no samples to start from")
    prompts = _load_prompts(run_dir)
    out_base = out_dir or run_dir
    out_dir = out_dir or run_dir / layout.MINIMIZE / safe_dirname(pair["pair_id"])
    # Before the engine starts: a link planted in the run directory (minimize/, its pair folder, an
    # output file) would take these writes outside it.
    safety.refuse_links(out_base, [out_dir / name for name in OUTPUTS])
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out_dir}: {e.strerror or e}") from None

    t0 = time.time()
    # The run dir travels as the run_dir key engines.build reads from a run's extra keys.
    run_for_engine = replace(run, extra={**run.extra, "run_dir": str(run_dir)})
    if engine_factory is None:
        from cascade_repro.run.worker import build_engine

        engine_factory = build_engine
    from cascade_repro.plan.models import quiet_progress

    try:
        # minimize prints its own lines; transformers' "Loading weights" bar would cut through them.
        with quiet_progress():
            engine = engine_factory(run_for_engine, eplan)
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - e.g. vLLM refusing to start: one line, not a traceback
        lines = [x for x in str(e).splitlines() if x.strip()]
        raise UsageError(
            f"could not start the {spec.engine} engine for {test_cell.engine_key}: "
            f"{type(e).__name__}: {lines[-1] if lines else ''} (the engine's own log above has the cause; "
            "a GPU busy with another process is a common one)"
        ) from None
    try:
        measured = measure_prefix(engine.tokenizer(), run.prompt_set.system_prompt_text, prompts)
        oracle = Oracle(engine, measured.rendered, measured.tokens, criterion, on_trial=on_trial)
        final, tests, exhausted, confirmations = search(
            oracle,
            start,
            max_tests=max_tests,
            min_requests=MIN_REQUESTS,
            full_tokens=int(spec.max_tokens),
            confirm=confirm,
        )
        effective = engine.effective()
        requested = getattr(engine, "requested", None)
        requested_env = dict(getattr(engine, "requested_env", None) or {})
    finally:
        engine.close()

    result = MinimizeResult(
        pair_id=pair["pair_id"],
        criterion=criterion,
        start=start,
        final=final,
        tests=tests,
        exhausted=exhausted,
        wall_s=round(time.time() - t0, 2),
        trials=[
            {
                "requests": len(t.case.prompt_indices),
                "max_tokens": t.case.max_tokens,
                "failed": t.failed,
                "violations": len(t.violations),
                "diverged": t.n_diverged,
                "cascade_steps": t.cascade_steps,
                "total_steps": t.total_steps,
                "wall_s": t.wall_s,
            }
            for t in oracle.trials
        ],
        confirmations=confirmations,
    )
    files: dict[str, Path] = {}
    run_id = run.run_id if run.has("run_id") else None
    data = result.to_dict() | {"run_id": run_id, "engine_key": test_cell.engine_key}
    layout.write_json_atomic(out_dir / "minimized.json", data)
    files["json"] = out_dir / "minimized.json"
    if result.reproduced:
        assert final is not None
        inject = spec.inject == "lse-layout"
        engine_args = repro_engine_args(run, eplan, requested)
        repro = render_repro(
            model=str(run.model_path or spec.model),
            system_prompt=run.prompt_set.system_prompt_text,
            prompts=[prompts[i]["prompt"] for i in final.case.prompt_indices],
            engine_args=engine_args,
            engine_env=requested_env,
            ignore_eos=bool(spec.ignore_eos),
            max_tokens=final.case.max_tokens,
            topk=int(spec.topk),
            seed=int(eplan.seed),
            inject=inject,
            header=f"model {run.model_name or spec.model}; from run {run_id}, pair {pair['pair_id']} ({spec.engine} engine, "
            f"vLLM {run.env.get('vllm', 'unknown')})",
        )
        layout.write_text_atomic(out_dir / "repro.py", repro)  # replaces, never follows, a link
        files["repro"] = out_dir / "repro.py"
        issue = render_issue(
            result=data,
            run=run,
            effective=effective,
            repro_src=repro,
            prompt_keys=[p.get("key", str(i)) for i, p in enumerate(prompts)],
            inject=inject,
            engine_args=engine_args,
        )
        layout.write_text_atomic(out_dir / "issue.md", issue)
        files["issue"] = out_dir / "issue.md"
    return MinimizeOutput(result, out_dir, files)
