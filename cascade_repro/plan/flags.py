"""The command line's values -> a typed matrix request (lm-evaluation-harness's ``from_cli``).

`matrix` and `explain` hand their parsed flag values (and ``--config``'s path) to
:func:`spec_from_cli` and get back a validated :class:`MatrixSpec`; `matrix` also gets its run
settings (:class:`RunSettings`: verdicts, where the run goes, how it is told), the file's where a
flag was left at its default. The commands parse nothing themselves: a flag's comma list, JSON or
ladder is read here, once, whichever command took it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade_repro.errors import UsageError
from cascade_repro.plan.matrix import (
    MatrixSpec,
    load_toml,
    parse_fa_list,
    parse_hf_overrides,
    parse_int_list,
    parse_onoff_list,
    run_settings,
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
    "engine", "model", "prompts", "system_prompt", "limit", "prompt_field", "key_field", "max_tokens", "ignore_eos",
    "force_cascade", "topk", "arm_switch", "enforce_eager", "graphs_for_batches", "load_format", "max_model_len",
    "gpu_memory_utilization", "trust_remote_code", "engine_timeout", "device", "inject", "rerun", "auto_controls",
    "twin",
)  # fmt: skip


def spec_values(given: Mapping[str, Any]) -> dict[str, Any]:
    """The spec field values of the flags in ``given`` (a command's parameters by name; a flag that
    is absent or None was not given): comma lists parsed, JSON decoded, vLLM's spellings mapped."""
    out: dict[str, Any] = {}
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
    if given.get("engine_args") is not None or given.get("engine_arg"):
        from cascade_repro.plan import engine_args as eargs

        merged = eargs.parse_json(given["engine_args"]) if given.get("engine_args") is not None else {}
        merged.update(eargs.parse_pairs(given.get("engine_arg") or []))
        out["engine_args"] = merged
    for name in SCALAR_FLAGS:
        if given.get(name) is not None:
            out[name] = given[name]
    return out


@dataclass(frozen=True)
class RunSettings:
    """`matrix`'s options that are not the matrix (``plan.matrix.RUN_KEYS``, which a --config file
    sets too), each the flag's value or, where the flag was left at its default, the file's.
    ``run.runner.RunOptions.from_settings`` checks them and builds the run's options."""

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

    def run_settings(self, given: Mapping[str, Any], defaulted: Callable[[str], bool]) -> RunSettings:
        """The run settings: ``given``'s (the command's parameters by name), the file's where
        ``defaulted(name)`` says the command line and the option's environment variable left it."""
        from_file = {k: v for k, v in self.settings.items() if defaulted(k)}
        names = [f for f in RunSettings.__dataclass_fields__ if f not in ("config", "from_file")]
        values = {k: from_file.get(k, given[k]) for k in names}
        values["results_dir"] = Path(values["results_dir"])
        return RunSettings(**values, config=self.config, from_file=frozenset(from_file))


def spec_from_cli(
    given: Mapping[str, Any],
    config: Path | None = None,
    *,
    engine: str | None = None,
    fields: Collection[str] | None = None,
) -> CliSpec:
    """Build and validate the spec a command line asks for: ``config``'s values (a matrix TOML
    file), the flags in ``given`` over them. ``engine``: the command's own default engine where
    neither names one (an error names it as ``--engine``). ``fields``: read only these spec fields
    of the file and no run settings (`explain`, which runs nothing); otherwise the file's run
    settings are taken out and checked (:attr:`CliSpec.settings`)."""
    flags = spec_values(given)
    values: dict[str, Any] = load_toml(config) if config else {}
    settings: dict[str, Any] = {}
    if fields is not None:
        values = {k: v for k, v in values.items() if k in fields}
    elif config:
        settings = run_settings(values, str(config))
    file_keys = frozenset(values)
    values.update(flags)
    if engine is not None and "engine" not in values:
        values["engine"] = engine
        flags["engine"] = engine
    spec = MatrixSpec.from_dict(values, source=str(config) if config else "options", flags=flags)
    return CliSpec(spec, values, file_keys, settings, config)
