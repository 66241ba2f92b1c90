"""The command line's values -> a typed matrix request (lm-evaluation-harness's ``from_cli``).

`matrix` and `explain` hand their parsed flag values (and ``--config``'s path) to
:func:`spec_from_cli` and get back a validated :class:`MatrixSpec`; `matrix` also gets its run
settings (:class:`RunSettings`: verdicts, where the run goes, how it is told), the file's where a
flag was left at its default. The commands parse nothing themselves: a flag's comma list, JSON or
ladder is read here, once, whichever command took it. A ``--config`` file is
``plan/config_file.py``'s to read, the flags of vLLM's and lm-eval's spelling ``plan/foreign_flags.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade_repro import twin as twins
from cascade_repro.errors import UsageError
from cascade_repro.plan.config_file import load_config, run_settings
from cascade_repro.plan.foreign_flags import ENGINE_ARG_OPTIONS, LM_EVAL_MODEL_TYPES, Foreign, read_foreign
from cascade_repro.plan.spec import MatrixSpec
from cascade_repro.plan.values import (
    parse_fa_list,
    parse_hf_overrides,
    parse_int_list,
    parse_onoff_list,
    split_list,
)
from cascade_repro.twin import CASCADE as TWIN

# vLLM's dtype spellings (vllm/config/model.py _STR_DTYPE_TO_TORCH_DTYPE) that mean one of ours.
VLLM_DTYPES = {
    "half": "float16",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
}

# Flags whose value is the spec field's as typed (the flag's parameter name is the field's).
SCALAR_FLAGS = (
    "engine", "model", "prompts", "system_prompt", "prompt_field", "key_field", "max_tokens", "ignore_eos",
    "force_cascade", "topk", "arm_switch", "enforce_eager", "graphs_for_batches", "load_format", "max_model_len",
    "gpu_memory_utilization", "trust_remote_code", "engine_timeout", "device", "inject", "rerun", "auto_controls",
    "twin",
)  # fmt: skip


def spec_values(given: Mapping[str, Any], foreign: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The spec field values of the flags in ``given`` (a command's parameters by name; a flag that
    is absent or None was not given): comma lists parsed, JSON decoded, vLLM's spellings mapped.
    ``foreign``: engine arguments given by vLLM's or lm-eval's spelling (:func:`read_foreign`),
    under -E and over --engine-args."""
    out: dict[str, Any] = {}
    if given.get("limit") is not None:
        out["limit"] = parse_limit(str(given["limit"]))
    for flag in ("tp", "batch"):
        if given.get(flag) is not None:
            out[flag] = parse_int_list(given[flag], flag)
    if given.get("seed") is not None:
        try:
            out["seeds"] = [int(x) for x in split_list(given["seed"], "--seed")]
        except ValueError:
            raise UsageError(f"--seed: expected integers, got {given['seed']!r}") from None
    # The axis's flag is its spec field's (--cascade), and so is the parameter that holds it.
    if given.get(TWIN.spec_field) is not None:
        out[TWIN.spec_field] = parse_onoff_list(given[TWIN.spec_field], TWIN.spec_field)
    if given.get("dtype") is not None:
        out["dtypes"] = [VLLM_DTYPES.get(x, x) for x in split_list(given["dtype"], "--dtype")]
    if given.get("fa_version") is not None:
        out["fa_versions"] = parse_fa_list(given["fa_version"])
    if given.get("backend") is not None:
        out["backends"] = [x.upper() for x in split_list(given["backend"], "--backend")]
    if given.get("calibrate") is not None:
        from cascade_repro.vllm_surface.inject import parse_ladder

        try:
            out["calibrate"] = parse_ladder(given["calibrate"])
        except ValueError as e:
            raise UsageError(str(e)) from None
    if given.get("hf_overrides") is not None:
        out["hf_overrides"] = parse_hf_overrides(given["hf_overrides"])
    if given.get("engine_args") is not None or given.get("engine_arg") or foreign:
        from cascade_repro.plan import engine_args as eargs

        merged = eargs.parse_json(given["engine_args"]) if given.get("engine_args") is not None else {}
        merged.update(foreign or {})
        merged.update(eargs.parse_pairs(given.get("engine_arg") or []))
        out["engine_args"] = merged
    if given.get("sampling"):
        from cascade_repro.vllm_surface import sampling as samp

        try:
            out["sampling"] = samp.parse_pairs(given["sampling"])
        except ValueError as e:
            raise UsageError(str(e)) from None
    for name in SCALAR_FLAGS:
        if given.get(name) is not None:
            out[name] = given[name]
    if (kind := LM_EVAL_MODEL_TYPES.get(str(out.get("model")))) is not None and not Path(
        out["model"]
    ).exists():
        raise UsageError(
            f"--model {out['model']}: lm-eval's model type; here --engine {kind} picks the engine and --model "
            "names the weights (embedded, a folder or a Hub id, as lm-eval's --model_args pretrained=...)"
        )
    return out


def options_from_engine_args(values: dict[str, Any], flags: Mapping[str, Any]) -> None:
    """The engine arguments that are options of the matrix too (:data:`ENGINE_ARG_OPTIONS`), moved
    from ``values["engine_args"]`` to the option (one value, said once in run.json); refused where
    the option was given on the command line with another value."""
    args = values.get("engine_args")
    if not isinstance(args, dict) or not set(args) & set(ENGINE_ARG_OPTIONS):
        return
    values["engine_args"] = {k: v for k, v in args.items() if k not in ENGINE_ARG_OPTIONS}
    for key, option in ENGINE_ARG_OPTIONS.items():
        if key not in args:
            continue
        if flags.get(key) is not None and flags[key] != args[key]:
            raise UsageError(
                f"engine argument {key}={args[key]!r} and {option} {flags[key]} set the same thing: give one "
                f"({option} is the matrix's own option)"
            )
        values[key] = args[key]


def parse_limit(text: str) -> int:
    """``--limit N``: a count of prompts. lm-eval's fraction (``--limit 0.5``) is refused with what to
    type instead, since a prefix-sharing matrix plans its waves on a count."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        frac = float(text)
    except ValueError:
        raise UsageError(f"--limit: expected a number of prompts, got {text!r}") from None
    raise UsageError(
        f"--limit {text}: lm-eval reads a fraction of the set; here --limit counts prompts "
        f"(e.g. --limit 32; `cascade-repro prompts list` gives each set's size)"
        if 0 < frac < 1
        else f"--limit: expected a whole number of prompts, got {text!r}"
    )


@dataclass(frozen=True)
class RunSettings:
    """`matrix`'s options that are not the matrix (``plan.matrix.RUN_KEYS``, which a --config file
    sets too), each the flag's value or, where the flag was left at its default, the file's.
    ``pipeline.RunOptions.from_settings`` checks them and builds the run's options."""

    fail_on: str
    alpha: float
    rep_delta: float
    min_topk_violations: int
    drift_min: float
    reference: str
    reference_device: str
    results_dir: Path
    run_id: str | None
    shard: str | None
    allow_mixed: bool
    quiet: bool
    executor: str
    ray_address: str | None
    retries: int
    max_engines_per_gpu: int | None = None
    config: Path | None = None
    from_file: frozenset[str] = field(default_factory=frozenset)  # the settings the file gave

    @contextmanager
    def named(self) -> Iterator[None]:
        """A refused value that came from the config file is named by the file and its key
        (``m.toml: alpha must be ...``), not by the flag nobody typed."""
        try:
            yield
        except UsageError as e:
            msg = str(e)
            for key in sorted(self.from_file):
                flag = "--" + key.replace("_", "-")
                if msg.startswith(flag) and msg[len(flag) : len(flag) + 1] in (" ", ":"):
                    raise UsageError(f"{self.config}: {key}{msg.removeprefix(flag)}") from None
            raise


@dataclass(frozen=True)
class CliSpec:
    """What a command's flags and its --config file ask for."""

    spec: MatrixSpec
    values: dict[str, Any]  # the spec's field values as given: the file's, the flags' over them
    file_keys: frozenset[str]  # the spec fields the file set
    settings: dict[str, Any]  # the file's run settings (RUN_KEYS), each checked for its type
    config: Path | None = None
    foreign: Foreign = field(default_factory=Foreign)  # the flags of vLLM's and lm-eval's spelling
    twin_note: str | None = None  # what ``--twin all`` left out here, and why

    def run_settings(self, given: Mapping[str, Any], defaulted: Callable[[str], bool]) -> RunSettings:
        """The run settings: ``given``'s (the command's parameters by name), the file's where
        ``defaulted(name)`` says the command line and the option's environment variable left it."""
        from_file = {k: v for k, v in self.settings.items() if defaulted(k)}
        names = [f for f in RunSettings.__dataclass_fields__ if f not in ("config", "from_file")]
        values = {k: from_file.get(k, given[k]) for k in names}
        if self.foreign.results_dir is not None:  # a flag, over the file's and the environment's
            if given.get("results_dir_typed"):
                raise UsageError("--results-dir and lm-eval's --output_path name the same folder: give one")
            from_file.pop("results_dir", None)
            values["results_dir"] = self.foreign.results_dir
        values["results_dir"] = Path(values["results_dir"])
        return RunSettings(**values, config=self.config, from_file=frozenset(from_file))


def spec_from_cli(
    given: Mapping[str, Any],
    config: Path | None = None,
    *,
    engine: str | None = None,
    fields: Collection[str] | None = None,
    extra: Sequence[str] = (),
    ours: Collection[str] = (),
    gpus: Callable[[], int | None] | None = None,
) -> CliSpec:
    """Build and validate the spec a command line asks for: ``config``'s values (a matrix TOML
    file), the flags in ``given`` over them. ``engine``: the command's own default engine where
    neither names one (an error names it as ``--engine``). ``fields``: read only these spec fields
    of the file and no run settings (`explain`, which runs nothing); otherwise the file's run
    settings are taken out and checked (:attr:`CliSpec.settings`). ``extra``: the tokens the
    command's parser left, read by :func:`read_foreign` (``ours``: the command's flags, for its
    suggestions)."""
    foreign = read_foreign(extra, ours)
    flags = spec_values(given, foreign.engine_args)
    if foreign.max_tokens is not None:
        if "max_tokens" in flags:
            raise UsageError("--max-tokens and --gen_kwargs max_gen_toks set the same thing: give one")
        flags["max_tokens"] = foreign.max_tokens
    values: dict[str, Any] = load_config(config) if config else {}
    settings: dict[str, Any] = {}
    if fields is not None:
        values = {k: v for k, v in values.items() if k in fields}
    elif config:
        settings = run_settings(values, str(config))
    file_keys = frozenset(values)
    values.update(flags)
    options_from_engine_args(values, flags)
    if engine is not None and "engine" not in values:
        values["engine"] = engine
        flags["engine"] = engine
    twin_note = _expand_all(values, gpus)
    spec = MatrixSpec.from_dict(values, source=str(config) if config else "options", flags=flags)
    return CliSpec(spec, values, file_keys, settings, config, foreign, twin_note)


def _expand_all(values: dict[str, Any], gpus: Callable[[], int | None] | None) -> str | None:
    """``--twin all`` (a flag's or the file's) expanded in ``values`` for this machine: the
    installed vLLM's twins, ``tp`` where ``gpus()`` counts enough GPUs (no ``gpus``: left out);
    the line that says what was left out (None: nothing, or no ``all``)."""
    text = values.get("twin")
    if not isinstance(text, str) or text.strip() != twins.ALL:
        return None
    from cascade_repro import vllm_surface
    from cascade_repro.engines import ENGINES
    from cascade_repro.engines import get as engine_info
    from cascade_repro.plan.twin_set import expand

    engine = values.get("engine", MatrixSpec.engine)
    if engine not in ENGINES:
        return None  # the spec's check names the engine
    vllm = engine_info(engine).is_vllm
    batch = values.get("batch")
    try:
        values["twin"], note = expand(
            text, engine, batch if isinstance(batch, list) else MatrixSpec().batch,
            vllm_surface.installed_version() if vllm else None, gpus() if vllm and gpus else None,
        )  # fmt: skip
    except ValueError as e:
        raise UsageError(str(e)) from None
    return note


@dataclass(frozen=True)
class VllmCheck:
    """What this box says of a vLLM matrix before it is planned (:meth:`MatrixOptions.check_vllm`).
    ``judge.outcome.refusal_status`` turns a refusal into the exit code."""

    refusal: str | None = None  # the one line the command refuses with (after "error: ")
    setting_missing: bool = False  # this vLLM lacks the twin's setting: no pair could be exercised
    warnings: tuple[str, ...] = ()  # what a plan for another machine should know of this one
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class MatrixOptions:
    """`matrix`'s command line, typed (lm-evaluation-harness's ``EvaluatorConfig.from_cli``): the
    validated spec with the flags of vLLM's and lm-eval's spelling (``asked``), the run settings
    (``pipeline.RunOptions.from_settings`` checks them), and what this call does."""

    asked: CliSpec
    settings: RunSettings
    dry_run: bool = False  # plan and print, run nothing
    json_out: bool = False  # print the run's summary.json
    fresh: bool = False  # start the run over
    twin_named: bool = False  # --twin or --config chose the twin (not the default, cascade)

    @property
    def spec(self) -> MatrixSpec:
        return self.asked.spec

    @classmethod
    def from_cli(
        cls,
        given: Mapping[str, Any],
        *,
        defaulted: Callable[[str], bool],
        extra: Sequence[str] = (),
        ours: Collection[str] = (),
        results_dir_typed: bool = False,
        on_note: Callable[[str], None] | None = None,
        gpus: Callable[[], int | None] | None = None,
    ) -> MatrixOptions:
        """The options ``given`` asks for (the command's parameters by name, ``config`` among them):
        the spec by :func:`spec_from_cli`, the run settings by :meth:`CliSpec.run_settings`
        (``defaulted(name)``: the command line and the option's environment variable left it, so the
        file's value counts; ``results_dir_typed``: --results-dir was typed). ``on_note`` hears each
        note on a flag that changes nothing here (and what ``--twin all`` left out) as soon as the
        flags are read, before a refused setting; ``gpus`` counts this machine's GPUs (``--twin
        all`` tests ``tp`` only where they are enough)."""
        config = given.get("config")
        asked = spec_from_cli(given, config, extra=extra, ours=ours, gpus=gpus)
        for note in (*asked.foreign.notes, *filter(None, [asked.twin_note])):
            if on_note is not None:
                on_note(note)
        settings = asked.run_settings({**given, "results_dir_typed": results_dir_typed}, defaulted)
        return cls(
            asked,
            settings,
            dry_run=bool(given.get("dry_run")),
            json_out=bool(given.get("json_out")),
            fresh=bool(given.get("fresh")),
            twin_named=given.get("twin") is not None or config is not None,
        )

    def check_vllm(self, version: str | None, gpus: int, command: str) -> VllmCheck:
        """What this box says of a vLLM matrix: ``version``, the installed vLLM's (None: none);
        ``gpus``, the GPUs visible; ``command``, the command line as typed (the default twin's
        refusal names the one to type instead). A dry run is refused nothing: a plan for another
        machine is fine, with a warning of what this one would refuse (bar a GPU-less box planning
        one-GPU work)."""
        from cascade_repro import vllm_surface

        tw = self.spec.twin_axis
        unsupported = any(
            vllm_surface.twin_problem(t.family, version) is not None for t in self.spec.twin_axes
        )
        if not self.dry_run and (version is None or (gpus == 0 and not unsupported)):
            # What this box lacks for any vLLM run, named; not a twin's GPU count (no --twin was given).
            install = f'pip install "{vllm_surface.VLLM_REQUIREMENT}"'
            lacks = {
                (
                    True,
                    True,
                ): f"vLLM and an NVIDIA GPU, and this machine has neither ({install} on a GPU machine)",
                (True, False): f"vLLM, which is not installed here: {install}",
                (False, True): "an NVIDIA GPU, and this machine has none visible",
            }[(version is None, gpus == 0)]
            return VllmCheck(
                f"--engine vllm needs {lacks}; --engine hf runs on the CPU, and --dry-run plans anywhere"
            )
        # Each twin of a run of several checked alike: the first this box refuses refuses the run.
        refused = [
            (t, why)
            for t in self.spec.twin_axes
            if (why := vllm_surface.twin_refusal(t.family, t.name, t.gpus, version, gpus))
        ]
        tw, why = refused[0] if refused else (tw, None)
        unsupported = vllm_surface.twin_problem(tw.family, version) is not None
        if unsupported and not self.twin_named:
            # The default twin (cascade) on a vLLM without it: the exact command to type instead.
            why = vllm_surface.default_twin_refusal(version, command) or why
        if why and not self.dry_run:
            return VllmCheck(why, setting_missing=unsupported)
        warnings = tuple(
            w for t, w in refused if vllm_surface.twin_problem(t.family, version) is not None or t.gpus > 1
        )
        cascade = any(t.family == TWIN.family for t in self.spec.twin_axes)
        note = vllm_surface.cascade_note(version) if cascade else None
        return VllmCheck(warnings=warnings, notes=(note,) if note else ())
