"""A ``--config`` file: the one read of its bytes, a matrix TOML file or a vLLM YAML config
(:func:`load_config`) as MatrixSpec field values (:func:`load_toml`, :func:`config_values`), and the
run settings (:data:`RUN_KEYS`) it may set beside the matrix (:func:`run_settings`)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from cascade_repro import twin as twins
from cascade_repro import userpath
from cascade_repro.errors import UsageError
from cascade_repro.plan.spec import (
    CONFIG_KEYS,
    LIST_FIELDS,
    ONE_OFF_KEYS,
    RUN_KEYS,
    TOML_ALIASES,
    show,
    toml_key,
)
from cascade_repro.plan.values import parse_fa_list, parse_onoff
from cascade_repro.twin import CASCADE as TWIN


def run_settings(values: dict[str, Any], source: str) -> dict[str, Any]:
    """Take the :data:`RUN_KEYS` out of a config file's values (what :func:`load_toml` read), each
    checked for its type; a one-off action (``fresh``) there is a one-line UsageError."""
    out: dict[str, Any] = {}
    for key in ONE_OFF_KEYS:
        if key in values:
            raise UsageError(f"{source}: {key} is a one-off action, not a setting: give --{key.replace('_', '-')} "
                             "on the command line")  # fmt: skip
    for key, kind in RUN_KEYS.items():
        if key not in values:
            continue
        v = values.pop(key)
        if kind is float:
            ok = isinstance(v, int | float) and not isinstance(v, bool)
        elif kind is int:
            ok = isinstance(v, int) and not isinstance(v, bool)
        else:
            ok = isinstance(v, kind)
        if not ok:
            want = {str: "a string", float: "a number", int: "an integer", bool: "true or false"}[kind]
            raise UsageError(f"{source}: {key} must be {want}, got {show(v)}")
        out[key] = v
    return out


def read_config_text(path: Path) -> str:
    """A ``--config`` file's text (TOML or YAML): the one place a config file is read."""
    raw = read_config_bytes(path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 at byte {e.start}") from None


def read_config_bytes(path: Path) -> bytes:
    """A ``--config`` file's bytes. A device (/dev/zero, read until memory runs out) or a FIFO
    (which blocks until a writer comes) is refused before it is opened, as ``--prompts`` refuses it."""
    import stat

    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise UsageError(f"config file not found: {path}") from None
    except OSError as e:
        raise UsageError(f"cannot read config file {path}: {e.strerror}") from None
    if stat.S_ISDIR(mode):
        raise UsageError(f"config file {path} is a folder, not a file")
    if not stat.S_ISREG(mode):
        raise UsageError(f"config file {path} is not a regular file (a device, a pipe or a socket)")
    try:
        return path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read config file {path}: {e.strerror}") from None


def load_toml(path: Path) -> dict[str, Any]:
    """Read a matrix TOML file (top-level keys or a [matrix] table) into MatrixSpec field values."""
    text = read_config_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise UsageError(f"{path}: invalid TOML: arrays or tables nested too deeply") from None
    if "matrix" in data:
        if not isinstance(data["matrix"], dict):
            raise UsageError(f"{path}: [matrix] must be a table")
        if outside := sorted(k for k in data if k != "matrix"):
            # Read as the [matrix] table alone, they would be dropped without a word.
            raise UsageError(
                f"{path}: {', '.join(outside)} outside [matrix]: put every setting in [matrix] or none there"
            )
        data = data["matrix"]
    return config_values(data, path)


def config_values(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """A config file's keys (TOML's, or a vLLM YAML file's once translated) as MatrixSpec field values."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}  # each setting's key as the file spelt it
    for key, v in data.items():
        k = key.replace("-", "_")
        k = TOML_ALIASES.get(k, k)
        if (first := given.setdefault(k, key)) != key:
            raise UsageError(f"{path}: {first} and {key} set the same setting: give one")
        if k in LIST_FIELDS and not isinstance(v, list):
            v = [v]
        if k == "twin" and isinstance(v, list) and all(isinstance(x, str) for x in v):
            v = twins.LIST_SEP.join(v)  # several twins, as --twin a,b spells them
        if k == TWIN.spec_field:
            v = [parse_onoff(x, f"{path}: {TWIN.spec_field}") for x in v]
        if k == "fa_versions":
            try:
                v = parse_fa_list(",".join(str(x) for x in v), toml_key(k))
            except UsageError as e:
                raise UsageError(f"{path}: {e}") from None
        out[k] = v
    return out


YAML_SUFFIXES = (".yaml", ".yml")
# vLLM's names (a `vllm serve --config` file's keys) for the matrix's own settings.
VLLM_CONFIG_KEYS = {"tensor_parallel_size": "tp", "attention_backend": "backend"}


def load_config(path: Path) -> dict[str, Any]:
    """``--config``: a matrix TOML file, or a vLLM YAML config (``vllm serve --config``'s: one
    mapping of engine arguments, dashed or not). A YAML key that is a matrix setting (``model``,
    ``dtype``, ``seed``, ``tensor-parallel-size`` as --tp, ...) sets it; every other key is an engine
    argument, checked as -E's are."""
    path = userpath.resolve(path, "--config")
    if path.suffix.lower() not in YAML_SUFFIXES:
        return load_toml(path)
    import yaml

    text = read_config_text(path)
    try:
        # An alias (*name) repeats what its anchor holds: nested ones ("billion laughs") expand to
        # more objects than memory holds once the values are walked. No engine argument needs one.
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                mark = event.start_mark
                raise UsageError(
                    f"{path} line {mark.line + 1}: YAML alias *{event.anchor} refused (aliases can expand "
                    "without bound); write the value out"
                )
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UsageError(f"{path}: invalid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise UsageError(f"{path}: invalid YAML: nested too deeply") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a vLLM config is one mapping of engine arguments (key: value)")
    ours: dict[str, Any] = {}
    engine: dict[str, Any] = {}
    given: dict[str, str] = {}  # each setting's key as the file spelt it
    for key, value in data.items():
        name = VLLM_CONFIG_KEYS.get(k := str(key).replace("-", "_"), k)
        if (first := given.setdefault(name, str(key))) != str(key):
            raise UsageError(f"{path}: {first} and {key} set the same setting: give one")
        if name == "engine_args" and isinstance(value, dict):
            engine.update({str(a).replace("-", "_"): v for a, v in value.items()})
        elif name in CONFIG_KEYS:
            ours[name] = value
        else:
            engine[name] = value
    if engine:
        ours["engine_args"] = engine
    return config_values(ours, path)
