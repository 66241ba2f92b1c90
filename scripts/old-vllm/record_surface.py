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

    fa_path = pkg / "v1/attention/backends/flash_attn.py"
    fa_src = fa_path.read_text(encoding="utf-8")
    fa = ast.parse(fa_src)
    fns, classes = _functions(fa), _classes(fa)
    rule = fns["use_cascade_attention"]
    out["flash_attn"] = {
        "module": "vllm.v1.attention.backends.flash_attn",
        "use_cascade_attention_params": _params(rule),
        "use_cascade_attention_source": ast.get_source_segment(fa_src, rule),
        "cascade_attention_params": _params(fns["cascade_attention"]),
        "merge_attn_states_imported_from": next(
            (
                n.module
                for n in fa.body
                if isinstance(n, ast.ImportFrom) and any(a.name == "merge_attn_states" for a in n.names)
            ),
            None,
        ),
        "merge_call_args": [_arg_text(a) for a in _calls(fns["cascade_attention"], "merge_attn_states")[0].args],
        "cascade_call_kwargs": sorted(
            {k.arg for c in _calls(fa, "cascade_attention") for k in c.keywords if k.arg}
        ),
        "impl_sets_vllm_flash_attn_version": "self.vllm_flash_attn_version =" in fa_src,
        "builder_has_use_cascade_attention": any(
            isinstance(n, ast.FunctionDef) and n.name == "use_cascade_attention"
            for n in classes.get("FlashAttentionMetadataBuilder", ast.ClassDef(body=[])).body
        ),
    }

    wrappers = []
    for rel in ("worker/worker_base.py", "v1/worker/worker_base.py"):
        t = _parse(pkg / rel)
        if t is not None and "WorkerWrapperBase" in _classes(t):
            wrappers.append("vllm." + rel[:-3].replace("/", "."))
    out["worker_wrapper_base_modules"] = wrappers

    runner = _parse(pkg / "v1/worker/gpu_model_runner.py")
    calls = _calls(runner, "use_cascade_attention") if runner else []
    out["runner_use_cascade_call_kwargs"] = sorted({k.arg for c in calls for k in c.keywords if k.arg})

    args = _classes(_parse(pkg / "engine/arg_utils.py"))["EngineArgs"]
    out["engine_args"] = sorted(
        n.target.id for n in args.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    )

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
    return out


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
