"""Record, from a vLLM source tree, the facts this harness relies on: names, signatures, call shapes.

Usage: python3 record_surface.py VLLM_PACKAGE_DIR OUT_JSON
  (VLLM_PACKAGE_DIR: the ``vllm/`` folder of an unpacked wheel, e.g. ``unzip vllm-0.10.2-*.whl 'vllm/*'``)

Reads the files with ``ast`` and imports nothing, so it runs on any machine. The JSON goes to
``tests/data/vllm-surface-<version>.json``; ``tests/vllm_surface/test_vllm_surface.py`` checks
``cascade_repro.vllm_surface``, the probe and ``explain``'s port of the cascade rule against it.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path


def _parse(path: Path) -> ast.Module | None:
    return ast.parse(path.read_text(encoding="utf-8")) if path.is_file() else None


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    return [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def _calls(node: ast.AST, name: str) -> list[ast.Call]:
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            called = f.id if isinstance(f, ast.Name) else (f.attr if isinstance(f, ast.Attribute) else None)
            if called == name:
                out.append(n)
    return out


def _arg_text(a: ast.expr) -> str:
    return ast.unparse(a)


def record(pkg: Path) -> dict:
    out: dict = {}
    ver = None
    for name in ("_version.py", "version.py"):  # _version.py holds the release; version.py may say "dev"
        t = _parse(pkg / name)
        if t is None:
            continue
        for n in ast.walk(t):
            if isinstance(n, ast.Assign) and any(
                isinstance(x, ast.Name) and x.id in ("__version__", "version") for x in n.targets
            ):
                if isinstance(n.value, ast.Constant) and isinstance(n.value.value, str):
                    ver = n.value.value
        if ver:
            break
    out["version"] = ver

    out["flash_attn"] = _flash_attn(pkg)

    wrappers = []
    for rel in ("worker/worker_base.py", "v1/worker/worker_base.py"):
        t = _parse(pkg / rel)
        if t is not None and "WorkerWrapperBase" in _classes(t):
            wrappers.append("vllm." + rel[:-3].replace("/", "."))
    out["worker_wrapper_base_modules"] = wrappers

    runner = _parse(pkg / "v1/worker/gpu_model_runner.py")  # the V1 model runner (gone in 0.34)
    calls = _calls(runner, "use_cascade_attention") if runner else []
    out["runner_use_cascade_call_kwargs"] = sorted({k.arg for c in calls for k in c.keywords if k.arg})

    args = _classes(_parse(pkg / "engine/arg_utils.py"))["EngineArgs"]
    out["engine_args"] = sorted(
        n.target.id for n in args.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    )
    out["engine_args_kinds"] = engine_args_kinds(pkg)

    envs = _parse(pkg / "envs.py")
    names: set[str] = set()
    for n in ast.walk(envs):
        if isinstance(n, ast.Dict):
            for k in n.keys:
                if isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value.startswith("VLLM_"):
                    names.add(k.value)
    out["env_vars"] = sorted(names)

    llm = _classes(_parse(pkg / "entrypoints/llm.py"))["LLM"]
    methods = {n.name: n for n in llm.body if isinstance(n, ast.FunctionDef)}
    out["llm_methods"] = {
        m: _params(methods[m]) for m in ("generate", "collective_rpc", "reset_prefix_cache", "get_tokenizer")
        if m in methods
    }

    # V1's LLMEngine.reset_prefix_cache: does it hand the scheduler's bool back (LLM's does)?
    eng = _classes(_parse(pkg / "v1/engine/llm_engine.py"))["LLMEngine"]
    reset = next(n for n in eng.body if isinstance(n, ast.FunctionDef) and n.name == "reset_prefix_cache")
    out["v1_reset_prefix_cache_returns"] = any(
        isinstance(n, ast.Return) and n.value is not None for n in ast.walk(reset)
    )

    sp = _classes(_parse(pkg / "sampling_params.py"))["SamplingParams"]
    out["sampling_params_fields"] = sorted(
        n.target.id for n in sp.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    )
    out["removed_env_vars"] = sorted(_dict_keys(envs, "removed_environment_variables"))
    out["env_vars_validated"] = _validated_env(pkg)
    out["modules"] = {m: facts for m in SURFACE_MODULES if (facts := module_facts(pkg, m)) is not None}
    return out


def _flash_attn(pkg: Path) -> dict:
    """The FlashAttention backend's cascade path: the rule, the kernel call, the merge (None where a
    release has no cascade: removed in 0.32)."""
    fa_src = (pkg / "v1/attention/backends/flash_attn.py").read_text(encoding="utf-8")
    fa = ast.parse(fa_src)
    fns, classes = _functions(fa), _classes(fa)
    rule, kernel = fns.get("use_cascade_attention"), fns.get("cascade_attention")
    merges = _calls(kernel, "merge_attn_states") if kernel else []
    return {
        "module": "vllm.v1.attention.backends.flash_attn",
        "use_cascade_attention_params": _params(rule) if rule else None,
        "use_cascade_attention_source": ast.get_source_segment(fa_src, rule) if rule else None,
        "cascade_attention_params": _params(kernel) if kernel else None,
        "merge_attn_states_imported_from": next(
            (
                n.module
                for n in fa.body
                if isinstance(n, ast.ImportFrom) and any(a.name == "merge_attn_states" for a in n.names)
            ),
            None,
        ),
        "merge_call_args": [_arg_text(a) for a in merges[0].args] if merges else None,
        "cascade_call_kwargs": sorted(
            {k.arg for c in _calls(fa, "cascade_attention") for k in c.keywords if k.arg}
        ),
        "impl_sets_vllm_flash_attn_version": "self.vllm_flash_attn_version =" in fa_src,
        "builder_has_use_cascade_attention": any(
            isinstance(n, ast.FunctionDef) and n.name == "use_cascade_attention"
            for n in classes.get("FlashAttentionMetadataBuilder", ast.ClassDef(body=[])).body
        ),
    }


def _dict_keys(tree: ast.Module, name: str) -> list[str]:
    """The string keys of a top-level dict literal assigned to ``name``."""
    for n in _top_level(tree):
        target = n.targets[0] if isinstance(n, ast.Assign) and len(n.targets) == 1 else getattr(n, "target", None)
        if isinstance(target, ast.Name) and target.id == name and isinstance(n.value, ast.Dict):
            return [k.value for k in n.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return []


def _validated_env(pkg: Path) -> list[str]:
    """The VLLM_* names the platform's ``validate_environ`` singles out (0.34 refuses
    ``VLLM_USE_V2_MODEL_RUNNER`` unless it is 1)."""
    tree = _parse(pkg / "platforms/interface.py")
    fn = next(
        (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "validate_environ"), None
    ) if tree else None
    if fn is None:
        return []
    return sorted({
        n.value for n in ast.walk(fn)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"VLLM_[A-Z0-9_]+", n.value)
    })  # fmt: skip


# --- Every module the harness reaches into, recorded whole --------------------------------------
#
# The probe patches (vllm_surface/probe.py), the engine (engines/vllm.py: engine arguments, the config
# read back, LLM methods, outputs) and doctor import or read these modules. Each is recorded with its
# top-level functions (parameter lists), classes (bases, methods with parameter lists, annotated
# fields, attributes set on ``self``) and imported names, so a test can ask for any target by name
# (vllm_surface.targets) without a new recording.

SURFACE_MODULES = (
    "vllm.v1.attention.backends.flash_attn",
    "vllm.v1.attention.backends.flash_attn_diffkv",
    "vllm.v1.attention.backends.triton_attn",
    "vllm.v1.attention.backends.flashinfer",
    "vllm.v1.attention.backends.fa_utils",
    "vllm.attention.utils.fa_utils",
    "vllm.v1.attention.ops.merge_attn_states",
    "vllm.attention.ops.merge_attn_states",
    "vllm.model_executor.layers.attention.attention",
    "vllm.attention.layer",
    "vllm.vllm_flash_attn.flash_attn_interface",
    "vllm.v1.worker.worker_base",
    "vllm.worker.worker_base",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.gpu.model_runner",
    "vllm.v1.worker.gpu.cudagraph_utils",
    "vllm.v1.cudagraph_dispatcher",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.core.sched.async_scheduler",
    "vllm.v1.core.sched.output",
    "vllm.v1.request",
    "vllm.v1.serial_utils",
    "vllm.v1.executor.uniproc_executor",
    "vllm.executor.uniproc_executor",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.engine.core",
    "vllm.entrypoints.llm",
    "vllm.engine.arg_utils",
    "vllm.config",
    "vllm.config.vllm",
    "vllm.config.model",
    "vllm.config.cache",
    "vllm.config.scheduler",
    "vllm.config.compilation",
    "vllm.config.parallel",
    "vllm.config.attention",
    "vllm.outputs",
    "vllm.sampling_params",
    "vllm.inputs",
    "vllm.inputs.llm",
    "vllm.inputs.data",
    "vllm.logprobs",
    "vllm.distributed.parallel_state",
    "vllm.plugins",
    "vllm.platforms.interface",
)


def _module_path(pkg: Path, module: str) -> Path | None:
    base = pkg.parent / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _self_attrs(cls: ast.ClassDef) -> list[str]:
    """Attributes a class's methods set on ``self`` (``self.requests = {}``, ``self.worker: T``)."""
    names = set()
    for n in ast.walk(cls):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        for t in targets:
            for e in ast.walk(t):
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    names.add(e.attr)
    return sorted(names)


def _class_facts(cls: ast.ClassDef) -> dict:
    methods = {
        n.name: _params(n) for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    return {
        "bases": [ast.unparse(b) for b in cls.bases],
        "methods": dict(sorted(methods.items())),
        "fields": sorted(
            n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        ),
        "attrs": _self_attrs(cls),
    }


def module_facts(pkg: Path, module: str) -> dict | None:
    """One module's functions, classes and imported names (None: the release has no such module)."""
    path = _module_path(pkg, module)
    if path is None:
        return None
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions, classes, imports, names = {}, {}, {}, set()
    for n in _top_level(tree):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
            functions.setdefault(n.name, _params(n))
        elif isinstance(n, ast.ClassDef):
            classes.setdefault(n.name, _class_facts(n))
        elif isinstance(n, ast.ImportFrom):
            for a in n.names:
                imports.setdefault(a.asname or a.name, f"{'.' * n.level}{n.module or ''}:{a.name}")
        elif isinstance(n, ast.Assign):
            names.update(t.id for t in n.targets if isinstance(t, ast.Name))
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            names.add(n.target.id)
    return {
        "functions": dict(sorted(functions.items())),
        "classes": dict(sorted(classes.items())),
        "imports": dict(sorted(imports.items())),
        "names": sorted(names),
    }


# --- EngineArgs kinds: each field's annotation mapped to a command-line kind as vLLM maps it ---
#
# vLLM turns a config field's annotation into an argparse type in ``_compute_kwargs``
# (``vllm/engine/arg_utils.py``): it flattens Annotated/Optional/unions into a set of hints, then
# takes the first rule that matches, in this order. ``engine_args_kinds`` reads the annotations with
# ``ast`` (vLLM needs a GPU torch to import), resolves the aliases and classes they name across the
# source tree (``CacheDType = Literal[...]``, ``@config class CacheConfig``), and applies the same
# order. The kinds are cascade_repro's (``vllm_surface/fields/``): int, float, bool, str,
# list, object (a JSON object), any (a union vLLM reads as two kinds, or a name not found).

_BUILTINS = {"int", "float", "bool", "str", "bytes", "dict", "list", "tuple", "set", "frozenset", "type", "object"}
_TYPING_ALIASES = {"Dict": "dict", "List": "list", "Tuple": "tuple", "Set": "set", "FrozenSet": "frozenset",
                   "Type": "type", "Mapping": "dict", "MutableMapping": "dict", "Sequence": "list"}
_TYPING_MODULES = {"typing", "typing_extensions", "collections.abc"}
_DATACLASS_DECORATORS = {"dataclass", "config"}  # vLLM's configs: @config is a pydantic dataclass


class _Hint(tuple):
    """One member of a flattened annotation: (what, detail). what is builtin, none, literal,
    dataclass, other (a class outside builtins: an Enum, torch.dtype, Any, Callable) or unknown."""


def _hint(what: str, detail: str = "") -> _Hint:
    return _Hint((what, detail))


class _Source:
    """A vLLM source tree's modules, read with ast, and the names each defines or imports."""

    def __init__(self, pkg: Path):
        self.root = pkg.parent  # the folder holding vllm/
        self._spaces: dict[str, dict[str, tuple] | None] = {}

    def space(self, module: str) -> dict[str, tuple] | None:
        if module not in self._spaces:
            self._spaces[module] = self._read(module)
        return self._spaces[module]

    def _read(self, module: str) -> dict[str, tuple] | None:
        base = self.root / module.replace(".", "/")
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                break
        else:
            return None
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        names: dict[str, tuple] = {}
        # First definition wins: an ``if TYPE_CHECKING:`` branch (the precise type) before its else.
        for node in _top_level(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                src = node.module or ""
                if node.level:
                    src = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([src] if src else []))
                for a in node.names:
                    names.setdefault(a.asname or a.name, ("import", src, a.name))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    names.setdefault(a.asname or a.name.partition(".")[0], ("module", a.name))
            elif isinstance(node, ast.ClassDef):
                names.setdefault(node.name, ("class", module, node))
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                names.setdefault(node.targets[0].id, ("expr", module, node.value))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                names.setdefault(node.target.id, ("expr", module, node.value))
            elif type(node).__name__ == "TypeAlias":  # ``type X = ...`` (Python 3.12+)
                names.setdefault(node.name.id, ("expr", module, node.value))
        return names

    def hints(self, node: ast.expr, module: str, depth: int = 0) -> set[_Hint]:
        """The flattened hints of an annotation read in ``module`` (vLLM's ``get_type_hints``)."""
        if depth > 20:
            return {_hint("unknown", ast.unparse(node))}
        if isinstance(node, ast.Constant):
            if node.value is None:
                return {_hint("none")}
            if isinstance(node.value, str):  # a forward reference
                try:
                    return self.hints(ast.parse(node.value, mode="eval").body, module, depth + 1)
                except SyntaxError:
                    return {_hint("unknown", node.value)}
            return {_hint("unknown", repr(node.value))}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.hints(node.left, module, depth + 1) | self.hints(node.right, module, depth + 1)
        if isinstance(node, ast.Subscript):
            head = self.hints(node.value, module, depth + 1)
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if head == {_hint("typing", "Literal")}:
                return {self._literal(items, module, depth)}
            if head == {_hint("typing", "Annotated")}:
                return self.hints(items[0], module, depth + 1)
            if head in ({_hint("typing", "Union")}, {_hint("typing", "Optional")}):
                out = {h for i in items for h in self.hints(i, module, depth + 1)}
                return out | ({_hint("none")} if head == {_hint("typing", "Optional")} else set())
            if head == {_hint("typing", "Callable")}:
                return {_hint("other", "Callable")}
            return head  # list[int] is list, dict[str, Any] is dict: vLLM reads the origin
        if isinstance(node, ast.Name):
            return self.name(node.id, module, depth + 1)
        if isinstance(node, ast.Attribute):  # typing.Optional, torch.dtype
            if isinstance(node.value, ast.Name):
                target = (self.space(module) or {}).get(node.value.id)
                if target and target[0] == "module" and target[1] in _TYPING_MODULES:
                    return self._typing(node.attr)
            return {_hint("other", ast.unparse(node))}
        return {_hint("unknown", ast.unparse(node))}

    def _literal(self, items: list[ast.expr], module: str, depth: int) -> _Hint:
        """A Literal's members' type, as ``literal_to_kwargs`` takes it (nested Literals flattened)."""
        kinds = set()
        for item in items:
            if isinstance(item, ast.Constant) and item.value is not None:
                kinds.add(type(item.value).__name__)
            else:
                inner = self.hints(item, module, depth + 1)
                kinds |= {d for w, d in inner if w == "literal"} or {"mixed"}
        return _hint("literal", kinds.pop() if len(kinds) == 1 else "mixed")

    def _typing(self, name: str) -> set[_Hint]:
        if name in _TYPING_ALIASES:
            return {_hint("builtin", _TYPING_ALIASES[name])}
        if name in ("Literal", "Annotated", "Union", "Optional", "Callable"):
            return {_hint("typing", name)}
        return {_hint("other", name)}  # Any, TypeAlias targets vLLM treats as a non-builtin class

    def name(self, name: str, module: str, depth: int) -> set[_Hint]:
        target = (self.space(module) or {}).get(name)
        if target is None:
            if name == "None":
                return {_hint("none")}
            if name in _BUILTINS:
                return {_hint("builtin", name)}
            return {_hint("unknown", name)}
        what = target[0]
        if what == "import":
            src, orig = target[1], target[2]
            if src in _TYPING_MODULES:
                return self._typing(orig)
            if self.space(src) is None:
                if src.partition(".")[0] == "vllm":  # vLLM's own module, missing from the tree
                    return {_hint("unknown", f"{src}.{orig}")}
                return {_hint("other", f"{src}.{orig}")}  # torch, transformers: a non-builtin class
            return self.name(orig, src, depth + 1)
        if what == "module":
            return {_hint("other", target[1])}
        if what == "class":
            node = target[2]
            decorators = {
                (d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list
            }
            marks = {d.id if isinstance(d, ast.Name) else getattr(d, "attr", "") for d in decorators}
            if marks & _DATACLASS_DECORATORS:
                return {_hint("dataclass", name)}
            bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
            # An IntEnum (OptimizationLevel) takes its int value: vLLM's CLI reads it as a string
            # and pydantic converts, but EngineArgs(...) in Python is handed the int.
            return {_hint("builtin", "int") if "IntEnum" in bases else _hint("other", name)}
        return self.hints(target[2], target[1], depth + 1)


def kind_of(hints: set[_Hint]) -> str:
    """The kind vLLM's ``_compute_kwargs`` gives a field with these hints, rule by rule in its order."""
    whats = {w for w, _ in hints}
    builtins = {d for w, d in hints if w == "builtin"}
    literals = {d for w, d in hints if w == "literal"}
    if "dataclass" in whats:
        return "object"  # parsed as the config class from JSON
    if "unknown" in whats:
        return "any"
    if whats <= {"builtin", "none"} and builtins == {"bool", "str"}:
        return "any"  # bool | str | None: a bare flag is True, a value is a string
    if "bool" in builtins:
        return "bool"
    if literals:
        kind = literals.pop()
        return kind if kind in ("int", "float", "str", "bool") and not literals else "any"
    if builtins & {"tuple", "list", "set", "frozenset"}:
        return "list"
    if "int" in builtins:
        return "int"
    if "float" in builtins:
        return "float"
    if "dict" in builtins:
        return "any" if "str" in builtins or "other" in whats else "object"  # union_dict_and_str
    if "str" in builtins or "other" in whats:
        return "str"
    return "any"  # vLLM itself refuses such a field ("Unsupported type")


def engine_args_kinds(pkg: Path) -> dict[str, str]:
    """Each ``EngineArgs`` field's kind, from ``engine/arg_utils.py`` and the modules it names."""
    src = _Source(pkg)
    module = "vllm.engine.arg_utils"
    args = _classes(_parse(pkg / "engine/arg_utils.py"))["EngineArgs"]
    return {
        n.target.id: kind_of(src.hints(n.annotation, module))
        for n in args.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }


def _top_level(tree: ast.Module):
    """A module's statements, with those inside top-level ``if``/``try`` blocks (TYPE_CHECKING)."""
    stack = list(reversed(tree.body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If):
            stack.extend(reversed(node.body + node.orelse))
        elif isinstance(node, ast.Try):
            stack.extend(reversed(node.body + [s for h in node.handlers for s in h.body] + node.orelse))
        else:
            yield node


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    facts = record(Path(argv[0]))
    Path(argv[1]).write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"recorded vLLM {facts['version']} into {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
