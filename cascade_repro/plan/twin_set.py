"""Which twins one run compares: ``--twin a,b,c``, or ``--twin all`` expanded to every twin this
engine can test (on vLLM: the installed release's, ``tp`` only where the GPUs are there); and the
plans of several twins merged into one, a cell two twins share run once (:func:`merge_twins`).

A run of several twins keeps them as one comma-separated text in the spec (``twin``), each entry's
own spelling, in the order given; ``all`` is never stored: a resumed run compares the twins its
first start expanded, whatever the machine it resumes on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cascade_repro import twin as twins
from cascade_repro import vllm_surface
from cascade_repro.engines import get as engine_info
from cascade_repro.errors import UsageError
from cascade_repro.rundir.cells import Cell, EnginePlan, Plan


@dataclass(frozen=True)
class Expansion:
    """What ``all`` stands for here: the twins, in the registry's order, and one line naming what
    was left out and why (None: nothing)."""

    names: tuple[str, ...]
    left_out: str | None = None


def expand_all(
    engine: str, batches: Sequence[int], version: str | None = None, gpus: int | None = None
) -> Expansion:
    """Every twin ``engine`` can test: the fixed entries and one of each parameterised family (the
    batch twin from 1 to the largest batch, TP 1 against 2, FLASH_ATTN against TRITON_ATTN); on
    vLLM those the installed ``version`` can test and, for ``tp``, where ``gpus`` (None: unknown)
    are enough."""
    info = engine_info(engine)
    top = max((b for b in batches if isinstance(b, int) and not isinstance(b, bool)), default=8)
    # Each parameterised family at its example arms; the batch twin up to this matrix's largest
    # batch, the backend twin against Triton's, which every vLLM carries (FlashInfer is a package
    # of its own that a box may lack: name it in a list).
    params = {f: ex for f, (_, ex) in twins.PARAMETERISED.items()}
    if "batch" in params:
        params["batch"] = f"batch=1:{top if top > 1 else 8}"
    if "attention-backend" in params:
        params["attention-backend"] = "attention-backend=FLASH_ATTN:TRITON_ATTN"
    candidates = [*twins.FIXED.values(), *(twins.resolve(ex) for ex in params.values())]
    kept: list[str] = []
    dropped: dict[str, list[str]] = {}

    def drop(why: str, name: str) -> None:
        dropped.setdefault(why, []).append(name)

    for tw in candidates:
        if engine not in tw.engines:
            drop(f"the {engine} engine cannot serve them", tw.name)
        elif tw.axis == "tp" and not info.tensor_parallel:
            drop(f"the {engine} engine runs on one device", tw.name)
        elif tw.family == twins.CHUNKED_PREFILL.family and top > twins.CHUNK_TOKENS:
            drop(f"batch {top} > the {twins.CHUNK_TOKENS}-token prefill step vLLM allows", tw.name)
        elif info.is_vllm and vllm_surface.twin_problem(tw.family, version) is not None:
            drop(f"vLLM {version} cannot test them", tw.name)
        elif info.is_vllm and tw.gpus > 1 and (gpus is None or gpus < tw.gpus):
            drop(f"{tw.gpus} GPUs needed, {'an unknown number' if gpus is None else gpus} visible", tw.name)
        else:
            kept.append(tw.name)
    note = "; ".join(f"{', '.join(names)} ({why})" for why, names in dropped.items())
    return Expansion(tuple(kept), f"--twin all leaves out {note}" if note else None)


def expand(
    text: str, engine: str, batches: Sequence[int], version: str | None = None, gpus: int | None = None
) -> tuple[str, str | None]:
    """``--twin``'s text with ``all`` expanded (the text unchanged otherwise), and the line naming
    what ``all`` left out; a ValueError in one line where ``all`` leaves nothing."""
    if text.strip() != twins.ALL:
        return text, None
    exp = expand_all(engine, batches, version, gpus)
    if not exp.names:
        raise ValueError(f"--twin all: the {engine} engine can test no twin here ({exp.left_out})")
    return twins.LIST_SEP.join(exp.names), exp.left_out


def arm_config(tw: twins.TwinAxis, arm: str, toggled: bool) -> tuple:
    """What an engine serving ``arm`` of ``tw`` is started with, as far as the twin decides it: its
    engine arguments and environment; an engine that toggles the arms per wave is the twin's own
    (its setting switched by the engine, never another twin's)."""
    if toggled:
        return ("toggle", tw.name, arm)
    args = tuple(sorted((k, repr(v)) for k, v in tw.engine_args(arm).items()))
    return (args, tuple(sorted(tw.env(arm).items())))


def merge_twins(plans: list[tuple[twins.TwinAxis, Plan]]) -> Plan:
    """The plans of several twins as one: the cells and engine keys of each in the twins' order,
    a cell another twin's cell duplicates (same engine configuration and cell axes, same batch,
    rerun, fault and origin) dropped in favour of the first, which then serves both (its
    ``twins``: each twin's name and the arm it reads the cell as). Every cell and engine names its
    twins (``twins``, ``EnginePlan.twin``: the twin whose spec builds the engine)."""
    engines: dict[str, EnginePlan] = {}
    cells: dict[str, Cell] = {}
    by_config: dict[tuple, Cell] = {}
    for tw, p in plans:
        toggled = {k for k, ep in p.engines.items() if ep.arm is None}
        for key, ep in p.engines.items():
            for c in p.cells_of(key):
                sig = (arm_config(tw, c.arm, key in toggled), c.tp, c.batch, c.rerun, c.seed, c.dtype,
                       c.fa_version, c.backend, c.inject, c.origin, key in toggled)  # fmt: skip
                if (first := by_config.get(sig)) is not None:
                    first.twins = {**(first.twins or {}), tw.name: c.arm}
                    continue
                if c.cell_id in cells:
                    other = next(iter(cells[c.cell_id].twins or {}), "another twin")
                    raise UsageError(
                        f"--twin {other} and {tw.name} both name cell {c.cell_id} with other settings: "
                        "run them apart"
                    )
                c.update(twins={tw.name: c.arm})
                by_config[sig] = cells[c.cell_id] = c
                mine = engines.get(key)
                if mine is None:
                    mine = engines[key] = EnginePlan.of(**{**ep.to_json(), "cells": []})
                    mine.update(twin=tw.name)
                mine.cells.append(c.cell_id)
    return Plan(engines=engines, cells=[cells[i] for ep in engines.values() for i in ep.cells])
