"""Who is compared with whom: each test cell paired with its twin, the reference-vs-reference noise
controls (``plan_pairs``), and the floor controls a pair's drift may be judged against
(``control_candidates``). Owns ``PairSpec`` and the pairing axes ``TWIN_AXES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cascade_repro.judge.outcome import (
    CALIBRATION,
    FLOOR_KINDS,
    NOISE_BATCH,
    NOISE_RERUN,
    NOISE_RESTART,
    TWIN_KINDS,
)
from cascade_repro.rundir.cells import Cell
from cascade_repro.twin import CASCADE as TWIN
from cascade_repro.twin import TwinAxis

TWIN_AXES = ("tp", "seed", "dtype", "fa_version", "backend")


@dataclass
class PairSpec:
    pair_id: str
    kind: str  # one of outcome.PAIR_KINDS
    test: Cell
    ref: Cell


def twin_key(c: Cell) -> tuple:
    return tuple(getattr(c, a) for a in TWIN_AXES)


def _ref_key(c: Cell, twin: TwinAxis) -> tuple:
    """What a test cell and its twin share: every axis but the one the twin's arms differ in."""
    axes = tuple(getattr(c, a) if a != twin.axis else None for a in TWIN_AXES)
    return (*axes, c.batch if twin.axis != "batch" else None)


def plan_pairs(cells: list[Cell] | list[dict[str, Any]], twin: TwinAxis = TWIN) -> list[PairSpec]:
    """Pair each test cell with its twin (cascade with flat); add reference-vs-reference noise controls.

    A twin that differs in a cell axis (``tp=1:2``, ``batch=1:N``, ``attention-backend=A:B``)
    pairs across it: the test cell at TP 2 with the TP 1 cell of the same batch, the batch-N cell
    with the batch-1 cell.

    Noise controls, per engine configuration: flat at batch B vs flat at the smallest batch, the
    smallest batch vs the next one (so every flat cell is the test side of one batch control), and
    a flat rerun vs its first run: ``noise-restart`` when the rerun had an engine start of its own,
    ``noise-rerun`` when it shared the engine. Calibration cells (cascade with an injected LSE
    shift) pair with the same twin as the clean cascade cell. Cells may come in their run.json form.
    """
    cells = [c if isinstance(c, Cell) else Cell.from_json(c) for c in cells]
    flat = {(twin_key(c), c.batch, c.rerun): c for c in cells if c.arm == twin.ref}
    refs = {_ref_key(c, twin): c for c in cells if c.arm == twin.ref and c.rerun == 0}
    pairs: list[PairSpec] = []
    for c in cells:
        if c.arm == twin.test and c.rerun == 0:
            ref = refs.get(_ref_key(c, twin))
            if ref:
                kind = CALIBRATION if c.origin == CALIBRATION else twin.pair_kind
                pairs.append(PairSpec(f"{c.cell_id}~{twin.ref}", kind, c, ref))
    by_twin: dict[tuple, list[Cell]] = {}
    for c in cells:
        if c.arm == twin.ref and c.rerun == 0:
            by_twin.setdefault(twin_key(c), []).append(c)
    for group in by_twin.values():
        group = sorted(group, key=lambda c: c.batch)
        base = group[0]
        for c in group[1:]:
            pairs.append(PairSpec(f"{c.cell_id}~b{base.batch}", NOISE_BATCH, c, base))
        if len(group) > 1:
            pairs.append(PairSpec(f"{base.cell_id}~b{group[1].batch}", NOISE_BATCH, base, group[1]))
    for (tk, b, r), c in flat.items():
        if r == 1 and (tk, b, 0) in flat:
            ref = flat[(tk, b, 0)]
            kind = NOISE_RESTART if c.engine_key != ref.engine_key else NOISE_RERUN
            pairs.append(PairSpec(f"{c.cell_id}~r0", kind, c, ref))
    return pairs


def control_candidates(pairs: list[PairSpec]) -> dict[str, list[tuple[PairSpec, str]]]:
    """For each cascade/calibration pair: the floor controls that contain its twin, with their other cell id.

    The control must contain the pair's twin, so the three cells (cascade, twin, the control's
    other side) give the same contexts on their agreeing positions. The scorer judges the pair
    against the candidate whose drift is largest (``compare_pair``), as the count floor takes the
    worst control: controls between similar batch shapes are quieter, and cascade is judged against
    the largest drift that an equivalent recomputation showed.
    """
    by_cell: dict[str, list[PairSpec]] = {}
    for ps in pairs:
        if ps.kind in FLOOR_KINDS:
            by_cell.setdefault(ps.test.cell_id, []).append(ps)
            by_cell.setdefault(ps.ref.cell_id, []).append(ps)
    out: dict[str, list[tuple[PairSpec, str]]] = {}
    for ps in pairs:
        if ps.kind not in (*TWIN_KINDS, CALIBRATION):
            continue
        twin = ps.ref.cell_id
        seen: dict[str, PairSpec] = {}
        for c in by_cell.get(twin, []):
            seen.setdefault(_other(c, twin).cell_id, c)  # one control per other cell
        if seen:
            out[ps.pair_id] = [(c, other) for other, c in seen.items()]
    return out


def _other(ps: PairSpec, cell_id: str) -> Cell:
    return ps.ref if ps.test.cell_id == cell_id else ps.test
