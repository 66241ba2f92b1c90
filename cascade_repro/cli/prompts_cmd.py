"""`cascade-repro prompts list|show`: the shipped prompt sets and their shared-prefix length."""

from __future__ import annotations

from typing import Annotated

import typer

from cascade_repro import exit_codes
from cascade_repro.cli.app import SPEC, Typer, app, out_console, shown, spec_default, user_errors
from cascade_repro.cli.options import KeyField, PromptField, SystemPrompt, Tokenizer, variant

SCHEMA_HELP = (
    "Prompt files: JSON Lines (one object per line; .jsonl or .json), CSV with a header row, parquet, "
    "or a Hub dataset (hf:owner/name[:split]). Fields: `prompt` (required, non-empty text; another "
    "column with --prompt-field), `key` (unique text or integer; else `id`, else file name and row; "
    "another column with --key-field), `instruction_id_list` (IFEval instruction ids) and `kwargs` "
    "(one object per id; in CSV both are JSON text), `lang`. Every other column is kept, as JSON data, "
    "under `extra` in the run's prompts.jsonl. A kwarg of another type than its verifier takes (text, "
    "a whole number, a list of texts) is an error naming the line. Ids with no verifier, and kwargs "
    "no verifier can use, leave their prompts unscored; `prompts show` and the run's report name them."
)

# The system prompt only measures the shared prefix here: what it is for, not what it can be.
MeasuredWith = variant(
    SystemPrompt, help="System prompt to measure the shared prefix with." + spec_default("system_prompt")
)

prompts_app = Typer(
    help="List and inspect prompt sets and system prompts.\n\n" + SCHEMA_HELP, no_args_is_help=True
)
app.add_typer(prompts_app, name="prompts")


def _prefix_tokens(system_prompt: str, prompts: list[str], model: str, keys: list[str] | None = None) -> int:
    """The shared prefix in tokens; with ``keys``, a prompt that leaves no room to generate in the
    model's context is refused (UsageError naming its key)."""
    from cascade_repro.plan.models import context_limit, load_tokenizer, resolve_model
    from cascade_repro.prompts.chat import check_context, measure_prefix
    from cascade_repro.prompts.promptsets import load_system_prompt

    path, name = resolve_model(model)
    measured = measure_prefix(load_tokenizer(path, False), load_system_prompt(system_prompt), prompts)
    if keys is not None and (limit := context_limit(path, name)) is not None:
        check_context(measured.rendered, keys, 0, *limit)  # no --max-tokens here: room for one token
    return measured.tokens


@prompts_app.command("list", panels=False, epilog=exit_codes.epilog("prompts list"))
def list_sets(
    model: Tokenizer = SPEC.model,
    tokens: Annotated[
        bool,
        typer.Option(
            help="Count shared-prefix tokens (loads the tokenizer); `--no-tokens` skips it. [default: on]",
            show_default=False,
        ),
    ] = True,
) -> None:
    """List built-in prompt sets and system prompts with sizes and shared-prefix lengths in tokens."""
    with user_errors():
        from rich.table import Table

        from cascade_repro.prompts.promptsets import BUILTIN_SYSTEM_PROMPTS, list_builtin_sets

        sets = list_builtin_sets()
        table = Table(title="prompt sets")
        for col in ("name", "prompts", "languages", "source"):
            table.add_column(col)
        for s in sets:
            langs = sorted({r.lang for r in s.records if r.lang})
            table.add_row(shown(s.name), str(len(s.records)), shown(",".join(langs)), shown(s.source))
        out_console().print(table)
        sp = Table(title="system prompts (shared prefix with each set's prompts, in tokens)")
        sp.add_column("name")
        for s in sets:
            sp.add_column(s.name)
        for name in BUILTIN_SYSTEM_PROMPTS:
            row = [name]
            for s in sets:
                row.append(str(_prefix_tokens(name, [r.prompt for r in s.records], model)) if tokens else "-")
            sp.add_row(*row)
        out_console().print(sp)


@prompts_app.command(
    "show",
    help="Show a prompt set: size, languages, instruction ids, shared-prefix tokens, first prompts.\n\n"
    + SCHEMA_HELP,
    panels=False,
    epilog=exit_codes.epilog("prompts show"),
)
def show(
    name: Annotated[
        str, typer.Argument(help="A built-in set, a file, or hf:owner/name[:split].", metavar="SET")
    ],
    system_prompt: MeasuredWith = SPEC.system_prompt,
    limit: Annotated[int, typer.Option(help="Prompts to print (the first N).", metavar="N")] = 10,
    all_prompts: Annotated[
        bool, typer.Option("--all", help="Print every prompt of the set (overrides --limit).")
    ] = False,
    model: Tokenizer = SPEC.model,
    prompt_field: PromptField = None,
    key_field: KeyField = None,
) -> None:
    """Show a prompt set: size, languages, instruction ids, shared-prefix tokens, first prompts."""
    with user_errors():
        from collections import Counter

        from rich.table import Table

        from cascade_repro.judge.ifeval.score import unscorable
        from cascade_repro.prompts.chat import MIN_CASCADE_PREFIX
        from cascade_repro.prompts.promptsets import load_prompt_set

        ps = load_prompt_set(name, prompt_field=prompt_field, key_field=key_field)
        console = out_console()
        shared = _prefix_tokens(
            system_prompt, [r.prompt for r in ps.records], model, [r.key for r in ps.records]
        )
        langs = Counter(r.lang or "?" for r in ps.records)
        ids = Counter(i for r in ps.records for i in r.instruction_id_list)
        languages = ", ".join(f"{lang} {n}" for lang, n in langs.most_common())
        # Every text from the set (file, Hub dataset) through shown(): control characters dropped, markup escaped.
        console.print(f"[bold]{shown(ps.name)}[/] ({shown(ps.source)}): {len(ps.records)} prompts, "
                      f"languages: {shown(languages)}")  # fmt: skip
        warn = (
            f"  [yellow](< {MIN_CASCADE_PREFIX}: cascade cannot fire)[/]"
            if shared < MIN_CASCADE_PREFIX
            else ""
        )
        console.print(f"shared prefix with system prompt {shown(repr(system_prompt))}: {shared} tokens{warn}")
        if ids:
            console.print(shown("instructions: " + ", ".join(f"{k} ×{v}" for k, v in ids.most_common())))
        if note := unscorable(ps.records).note():
            console.print(f"[yellow]{shown(note)}[/]")
        if extra := sorted({k for r in ps.records for k in r.extra}):
            console.print(shown("extra columns (kept in the run's prompts.jsonl): " + ", ".join(extra)))
        table = Table()
        for col in ("key", "lang", "instructions", "prompt"):
            table.add_column(col)
        listed = ps.records if all_prompts else ps.records[: max(0, limit)]
        for r in listed:
            table.add_row(
                shown(r.key), shown(r.lang), shown(", ".join(r.instruction_id_list)), shown(r.prompt)
            )
        console.print(table)
        if len(listed) < len(ps.records):
            console.print(
                f"{len(listed)} of {len(ps.records)} prompts shown; `--limit N` shows the first N, `--all` every one."
            )
