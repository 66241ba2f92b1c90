"""A flag's or config file's value as the matrix reads it: comma lists (:func:`split_list`),
positive integers, on/off (an arm's name too), FlashAttention versions and ``--hf-overrides``' JSON;
each malformed value a one-line UsageError."""

from __future__ import annotations

import json
from typing import Any

from cascade_repro.errors import UsageError
from cascade_repro.twin import CASCADE as TWIN


def parse_onoff(x: Any, where: str) -> bool:
    if isinstance(x, bool):
        return x
    s = str(x).strip().lower()
    # An arm's name says which value it is.
    if s in ("on", "true", "1", "yes", TWIN.test):
        return True
    if s in ("off", "false", "0", "no", TWIN.ref):
        return False
    raise UsageError(f"{where}: expected on/off, got {x!r}")


def split_list(text: str, name: str) -> list[str]:
    """The items of a comma-separated flag value, stripped; an empty item (``8,,16``, a trailing
    comma) is a one-line error, not skipped: it is a value the user meant to type and did not."""
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise UsageError(f"{name}: give at least one value")
    if not all(parts):
        raise UsageError(f"{name}: empty item in {text!r}")
    return parts


def parse_int_list(text: str, name: str) -> list[int]:
    """Parse ``"1,8,16"``; reject empty items, non-integers and values <= 0 with a one-line error."""
    out = []
    for part in split_list(text, f"--{name}"):
        try:
            v = int(part)
        except ValueError:
            raise UsageError(f"--{name}: {part!r} is not an integer") from None
        if v <= 0:
            raise UsageError(f"--{name}: values must be positive, got {v}")
        out.append(v)
    if not out:
        raise UsageError(f"--{name}: give at least one value")
    return out


def parse_onoff_list(text: str, name: str) -> list[bool]:
    return [parse_onoff(p, f"--{name}") for p in split_list(text, f"--{name}")]


def parse_fa_list(text: str, name: str = "--fa-version") -> list[int | None]:
    """Parse ``"default,2,3"``; ``name`` is how the error names the value (a flag or a TOML key)."""
    out: list[int | None] = []
    for p in split_list(text, name):
        p = p.lower()
        if p in ("default", "auto", "none", "0"):
            out.append(None)
        elif p in ("2", "3", "4", "fa2", "fa3", "fa4"):
            out.append(int(p[-1]))
        else:
            raise UsageError(f"{name}: expected 2, 3, 4 or default, got {p!r}")
    return out


def parse_hf_overrides(text: str) -> dict[str, Any]:
    """Parse ``--hf-overrides`` JSON into a dict; any malformed input is a one-line UsageError."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--hf-overrides is not valid JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:
        raise UsageError("--hf-overrides is nested too deeply") from None
    if not isinstance(value, dict):
        raise UsageError("--hf-overrides must be a JSON object")
    return value
