"""`cascade-repro explain`: will cascade attention fire in each planned cell? Decided before any GPU time."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cascade_repro import exit_codes
from cascade_repro.cli.app import (
    RESULTS_DIR,
    app,
    command_line,
    default,
    out_console,
    spec_default,
    user_errors,
)
from cascade_repro.cli.options import (
    GPU,
    MATRIX,
    MEASURE,
    Backend,
    Batch,
    Cascade,
    Config,
    Engine,
    FaVersion,
    Fresh,
    HfOverrides,
    Json,
    Limit,
    MaxTokens,
    Model,
    Prompts,
    ResultsDir,
    RunId,
    SystemPrompt,
    Tp,
    TrustRemoteCode,
    Twin,
    option,
    variant,
)
from cascade_repro.twin import CASCADE as TWIN

ENGINE = "vllm"  # explain's engine when neither a flag nor the TOML file names one (matrix's is hf)
BLOCK_SIZE, DCP = 16, 1

# `matrix`'s options in explain's panels: what would run is all under Matrix, the run directory
# under Measure. Where explain means something else, its own words.
ExplainModel = variant(Model, rich_help_panel=MATRIX)
ExplainPrompts = variant(Prompts, rich_help_panel=MATRIX)
ExplainSystemPrompt = variant(SystemPrompt, rich_help_panel=MATRIX)
ExplainLimit = variant(Limit, rich_help_panel=MATRIX)
ExplainTrustRemoteCode = variant(
    TrustRemoteCode,
    help="Allow model code from the Hub (tokenizer)." + spec_default("trust_remote_code"),
    rich_help_panel=MATRIX,
)
# The matrix's axes, declared once (options.py), in explain's words: what each means for a prediction.
ExplainTp = variant(Tp, help="Tensor-parallel sizes, comma-separated." + spec_default("tp"))
ExplainBatch = variant(
    Batch, help="Batch sizes (concurrent requests per wave), comma-separated." + spec_default("batch")
)
ExplainCascade = variant(
    Cascade, help="Cascade arms, as for `matrix` (flat cells never fire)." + spec_default(TWIN.spec_field)
)
ExplainBackend = variant(
    Backend, help="vLLM attention backends (only FLASH_ATTN has cascade)." + spec_default("backends")
)
ExplainFaVersion = variant(
    FaVersion,
    help="FlashAttention versions, as for `matrix`: default, 2, 3, 4 (only FA2 had the split-KV LSE bug; "
    "vLLM's default is FA3 on Hopper)." + spec_default("fa_versions"),
)
ExplainHfOverrides = variant(
    HfOverrides,
    help="JSON object of config overrides, as for `matrix`, e.g. '{\"num_key_value_heads\": 1}'. [default: none]",
    rich_help_panel=MATRIX,
)
ExplainConfig = variant(
    Config, help="Matrix TOML file (the same one `matrix --config` reads; flags here win)."
)
ExplainMaxTokens = variant(
    MaxTokens,
    help="Tokens generated per prompt: with the question, how long a request's own part gets (FA2's "
    "split-KV band depends on it)." + spec_default("max_tokens"),
    rich_help_panel=MATRIX,
)
# The engine whose decision is predicted: its own default, and no env var (that one picks what runs).
ExplainEngine = variant(
    Engine,
    help="Engine whose decision to predict: `vllm` (vLLM's rule with its cost model) or `hf` (hard "
    "conditions only)." + default(ENGINE),
    envvar=None,
)
ExplainJson = variant(Json, help="Print JSON instead of tables.")
MeasureResultsDir = variant(ResultsDir, rich_help_panel=MEASURE)
MeasureFresh = variant(Fresh, rich_help_panel=MEASURE)
# The sweep derives its own matrix: matrix's example run id would not be its.
MeasureRunId = variant(
    RunId,
    help="Run id of the --measure run. [default: derived from the matrix, so reruns resume]",
    rich_help_panel=MEASURE,
)


@app.command(epilog=exit_codes.epilog("explain"))
def explain(
    engine: ExplainEngine = None,
    model: ExplainModel = None,
    tp: ExplainTp = None,
    batch: ExplainBatch = None,
    twin: Twin = None,
    cascade: ExplainCascade = None,
    backend: ExplainBackend = None,
    fa_version: ExplainFaVersion = None,
    hf_overrides: ExplainHfOverrides = None,
    config: ExplainConfig = None,
    prompts: ExplainPrompts = None,
    system_prompt: ExplainSystemPrompt = None,
    limit: ExplainLimit = None,
    max_tokens: ExplainMaxTokens = None,
    trust_remote_code: ExplainTrustRemoteCode = None,
    prefix_tokens: Annotated[
        int | None,
        option(
            "Shared prefix length in tokens; skips tokenizing the prompts. [default: measured]",
            MATRIX,
            metavar="N",
        ),
    ] = None,
    gpu: Annotated[
        str | None,
        option(
            "GPU by name when none is visible here: H200, H100 (SXM), H100-PCIe, A100, L40S, L4, A10, RTX4090. "
            "[default: the visible GPU]",
            GPU,
            metavar="NAME",
        ),
    ] = None,
    sm_count: Annotated[
        int | None, option("Multiprocessor count (wins over --gpu and detection).", GPU, metavar="N")
    ] = None,
    block_size: Annotated[
        int,
        option(
            "KV-cache block size: the prefix is rounded down to it." + default(BLOCK_SIZE), GPU, metavar="N"
        ),
    ] = BLOCK_SIZE,
    dcp: Annotated[
        int, option("Decode-context-parallel size (> 1 disables cascade)." + default(DCP), GPU, metavar="N")
    ] = DCP,
    json_out: ExplainJson = False,
    measure: Annotated[
        bool,
        option(
            "Measure where cascade pays (vLLM #15647): run a matrix on this GPU over batch sizes around "
            "the heuristic's decode threshold (half to three times it, unless --batch), FA2 and FA3 "
            "(unless --fa-version), cascade forced on every decode step vLLM's hard conditions allow, "
            "128 tokens per request decoded to the end; print each batch's decode speed of cascade vs flat "
            "beside the cost model's numbers, and write sweep.md (a table to paste into the issue) into "
            "the run directory. Minutes of GPU time; rerunning resumes.",
            MEASURE,
            "--measure",
        ),
    ] = False,
    results_dir: MeasureResultsDir = RESULTS_DIR,
    run_id: MeasureRunId = None,
    fresh: MeasureFresh = False,
) -> None:
    """Predict, per planned cell, whether vLLM's cascade attention fires on prefill and on decode steps.

    Uses vLLM's own `use_cascade_attention` when vLLM is importable, else a line-by-line port of
    vLLM 0.26's rule (flash_attn.py): shared prefix >= 256 tokens (block-aligned), >= 8 requests in
    the step, no ALiBi / sliding window / chunked local attention / decode context parallelism;
    decode-only steps of a GQA model then go through a cost model (cascade vs flash-decoding CTAs
    on the GPU's SMs). Prints, per TP, the number of concurrent requests from which decode steps
    choose cascade, and the band of request counts whose decode steps would run cascade through
    FA2's split-KV path (FA2's own num_splits_heuristic, ported): where the field bug of vLLM <= 0.11.0
    bites. The band moves with TP (KV heads per GPU) and needs long own parts (question + generated
    tokens): set --max-tokens as the matrix will.

    Examples:

        cascade-repro explain --gpu H200 --batch 8,32,64,128

        cascade-repro explain --gpu H200 --batch 32,48,56,64,96 --max-tokens 1024

        cascade-repro explain --tp 1,3 --sm-count 108 --prefix-tokens 1597

        cascade-repro explain --measure --limit 64      # on a GPU box with vLLM: the #15647 sweep
    """
    import json

    flags = dict(locals())
    with user_errors():
        from cascade_repro.explain import explain_spec, threshold_lines
        from cascade_repro.plan.flags import spec_from_cli

        if measure:
            from cascade_repro.sweep import require_vllm

            require_vllm()
        asked = spec_from_cli(flags, config, engine=ENGINE, fields=_SPEC_FIELDS)
        spec, values = asked.spec, asked.values
        ex = explain_spec(
            spec,
            gpu=gpu,
            sm_count=sm_count,
            block_size=block_size,
            dcp_world_size=dcp,
            prefix_tokens=prefix_tokens,
        )
    if measure:
        _measure(ex, values, flags, asked.file_keys, results_dir, run_id, fresh, json_out)
        return
    if json_out:
        typer.echo(json.dumps(ex.to_dict(), indent=2, ensure_ascii=False))
        return
    if ex.twin_cells:
        from cascade_repro.explain import twin_lines

        for line in twin_lines(ex):
            typer.echo(line)
        return
    _print(ex, threshold_lines(ex))


# explain's flags that set a sweep value (the sweep's own default applies to the others).
_SWEEP_GIVEN = {
    "batch": "batch",
    "fa_version": "fa_versions",
    TWIN.spec_field: TWIN.spec_field,
    "max_tokens": "max_tokens",
}


def _measure(ex: Any, values: dict[str, Any], flags: dict[str, Any], config_keys: frozenset[str], results_dir: Path,
             run_id: str | None, fresh: bool, json_out: bool) -> None:  # fmt: skip
    import json

    from rich.markup import escape

    from cascade_repro.pipeline import RunOptions
    from cascade_repro.plan.matrix import MatrixSpec
    from cascade_repro.rundir import layout
    from cascade_repro.sweep import as_dict, measure, summary_lines, sweep_values, table

    console = out_console(stderr=True)
    with user_errors():
        tps = sorted(ex.thresholds)
        threshold = ex.thresholds[tps[0]].get("decode_from_batch") if tps else None
        given = config_keys | {field for flag, field in _SWEEP_GIVEN.items() if flags.get(flag) is not None}
        spec = MatrixSpec.from_dict(sweep_values(values, threshold, given), source="options")
        opts = RunOptions(results_dir=results_dir, run_id=run_id, fresh=fresh, fail_on="never",
                          command=command_line())  # fmt: skip
        console.print(
            f"measuring: batch {','.join(map(str, spec.batch))} x FA {','.join(str(v or 'default') for v in spec.fa_versions)}"
            f" x cascade on/off ({'forced' if spec.force_cascade else 'as the heuristic chooses'}), "
            f"{spec.max_tokens} tokens per request; the heuristic's decode threshold here: "
            f"{threshold if threshold is not None else 'none in range'}",
            highlight=False,
        )
        outcome, rows, _ = measure(spec, opts, console)
    if json_out:
        typer.echo(json.dumps({"run_dir": str(outcome.run_dir), "rows": as_dict(rows)}, indent=2))
        return
    from rich.table import Table

    headers, body = table(rows)
    t = Table(title="cascade vs flat, decode steps")
    for h in headers:
        t.add_column(h, overflow="fold")
    for row in body:
        t.add_row(*(escape(c) for c in row))
    out = out_console()
    out.print(t)
    for line in summary_lines(rows):
        out.print(escape(line), highlight=False)
    out.print(
        f"wrote {escape(str(layout.sweep_path(outcome.run_dir)))} (Markdown, ready to paste)",
        highlight=False,
    )


# The spec fields a matrix TOML file sets for `explain` (its other keys are matrix's alone).
_SPEC_FIELDS = (
    "engine", "model", "prompts", "system_prompt", "limit", "prompt_field", "key_field", "tp", "batch", TWIN.spec_field, "seeds",
    "dtypes", "fa_versions",
    "backends", "rerun", "hf_overrides", "trust_remote_code", "max_tokens", "twin", "graphs_for_batches",
)  # fmt: skip


def _yes(v: bool | None) -> str:
    return "?" if v is None else ("[green]yes[/]" if v else "no")


NARROW = 120  # columns below which explain's table leaves its reasons to lines under it


def _print(ex: Any, lines: list[str]) -> None:
    from rich.markup import escape
    from rich.table import Table

    console = out_console()
    a = ex.attention
    console.print(
        f"model: {escape(ex.model)}  ({a.num_attention_heads} query heads, {a.num_kv_heads} KV heads)"
    )
    if a.notes:
        console.print(f"attention: {escape('; '.join(a.notes))}")
    console.print(
        f"shared prefix: {ex.shared_prefix_tokens} tokens -> {ex.prefix_tokens} after rounding down to "
        f"block size {ex.block_size}"
    )
    from cascade_repro.engines import get as engine_info

    if engine_info(ex.engine).cost_model:
        console.print(f"SMs: {ex.num_sms if ex.num_sms is not None else '?'} ({escape(ex.sms_source)})")
    console.print(f"rule: {escape(ex.rule_source)}")
    if engine_info(ex.engine).is_vllm:
        from cascade_repro import vllm_surface

        if note := vllm_surface.cascade_note(vllm_surface.installed_version()):
            console.print(f"note: {escape(note)}", highlight=False)
    for line in lines:
        console.print(f"[bold]{escape(line)}[/]")
    table = Table(title=f"cascade predictions ({ex.engine})")
    # Under 120 columns the reasons go below the table, one line per cell: in a column they fold
    # into rows of 6 to 10 lines at 80 columns.
    narrow = console.width < NARROW
    cols = ("cell", "prefill", "decode", "FA2 split-KV") if narrow else (
        "cell", "tp", "batch", "heads q/kv per GPU", "prefill", "decode", "why (decode)", "FA2 split-KV",
    )  # fmt: skip
    for col in cols:
        table.add_column(col, overflow="fold", no_wrap=col == "cell")
    flat = 0
    reasons: list[str] = []
    for c in ex.cells:
        if c.arm != TWIN.test:
            flat += 1
            continue
        why = c.decode_reason + (f" [{'; '.join(c.notes)}]" if c.notes else "")
        if narrow:
            table.add_row(escape(c.cell_id), _yes(c.prefill), _yes(c.decode), _yes(c.fa2_split))
            split = f"; FA2 split-KV: {c.fa2_split_reason}" if c.fa2_split_reason else ""
            reasons.append(
                f"{c.cell_id} (tp {c.tp}, batch {c.batch}, heads {c.q_heads}/{c.kv_heads}): {why}{split}"
            )
            continue
        table.add_row(
            escape(c.cell_id), str(c.tp), str(c.batch), f"{c.q_heads}/{c.kv_heads}", _yes(c.prefill),
            _yes(c.decode), escape(why),
            f"{_yes(c.fa2_split)}: {escape(c.fa2_split_reason)}" if c.fa2_split_reason else _yes(c.fa2_split),
        )  # fmt: skip
    console.print(table)
    for line in reasons:
        console.print(escape(line), highlight=False)
    if flat:
        console.print(f"{flat} flat cell{'s' if flat != 1 else ''}: cascade disabled, never fires")
    console.print(
        "Decode steps: as requests finish, fewer remain in each step; below the threshold above "
        "they stop choosing cascade."
    )
