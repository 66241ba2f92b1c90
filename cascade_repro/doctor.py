"""`cascade-repro doctor`: can cascade attention fire here, and can the harness see and steer it?

Facts are gathered first (:func:`gather_facts`, each by a small function that tests replace), then
judged by pure rules (``doctor_rules.py``: :func:`run_checks`, each rule citing the vLLM code it
mirrors); :func:`doctor` does both and gives the checks with the exit code.
"""

from __future__ import annotations

import os
from typing import Any

from cascade_repro import vllm_surface
from cascade_repro.doctor_rules import (
    FAIL,
    OK,
    PLUGIN_GROUP,
    PLUGIN_NAME,
    WARN,
    Check,
    Facts,
    exit_code,
    run_checks,
)

# The checks' type and statuses are doctor()'s answer: named here for its callers.
__all__ = ["FAIL", "OK", "WARN", "Check", "Facts", "doctor", "exit_code", "gather_facts", "run_checks"]

# --------------------------------------------------------------------------------------------
# Fact gathering (each function is replaceable in tests)
# --------------------------------------------------------------------------------------------


def _one_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0]}" if s else type(e).__name__


def import_vllm() -> str:
    """Import vLLM and return its version (raises ImportError and friends)."""
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def plugin_registered() -> bool:
    from importlib.metadata import entry_points

    return any(ep.name == PLUGIN_NAME for ep in entry_points(group=PLUGIN_GROUP))


def probe_targets(version: str | None = None) -> dict[str, bool]:
    """Which of the functions, classes and methods the probe and the engine rely on
    (vllm_surface.targets, those of this vLLM's release) exist here: each imported, by its label."""
    import importlib

    from cascade_repro.vllm_surface import targets

    release = vllm_surface.release_for(version)[0]
    out: dict[str, bool] = {}
    for t in targets.importable(release):
        found = False
        for module in t.modules:  # a name that moved between releases: the probe hooks each place
            try:
                obj: Any = importlib.import_module(module)
            except ImportError:
                continue
            for part in t.name.split("."):
                obj = getattr(obj, part, None) if obj is not None else None
            if obj is not None:
                found = True
                break
        out[t.label] = found
    return out


def gpus() -> list[dict[str, Any]]:
    from cascade_repro.run import envinfo

    return envinfo.gpu_devices()


def fa_support() -> tuple[dict[int, str | None], int | None]:
    """FlashAttention versions this vLLM build can run here, and the one vLLM picks by default."""
    from vllm.vllm_flash_attn.flash_attn_interface import (
        fa_version_unsupported_reason,
        is_fa_version_supported,
    )

    out: dict[int, str | None] = {}
    for v in (2, 3, 4):
        try:
            out[v] = (
                None if is_fa_version_supported(v) else (fa_version_unsupported_reason(v) or "unsupported")
            )
        except Exception as e:  # noqa: BLE001 - unknown versions in older builds
            out[v] = _one_line(e)
    default = None
    for mod in ("vllm.v1.attention.backends.fa_utils", "vllm.attention.utils.fa_utils"):
        try:
            import importlib

            default = importlib.import_module(mod).get_flash_attn_version()
            break
        except Exception:  # noqa: BLE001 - moved between releases
            continue
    return out, default


def model_config(model: str, hf_overrides: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    from cascade_repro.plan.models import load_config, resolve_model

    path, _ = resolve_model(model)
    cfg = dict(load_config(path))
    cfg.update(hf_overrides or {})
    return path, cfg


def shared_prefix(model_path: str, system_prompt: str, prompts: str, trust_remote_code: bool = False) -> int:
    from cascade_repro.plan.models import load_tokenizer
    from cascade_repro.prompts.chat import measure_prefix
    from cascade_repro.prompts.promptsets import load_prompt_set, load_system_prompt

    pset = load_prompt_set(prompts)
    text = load_system_prompt(system_prompt)
    tok = load_tokenizer(model_path, trust_remote_code)
    return measure_prefix(tok, text, pset.records).tokens


def gather_facts(
    model: str = "embedded",
    tp: int = 1,
    system_prompt: str = "ko",
    prompts: str = "ko-ifeval-style",
    hf_overrides: dict[str, Any] | None = None,
    trust_remote_code: bool = False,
) -> Facts:
    f = Facts(tp=tp, model=model)
    f.env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
    try:
        f.vllm_version = import_vllm()
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken install raising anything
        f.vllm_error = _one_line(e)
    try:
        f.plugin_registered = plugin_registered()
    except Exception:  # noqa: BLE001
        f.plugin_registered = None
    try:
        f.gpus = gpus()
    except Exception:  # noqa: BLE001
        f.gpus = []
    if f.vllm_error is None:
        try:
            f.probe_targets = probe_targets(f.vllm_version)
        except Exception as e:  # noqa: BLE001 - e.g. no CUDA platform on this machine
            f.probe_targets_error = _one_line(e)
        try:
            f.fa_support, f.fa_default = fa_support()
        except Exception as e:  # noqa: BLE001
            f.fa_error = _one_line(e)
    path = None
    try:
        path, f.model_config = model_config(model, hf_overrides)
    except Exception as e:  # noqa: BLE001 - UsageError for unknown models, OSError, ...
        f.model_error = _one_line(e)
    if path is not None:
        try:
            f.shared_prefix = shared_prefix(path, system_prompt, prompts, trust_remote_code)
        except Exception as e:  # noqa: BLE001
            f.prefix_error = _one_line(e)
    return f


def doctor(**kwargs: Any) -> tuple[list[Check], int]:
    """Gather the facts, run every check, return (checks, exit code)."""
    checks = run_checks(gather_facts(**kwargs))
    return checks, exit_code(checks)
