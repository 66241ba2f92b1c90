"""The report's sections below the verdicts, in order: one list that report.md and report.html both
render, so their titles and contents cannot drift apart.

Each section has an id, a title, whether it applies to a run, and its content as typed blocks
(a table, a note, a paragraph, ...); a formatter renders each block type its own way and decides
nothing about what a section holds. What stays with a formatter is its frame: the headline, the
stack line, the verdict table, the warnings and the rule note above the list, the plots (HTML),
the Reproduce block below it, and how a section is shown (folded or under a heading).

To add a section: write its content function here and add a `Section` to `SECTIONS`; both formats
render it. To add a block type: add its dataclass to `Block` and a case to both formatters'
``_block`` (each ends in ``assert_never``, so a type one of them does not render fails type checks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cascade_repro.report import environment, power, power_estimate, prose, speed_table, tables, verdict_table
from cascade_repro.report import reference as ref
from cascade_repro.report.load import Example, RunData
from cascade_repro.report.text import terminal_output
from cascade_repro.report.view import Table


@dataclass(frozen=True)
class TableBlock:
    """A table, or the italic ``empty`` note when it has no rows."""

    table: Table
    empty: str


@dataclass(frozen=True)
class PairsBlock:
    """The per-pair evidence table (its first column the pair, a ``reasons`` column): HTML shows it
    whole, markdown one two-column table per pair so it fits an issue's column."""

    table: Table
    empty: str


@dataclass(frozen=True)
class Note:
    """A note that explains what is above it (an italic line, a caption)."""

    text: str


@dataclass(frozen=True)
class Para:
    """A paragraph of plain text."""

    text: str


@dataclass(frozen=True)
class CodedPara:
    """A paragraph with inline code spans: ``make`` is given the format's code-span function."""

    make: Callable[[Callable[[str], str]], str]


@dataclass(frozen=True)
class Bullets:
    """A lead-in line and a bulleted list."""

    lead: str
    items: tuple[str, ...]


@dataclass(frozen=True)
class Preformatted:
    """Text shown as it is, in a monospaced block."""

    text: str


@dataclass(frozen=True)
class Examples:
    """The most divergent prompts, each with its token table and both arms' sample texts; ``missing``
    says why sample texts could not be read (empty when they could)."""

    examples: tuple[Example, ...]
    missing: str


Block = TableBlock | PairsBlock | Note | Para | CodedPara | Bullets | Preformatted | Examples


@dataclass(frozen=True)
class Section:
    """One section of the report: the same id, title, test and content in every format."""

    id: str
    title: str
    applies: Callable[[RunData], bool]
    content: Callable[[RunData], list[Block]]


def _always(data: RunData) -> bool:
    return True


def _intro(data: RunData) -> list[Block]:
    return [CodedPara(lambda code: prose.intro(data, code))]


def _evidence(data: RunData) -> list[Block]:
    table = verdict_table.verdict_table(data)
    out: list[Block] = [PairsBlock(table, f"no {data.twin.family} pairs")]
    if not table.rows:
        return out
    notes = (prose.drift_note(data), prose.if_note(data), prose.unscored_note(data))
    return out + [Note(n) for n in notes if n]


def _reference(data: RunData) -> list[Block]:
    out: list[Block] = [
        TableBlock(ref.reference_table(data), "no pair scored"),
        Note(ref.reference_note(data)),
    ]
    if lines := ref.by_step_lines(data):
        out.append(Bullets("Error against the reference by decode step:", tuple(lines)))
    return out


def _speed(data: RunData) -> list[Block]:
    return [TableBlock(speed_table.speed_table(data), "no timed pairs"), Note(speed_table.SPEED_NOTE)]


def _power(data: RunData) -> list[Block]:
    entries = power.detection_power(data)
    if not entries:
        return [CodedPara(lambda code: power.not_calibrated(data, code))]
    out: list[Block] = []
    for e in entries:
        out += [Para(e["statement"]), TableBlock(power.ladder_table(data, e), "no shifts")]
    return out


def _power_estimate(data: RunData) -> list[Block]:
    table = power_estimate.estimate_table(power_estimate.estimates(data))
    return [TableBlock(table, "no pair with errors against the reference"), Note(power_estimate.NOTE)]


def _invocations(data: RunData) -> list[Block]:
    inv = tables.invocations_table(data)
    return [TableBlock(inv, "one invocation")] if inv is not None else []


def _environment(data: RunData) -> list[Block]:
    return [Preformatted("\n".join(f"{k}: {v}" for k, v in environment.env_lines(data)))]


def _collected(data: RunData) -> str | None:
    collected = data.manifest.vllm_collect_env
    return collected if isinstance(collected, str) and collected.strip() else None


def _collect_env(data: RunData) -> list[Block]:
    return [Preformatted(terminal_output(_collected(data) or ""))]


SECTIONS: tuple[Section, ...] = (
    Section("intro", "What this run compares", _always, _intro),
    Section("evidence", "Evidence per pair", _always, _evidence),
    Section("reference", "Against the reference", ref.has_reference, _reference),
    Section("speed", "Decode speed", speed_table.has_speed, _speed),
    Section("power", "Detection power", _always, _power),
    Section("power_estimate", "Power without a ladder", power_estimate.has_estimate, _power_estimate),
    Section(
        "noise", "Noise floor", _always, lambda d: [TableBlock(tables.noise_table(d), "no control pairs")]
    ),
    Section("cells", "Cells", _always, lambda d: [TableBlock(tables.cell_table(d), "no cells")]),
    Section(
        "examples",
        "Most divergent prompts",
        lambda d: bool(d.examples),
        lambda d: [Examples(tuple(d.examples), d.samples_missing)],
    ),
    Section("invocations", "Invocations", lambda d: tables.invocations_table(d) is not None, _invocations),
    Section("environment", "Environment", _always, _environment),
    Section("collect_env", "vLLM's collect_env", lambda d: _collected(d) is not None, _collect_env),
)

# The sections of the run as a whole, not of one twin: a run of several twins shows them once,
# after every twin's own (report.md and report.html alike).
RUN_WIDE = frozenset({"cells", "invocations", "environment", "collect_env"})


def sections(data: RunData) -> list[Section]:
    """The sections that apply to this run, in report order."""
    return [s for s in SECTIONS if s.applies(data)]
