"""The package's import graph has no cycle, reading every import statement of every module.

Counted: imports at module level, inside functions (run later, but a cycle all the same) and under
``if TYPE_CHECKING:`` (never run; none is needed to close a cycle today, so they count too: one
that must close a cycle for an annotation should be exempted here by name, with why).

An edge A -> B means running A's import statement runs B's module code: the module named, and
each package above it that is not already A's own (importing ``cascade_repro.engines.vllm`` from
``cascade_repro.plan.matrix`` runs ``cascade_repro/engines/__init__.py`` first; from inside
``cascade_repro.engines`` it does not, that package is already being imported). ``from pkg import
name`` inside pkg depends on pkg itself only where ``name`` is not a submodule.

Not edges: ``importlib.import_module`` with a computed name, such as the engine registry's
``module:function`` builder paths, resolved only when an engine is built.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cascade_repro"


def module_names(package: Path) -> dict[str, Path]:
    out = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _chain(name: str) -> list[str]:
    """``a.b.c`` -> ``[a, a.b, a.b.c]``."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _imports_of(name: str, path: Path, mods: dict[str, Path]) -> dict[str, int]:
    """The modules one module's import statements run: {module: first line}."""
    root = name.split(".")[0]
    own = set(_chain(name))  # this module and the packages above it: already being imported
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: dict[str, int] = {}

    def add(target: str, line: int, *, whole_chain: bool = True) -> None:
        for m in _chain(target) if whole_chain else [target]:
            if m in mods and m not in own:
                edges.setdefault(m, line)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == root:
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = base.split(".")[: len(base.split(".")) - (node.level - 1)]
                module = ".".join(up + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != root:
                continue
            add(module, node.lineno)
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                if sub in mods:
                    add(sub, node.lineno, whole_chain=False)
                elif module in own and module != name:
                    # A name read from a package this module is inside: its __init__ must have
                    # defined it already, a real dependency.
                    edges.setdefault(module, node.lineno)
    return edges


def import_graph(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {module it imports: first line}, over the package's own modules."""
    mods = module_names(package)
    return {name: _imports_of(name, path, mods) for name, path in mods.items()}


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph.get(v, {})):
            if state.get(w) == 1:
                return path[path.index(w) :] + [w]
            if w not in state and (found := visit(w)):
                return found
        path.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def _describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False)) + f" -> {cycle[-1]}"


def test_package_import_graph_has_no_cycle():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + _describe(graph, cycle)


def test_graph_sees_the_imports_it_must():
    graph = import_graph()
    # Module level, package __init__ run by a submodule import, and inside a function.
    assert "cascade_repro.engines" in graph["cascade_repro.plan.matrix"]
    assert "cascade_repro.engines" in graph["cascade_repro.run.worker"]  # imported inside run_engine
    assert "cascade_repro.prompts.chat" in graph["cascade_repro.engines.vllm"]  # imported inside run_wave
    assert "cascade_repro.rundir.manifest" in graph["cascade_repro.engines.hf"]  # under TYPE_CHECKING
    # A submodule imported from inside its package does not run the package again.
    assert "cascade_repro.engines" not in graph["cascade_repro.engines.hf"]
    assert "cascade_repro.report" not in graph["cascade_repro.report.html"]


def test_engine_registry_imports_nothing_that_leads_back():
    # matrix.py reads the registry, so the registry may import only what never imports the planner.
    assert set(import_graph()["cascade_repro.engines"]) <= {"cascade_repro.errors"}


def test_registry_builders_resolve():
    from cascade_repro.engines import ENGINES

    for info in ENGINES.values():
        module, _, func = info.builder.partition(":")
        assert module in module_names(PACKAGE), info.builder
        tree = ast.parse(module_names(PACKAGE)[module].read_text(encoding="utf-8"))
        assert func in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, info.builder


def _write(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "cascade_repro"
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text, encoding="utf-8")
    return pkg


def test_a_function_level_cycle_is_found(tmp_path):
    pkg = _write(tmp_path, {
        "__init__.py": "",
        "a.py": "from cascade_repro.eng import get\n",
        "eng/__init__.py": "def get():\n    from cascade_repro.eng import impl\n",
        "eng/impl.py": "def f():\n    from cascade_repro import a\n",
    })  # fmt: skip
    graph = import_graph(pkg)
    # eng/__init__ imports its own submodule (no edge back to itself), impl imports a, a imports eng.
    assert find_cycle(graph) == ["cascade_repro.a", "cascade_repro.eng", "cascade_repro.eng.impl", "cascade_repro.a"]


def test_a_package_reading_its_own_name_from_a_submodule_is_a_cycle(tmp_path):
    pkg = _write(tmp_path, {
        "__init__.py": "",
        "rep/__init__.py": "from cascade_repro.rep.fmt import F\nX = 1\n",
        "rep/fmt.py": "from cascade_repro.rep import X\nF = X\n",
    })  # fmt: skip
    assert find_cycle(import_graph(pkg)) == ["cascade_repro.rep", "cascade_repro.rep.fmt", "cascade_repro.rep"]


def test_the_probe_reaches_only_standard_library_modules_of_the_package():
    # The probe runs inside vLLM's process: what it imports of the package, directly or through
    # another module, must be standard library only (its own parts, the atomic writer and the errors
    # it names).
    graph = import_graph()
    seen, todo = set(), ["cascade_repro.vllm_surface.probe"]
    while todo:
        for dep in graph[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    parts = {f"cascade_repro.vllm_surface.probe_{p}" for p in ("state", "cascade", "steps", "worker", "control")}
    assert parts <= seen
    assert seen - parts == {
        "cascade_repro.atomic",
        "cascade_repro.errors",
        "cascade_repro.vllm_surface.flashinfer_cascade",
        "cascade_repro.vllm_surface.inject",
        "cascade_repro.vllm_surface.preemption",
        "cascade_repro.vllm_surface.splitkv",
    }


# --- the same graph by folder (room) -------------------------------------------------------------
# Two rooms that import each other, each way through some module, are one room in all but name.
# The run directory's room (rundir/) took away engines<->run; the reference records (rundir/reference)
# and run.json's repository address (rundir/manifest) took judge<->run and report<->run, the CUDA cache
# moving into plan/ took plan<->run, the IFEval kwarg types in prompts/ took judge<->prompts, and the
# worker handing the engine builders the spec and plan/models took engines<->plan. None is left: the
# test fails on any pair of rooms that import each other (list one here only with what ties it).
ROOM_CYCLES_LEFT: dict[tuple[str, str], str] = {}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def room_pairs(graph: dict[str, dict[str, int]]) -> set[tuple[str, str]]:
    """Pairs of rooms (sorted) that import each other."""
    edges = {(room_of(a), room_of(b)) for a, deps in graph.items() for b in deps}
    return {tuple(sorted((x, y))) for x, y in edges if x and y and x != y and (y, x) in edges}


def test_rooms_import_each_other_only_where_listed():
    assert room_pairs(import_graph()) == set(ROOM_CYCLES_LEFT)


def test_the_run_directory_room_imports_only_shared_modules():
    shared = {"twin", "errors", "exit_codes", "atomic", "section", "userpath", "hub"}
    graph = import_graph()
    used = {room_of(b) for a, deps in graph.items() if room_of(a) == "rundir" for b in deps}
    assert used - {"rundir"} <= shared
