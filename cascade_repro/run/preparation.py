"""Prepare a matrix run before any worker starts: the run settings (``RunSetup``, ``Executor``), the
run id, the run directory's run.json and prompts as they will be written (``prepare`` ->
``PreparedRun``, a resume checked against the run it continues), and the machine's refusals (its
GPUs: ``visible_gpus``, ``machine_gpus``; how the engine keys share them: ``packing_of``).
"""

from __future__ import annotations

import copy
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade_repro import userpath
from cascade_repro.engines import get as engine_info
from cascade_repro.errors import UsageError
from cascade_repro.plan import gpus as gpu_inventory
from cascade_repro.plan import packing as packings
from cascade_repro.plan.matrix import MatrixSpec, plan, plan_warnings, spec_hash, spec_of
from cascade_repro.plan.shard import Shard, empty_warning
from cascade_repro.run.reference import ReferenceOptions
from cascade_repro.rundir import layout, manifest, runlock, safety
from cascade_repro.rundir.manifest import (
    Manifest,
    PromptSetFacts,
    Timings,
    newer_version_note,
)

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class Executor:
    """Where the engine keys' workers run; a run setting, not part of the matrix (nor its hash)."""

    name: str = "local"  # local: one after the other on this machine; ray: tasks on a Ray cluster
    ray_address: str | None = None  # None: `auto` where RAY_ADDRESS is set, else a local Ray
    retries: int = 1  # ray: attempts after a task died, before its unfinished cells are errors

    def __post_init__(self) -> None:
        if self.name not in EXECUTORS:
            raise UsageError(f"--executor {self.name!r}: choose from {', '.join(EXECUTORS)}")
        if self.retries < 0:
            raise UsageError(f"--retries {self.retries}: must be 0 or more")
        if self.ray_address is not None and self.name != "ray":
            raise UsageError("--ray-address names a Ray cluster: give it with --executor ray")


@dataclass
class RunSetup:
    """How to run a matrix's workers, as opposed to what the matrix is (MatrixSpec); the thresholds
    it is judged by are the pipeline's (``pipeline.RunOptions`` adds them)."""

    results_dir: Path = Path("results")
    run_id: str | None = None
    fresh: bool = False
    fail_on: str = "regression"
    command: str = ""
    progress: bool = True  # False: nothing at all (tests, benchmarks); the CLI always shows progress
    bar: bool = True  # the live bar on a terminal; False (--quiet): the plain lines a log gets
    shard: Shard | None = None  # run only this shard's engine keys (see shard.py); not part of the matrix
    allow_mixed: bool = False  # resume under another vLLM/torch/transformers/GPU than the run began with
    reference: ReferenceOptions = field(default_factory=ReferenceOptions)  # what the judge compares with
    executor: Executor = field(default_factory=Executor)  # where the workers run
    # Engines at once per GPU (None: as many as fit, see plan/packing.py; 1: one after another on a
    # one-GPU machine, as before engines ran side by side)
    max_engines_per_gpu: int | None = None

    def __post_init__(self) -> None:
        self.results_dir = userpath.resolve(self.results_dir, "--results-dir")

    def thresholds_record(self) -> dict[str, Any]:
        """run.json's ``thresholds`` as prepared (scoring writes the ones it judged by): none here,
        ``pipeline.RunOptions`` records its own."""
        return {}


def default_run_id(spec: MatrixSpec) -> str:
    """Same matrix, same run id: rerunning a command resumes it instead of starting over."""
    model = (
        re.sub(r"[^A-Za-z0-9]+", "-", Path(spec.model).name or spec.model).strip("-").lower()[:32] or "model"
    )
    return f"{spec.engine}-{model}-{spec_hash(spec)}"


def visible_gpus() -> int:
    """The GPUs a worker would see (``envinfo.visible_gpu_count``; 0 where unknown)."""
    from cascade_repro.run.envinfo import visible_gpu_count

    return visible_gpu_count() or 0


@dataclass
class PreparedRun:
    """A validated run, not yet on disk: ``write`` it while holding the directory's lock.

    ``run`` is its manifest (run.json's dict form is converted on construction).
    """

    run_dir: Path
    run: Manifest
    records: list[Any]
    fresh: bool
    allow_mixed: bool = False
    # Each prompt's hash as the run's tokenizer renders it (chat.prompt_hash), for prompts.jsonl.
    hashes: list[str] | None = None
    newer: str | None = None  # set by ``write`` where the run resumed was made by a newer version

    def write(self) -> None:
        run_dir = self.run_dir
        if (
            run_dir.is_dir()
            and not (run_dir / layout.RUN_JSON).exists()
            and (theirs := sorted(p.name for p in run_dir.iterdir() if p.name != layout.LOCK))
        ):
            # Not a run (run.json is the first file a run writes): the user's own folder, whose
            # samples/, minimize/ and reports --fresh would delete and a run would overwrite.
            raise UsageError(
                f"{run_dir} is not a cascade-repro run (no {layout.RUN_JSON}) and holds "
                f"{_first_names(theirs)}: choose another --run-id or --results-dir"
            )
        if self.fresh:
            # Whatever the folder holds, run.json or not: samples left beside a lost run.json would
            # otherwise be resumed by the run that was asked to start over.
            safety.clear_derived(run_dir)
        elif (run_dir / layout.RUN_JSON).exists():
            old = manifest.read_manifest(run_dir)
            if old.stored("spec_hash") != self.run.spec_hash:
                raise UsageError(
                    f"{run_dir} holds a different matrix; pass --fresh to start it over or choose another --run-id"
                )
            elif (was := old.shard) != (now := self.run.shard):
                was, now = (f"shard {s}" if s else "the unsharded run" for s in (was, now))
                raise UsageError(f"{run_dir} holds {was} of this matrix, not {now}: one --run-id per shard")
            else:
                self.run = resumed_run(old, self.run, self.allow_mixed)
                self.newer = newer_version_note(old, self.run.tool_version)
        # run.json first: a folder without one was never begun by this tool (see above).
        manifest.write_manifest(run_dir, self.run)
        (run_dir / layout.SAMPLES).mkdir(parents=True, exist_ok=True)
        # With the prompt source's extra columns, and each prompt's hash as this tokenizer renders it.
        layout.write_prompts(run_dir, self.records, self.hashes)


def _first_names(names: list[str]) -> str:
    """``a, b and 3 more``: what a folder holds, in a few words."""
    more = f" and {len(names) - 2} more" if len(names) > 2 else ""
    return ", ".join(names[:2]) + more


# What a comparison must not mix: two of these differing between invocations of one run means its
# cells were generated by two stacks (a cascade cell by one, its flat twin by the other).
STACK_KEYS = ("vllm", "vllm_flash_attn", "torch", "transformers", "gpu_name", "driver")


def stack_of(env: dict[str, Any]) -> dict[str, str]:
    return {k: str(env[k]) for k in STACK_KEYS if env.get(k) not in (None, "")}


def resumed_run(old_m: Manifest, new_m: Manifest, allow_mixed: bool) -> Manifest:
    """run.json for a resume: the first invocation's identity kept, this one appended.

    A resume under another stack (vLLM, torch, transformers, GPU model, driver) would put cells
    generated by two stacks into one comparison: refused unless ``allow_mixed``, and then marked.
    """
    first = old_m.first_invocation()
    was, now = stack_of(first.env or {}), stack_of(new_m.env or {})
    differ = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
    if differ and not allow_mixed:
        what = "; ".join(f"{k} {was.get(k, 'absent')} -> {now.get(k, 'absent')}" for k in differ)
        raise UsageError(
            f"{new_m.run_id} began under another stack ({what}): finishing it here would compare cells "
            "of two stacks; rerun where it began, pass --fresh to start over, or --allow-mixed to mix them"
        )
    out = copy.copy(new_m)
    out.update(
        created_at=old_m.created_at if old_m.has("created_at") else new_m.created_at,
        env=old_m.env if old_m.has("env") else new_m.env,
        invocations=[*(old_m.invocations or [old_m.own_invocation()]), *new_m.invocations],
    )
    if differ or old_m.mixed_stack:
        out.update(mixed_stack=sorted(set(differ) | set(old_m.mixed_stack or [])))
    out.update(timings=copy.deepcopy(old_m.timings))
    if old_m.has("engines"):  # until scoring writes them anew (each record's unknown keys kept)
        out.update(engines=copy.deepcopy(old_m.engines))
    out.keep_unknown(old_m)  # a newer version's keys survive this version's rewrite
    return out


def check_run_id(run_id: str) -> None:
    """Refuse a run id that is not one plain directory name inside the results dir.

    "." and ".." pass the character check but name the results dir itself or its parent (with
    --fresh, that parent's samples/ would be deleted); a leading dot would hide the run. Checked
    before the model loads (and by --dry-run), so the mistake costs nothing.
    """
    if not re.fullmatch(r"[A-Za-z0-9._-]+", run_id) or run_id.startswith("."):
        raise UsageError(f"--run-id {run_id!r}: use letters, digits, '.', '_' and '-', not starting with '.'")
    if len(run_id) > MAX_RUN_ID:  # a folder name: the filesystem refuses one past 255 bytes
        raise UsageError(f"--run-id: at most {MAX_RUN_ID} characters, got {len(run_id):,}")


MAX_RUN_ID = 200


def prepare(spec: MatrixSpec, opts: RunSetup, console: Any = None) -> PreparedRun:
    """Validate everything a user can get wrong and build run.json's content.

    Nothing is written here, so a usage error leaves no half-made run directory behind.
    """
    from cascade_repro.plan.models import (
        EMBEDDED,
        embedded_converted,
        embedded_gguf_path,
        load_tokenizer,
        quiet_progress,
        resolve_model,
    )
    from cascade_repro.prompts.chat import MIN_CASCADE_PREFIX, check_context, measure_prefix
    from cascade_repro.prompts.promptsets import load_prompt_set, load_system_prompt
    from cascade_repro.run import envinfo

    spec.validate()
    run_id = opts.run_id or default_run_id(spec)
    if opts.shard and not opts.run_id:
        run_id += f"-shard{opts.shard.index}of{opts.shard.count}"
    check_run_id(run_id)
    if (file := runlock.not_a_folder(opts.results_dir / run_id)) is not None:
        raise UsageError(f"--results-dir {opts.results_dir}: {file} is a file, not a folder")
    # A Ray cluster's GPUs are counted where its tasks are placed (ray_executor), not on the driver.
    if engine_info(spec.engine).tensor_parallel and opts.executor.name == "local":
        gpus = len(machine_gpus())  # said before the model loads; the packing checks memory later
        if max(spec.tp) > gpus:
            raise UsageError(f"--tp {max(spec.tp)} needs {max(spec.tp)} GPUs, {gpus} visible")
    elif spec.device.startswith("cuda") and opts.executor.name == "local":
        # Said now, not as every cell's error once the engine has started on a machine without one.
        index, gpus = int(spec.device.partition(":")[2] or 0), visible_gpus()
        if index >= gpus:  # nvidia-smi may be absent where CUDA works: torch has the last word
            import torch

            gpus = max(gpus, torch.cuda.device_count())
        if index >= gpus:
            raise UsageError(f"--device {spec.device}: {gpus} CUDA GPU{'s' if gpus != 1 else ''} visible")
    pset = load_prompt_set(spec.prompts, spec.limit, spec.prompt_field, spec.key_field)
    system_text = load_system_prompt(spec.system_prompt)
    # The first conversion of the embedded model takes tens of seconds: one line says what is
    # happening, on a terminal too (its bars were few and late, so the terminal sat silent); in a log
    # the bars themselves are carriage-return noise and stay off.
    plain = not getattr(console, "is_terminal", False) or not opts.bar
    info = engine_info(spec.engine)
    if info.has_weights and spec.model in ("", EMBEDDED):
        embedded_gguf_path()  # a missing model package: its one install line, before anything else is said
        if opts.progress and console is not None and not embedded_converted():
            console.print(
                "converting the embedded model into the user cache (first run only; under a minute, then kept)",
                highlight=False,
            )
    if not info.has_weights:  # the fake: no model to resolve, its own tokenizer
        model_path, model_name, tokenizer = "", f"none ({spec.engine} engine)", info.own_tokenizer()
    else:
        with quiet_progress(not opts.progress or plain):
            model_path, model_name = resolve_model(spec.model)
            tokenizer = load_tokenizer(model_path, spec.trust_remote_code)
    measured = measure_prefix(tokenizer, system_text, pset.records)
    rendered, shared = measured.rendered, measured.tokens
    if info.has_weights and (limit := context_limit_of(spec, model_path, model_name)) is not None:
        check_context(rendered, [r.key for r in pset.records], int(spec.max_tokens), *limit)

    run_dir = opts.results_dir / run_id
    planned = plan(spec, len(pset.records))
    if console is not None:
        for warning in plan_warnings(spec, len(pset.records)):
            console.print(f"[yellow]warning:[/] {markup_escaped(warning)}", highlight=False)
    if opts.shard and console is not None and (warning := empty_warning(planned.engines, opts.shard)):
        console.print(f"[yellow]warning:[/] {markup_escaped(warning)}", highlight=False)
    # Built in code, the manifest writes every field but the optional ones left unset: those set
    # below only where they apply.
    run = Manifest(
        run_id=run_id,
        created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        command=opts.command,
        tool_version=envinfo._version("cascade-repro"),
        tool_source=envinfo.source_info(),  # commit and repository, for the report's install line
        spec_json=spec.to_dict(),
        spec_hash=spec_hash(spec),
        model_path=model_path,
        model_name=model_name,
        prompt_set=PromptSetFacts(
            name=pset.name,
            source=pset.source,
            n=len(pset.records),
            system_prompt=spec.system_prompt,
            system_prompt_text=system_text,
            shared_prefix_tokens=shared,
            prompt_tokens_mean=sum(map(len, rendered)) / len(rendered),
            prompt_tokens_max=max(map(len, rendered)),
            tokenizer=model_name,
            min_cascade_prefix=MIN_CASCADE_PREFIX,
        ),
        # The fake runs on no device: nothing to ask torch (whose import is seconds) about.
        env=envinfo.capture(include_gpu=info.is_vllm or (info.has_weights and spec.device != "cpu")),
        plan=planned,
        arm_switch=spec.arm_switch if engine_info(spec.engine).attention_axes else "shared",
        thresholds=opts.thresholds_record(),
        fail_on=opts.fail_on,
        engines={},
        timings=Timings(),
    )
    if engine_info(spec.engine).is_vllm and (collected := envinfo.vllm_collect_env()) is not None:
        run.vllm_collect_env = collected  # vLLM's bug template asks for exactly this
    if opts.shard:
        run.shard = str(opts.shard)  # the plan stays whole: every shard of a matrix has the same one
    from cascade_repro.run.predictions import predictions_for

    run.predictions = predictions_for(run)  # what vLLM's rule says, shown next to the probe's counts
    if console is not None and (warning := measured.warning()) is not None:
        console.print(f"[yellow]warning:[/] {warning}")
    run.invocations = [run.own_invocation()]
    if opts.executor.name == "local":
        # Said before anything runs: a TP group or an engine that cannot fit this machine's GPUs.
        packing_of(run, opts.max_engines_per_gpu)
    hashes = measured.hashes()
    return PreparedRun(run_dir, run, list(pset.records), opts.fresh, opts.allow_mixed, hashes)


def context_limit_of(spec: MatrixSpec, model_path: str, model_name: str) -> tuple[int, str] | None:
    """``models.context_limit`` for this matrix: vLLM's ``--max-model-len`` and ``--hf-overrides``
    count only where vLLM runs (the hf engine reads neither)."""
    from cascade_repro.plan.models import context_limit

    if engine_info(spec.engine).is_vllm:
        return context_limit(model_path, model_name, spec.max_model_len, spec.hf_overrides)
    return context_limit(model_path, model_name)


def machine_gpus() -> gpu_inventory.Inventory:
    """The GPUs engines are placed on: nvidia-smi's query (or ``CASCADE_REPRO_GPUS``), else a bare
    count (``visible_gpus``) with their memory unknown."""
    inv = gpu_inventory.detect()
    if not inv.gpus and (n := visible_gpus()) > 0:
        inv = gpu_inventory.counted(n, "counted, memory unknown")
    return inv


def packing_of(
    run: Manifest, max_per_gpu: int | None, inventory: gpu_inventory.Inventory | None = None
) -> packings.Packing:
    """How a prepared run's engine keys share this machine (vLLM's: its GPUs, ``machine_gpus``);
    refused in one line (UsageError) where a TP group or one engine cannot fit."""
    placed = engine_info(spec_of(run.spec_json).engine).is_vllm
    none = gpu_inventory.Inventory((), "not placed on GPUs")
    if inventory is None:
        inventory = machine_gpus() if placed else none
    return packings.for_run(run, max_per_gpu, inventory)


def markup_escaped(text: str) -> str:
    """Text for a rich console message: markup escaped, so "[x]" in a path or a key prints as is."""
    from rich.markup import escape

    return escape(text)
