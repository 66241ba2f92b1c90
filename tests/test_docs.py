"""The README cannot go stale: its commands exist, every command is in it, its quoted output is a
real run's, and its exit codes are the ones the CLI documents.

The quoted `make run` output and verdict table are checked against a real run of the Makefile's
RUN_ARGS in tests/test_worked_example.py.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import typer
from support.readme import markdown_table, worked_example
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

def test_the_worked_example_is_make_run():
    example = worked_example()
    assert "$ make run\n" in example
    assert "\n$(BIN)/cascade-repro matrix $(RUN_ARGS)\n" in (ROOT / "Makefile").read_text(encoding="utf-8").replace("\t", "")
    header, rows = markdown_table(example)
    assert header[0] == "pair" and rows


def _matrix_commands() -> list[list[str]]:
    return [w for w in command_lines() if w[:1] == ["matrix"] and len(w) > 1 and not {"--help", "--help-all"} & set(w)
            and not any("<" in x or x.isupper() for x in w)]  # fmt: skip


@pytest.mark.parametrize("words", _matrix_commands(), ids=lambda w: " ".join(w)[:60])
def test_every_readme_matrix_command_plans(words, tmp_path):
    """Each matrix example of the README is a valid matrix: its dry run plans it."""
    args = [w for w in words if w != "--dry-run"]
    res = CliRunner().invoke(app, [*args, "--dry-run", "--results-dir", str(tmp_path)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    if "--json" in words:  # the plan as one JSON object
        assert json.loads(res.stdout)["cells"]
    else:
        assert " cells, " in res.stdout


def test_the_usage_blocks_matrix_options_are_in_matrix_help():
    """The README's first usage block is what a newcomer copies: each option it gives `matrix` is
    explained by `matrix --help`, not only by --help-all (`--inject` once was not)."""
    usage = README[README.index("## Usage") :]
    block = usage[usage.index("```bash\n") + 8 : usage.index("\n```", usage.index("```bash\n"))]
    used = {w for line in block.splitlines() if line.startswith("cascade-repro matrix ") for w in line.split()
            if w.startswith("--")}  # fmt: skip
    shown = CliRunner().invoke(app, ["matrix", "--help"], env={"COLUMNS": "250"}).stdout
    assert used and {o for o in used if not re.search(rf"(^|[ ,]){re.escape(o)}[ ,\n]", shown)} == set()


ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_architecture_answers_where_to_add_each_thing_with_files_that_exist():
    """docs/architecture.md's "Where do I add ..." names, for a twin, a statistic, a report section and
    a vLLM flag spelling, files of the package as they are."""
    where = ARCHITECTURE.split("## Where do I add ...", 1)[1].split("\n## ", 1)[0]
    answers = dict(re.findall(r"^\*\*(A [^*]+)\*\*(.*?)(?=^\*\*A |\Z)", where, re.S | re.M))
    assert set(answers) == {"A twin", "A statistic", "A report section", "A vLLM flag spelling"}
    for question, answer in answers.items():
        files = re.findall(r"`([\w/]+\.(?:py|json|md))`", answer)
        assert files, f"{question}: names no file"
        for name in files:
            assert (ROOT / "cascade_repro" / name).exists() or (ROOT / name).exists(), f"{question}: no {name}"
