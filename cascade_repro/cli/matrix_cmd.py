"""`cascade-repro matrix`: run the cascade-vs-flat matrix and write its reports."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from cascade_repro import exit_codes
from cascade_repro.cli.app import (
    RESULTS_DIR,
    SPEC,
    ShortHelpCommand,
    app,
    as_typed,
    command_line,
    err_console,
    print_summary_json,
    show_all_help,
    spec_default,
    user_errors,
)
from cascade_repro.cli.options import (
    DEBUG,
    ENGINE,
    EXECUTOR_DEFAULT,
    MATRIX,
    OUTPUT,
    PROMPTS,
    RETRIES_DEFAULT,
    THRESHOLDS,
    VERDICTS,
    Alpha,
    Backend,
    Batch,
    Cascade,
    Config,
    DriftMin,
    Engine,
    Executor,
    FailOn,
    FaVersion,
    Fresh,
    HfOverrides,
    Json,
    KeyField,
    Limit,
    MaxEnginesPerGpu,
    MaxTokens,
    MinTopkViolations,
    Model,
    PromptField,
    Prompts,
    Quiet,
    RayAddress,
    Reference,
    ReferenceDevice,
    RepDelta,
    ResultsDir,
    Retries,
    RunId,
    SystemPrompt,
    Tp,
    TrustRemoteCode,
    Twin,
    option,
    variant,
)
from cascade_repro.engines.base import MAX_TOPK
from cascade_repro.plan.matrix import ARM_SWITCHES, FAIL_ON_DEFAULT
from cascade_repro.rundir import layout
from cascade_repro.userpath import display
from cascade_repro.vllm_surface.inject import DEFAULT_LADDER


class MatrixCommand(ShortHelpCommand):
    """`matrix`'s help: the common options first; the rest, and every vLLM flag, under --help-all."""

    rare = frozenset(
        {
            "alpha", "rep_delta", "min_topk_violations", "drift_min", "engine_timeout",
            "graphs_for_batches", "load_format", "hf_overrides", "prompt_field", "key_field", "allow_mixed",
            "run_id", "reference_device", "topk", "arm_switch", "auto_controls", "rerun", "force_cascade",
            "ignore_eos", "device", "trust_remote_code", "engine_args", "seed", "system_prompt",
            "ray_address", "retries", "sampling",
        }
    )  # fmt: skip
    more_help = staticmethod(lambda: _foreign_help())


def _foreign_help() -> list[tuple[str, str, str]]:
    """The panels of vLLM's and lm-eval's spellings: a line each in --help, vLLM's every flag under
    --help-all (from the installed vLLM's EngineArgs, or the recorded release's)."""
    from cascade_repro.plan.engine_args import OWNED, SHORT_FLAGS, flag_of, known_fields

    fields = known_fields()
    flags = [flag_of(n) for n in sorted(fields.kinds) if n not in OWNED]
    short = (
        "Every vLLM engine argument by vLLM's spelling, as vllm serve takes it, the same for both arms "
        "(as -E key=value): --block-size 32, --kv-cache-dtype fp8, -pp 2, -O0, --max-num-seqs N, "
        f"--enable-chunked-prefill, --quantization, ... ({len(flags)} flags; --help-all lists them). "
        "Values are checked against each field's type; the ones the matrix owns are refused with its option."
    )
    full = (
        f"Checked against {fields.where}. Short forms: {', '.join(f'{k} ({flag_of(v)})' for k, v in SHORT_FLAGS.items())}, "
        "-O<n> (the optimization level). A switch takes --no-<flag> to turn it off. "
        "Refused with the option to use: "
        + ", ".join(f"{flag_of(k)} ({v})" for k, v in OWNED.items())
        + ".\n\n"
        + " ".join(flags)
    )
    lm_eval = (
        "lm-eval's spellings: --model_args k=v,... (as -E), --output_path/--output-path/-o DIR (as "
        "--results-dir), --log_samples (every sample is kept anyway), --gen_kwargs max_gen_toks=N "
        "(as --max-tokens; the matrix decodes greedily), --apply_chat_template (always applied). Refused with "
        "the option they mean: --batch_size (--batch), --tasks (--prompts), --model vllm|hf (--engine). "
        "-E gpu_memory_utilization / max_model_len are --gpu-memory-utilization / --max-model-len: given "
        "both ways with different values, refused."
    )
    return [("vLLM engine flags", short, full), ("lm-eval spellings", lm_eval, lm_eval)]


# matrix's own options (the shared ones are cli/options.py's), each as an alias so the command reads
# as the list of what it takes.
HelpAll = Annotated[
    bool,
    typer.Option(
        "--help-all",
        help="Show every option, each text in full, and every vLLM engine flag.",
        is_eager=True,
        callback=show_all_help,
    ),
]

Seed = Annotated[
    str | None,
    option(
        "Seeds, comma-separated (an axis; greedy decoding makes them matter only for engine state)."
        + spec_default("seeds"),
        MATRIX,
        metavar="SEEDS",
    ),
]

Dtype = Annotated[
    str | None,
    option(
        "Dtypes, comma-separated: auto, float32, float16, bfloat16, or vLLM's names half, float, bf16 (auto: float32 on CPU, bfloat16 on GPU / the model's for vLLM)."
        + spec_default("dtypes"),
        MATRIX,
        metavar="DTYPES",
    ),
]

Rerun = Annotated[
    bool | None,
    option(
        "Also run every flat cell a second time. Inside one engine a rerun is bitwise identical, so it is shown but never used as a noise floor; under `--arm-switch restart` it runs in an engine start of its own and is one."
        + spec_default("rerun"),
        MATRIX,
    ),
]

AutoControls = Annotated[
    bool | None,
    option(
        "Add the noise controls a pair needs when the matrix lacks them: a flat cell a factor 8 away (B/8, or 8B below batch 8) when only one batch size is given; under `--arm-switch restart`, a flat rerun in a third engine start. `--no-auto-controls` leaves such pairs `inconclusive` (exit 5)."
        + spec_default("auto_controls"),
        MATRIX,
    ),
]

DryRun = Annotated[
    bool,
    option(
        "Print the cell table and the number of engine starts, run nothing. Also where and when each "
        "engine key would run side by side (its GPUs, its turn, the memory it gets: see "
        "--max-engines-per-gpu) and the expected wall time; with --json, all of it as one JSON object "
        "on stdout.",
        MATRIX,
        "--dry-run",
    ),
]

MatrixJson = variant(
    Json,
    help='Print the outcome on stdout as one JSON object: {"run_dir", "exit_code", "summary"}, where '
    "summary is the summary.json written (its JSON Schema ships in the package as "
    "cascade_repro/report/summary.schema.json; null where nothing was scored). Messages stay on stderr. "
    "With --dry-run: the plan instead (cells, engine keys with their GPUs and turns, packing, estimate).",
)

IgnoreEos = Annotated[
    bool | None,
    option(
        "Generate --max-tokens for every request even past its end-of-sequence token, so every decode step of a wave keeps its batch size (FA2's split-KV band needs full batches and long own parts; see `explain`)."
        + spec_default("ignore_eos"),
        PROMPTS,
    ),
]

ForceCascade = Annotated[
    bool | None,
    option(
        "vLLM: the cascade arm takes cascade on every decode step vLLM's hard conditions allow (prefix >= 256 tokens, >= 8 requests), overriding its cost model, to measure what cascade costs where the heuristic declines it."
        + spec_default("force_cascade"),
        PROMPTS,
    ),
]

Topk = Annotated[
    int | None,
    option(
        f"Top-k logprobs kept per step, for vLLM's check_logprobs_close rule (1 to {MAX_TOPK})."
        + spec_default("topk"),
        PROMPTS,
        metavar="K",
    ),
]

ArmSwitch = Annotated[
    str | None,
    option(
        "vLLM: `toggle` serves both arms from one engine by forcing the cascade decision off for the flat arm (halves engine starts); `restart` starts one engine per arm with disable_cascade_attn. The hf engine always serves both arms from one model: its run.json and report say `shared`."
        + spec_default("arm_switch"),
        ENGINE,
        metavar="|".join(ARM_SWITCHES),
    ),
]

EnforceEager = Annotated[
    bool | None,
    option("vLLM: disable CUDA graphs (slower, simpler)." + spec_default("enforce_eager"), ENGINE),
]

GraphsForBatches = Annotated[
    bool | None,
    option(
        "vLLM: capture CUDA graphs only for the matrix's batch sizes (a cold engine starts minutes sooner; vLLM's default captures ~50 sizes)."
        + spec_default("graphs_for_batches"),
        ENGINE,
    ),
]

LoadFormat = Annotated[
    str | None,
    option(
        "vLLM load format; `dummy` runs random weights (with --hf-overrides, to reshape heads for TP tests)."
        + spec_default("load_format"),
        ENGINE,
        metavar="FORMAT",
    ),
]

EngineArgs = Annotated[
    str | None,
    option(
        'Any other vLLM engine arguments as a JSON object, the same for both arms, e.g. \'{"block_size": 32, "kv_cache_dtype": "fp8"}\'. Checked against the installed vLLM\'s EngineArgs; the ones the harness owns (tensor_parallel_size, seed, dtype, attention_config, disable_cascade_attn) or that break the experiment (enable_prefix_caching=false, max_num_seqs below the largest batch) are refused with the option to use. [default: none]',
        ENGINE,
        metavar="JSON",
    ),
]

EngineArg = Annotated[
    list[str] | None,
    option(
        "One vLLM engine argument as key=value (repeatable; values read as JSON when they can be), e.g. -E block_size=32 -E enable_chunked_prefill=false. Wins over --engine-args.",
        ENGINE,
        "-E",
        "--engine-arg",
        metavar="KEY=VALUE",
    ),
]

Sampling = Annotated[
    list[str] | None,
    option(
        "A sampling penalty every arm's requests carry, as key=value (repeatable): repetition_penalty, frequency_penalty or presence_penalty, e.g. --sampling repetition_penalty=1.3. Decoding stays greedy; vLLM returns the logprobs after the penalty (logprobs_mode=processed_logprobs) and the reference pass applies the same penalty to its logits, so both score what the token was chosen from. vLLM only. [default: none]",
        ENGINE,
        "--sampling",
        metavar="KEY=VALUE",
    ),
]

MaxModelLen = Annotated[
    int | None,
    option("vLLM max_model_len. [default: prompt + max tokens, rounded up]", ENGINE, metavar="N"),
]

GpuMemoryUtilization = Annotated[
    float | None,
    option(
        f"vLLM gpu_memory_utilization, in (0, 1]. [default: {as_typed(SPEC.gpu_memory_utilization)}, not vLLM's 0.9: a small model's waves need little, and the GPU stays usable for others]",
        ENGINE,
        metavar="FRACTION",
    ),
]

EngineTimeout = Annotated[
    float | None,
    option(
        "Seconds a worker may go without progress before it is killed and its unfinished cells marked error."
        + spec_default("engine_timeout"),
        ENGINE,
        metavar="SECONDS",
    ),
]

Device = Annotated[
    str | None,
    option("hf engine device: auto, cpu, cuda." + spec_default("device"), ENGINE, metavar="auto|cpu|cuda"),
]

AllowMixed = Annotated[
    bool,
    option(
        "Resume a run that began under another vLLM, torch, transformers, GPU model or driver (refused otherwise: its cells would come from two stacks); the report's headline then says so.",
        OUTPUT,
        "--allow-mixed",
    ),
]

Shard = Annotated[
    str | None,
    option(
        "Run only shard I of N (1-based, e.g. `1/2`): whole engine keys, split deterministically so every machine given the same matrix picks a disjoint part. Combine the shard directories with `cascade-repro merge`. [default: the whole matrix]",
        OUTPUT,
        metavar="I/N",
    ),
]

Calibrate = Annotated[
    str | None,
    option(
        "Measure detection power: beside every clean cascade cell, run cascade cells with the prefix LSE shifted by each X of this ladder (nats, comma-separated, or `default` = "
        + as_typed(DEFAULT_LADDER)
        + "). The report states the smallest X this setup flags; calibration pairs never change the exit code. [default: not calibrated]",
        VERDICTS,
        metavar="NATS",
    ),
]

Inject = Annotated[
    str | None,
    option(
        "Fault injection in the cascade arm: `lse-layout` reads the suffix LSE transposed (the FA2 split-KV bug class); `lse-shift=X` adds X nats to the prefix LSE in the merge (graded). A positive control: the harness must flag it. [default: none]",
        DEBUG,
        metavar="FAULT",
    ),
]


@app.command(
    cls=MatrixCommand,
    epilog=exit_codes.epilog("matrix"),
    # vLLM's engine flags and lm-eval's spellings arrive as ctx.args, read by plan/flags.read_foreign
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
def matrix(
    ctx: typer.Context,
    help_all: HelpAll = False,
    engine: Engine = None,
    model: Model = None,
    tp: Tp = None,
    batch: Batch = None,
    twin: Twin = None,
    cascade: Cascade = None,
    seed: Seed = None,
    dtype: Dtype = None,
    fa_version: FaVersion = None,
    backend: Backend = None,
    rerun: Rerun = None,
    auto_controls: AutoControls = None,
    config: Config = None,
    dry_run: DryRun = False,
    prompts: Prompts = None,
    system_prompt: SystemPrompt = None,
    limit: Limit = None,
    prompt_field: PromptField = None,
    key_field: KeyField = None,
    max_tokens: MaxTokens = None,
    ignore_eos: IgnoreEos = None,
    force_cascade: ForceCascade = None,
    topk: Topk = None,
    arm_switch: ArmSwitch = None,
    enforce_eager: EnforceEager = None,
    graphs_for_batches: GraphsForBatches = None,
    load_format: LoadFormat = None,
    hf_overrides: HfOverrides = None,
    engine_args: EngineArgs = None,
    engine_arg: EngineArg = None,
    sampling: Sampling = None,
    max_model_len: MaxModelLen = None,
    gpu_memory_utilization: GpuMemoryUtilization = None,
    trust_remote_code: TrustRemoteCode = None,
    engine_timeout: EngineTimeout = None,
    device: Device = None,
    results_dir: ResultsDir = RESULTS_DIR,
    run_id: RunId = None,
    fresh: Fresh = False,
    allow_mixed: AllowMixed = False,
    fail_on: FailOn = FAIL_ON_DEFAULT,
    quiet: Quiet = False,
    json_out: MatrixJson = False,
    shard: Shard = None,
    executor: Executor = EXECUTOR_DEFAULT,
    max_engines_per_gpu: MaxEnginesPerGpu = None,
    ray_address: RayAddress = None,
    retries: Retries = RETRIES_DEFAULT,
    alpha: Alpha = THRESHOLDS.alpha,
    rep_delta: RepDelta = THRESHOLDS.rep_delta,
    min_topk_violations: MinTopkViolations = THRESHOLDS.min_topk_violations,
    drift_min: DriftMin = THRESHOLDS.drift_min,
    reference: Reference = "auto",
    reference_device: ReferenceDevice = "auto",
    calibrate: Calibrate = None,
    inject: Inject = None,
) -> None:
    """Run prompts through tp x batch x cascade on/off (and more axes) and judge every cascade cell.

    Each cascade cell is compared with its flat twin (same everything, cascade off) and judged
    against a noise control that is a different-but-equivalent computation: flat at batch B vs flat
    at another batch (added by the planner when the matrix has one batch size), or under
    `--arm-switch restart` a flat rerun in another engine start. A pair is a `regression` when its
    error against a more precise reference computation of the same model (--reference) exceeds
    its twin's beyond chance and beyond what this run's own flat-vs-flat controls show. With
    --reference off, when its logprob drift on agreeing tokens exceeds the control's beyond the
    permutation null and --drift-min, or when divergence counts, top-k violations or repetition
    exceed the noise floor. Verdicts: `not exercised`, `identical`, `within noise`, `regression`, `inconclusive`.

    Examples:

        cascade-repro matrix --dry-run

        cascade-repro matrix --engine hf --batch 1,8,16 --max-tokens 64 --limit 16

        cascade-repro matrix --limit 8 --inject lse-layout --results-dir /tmp/r

        cascade-repro matrix --engine vllm --batch 8,64,128 --calibrate default
    """
    given = {k: v for k, v in locals().items() if k != "ctx"}
    with user_errors():
        from cascade_repro.plan.flags import MatrixOptions
        from cascade_repro.plan.models import check_cache_root

        check_cache_root()  # said now, not after the plan's table
        request = MatrixOptions.from_cli(
            given,
            defaulted=lambda name: _defaulted(ctx, name),
            extra=ctx.args,
            ours=_own_flags(ctx),
            results_dir_typed=getattr(ctx.get_parameter_source("results_dir"), "name", "") == "COMMANDLINE",
            on_note=lambda note: _say("note", note),
            gpus=_gpu_count,
        )
        from cascade_repro.pipeline import RunOptions, run_matrix

        opts = RunOptions.from_settings(request.settings, fresh=request.fresh, command=command_line())
        _check_box(request)
        if request.dry_run:
            from cascade_repro.cli.matrix_plan import dry_run

            dry_run(request, opts)
            return
        console = err_console()
        outcome = run_matrix(request.spec, opts, console)
    _print_outcome(outcome, console)
    if request.json_out:
        print_summary_json(outcome.run_dir, outcome.exit_code)
    raise typer.Exit(outcome.exit_code)


def _gpu_count() -> int | None:
    """The GPUs a worker would see (``--twin all`` tests ``tp`` only where they are enough)."""
    from cascade_repro.run.envinfo import visible_gpu_count

    return visible_gpu_count()


def _say(kind: str, line: str) -> None:
    """A line on stderr as ``kind: line``, printed as is (no markup, no highlighting)."""
    err_console().print(f"{kind}: {line}", highlight=False, markup=False)


def _check_box(request: Any) -> None:
    """A vLLM matrix: what this box refuses (exit code by ``judge.outcome.refusal_status``), or warns
    and notes of it."""
    from cascade_repro.engines import get as engine_info

    if not engine_info(request.spec.engine).is_vllm:
        return
    from cascade_repro import vllm_surface
    from cascade_repro.judge.outcome import refusal_status
    from cascade_repro.run.envinfo import visible_gpu_count

    check = request.check_vllm(vllm_surface.installed_version(), visible_gpu_count(), command_line())
    if check.refusal is not None:
        _say("error", check.refusal)
        raise typer.Exit(refusal_status(check))
    for line in check.warnings:
        _say("warning", line)
    for line in check.notes:
        _say("note", line)


def _own_flags(ctx: Any) -> list[str]:
    """Every flag the command declares (its suggestions for a mistyped one)."""
    return [o for p in ctx.command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")]


def _defaulted(ctx: Any, name: str) -> bool:
    """True when option ``name`` was given neither on the command line nor by its environment variable."""
    source = ctx.get_parameter_source(name)
    return source is None or source.name in ("DEFAULT", "DEFAULT_MAP")


def _print_outcome(outcome: Any, console: Any) -> None:
    """Summary on stderr: the headline, why the exit code, errors, where the reports are."""
    from cascade_repro.cli.app import print_outcome

    if not outcome.headline:  # an empty shard scores nothing
        console.print("[bold green]no cells in this shard[/]", highlight=False)
    else:
        print_outcome(console, outcome.headline, outcome.exit_code, outcome.reason)
    for e in outcome.errors:
        console.print(f"[red]error[/] {escape(e)}", highlight=False)
    # Paths and cell errors are data: printed without markup ("[x]" in a path is no style tag).
    if not (outcome.run_dir / layout.REPORT_MD).exists():  # an empty shard scores nothing
        console.print(f"run: {outcome.run_dir}", highlight=False, markup=False)
        return
    console.print(
        f"report: {display(outcome.run_dir / layout.REPORT_MD)}  (html: {display(outcome.run_dir / layout.REPORT_HTML)})",
        highlight=False,
        markup=False,
    )
