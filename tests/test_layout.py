"""The package's folders follow the data's flow: prompts/ -> plan/ -> run/ -> judge/ -> report/.

Every import statement of every module (function level included) is read; an import from one stage
into a LATER stage, or into one of the commands and tools at the top of the package, must be one
of the few listed here with why. engines/ and vllm_surface/ stand beside the flow: any stage may use
them; engines/ may use the stages up to run/ (what it builds from), vllm_surface/ nothing but the
shared modules; rundir/, the run directory's room, stands below every stage and imports only the
shared modules. twin/, errors.py, exit_codes.py, atomic.py, section.py, userpath.py and hub.py are
shared by all. docs/architecture.md describes the same. No exception is left: scoring and reporting
a run once its workers finish (a matrix, a rescore, a merge) is pipeline.py's, at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cascade_repro"
FLOW = ("prompts", "plan", "run", "judge", "report")
BESIDE = {"engines": {"prompts", "plan", "run", "vllm_surface"}, "vllm_surface": set()}
SHARED = {"twin", "errors", "exit_codes", "atomic", "section", "userpath", "hub"}
# The run directory's room: below every stage (each reads or writes a run directory), it imports
# nothing of the package but the shared modules.
BELOW = {"rundir"}
# (importing module, imported stage or tool): why the flow runs backwards there.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def stage_of(module: str) -> str | None:
    """``cascade_repro.run.worker`` -> ``run``; a top-level module -> its name; the package -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "cascade_repro" else None


def imports() -> list[tuple[str, str]]:
    """(importing module without the package prefix, imported stage/tool/shared name)."""
    out = []
    for path in PACKAGE.rglob("*.py"):
        mod = ".".join(path.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("cascade_repro"):
                names = [node.module] if node.module != "cascade_repro" else [f"cascade_repro.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("cascade_repro.")]
            for name in names:
                target = stage_of(name)
                if target is not None and target != mod.split(".")[0]:
                    out.append((mod, target))
    return out


def allowed(mod: str, target: str) -> bool:
    src = mod.split(".")[0]
    if target in SHARED:
        return True
    if src in BELOW:
        return False
    if target in BELOW:
        return True
    if src in FLOW:
        if target in FLOW:
            return FLOW.index(target) < FLOW.index(src) or (mod, target) in EXCEPTIONS
        return target in BESIDE or (mod, target) in EXCEPTIONS
    if src in BESIDE:
        return target in BESIDE[src]
    if src in SHARED:
        return False
    return True  # the commands and tools at the top use whatever they need


def test_the_flow_runs_one_way():
    wrong = sorted({(m, t) for m, t in imports() if not allowed(m, t)})
    assert not wrong, f"imports against the flow (add to EXCEPTIONS only with a reason): {wrong}"


def test_every_exception_is_still_needed():
    seen = set(imports())
    assert not [e for e in EXCEPTIONS if e not in seen], "drop the exceptions the code no longer needs"


def test_the_stages_are_folders():
    for name in (*FLOW, *BESIDE, *BELOW):
        assert (PACKAGE / name / "__init__.py").is_file(), name
    for name in SHARED:  # a module, or a package of its own parts (twin/)
        assert (PACKAGE / f"{name}.py").is_file() or (PACKAGE / name / "__init__.py").is_file(), name


# The report renders what scoring wrote and never scores: only its loader reads the one thing the
# tables do not hold (which prompts no IFEval verifier can score) through the scorer's modules.
SCORER = ("cascade_repro.judge.compare", "cascade_repro.judge.ifeval")
READS_FOR_THE_REPORT = {"report.load"}


def test_the_report_never_calls_the_scorer():
    wrong = []
    for path in (PACKAGE / "report").rglob("*.py"):
        mod = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(SCORER):
                if mod not in READS_FOR_THE_REPORT:
                    wrong.append((mod, node.module))
    assert wrong == []


# Tests mirror the package: tests/<room>/ holds the tests of cascade_repro/<room>/. The few at the top
# cover a top-level module (doctor, explain, sweep, twin) or the whole tool (end to end, the README's
# worked example, docs, layout, packaging, hostile input); fuzz/ and benchmarks/ hold the fuzz targets and the benchmarks' tests.
TESTS = Path(__file__).resolve().parent
TOP_LEVEL_TESTS = {"test_docs", "test_doctor", "test_e2e", "test_explain", "test_hostile", "test_import_graph",
                   "test_layout", "test_packaging", "test_sweep", "test_synth", "test_twin", "test_twin_axes", "test_twin_registry",
                   "test_worked_example"}  # fmt: skip
BESIDE_PACKAGE = {"fuzz", "benchmarks"}


def test_tests_mirror_the_package():
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    folders = {p.parent.relative_to(TESTS).parts[0] for p in TESTS.rglob("test_*.py") if p.parent != TESTS}
    assert folders - rooms - BESIDE_PACKAGE - {"support"} == set()
    assert {p.stem for p in TESTS.glob("test_*.py")} <= TOP_LEVEL_TESTS
