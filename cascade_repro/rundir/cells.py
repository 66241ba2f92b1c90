"""The plan as run.json stores it: a ``Plan`` of ``EnginePlan``s and ``Cell``s, the very sections the
planner (``plan.matrix.plan``) makes and every stage after it reads back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from cascade_repro.section import Section, section_list, section_map

ORIGINS = ("matrix", "control", "calibration")


@dataclass
class Cell(Section):
    """One (engine key, batch size, arm, rerun) combination: a set of samples over all prompts; one
    entry of run.json's ``plan.cells``.

    ``inject`` is the fault the cascade arm runs with (None: clean). ``origin`` says why the cell
    exists: the user's matrix, a noise control the planner added, or a calibration step. The
    defaults are what a run.json without the key is read as.
    """

    cell_id: str = ""
    engine_key: str = ""
    tp: int = 1
    batch: int = 1
    arm: str = ""  # TWIN.test | TWIN.ref
    rerun: int = 0
    seed: int = 0
    dtype: str = "auto"
    fa_version: int | None = None
    backend: str = ""
    inject: str | None = None
    origin: str = "matrix"
    # A run of several twins: each twin the cell serves and the arm it reads the cell as (a cell
    # whose engine configuration two twins' arms share runs once); None in a run of one twin.
    twins: dict[str, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = field(default=None, repr=False, compare=False)

    def arm_for(self, twin: str) -> str | None:
        """The arm ``twin`` reads this cell as; None where the cell does not serve it (a run of one
        twin: every cell serves it, under its own arm)."""
        if self.twins is None:
            return self.arm
        return self.twins.get(twin)


@dataclass
class EnginePlan(Section):
    """Everything one worker process needs: the engine to build and the ids of the cells it serves,
    in run order; one entry of run.json's ``plan.engines``."""

    key: str = ""
    tp: int = 1
    seed: int = 0
    dtype: str = "auto"
    fa_version: int | None = None
    backend: str = ""
    arm: str | None = None  # None: the engine serves both arms (toggled per cell)
    cells: list[str] = field(default_factory=list)
    # A run of several twins: the twin whose settings this engine is built with (None: the run's one).
    twin: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = field(default=None, repr=False, compare=False)


@dataclass
class Plan(Section):
    """What :func:`~cascade_repro.plan.matrix.plan` makes of a spec and run.json stores as ``plan``: the engine keys (in run
    order) and every cell (grouped by engine, in run order)."""

    _nested: ClassVar[dict[str, tuple[Any, Any]]] = {
        "engines": section_map(EnginePlan),
        "cells": section_list(Cell),
    }

    engines: dict[str, EnginePlan] = field(default_factory=dict)
    cells: list[Cell] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = field(default=None, repr=False, compare=False)

    def cell_map(self) -> dict[str, Cell]:
        return {c.cell_id: c for c in self.cells}

    def for_twin(self, twin: str) -> Plan:
        """The plan as a run of ``twin`` alone reads it: the cells serving it, each under the arm
        that twin reads it as (copies; the engines as they are)."""
        import dataclasses

        cells = [c if c.twins is None else dataclasses.replace(c, arm=c.twins[twin])
                 for c in self.cells if c.arm_for(twin) is not None]  # fmt: skip
        return Plan(engines=self.engines, cells=cells, extra=self.extra, keys=self.keys)

    def cells_of(self, key: str) -> list[Cell]:
        """The cells engine ``key`` serves, in its order (ids without a cell left out)."""
        by_id = self.cell_map()
        return [by_id[i] for i in self.engines[key].cells if i in by_id]
