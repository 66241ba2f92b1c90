"""run.json as typed sections: the manifest of a run directory.

Every section is a :class:`~cascade_repro.section.Section`: ``Manifest.from_json`` reads what any
version of the harness wrote (missing keys: defaults; unknown keys kept in ``extra`` and written
back), and ``Manifest.to_json`` gives back the dict that was read, key for key (order included), so
the bytes of run.json survive a round trip. The plan is the planner's own type
(:class:`~cascade_repro.rundir.cells.Plan` of ``EnginePlan``s and ``Cell``s). ``read_manifest``
/ ``write_manifest`` are the file's reader and writer. The spec is kept as stored (``spec_json``):
the planner reads it as its ``MatrixSpec`` (``plan.matrix.spec_of``), so this room never imports
the planner.
"""

from __future__ import annotations

import functools
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from cascade_repro import twin as twins
from cascade_repro.errors import EnvironmentFailure, UsageError
from cascade_repro.rundir.cells import Plan
from cascade_repro.rundir.layout import RUN_JSON, shown, write_run_json
from cascade_repro.section import Section, section_list, section_map, section_one
from cascade_repro.twin import TwinAxis


@dataclass
class PromptSetFacts(Section):
    """``prompt_set``: where the prompts came from and what the tokenizer made of them."""

    name: str = ""
    source: str = ""
    n: int = 0
    system_prompt: str | None = None
    system_prompt_text: str = ""
    shared_prefix_tokens: int = 0
    prompt_tokens_mean: float = 0.0
    prompt_tokens_max: int = 0
    tokenizer: str = ""
    min_cascade_prefix: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = field(default=None, repr=False, compare=False)


@dataclass
class Invocation(Section):
    """One entry of ``invocations``: a run, resume, rescore or merge."""

    started_at: str = ""
    command: Any = ""
    env: dict[str, Any] = field(default_factory=dict)
    kind: str | None = None
    cells_kept: int | None = None
    cells_run: int | None = None
    total_s: float | None = None
    shard: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = field(default=None, repr=False, compare=False)


@dataclass
class EngineRecord(Section):
    """One engine key of ``engines``: the flags read back from the engine, its start and status."""

    effective: dict[str, Any] = field(default_factory=dict)
    start_s: float | None = None
    status: str = "pending"
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = field(default=None, repr=False, compare=False)


@dataclass
class Timings(Section):
    """``timings``: the run's wall time (merged runs: the slowest shard's, and their sum)."""

    total_s: float | None = None
    shards_sum_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = field(default=None, repr=False, compare=False)


@dataclass
class Manifest(Section):
    """run.json. ``spec_json`` is the spec as stored (``plan.matrix.spec_of`` reads it as a ``MatrixSpec``)."""

    _nested: ClassVar[dict[str, tuple[Any, Any]]] = {
        "prompt_set": section_one(PromptSetFacts),
        "plan": section_one(Plan),
        "engines": section_map(EngineRecord),
        "timings": section_one(Timings),
        "invocations": section_list(Invocation),
    }

    run_id: str = ""
    created_at: str = ""
    command: Any = ""
    tool_version: str | None = None
    tool_source: dict[str, Any] | None = None
    spec_json: dict[str, Any] = field(default_factory=dict)
    spec_hash: str = ""
    model_path: str = ""
    model_name: str = ""
    prompt_set: PromptSetFacts = field(default_factory=PromptSetFacts)
    env: dict[str, Any] = field(default_factory=dict)
    plan: Plan = field(default_factory=Plan)
    arm_switch: str = "toggle"
    thresholds: dict[str, Any] = field(default_factory=dict)
    fail_on: str = "regression"
    engines: dict[str, EngineRecord] = field(default_factory=dict)
    timings: Timings = field(default_factory=Timings)
    vllm_collect_env: Any = None
    shard: str | None = None
    predictions: dict[str, Any] | None = None
    # The reference pass (run/reference.py): precision, device, status, sequences scored, seconds.
    reference: dict[str, Any] | None = None
    invocations: list[Invocation] | None = None
    mixed_stack: list[str] | None = None
    # merged runs (merge.py)
    merged_at: str | None = None
    merge_command: str | None = None
    shards: list[dict[str, Any]] | None = None
    shards_expected: int | None = None
    shards_missing: list[str] | None = None
    merge_warnings: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        data = dict(data) if isinstance(data, dict) else {}
        keys = tuple(data)
        spec = data.pop("spec", None)
        m = super().from_json(data)
        m.keys = tuple("spec_json" if k == "spec" else k for k in keys)
        if spec is not None:
            m.spec_json = spec
        elif "spec_json" in m.keys:  # a key spelled like the attribute: an unknown key, kept
            m.keys = tuple(k for k in m.keys if k != "spec_json")
        return m

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        return {("spec" if k == "spec_json" else k): v for k, v in out.items()}

    @property
    def twins(self) -> tuple[TwinAxis, ...]:
        """The run's twins (``--twin a,b``: several), resolved once from the text run.json keeps (a
        run from before --twin: cascade); resolved again only if that text changes."""
        text = self.spec_json.get("twin") if isinstance(self.spec_json, dict) else None
        hit = self.__dict__.get("_twins")
        if hit is None or hit[0] != text:
            hit = self.__dict__["_twins"] = (text, twins.resolve_list(text or None))
        return hit[1]

    @property
    def twin(self) -> TwinAxis:
        """The run's twin; of a run of several, the first (:meth:`for_twin` gives each its own view)."""
        return self.twins[0]

    @property
    def several(self) -> bool:
        """Whether the run compares several twins."""
        return len(self.twins) > 1

    def for_twin(self, tw: TwinAxis) -> Manifest:
        """The run as a run of ``tw`` alone reads it (a copy; the file is not touched): the spec's
        twin is ``tw`` and the plan's cells are those serving it, each under its arm for ``tw``.
        Judging and reporting a run of several twins take each twin's view in turn."""
        import copy

        view = copy.copy(self)
        view.__dict__.pop("_twins", None)
        view.spec_json = {**self.spec_json, "twin": tw.name}
        view.plan = self.plan.for_twin(tw.name)
        return view

    def stored(self, name: str) -> Any:
        return super().stored("spec_json" if name == "spec" else name)  # run.json's name for it

    @property
    def stack_env(self) -> dict[str, Any]:
        """The environment of the first invocation (``env``), a dict even in a damaged file."""
        return self.env if isinstance(self.env, dict) else {}

    def first_invocation(self) -> Invocation:
        """This run's first invocation; old files without ``invocations``: one made from the top."""
        return (self.invocations or [self.own_invocation()])[0]

    def own_invocation(self) -> Invocation:
        """The invocation record of the run as built by ``runner.prepare`` (time, command, env)."""
        return Invocation(started_at=self.created_at, command=self.command or "", env=self.env or {})


# --- what run.json's sections must be ------------------------------------------------------------
# A run directory travels (a CI artifact, a tarball), so run.json is input from elsewhere: a section
# of the wrong type would otherwise be read as its default (a plan that is a list: no cells, so a
# rescore writes empty tables) or crash the first reader that trusts it. ``manifest_problem`` checks
# every field against its annotation, sections nested included, before anything is read from it.


def newer_version_note(m: Manifest, ours: str | None) -> str | None:
    """One line where run.json holds keys this version has no field for: the run was made by a
    newer cascade-repro, and those keys are kept as they are (every writer carries them over)."""
    unknown = m.unknown_keys()
    if not unknown:
        return None
    was = f"{m.tool_version}, " if m.tool_version and m.tool_version != ours else ""
    names = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
    return (
        f"this run was made by a newer cascade-repro ({was}this is {ours or 'unknown'}): "
        f"run.json's keys this version does not know are kept as they are ({names})"
    )


def pip_vcs_url(repository: str) -> str | None:
    """``repository`` as the URL of a pip VCS requirement (``git+URL@commit``), or None where pip
    takes none: a local folder or a ``file://`` URL (a path of the machine that ran, which pip
    rejects after ``git+`` and which names someone's disk). A scp-style address
    (``git@github.com:owner/repo.git``) becomes the ``ssh://`` URL pip needs.

    ``tool_source.repository`` is only ever such an address: the environment capture writes it,
    the report's Reproduce block reads it."""
    r = repository.strip().removeprefix("git+")
    if re.match(r"(https?|ssh|git)://[^/\s]+/\S+$", r):
        return r
    if m := re.fullmatch(r"([\w.-]+)@([\w.-]+):([^\s]+)", r):
        user, host, path = m.groups()
        return f"ssh://{user}@{host}/{path.lstrip('/')}"
    return None


SCORED = ("plan",)  # what scoring reads: without it there are no cells to score (an empty table)

_WORDS = {str: "text", int: "a whole number", float: "a number", bool: "true or false"}


def manifest_problem(data: Any, require: tuple[str, ...] = ()) -> str | None:
    """What is wrong with run.json's parsed content, in words naming the section, or None.

    Every field of :class:`Manifest` and of its sections must hold its annotation's JSON type (a
    number may be whole where a fraction is declared; ``true`` is not a number), a section must be an
    object, and the sections named in ``require`` (``SCORED``, for a reader that scores) must be
    there. Unknown keys are not checked: they are another version's, kept as read.
    """
    if not isinstance(data, dict):
        return f"not a JSON object but {_kind(data)}"
    for name in require:
        if name not in data:
            return f"no {name!r} section"
    fields = {("spec" if n == "spec_json" else n): t for n, t in _hints(Manifest).items()}
    for name, hint in fields.items():
        if name in data and (why := type_problem(data[name], hint, name)) is not None:
            return why
    return None


@functools.cache  # a class's annotations do not change: evaluating them is most of the check's time
def _hints(cls: type) -> dict[str, Any]:
    names = {f.name for f in cls._names()}  # type: ignore[attr-defined]
    return {n: t for n, t in typing.get_type_hints(cls).items() if n in names}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    for t, word in (
        (dict, "an object"),
        (list, "a list"),
        (str, "text"),
        (int, "a whole number"),
        (float, "a number"),
    ):
        if isinstance(value, t):
            return word
    return type(value).__name__


def type_problem(value: Any, hint: Any, where: str) -> str | None:
    """Why ``value`` at ``where`` (a dotted path) does not hold the JSON type of annotation ``hint``,
    or None: run.json's sections here, the samples files' control records in ``rundir``."""
    if hint is Any:
        return None
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        real = [o for o in options if o is not type(None)]
        whys = [type_problem(value, o, where) for o in real]
        return None if any(w is None for w in whys) else whys[0]
    if isinstance(hint, type) and issubclass(hint, Section):
        if not isinstance(value, dict):
            return f"{where!r} is {_kind(value)}, not an object"
        for name, sub in _hints(hint).items():
            if name in value and (why := type_problem(value[name], sub, f"{where}.{name}")) is not None:
                return why
        return None
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            return f"{where!r} is {_kind(value)}, not an object"
        args = typing.get_args(hint)
        if args:
            for k, v in value.items():
                if (why := type_problem(v, args[1], f"{where}.{k}")) is not None:
                    return why
        return None
    if origin is list or hint is list:
        if not isinstance(value, list):
            return f"{where!r} is {_kind(value)}, not a list"
        args = typing.get_args(hint)
        if args:
            for i, v in enumerate(value):
                if (why := type_problem(v, args[0], f"{where}[{i}]")) is not None:
                    return why
        return None
    ok = {
        str: lambda v: isinstance(v, str),
        int: lambda v: type(v) is int,
        float: lambda v: type(v) in (int, float),
        bool: lambda v: type(v) is bool,
    }.get(hint)
    if ok is None or ok(value):
        return None
    return f"{where!r} is {_kind(value)}, not {_WORDS[hint]}"


# --- run.json's reader and writer ---------------------------------------------------------------


def read_manifest(run_dir: Path, require: tuple[str, ...] = ()) -> Manifest:
    """run.json as a :class:`~cascade_repro.rundir.manifest.Manifest` (any version's file), checked
    (:func:`read_run_json`); ``require``: sections it must hold (``manifest.SCORED`` to score it)."""
    return Manifest.from_json(read_run_json(run_dir, require))


def write_manifest(run_dir: Path, manifest: Manifest) -> None:
    write_run_json(run_dir, manifest.to_json())


def read_run_json(run_dir: Path, require: tuple[str, ...] = ()) -> dict[str, Any]:
    """run.json's JSON object, checked where it enters (:func:`~cascade_repro.rundir.manifest.manifest_problem`):
    a file that is not JSON, not an object, lacks a section in ``require`` or holds a section of the
    wrong type is a one-line UsageError naming the file and the section, before any caller reads or
    writes a thing."""
    p = Path(run_dir) / RUN_JSON
    try:
        data = json.loads(p.read_bytes())
    except FileNotFoundError:
        raise UsageError(f"not a cascade-repro run directory: {shown(run_dir)} (missing run.json)") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{shown(p)}: corrupt JSON at line {e.lineno}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{shown(p)}: corrupt JSON (not UTF-8 text)") from None
    except IsADirectoryError:
        raise UsageError(f"{shown(p)} is a folder, not a file") from None
    except OSError as e:
        raise EnvironmentFailure.from_oserror(e, "cannot read run.json") from None
    if (why := manifest_problem(data, require)) is not None:
        raise UsageError(f"{shown(p)}: {why}; not a run.json this tool wrote (damaged or edited)")
    return data
