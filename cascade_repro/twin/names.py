"""A twin's name -> its entry: ``--twin`` parsed (:func:`resolve`, several with :func:`resolve_list`,
``all``), the spellings ``--help`` lists (:func:`help_text`), a run's spec read (:func:`of`), pair ids'
prefix, and the registry kept (:func:`register`, :func:`unregister`, :func:`load_plugins` from
``CASCADE_REPRO_TWINS``). Standard library only."""

from __future__ import annotations

import difflib
import importlib
import os
from typing import Any

from cascade_repro.twin.axis import TwinAxis
from cascade_repro.twin.entries import (
    _BUILT_IN,
    BACKEND,
    CASCADE,
    FAMILIES,
    FIXED,
    MAX_AXIS,
    PAIR_KINDS,
    PARAMETERISED,
    SPELLINGS,
    _backend_twin,
    _batch_twin,
    _tp_twin,
)

# ``module:NAME[,module:NAME...]``: entries outside this package, registered in every process that
# imports this module (a run's workers too, which inherit the environment).
PLUGINS_ENV = "CASCADE_REPRO_TWINS"


def _rebuild() -> None:
    FAMILIES[:] = [*dict.fromkeys(t.family for t in FIXED.values()), *PARAMETERISED]
    PAIR_KINDS.clear()
    PAIR_KINDS.update(FAMILIES)
    SPELLINGS[:] = [*FIXED, *(s for s, _ in PARAMETERISED.values())]


def register(entry: TwinAxis) -> TwinAxis:
    """Add a fixed entry to the registry (``--twin`` takes its name from then on); ValueError when
    its name or arms are another entry's."""
    taken = {n for t in FIXED.values() for n in (t.name, t.test, t.ref)} | set(PARAMETERISED)
    if FIXED.get(entry.name) == entry:
        return entry
    if {entry.name, entry.test, entry.ref} & taken or entry.family in PARAMETERISED:
        raise ValueError(f"twin {entry.name!r}: its name or an arm's is another entry's")
    FIXED[entry.name] = entry
    _rebuild()
    return entry


def unregister(name: str) -> None:
    """Remove a registered entry (tests that register a throw-away one)."""
    if name in _BUILT_IN:
        raise ValueError(f"twin {name!r} is built in")
    FIXED.pop(name, None)
    _rebuild()


def load_plugins(spec: str | None = None) -> None:
    """Register the entries ``CASCADE_REPRO_TWINS`` names (``module:NAME``, comma-separated)."""
    for item in filter(
        None, (x.strip() for x in (spec if spec is not None else os.environ.get(PLUGINS_ENV, "")).split(","))
    ):
        module, _, attr = item.partition(":")
        entry = getattr(importlib.import_module(module), attr, None)
        if not isinstance(entry, TwinAxis):
            raise ValueError(f"{PLUGINS_ENV}: {item} is not a twin entry (module:NAME of a TwinAxis)")
        register(entry)


def resolve(name: str | None) -> TwinAxis:
    """The registry's entry for ``--twin NAME`` (None: cascade); ValueError in one line otherwise."""
    if name is None:
        return CASCADE
    text = str(name).strip()
    if text in FIXED:
        return FIXED[text]
    family, eq, arg = text.partition("=")
    if family in PARAMETERISED and eq:
        spelling, example = PARAMETERISED[family]
        a, colon, b = arg.partition(":")
        if family == "attention-backend":
            a, b = a.strip().upper(), b.strip().upper()
            if not (colon and BACKEND.fullmatch(a) and BACKEND.fullmatch(b)) or a == b:
                raise ValueError(
                    f"--twin {spelling}: two different backend names, as in {example}; got {text!r}"
                )
            return _backend_twin(a, b)
        try:
            x, y = int(a), int(b)
        except ValueError:
            raise ValueError(f"--twin {spelling}: two integers, as in {example}; got {text!r}") from None
        if not (0 < x < y <= MAX_AXIS):
            raise ValueError(f"--twin {spelling}: A < B, both positive, as in {example}; got {text!r}")
        if family == "batch":
            if x != 1:
                raise ValueError(
                    f"--twin {spelling}: the reference arm runs one request at a time; got {text!r}"
                )
            return _batch_twin(x, y)
        return _tp_twin(x, y)
    if family in PARAMETERISED:
        spelling, example = PARAMETERISED[family]
        raise ValueError(f"--twin {family} takes its arms: {spelling}, as in {example}")
    raise ValueError(f"--twin must be one of {', '.join(SPELLINGS)}; got {text!r}")


# ``--twin all``: every twin the engine (and the installed vLLM, and the GPUs) can test, expanded by
# the planner (plan/twin_set.py); ``--twin a,b`` names several.
ALL = "all"
LIST_SEP = ","


def resolve_list(text: str | None) -> tuple[TwinAxis, ...]:
    """The entries ``--twin a,b,c`` names, in order, each once (None or one name: one entry); a
    ValueError in one line naming the unknown one, with the names it is close to."""
    if text is None or LIST_SEP not in str(text):
        return (resolve(text),)
    names = [p.strip() for p in str(text).split(LIST_SEP)]
    if not all(names):
        raise ValueError(f"--twin: empty name in {str(text)!r}")
    out: dict[str, TwinAxis] = {}
    for name in names:
        if name == ALL:
            raise ValueError(f"--twin {ALL} names every twin: give it alone, not in a list")
        try:
            tw = resolve(name)
        except ValueError as e:
            close = difflib.get_close_matches(name, [*SPELLINGS, *PARAMETERISED], n=2, cutoff=0.6)
            known = name.partition("=")[0] in PARAMETERISED  # a family's own message says how to spell it
            hint = f" (did you mean {' or '.join(close)}?)" if close and not known else ""
            raise ValueError(f"{e}{hint}") from None
        if tw.name in out:
            raise ValueError(f"--twin names {tw.name} twice in {str(text)!r}")
        out[tw.name] = tw
    return tuple(out.values())


def pair_prefix(tw: TwinAxis) -> str:
    """What every pair id of ``tw`` begins with in a run of several twins (``prefix-caching/``);
    a run of one twin's pair ids have none."""
    return tw.name + "/"


def all_examples() -> list[TwinAxis]:
    """One entry per family, the parameterised ones with their example arms (docs, doctor, tests)."""
    return [*FIXED.values(), *(resolve(ex) for _, ex in PARAMETERISED.values())]


def of(spec: Any) -> TwinAxis:
    """The twin a run's spec compares its arms on (a spec or run.json from before --twin: cascade)."""
    name = getattr(spec, "twin", None) if not isinstance(spec, dict) else spec.get("twin")
    return resolve(name or CASCADE.name)


def help_text() -> str:
    """The names ``--twin`` takes, as its help lists them: `a`, `b` or `c`."""
    names = [f"`{n}`" for n in SPELLINGS]
    return f"{', '.join(names[:-1])} or {names[-1]}"
