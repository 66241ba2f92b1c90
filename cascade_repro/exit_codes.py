"""Every exit code of every command, declared once.

The README's exit-code table and each command's ``--help`` epilog are rendered from :data:`TABLE`
(``tests/test_docs.py`` holds the README to it), and the constants below are the values the code
exits with. A code means one thing across the tool, so a CI script can branch on it without knowing
which command ran; 1 is only ever a finding (a regression, a kernel mismatch), never a crash or a box
that cannot run the test. Standard library only: it imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass

OK = 0
REGRESSION = 1
USAGE = 2
NOT_REPRODUCED = 3
NOTHING_EXERCISED = 4
INCONCLUSIVE = 5
MACHINE_REFUSED = 6
# sysexits.h's EX_UNAVAILABLE, beside EX_SOFTWARE's 70: what is missing is on the box (vLLM, a GPU,
# a cascade that can fire), not in the command line or the tool.
CANNOT_RUN = 69
INTERNAL = 70  # sysexits.h's EX_SOFTWARE: a bug in the tool, not in the run or the command line
INTERRUPTED = 130
BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool that SIGPIPE ended

# The commands by their path as typed after `cascade-repro`.
COMMANDS = (
    "matrix", "report", "merge", "explain", "doctor", "minimize", "kernel", "prompts list", "prompts show", "env",
)  # fmt: skip
SCORED = ("matrix", "report", "merge")  # the commands whose code is a run's outcome (report/outcome.py)


@dataclass(frozen=True)
class ExitCode:
    """One code for a set of commands: ``meaning`` for the README (Markdown), ``brief`` for --help."""

    code: int
    commands: tuple[str, ...]
    meaning: str
    brief: str


TABLE: tuple[ExitCode, ...] = (
    ExitCode(
        OK, COMMANDS,
        "success; for a scored run: clean (`--fail-on never` always exits 0); for `doctor`: no check "
        "fails (warnings allowed)",
        "success",
    ),
    ExitCode(
        REGRESSION, SCORED,
        "regression (see `--fail-on`), or every cascade pair errored: nothing measured must not pass a CI guard",
        "regression (per --fail-on), or every cascade pair errored",
    ),
    ExitCode(
        REGRESSION, ("kernel",),
        "a kernel case is outside tolerance or errored, no case ran, or the run did not finish",
        "a case is outside tolerance or errored, no case ran, or the run did not finish",
    ),
    ExitCode(
        USAGE, COMMANDS,
        "usage error: a bad flag, file or record, in one line (a damaged `run.json` too, naming its "
        "section); for `merge` also a missing shard (`--allow-partial` merges without it); for "
        "`report --rescore` also new tables that would lose what the old ones hold (nothing written; "
        "`--allow-loss` writes them); for `kernel` also no CUDA GPU or no vLLM",
        "usage error, in one line",
    ),
    ExitCode(
        NOT_REPRODUCED, ("minimize",),
        "the pair's fault did not reproduce on this engine (only `minimized.json` is written)",
        "the fault did not reproduce (only minimized.json written)",
    ),
    ExitCode(
        NOTHING_EXERCISED, SCORED,
        "nothing exercised: cascade never fired in any pair (batch sizes under 8, a short prefix, or a "
        "vLLM that leaves cascade off or has none; the line says which), or it fired on prefill steps only in "
        "every exercised pair: not tested in decode, where the field bug lived",
        "nothing exercised (cascade never fired in any pair, or on prefill steps only: not tested in decode)",
    ),
    ExitCode(
        INCONCLUSIVE, SCORED,
        "inconclusive: no noise control, or the run is not finished (`report` of a cut run)",
        "inconclusive (no noise control, or the run is not finished)",
    ),
    ExitCode(
        MACHINE_REFUSED, tuple(c for c in COMMANDS if c != "env"),
        "the machine refused: a permission, a full disk, an I/O error; one line names the path, and "
        "what was written stays whole",
        "the machine refused (a permission, a full disk, an I/O error: one line names the path)",
    ),
    ExitCode(
        CANNOT_RUN, ("doctor",),
        "this box cannot run the GPU matrix: a check failed (no vLLM, no CUDA GPU, a vLLM without "
        "cascade, a model cascade cannot fire on, ...); each failing row says the fix",
        "this box cannot run the GPU matrix (a check failed; its row says the fix)",
    ),
    ExitCode(
        INTERNAL, COMMANDS,
        "internal error: a bug in cascade-repro, said in one line (`--debug` before the command, as in "
        "`cascade-repro --debug report results/<run-id>`, or `CASCADE_REPRO_DEBUG=1` prints the "
        "traceback instead); never 1, so a crash cannot read as a regression",
        "internal error (a bug: `cascade-repro --debug` shows its traceback)",
    ),
    ExitCode(
        INTERRUPTED, COMMANDS,
        "interrupted (Ctrl-C, SIGTERM from `timeout` or a cancelled CI job, or SIGHUP from a closed terminal, in any phase): rerun the "
        "same command to resume",
        "interrupted",
    ),
    ExitCode(
        BROKEN_PIPE, COMMANDS,
        "a pipe closed early (`\\| head -1`, SIGPIPE), or standard output closed before the command started "
        "(`>&-`) while it had something to print: the command ends quietly, as any Unix tool does on "
        "SIGPIPE, never as 0 or 1",
        "a pipe closed early (`| head -1`: SIGPIPE, as any Unix tool)",
    ),
)  # fmt: skip


def codes_of(command: str) -> list[ExitCode]:
    """The rows that apply to a command (``"prompts list"`` for a subcommand), in code order."""
    if command not in COMMANDS:
        raise KeyError(command)
    return [e for e in TABLE if command in e.commands]


def epilog(command: str) -> str:
    """The ``--help`` epilog of a command: one line per code (Markdown, as the app renders help)."""
    return "Exit codes:\n\n" + "\n".join(f"- {e.code} {e.brief}" for e in codes_of(command))


def _commands_cell(commands: tuple[str, ...]) -> str:
    if commands == COMMANDS:
        return "all"
    if set(COMMANDS) - set(commands) and len(commands) > len(COMMANDS) // 2:
        return "all but " + ", ".join(f"`{c}`" for c in COMMANDS if c not in commands)
    return ", ".join(f"`{c}`" for c in commands)


def markdown_table() -> str:
    """The README's exit-code table, byte for byte."""
    rows = ["| exit code | commands | meaning |", "|---|---|---|"]
    rows += [f"| {e.code} | {_commands_cell(e.commands)} | {e.meaning} |" for e in TABLE]
    return "\n".join(rows)
