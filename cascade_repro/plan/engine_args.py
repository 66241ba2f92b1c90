"""`--engine-args` / `-E key=value`: any vLLM engine argument, passed to both arms alike.

vLLM users describe their setup in engine arguments (``block_size``, ``max_num_batched_tokens``,
``kv_cache_dtype``, quantization, ...); lm-eval's ``--model_args`` passes any key to ``LLM(...)``.
This module parses them, refuses the few that would break the experiment or that the harness owns
(with the option to use instead), and checks every name against the installed vLLM's
``EngineArgs`` fields, or, where vLLM is not importable (``--dry-run`` on a laptop), against the
fields recorded from vLLM 0.26.0 (``tests/data/vllm-surface-0.26.0.json``; a test keeps
the two equal). Standard library only, and vLLM is imported only when arguments are given.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cascade_repro.errors import UsageError
from cascade_repro.vllm_surface.fields import FIELDS

RECORDED_RELEASE = "0.26.0"
# EngineArgs fields of vLLM 0.26.0 (public names), recorded by scripts/old-vllm/record_surface.py.
RECORDED_FIELDS = frozenset(FIELDS[RECORDED_RELEASE])


# Owned by the harness: each is a matrix option (an axis or a per-arm setting), so passing it here
# would either be overwritten or make the two arms differ.
OWNED = {
    "model": "use --model",
    "tensor_parallel_size": "use --tp (an axis of the matrix)",
    "seed": "use --seed (an axis of the matrix)",
    "dtype": "use --dtype (an axis of the matrix)",
    "attention_config": "use --backend and --fa-version (axes of the matrix)",
    "attention_backend": "use --backend (an axis of the matrix)",
    "disable_cascade_attn": "the harness sets it per arm (cascade on in the cascade arm, off in the flat twin)",
}


# vLLM's short spellings (``vllm serve``'s argparse aliases): ``-pp 2``, ``-O0``. ``-tp`` is the
# matrix's own (--tp); ``-q`` is --quiet here, so quantization is spelled --quantization.
SHORT_FLAGS = {
    "-pp": "pipeline_parallel_size",
    "-dcp": "decode_context_parallel_size",
    "-dp": "data_parallel_size",
    "-dpn": "data_parallel_rank",
    "-dpr": "data_parallel_start_rank",
    "-dpl": "data_parallel_size_local",
    "-dpa": "data_parallel_address",
    "-dpp": "data_parallel_rpc_port",
}
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_KIND_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "list": "a list (comma-separated, or JSON)",
    "object": "a JSON object",
}


@dataclass(frozen=True)
class Fields:
    """The engine-argument names to check against, the kind of value each takes, and where they come
    from (the installed vLLM's EngineArgs, or a recorded release's)."""

    kinds: Mapping[str, str]
    where: str

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.kinds)


def parse_value(text: str) -> Any:
    """A value as JSON when it reads as JSON (``32``, ``true``, ``{"a": 1}``), else the string itself."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def coerce(key: str, text: str, kind: str, source: str = "-E") -> Any:
    """A value typed on the command line as its field's kind: ``32`` for an int field, ``True`` for
    ``true`` on a bool, the text itself for a string (``--revision 0123`` stays ``"0123"``). A value
    that is not of the kind is a one-line UsageError naming the field and what it takes; ``None`` or
    ``null`` is None, as vLLM's optional arguments read it."""
    text = text.strip()
    if text in ("None", "null") and kind != "bool":
        return None
    if kind == "str":
        return text
    if kind == "bool":
        low = text.lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
    elif kind == "int":
        try:
            return int(text)
        except ValueError:
            pass
    elif kind == "float":
        try:
            return float(text)
        except ValueError:
            pass
    elif kind == "list":
        value = parse_value(text)
        return value if isinstance(value, list) else [parse_value(x.strip()) for x in text.split(",")]
    elif kind == "object":
        if isinstance(value := parse_value(text), dict):
            return value
    else:
        return parse_value(text)
    raise UsageError(f"{source} {key}={text!r}: {key} takes {_KIND_WORDS[kind]}")


def check_kind(key: str, value: Any, kind: str, source: str) -> None:
    """Refuse a value (already typed: from JSON, TOML or YAML) that is not of its field's kind."""
    if value is None or kind == "any":
        return
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "list": isinstance(value, list),
        "object": isinstance(value, dict),
    }[kind]
    if not ok:
        raise UsageError(f"{source}: engine argument {key}={value!r}: {key} takes {_KIND_WORDS[kind]}")


def _looks_like_pairs(value: str) -> bool:
    """``32,kv_cache_dtype=fp8``: lm-eval's ``k=v,k=v`` typed after one -E, not one value."""
    parts = value.split(",")
    return len(parts) > 1 and all(_is_pair(p) for p in parts[1:])


def _is_pair(text: str) -> bool:
    key, sep, _ = text.partition("=")
    key = key.strip().replace("-", "_")
    return bool(sep) and key.isidentifier()


def split_pairs(text: str) -> list[str]:
    """``k=v,k=v`` (lm-eval's ``--model_args``) into its pairs; a comma inside a JSON value
    (``{"a": 1, "b": 2}``, ``[1, 2]``) or a list (``8,16``) stays in its value."""
    out: list[str] = []
    for part in text.split(","):
        if out and not _is_pair(part):
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def parse_pairs(items: Iterable[str], source: str = "-E") -> dict[str, Any]:
    """``-E key=value`` (repeatable) into a dict; vLLM's dashed spelling (``block-size``) is accepted,
    ``k=v,k=v`` after one -E is split as lm-eval splits ``--model_args``, and each value is read as
    its field's kind (:func:`coerce`; JSON where the field is not known)."""
    kinds = known_fields().kinds
    out: dict[str, Any] = {}
    for item in items:
        for pair in split_pairs(item) if _looks_like_pairs(item.partition("=")[2]) else [item]:
            key, sep, value = pair.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or not key:
                raise UsageError(f"{source} {item!r}: expected key=value, e.g. -E block_size=32")
            out[key] = coerce(key, value, kinds.get(key, "any"), source)
    return out


def parse_json(text: str) -> dict[str, Any]:
    """``--engine-args`` JSON into a dict; malformed input is a one-line UsageError."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--engine-args is not valid JSON: {e}") from None
    except RecursionError:
        raise UsageError("--engine-args is nested too deeply") from None
    if not isinstance(value, dict):
        raise UsageError("--engine-args must be a JSON object, e.g. '{\"block_size\": 32}'")
    return {str(k).replace("-", "_"): v for k, v in value.items()}


def flag_of(name: str) -> str:
    """A field's ``vllm serve`` spelling: ``--block-size``."""
    return "--" + name.replace("_", "-")


def parse_flags(tokens: list[str], fields: Fields | None = None) -> tuple[dict[str, Any], list[str]]:
    """vLLM's own flags as ``vllm serve`` takes them (``--block-size 32``, ``--block-size=32``,
    ``--enable-prefix-caching``, ``--no-enable-chunked-prefill``, ``-pp 2``, ``-O0``) into engine
    arguments, each value read as its field's kind. Returns them and the tokens that are not vLLM
    flags (for the caller to read or refuse), in order. A flag of a field whose kind is unknown and
    that no value follows is ``True``, as a switch."""
    fields = fields or known_fields()
    out: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        flag, eq, inline = tok.partition("=")
        name, negated = _field_of(flag, fields)
        if name is None:
            rest.append(tok)
            continue
        if name is _OPT_LEVEL:  # -O0, -O 3, -O=3
            name, text = _optimization(tok, tokens, i, fields)
            i += 0 if tok[2:] else 1
            out.update({name: text})
            continue
        kind = fields.kinds[name]
        if negated or (kind == "bool" and not eq):
            out[name] = not negated
            continue
        if eq:
            text = inline
        elif i < len(tokens) and not tokens[i].startswith("--"):
            text = tokens[i]
            i += 1
        elif kind == "any":
            out[name] = True
            continue
        else:
            raise UsageError(f"{flag} needs a value: {name} takes {_KIND_WORDS[kind]}")
        out[name] = coerce(name, text, kind, flag)
    return out, rest


_OPT_LEVEL = "-O"


def _field_of(flag: str, fields: Fields) -> tuple[str | None, bool]:
    """The field a flag names (and whether it is the ``--no-`` form), or None."""
    if flag.startswith("-O") and not flag.startswith("--"):
        return _OPT_LEVEL, False
    if flag in SHORT_FLAGS:
        name = SHORT_FLAGS[flag]
        return (name, False) if name in fields.kinds else (None, False)
    if not flag.startswith("--"):
        return None, False
    name = flag[2:].replace("-", "_")
    if name in fields.kinds:
        return name, False
    if name.startswith("no_") and fields.kinds.get(name[3:]) in ("bool", "any"):
        return name[3:], True
    return None, False


def _optimization(tok: str, tokens: list[str], i: int, fields: Fields) -> tuple[str, Any]:
    """``-O<n>``: vLLM's optimization level (``optimization_level`` where the release has it; before
    that, ``-O3`` was compilation_config's level)."""
    text = tok[2:].lstrip("=") or (tokens[i] if i < len(tokens) else "")
    try:
        level = int(text)
    except ValueError:
        raise UsageError(f"-O{text}: expected an optimization level, e.g. -O0 or -O3") from None
    if "optimization_level" in fields.kinds:
        return "optimization_level", level
    return "compilation_config", {"level": level}


def known_fields() -> Fields:
    """The engine-argument names to check against, their kinds, and where they come from."""
    if importlib.util.find_spec("vllm") is not None:
        try:
            import vllm
            from vllm.engine.arg_utils import EngineArgs

            return Fields(
                _installed_kinds(EngineArgs), f"vLLM {getattr(vllm, '__version__', '?')}'s EngineArgs"
            )
        except Exception:  # noqa: BLE001 - a broken install: fall back to the recorded list
            pass
    return recorded(RECORDED_RELEASE, "vLLM is not importable here")


def recorded(release: str, why: str = "") -> Fields:
    """A recorded release's fields (``vllm_surface/fields/``)."""
    return Fields(FIELDS[release], f"vLLM {release}'s EngineArgs as recorded" + (f", {why}" if why else ""))


def _installed_kinds(cls: type) -> dict[str, str]:
    """Each field's kind from its annotation, as vLLM's ``_compute_kwargs`` maps annotations to
    command-line types (see :func:`kind_of_type`).

    The annotations are resolved first for the whole class; where that fails (one field naming a
    class imported only under ``TYPE_CHECKING``, as 0.26.0's ``quantization_config`` does), each
    field on its own, a string annotation evaluated in its module's namespace; a field that still
    does not resolve takes its recorded kind, so one such field never turns every kind to ``any``."""
    import dataclasses
    import sys
    import typing

    try:
        hints: dict[str, Any] | None = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # noqa: BLE001 - a name vLLM imports only for type checkers
        hints = None
    module = sys.modules.get(cls.__module__)
    namespace = dict(vars(module)) if module is not None else {}
    recorded_kinds = FIELDS[RECORDED_RELEASE]

    out: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        hint = hints[f.name] if hints is not None and f.name in hints else _field_hint(f.type, namespace)
        kind = kind_of_type(hint) if hint is not _UNRESOLVED else None
        out[f.name] = kind or recorded_kinds.get(f.name, "any")
    return out


_UNRESOLVED = object()


def _field_hint(annotation: Any, namespace: dict[str, Any]) -> Any:
    """One field's annotation as a type: a string one evaluated in its module's namespace."""
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, namespace)  # noqa: S307 - the installed vLLM's own annotation text
    except Exception:  # noqa: BLE001 - NameError for a TYPE_CHECKING-only name, or older syntax
        return _UNRESOLVED


def _hint_members(t: Any) -> set[Any] | None:
    """vLLM's ``get_type_hints``: Annotated and unions flattened; None where a member is still a
    forward reference (a string inside ``Optional["X"]``)."""
    import types
    import typing

    origin = typing.get_origin(t)
    if origin is typing.Annotated:
        return _hint_members(typing.get_args(t)[0])
    if origin in (typing.Union, types.UnionType):
        out: set[Any] = set()
        for a in typing.get_args(t):
            inner = _hint_members(a)
            if inner is None:
                return None
            out |= inner
        return out
    if isinstance(t, str | typing.ForwardRef):
        return None
    return {t}


def kind_of_type(t: Any) -> str | None:
    """The kind vLLM's ``_compute_kwargs`` gives an annotation, rule by rule in its order: a config
    dataclass is a JSON object; ``bool | str | None`` a bare flag or a string (``any``); then bool,
    Literal (its members' type), list/tuple/set, int (an IntEnum too: Python is handed its int),
    float, a dict-or-string (``any``), dict (an object), str or any other class (an Enum, ``Any``).
    None where the annotation does not resolve."""
    import dataclasses
    import enum
    import typing

    hints = _hint_members(t)
    if hints is None:
        return None
    hints = {int if isinstance(h, type) and issubclass(h, enum.IntEnum) else h for h in hints}

    def has(kind: Any) -> bool:
        return any(h is kind or typing.get_origin(h) is kind for h in hints)

    def foreign() -> bool:
        return any(getattr(h, "__module__", "builtins") != "builtins" for h in hints)

    if any(isinstance(h, type) and dataclasses.is_dataclass(h) for h in hints):
        return "object"
    if hints == {bool, str, type(None)}:
        return "any"
    if has(bool):
        return "bool"
    if has(typing.Literal):
        literal = next(h for h in hints if typing.get_origin(h) is typing.Literal)
        members = {type(a) for a in typing.get_args(literal)}
        kind = members.pop().__name__ if len(members) == 1 else "any"
        return kind if kind in ("int", "float", "str", "bool") else "any"
    if has(tuple) or has(list) or has(set) or has(frozenset):
        return "list"
    if has(int):
        return "int"
    if has(float):
        return "float"
    if has(dict):
        return "any" if has(str) or foreign() else "object"
    if has(str) or foreign():
        return "str"
    return "any"


def check(args: dict[str, Any], max_batch: int, source: str = "options") -> None:
    """Raise a one-line UsageError for the first argument that is unknown, of the wrong kind, or
    would break the experiment."""
    if not args:
        return
    for key, value in args.items():
        if not isinstance(key, str) or not key:
            raise UsageError(f"{source}: engine argument names must be strings, got {key!r}")
        if key in OWNED:
            raise UsageError(f"{source}: engine argument {key!r}: {OWNED[key]}")
        if key == "enable_prefix_caching" and value is not True:
            raise UsageError(
                f"{source}: engine argument enable_prefix_caching={value!r}: cascade attention needs "
                "prefix caching (the shared prefix must be cached), so both arms keep it on"
            )
        if key == "max_num_seqs":
            if not isinstance(value, int) or isinstance(value, bool) or value < max_batch:
                raise UsageError(
                    f"{source}: engine argument max_num_seqs={value!r}: must be an integer >= the largest "
                    f"--batch ({max_batch}), or a wave would not run as one batch (--batch is the number of "
                    "concurrent requests per wave)"
                )
    fields = known_fields()
    for key, value in args.items():
        if key not in fields.kinds:
            close = difflib.get_close_matches(key, sorted(fields.kinds), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(f"{source}: {key!r} is not an engine argument of {fields.where}{hint}")
        check_kind(key, value, fields.kinds[key], source)
