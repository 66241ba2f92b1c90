"""A JSON object as a dataclass that gives back, key for key, the object it was read from.

``Section.from_json`` reads what any version of the harness wrote: a missing key takes its field's
default, a key this version does not know is kept in ``extra`` and written back unchanged.
``to_json`` gives back the dict that was read, key for key (order included), so a read and a write
change nothing but what the caller changed: a key the object lacked is written only once a caller
sets it to something other than its default, or through ``update`` (which, like ``dict.update``,
writes what it sets even where that is the default; ``drop`` is ``dict.pop``). A section built in
code (not read) writes every field, except the optional ones (default ``None``) still unset; one
built with ``of`` writes the fields given, as a dict literal of them would. Values are kept as read
(an int stays an int where a float was declared).

run.json's sections (``run/manifest.py``) and the plan it stores (``plan/matrix.py``: ``Cell``,
``EnginePlan``, ``Plan``, which the planner builds and the manifest serialises) are sections.
Standard library only; imports nothing of the package.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

_MISSING = dataclasses.MISSING


def _default(f: dataclasses.Field) -> Any:
    if f.default is not _MISSING:
        return f.default
    if f.default_factory is not _MISSING:
        return f.default_factory()
    return _MISSING


class Section:
    """A JSON object with typed fields, the unknown keys in ``extra`` and the keys read in ``keys``.

    ``keys`` is None for a section built in code, else the keys it is written with, in their order:
    those of the object it was read from (or the fields given to ``of``), then those ``update`` added.
    Subclasses name nested sections in ``_nested`` (field -> (decode, encode)).
    """

    _nested: ClassVar[dict[str, tuple[Any, Any]]] = {}
    extra: dict[str, Any]
    keys: tuple[str, ...] | None

    @classmethod
    def _names(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if f.name not in ("extra", "keys")]

    @classmethod
    def from_json(cls, data: Any) -> Any:
        data = data if isinstance(data, dict) else {}
        kw: dict[str, Any] = {}
        names = set()
        for f in cls._names():
            names.add(f.name)
            if f.name in data:
                value = data[f.name]
                if f.name in cls._nested:
                    value = cls._nested[f.name][0](value)
                kw[f.name] = value
        extra = {k: v for k, v in data.items() if k not in names}
        return cls(**kw, extra=extra, keys=tuple(data))

    @classmethod
    def of(cls, **values: Any) -> Any:
        """A section built in code that writes exactly ``values`` (a ``None`` among them too), as a
        dict literal of them would, and any other field only once it is set."""
        return cls(**values, keys=tuple(values))

    def has(self, name: str) -> bool:
        """Whether the object read held ``name`` (always, for a section built in code)."""
        return self.keys is None or name in self.keys

    def update(self, **values: Any) -> None:
        """Set fields as ``dict.update`` sets keys: each is written, even where it equals its default."""
        names = {f.name for f in self._names()}
        for name, value in values.items():
            if name not in names:
                raise TypeError(f"{type(self).__name__} has no field {name!r}")
            setattr(self, name, value)
            if self.keys is not None and name not in self.keys:
                self.keys = (*self.keys, name)

    def drop(self, name: str) -> None:
        """Unset an optional field as ``dict.pop`` removes a key: back to None, and not written."""
        setattr(self, name, None)
        if self.keys is not None:
            self.keys = tuple(k for k in self.keys if k != name)

    def stored(self, name: str) -> Any:
        """What ``to_json`` writes under ``name`` (a nested section in its JSON form), None where it
        writes no such key: a dict's ``get``, for code that copies fields as the file held them."""
        for f in self._names():
            if f.name == name:
                value = getattr(self, name)
                if not self._written(f, value):
                    return None
                return self._nested[name][1](value) if name in self._nested else value
        return self.extra.get(name)

    def unknown_keys(self) -> list[str]:
        """The keys read that this version has no field for (a newer version's), nested sections'
        too, as dotted names: ``future``, ``plan.cells[3].future``, ``engines.k.future``."""
        out = list(self.extra)
        for name, child in self._children():
            out += [f"{name}.{k}" for k in child.unknown_keys()]
        return out

    def keep_unknown(self, old: Section) -> None:
        """Take ``old``'s unknown keys that this section lacks: a section built anew to replace the
        one read (a resume's run.json) keeps what a newer version wrote there. Nested sections are
        matched by field, by key in a map and by position in a list."""
        for k, v in old.extra.items():
            self.extra.setdefault(k, v)
        theirs = dict(old._children())
        for name, child in self._children():
            if (twin := theirs.get(name)) is not None and type(twin) is type(child):
                child.keep_unknown(twin)

    def _children(self) -> list[tuple[str, Section]]:
        """The nested sections, each named as :meth:`unknown_keys` names it."""
        out: list[tuple[str, Section]] = []
        for name in self._nested:
            value = getattr(self, name, None)
            if isinstance(value, Section):
                out.append((name, value))
            elif isinstance(value, dict):
                out += [(f"{name}.{k}", v) for k, v in value.items() if isinstance(v, Section)]
            elif isinstance(value, list):
                out += [(f"{name}[{i}]", v) for i, v in enumerate(value) if isinstance(v, Section)]
        return out

    def _written(self, f: dataclasses.Field, value: Any) -> bool:
        default = _default(f)
        if self.keys is None:
            return not (value is None and default is None)  # an optional key never set is left out
        # A key absent from the file read is left out while it is untouched.
        return f.name in self.keys or not (value == default or (value is None and default is None))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in self._names():
            value = getattr(self, f.name)
            if not self._written(f, value):
                continue
            if f.name in self._nested:
                value = self._nested[f.name][1](value)
            out[f.name] = value
        out.update(self.extra)
        if self.keys:
            order = {k: i for i, k in enumerate(self.keys)}
            out = dict(sorted(out.items(), key=lambda kv: order.get(kv[0], len(order))))
        return out


def section_map(cls: Any) -> tuple[Any, Any]:
    """(decode, encode) of a JSON object whose values are ``cls`` sections."""
    return (
        lambda d: {k: cls.from_json(v) for k, v in d.items()} if isinstance(d, dict) else d,
        lambda d: {k: v.to_json() for k, v in d.items()} if isinstance(d, dict) else d,
    )


def section_list(cls: Any) -> tuple[Any, Any]:
    """(decode, encode) of a JSON list of ``cls`` sections."""
    return (
        lambda xs: [cls.from_json(x) for x in xs] if isinstance(xs, list) else xs,
        lambda xs: [x.to_json() for x in xs] if isinstance(xs, list) else xs,
    )


def section_one(cls: Any) -> tuple[Any, Any]:
    """(decode, encode) of one nested ``cls`` section."""
    return (cls.from_json, lambda v: v.to_json())
