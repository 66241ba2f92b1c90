"""The twin axis is named in one place: the arm names, the spec field and the pair kind come from
cascade_repro/twin/, and the values stay what run directories already hold on disk.

The scan reads every module's string constants (ast: prose in comments, docstrings and messages is
never a constant equal to the bare name); "cascade" or "flat" elsewhere is either the axis spelt by
hand or one of the few uses below that mean something else.
"""

from __future__ import annotations

import ast
from pathlib import Path

from cascade_repro.twin import CASCADE, TwinAxis

PACKAGE = Path(__file__).resolve().parents[1] / "cascade_repro"
NAMES = ("cascade", "flat")

# Whole files that keep their own spelling.
EXEMPT = {
    "minimize/standalone.py": "a script users run without the package installed: it imports nothing from it",
}
EXEMPT_DIRS = {
    "twin/": "where the axis is defined (the entry type's default spec field, the entries)",
    "kernel/": "the kernel benchmark's two FlashAttention paths (result fields cascade/flat), not matrix arms",
}

# (module, the line as written) -> why that "cascade"/"flat" is not the twin axis.
ALLOWED = {
    ("engines/cascade_attention.py", '("cascade", g, aligned),'):
        "cache key of the reference kernel's cascade-path mask",
    ("engines/cascade_attention.py", '("flat", g, query.dtype),'):
        "cache key of the reference kernel's flat-path mask",
    ("plan/predict.py", 'cost = {"cascade": dec.cascade_time, "flash_decoding": dec.flash_decoding_time}'):
        "vLLM's cost model's two paths (predictions' decode_cost keys)",
    ("report/speed_table.py", 'ct, ft = as_int(cost.get("cascade")), as_int(cost.get("flash_decoding"))'):
        "reads decode_cost: the cost model's cascade time",
    ("judge/speed.py", 'c, f = cost.get("cascade"), cost.get("flash_decoding")'):
        "reads decode_cost: the cost model's cascade time",
    ("sweep.py", 'tp, batch, dec if isinstance(dec, bool) else None, as_int(cost.get("cascade")),'):
        "reads decode_cost: the cost model's cascade time",
    ("judge/speed.py", '"cascade_step_ms": _ratio_ms(waves, "cascade"),'):
        "the probe's step kinds (decode_cascade_s / decode_flat_s): which path a step took",
    ("judge/speed.py", '"flat_step_ms": _ratio_ms(waves, "flat"),'):
        "the probe's step kinds (decode_cascade_s / decode_flat_s): which path a step took",
    ("sweep.py", 'heur = {True: "cascade", False: "flat", None: "?"}[r.heuristic]'):
        "the path vLLM's heuristic picks for a decode step, not an arm",
}  # fmt: skip


def _exempt(rel: str) -> bool:
    return rel in EXEMPT or any(rel.startswith(d) for d in EXEMPT_DIRS)


def twin_literals(package: Path = PACKAGE) -> list[tuple[str, int, str]]:
    """(module, line number, line) of every string constant "cascade" or "flat" outside the exempt files."""
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if _exempt(rel):
            continue
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source, filename=str(path))):
            if isinstance(node, ast.Constant) and node.value in NAMES:
                out.append((rel, node.lineno, lines[node.lineno - 1].strip()))
    return out


def test_no_twin_literal_outside_twin_py():
    found = twin_literals()
    stray = [f"cascade_repro/{rel}:{n}: {line}" for rel, n, line in found if (rel, line) not in ALLOWED]
    assert not stray, "spell the arm, spec field or pair kind through cascade_repro.twin:\n" + "\n".join(stray)


def test_allow_list_is_not_stale():
    seen = {(rel, line) for rel, _, line in twin_literals()}
    assert set(ALLOWED) <= seen, f"allow-list entries that match nothing: {sorted(set(ALLOWED) - seen)}"


def test_exempt_files_exist():
    for rel in EXEMPT:
        assert (PACKAGE / rel).is_file(), rel
    for rel in EXEMPT_DIRS:
        assert (PACKAGE / rel).is_dir(), rel


def test_scan_sees_a_literal(tmp_path):
    # Inside a function, and not a message that mentions the arm.
    (tmp_path / "m.py").write_text('def f(c):\n    return c.arm == "flat" or f"{c}~flat"\n', encoding="utf-8")
    assert twin_literals(tmp_path) == [("m.py", 2, 'return c.arm == "flat" or f"{c}~flat"')]


def test_cascade_axis_values_are_the_on_disk_ones():
    # cells.parquet's arm column, run.json's cells and spec, pair ids and kinds already hold these.
    assert (CASCADE.test, CASCADE.ref, CASCADE.spec_field, CASCADE.pair_kind) == ("cascade", "flat", "cascade", "cascade")
    assert (CASCADE.test_label, CASCADE.ref_label) == ("cascade (test)", "flat (ref)")
    assert CASCADE.arms == ("cascade", "flat")
    assert (CASCADE.arm(True), CASCADE.arm(False)) == ("cascade", "flat")


def test_axis_is_frozen_and_the_spec_has_its_field():
    import dataclasses

    import pytest

    from cascade_repro.plan.matrix import MatrixSpec

    with pytest.raises(dataclasses.FrozenInstanceError):
        CASCADE.test = "x"  # type: ignore[misc]
    assert CASCADE.spec_field in {f.name for f in dataclasses.fields(MatrixSpec)}
    assert isinstance(CASCADE, TwinAxis)


def test_twin_imports_nothing_from_the_package_but_its_own_parts():
    for path in sorted((PACKAGE / "twin").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        mods = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        mods += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        # Its parts by their full name: ``from cascade_repro.twin import X`` inside would be a cycle.
        outside = [m for m in mods if m.startswith("cascade_repro") and not m.startswith("cascade_repro.twin.")]
        assert not outside, (path.name, outside)
