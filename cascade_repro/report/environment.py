"""The environment block: run identity, spec, prompt set, captured stack, engines, thresholds
and timings as key/value lines."""

from __future__ import annotations

import json
from pathlib import PurePath, PureWindowsPath

from cascade_repro.plan.matrix import spec_of
from cascade_repro.report.load import RunData
from cascade_repro.report.text import one_line, portable_paths, truncate
from cascade_repro.report.view import prompt_set, ran_vllm, stored_spec

ENV_VALUE_MAX = 200


def env_pairs(env: dict) -> list[tuple[str, str]]:
    """A run's captured environment as sorted key/value pairs, one level of nesting as ``a.b``."""
    out: list[tuple[str, str]] = []
    for k in sorted(env):
        if isinstance(env[k], dict):
            out.extend((f"{k}.{kk}", portable_paths(_flat(vv))) for kk, vv in sorted(env[k].items()))
        else:
            out.append((k, portable_paths(_flat(env[k]))))
    return out


def env_lines(data: RunData) -> list[tuple[str, str]]:
    """Flatten run identity, spec, environment, engines and thresholds into key/value lines."""
    m = data.manifest
    out: list[tuple[str, str]] = []
    for k in ("run_id", "created_at", "tool_version", "model_name", "arm_switch", "fail_on"):
        if m.has(k):
            out.append((k, _flat(getattr(m, k))))
    # The spec and prompt_set as stored, every key (a newer version's too), nothing defaulted in.
    spec = stored_spec(data)
    skip = _VLLM_ONLY if not ran_vllm(spec_of(m.spec_json)) else ()
    for k in sorted(spec):
        if k not in skip:
            out.append((f"spec.{k}", _flat(spec[k])))
    ps = prompt_set(data).to_json()
    for k in sorted(ps):
        if k == "source":
            out.append(("prompt_set.source", portable_source(_flat(ps[k]))))
        elif k != "system_prompt_text":  # kilobytes of text; the prompt set name identifies it
            out.append((f"prompt_set.{k}", _flat(ps[k])))
    out.extend(env_pairs(m.stack_env))
    for key, e in sorted(m.engines.items()):
        for k in ("status", "error"):
            if v := e.stored(k):
                out.append((f"engine[{key}].{k}", _flat(v)))
        out.extend((f"engine[{key}].{k}", _flat(v)) for k, v in sorted(e.effective.items()))
    out.extend((f"thresholds.{k}", _flat(v)) for k, v in sorted(m.thresholds.items()))
    out.extend((f"timings.{k}", _flat(v)) for k, v in sorted(m.timings.to_json().items()))
    # A system prompt or a long error can be kilobytes; the environment block is for versions and flags.
    return [(one_line(k), truncate(one_line(portable_paths(v)), ENV_VALUE_MAX)) for k, v in out]


def portable_source(source: str) -> str:
    """Where the prompts were read from, without the user's machine: a shipped set as
    `<site-packages>/cascade_repro/prompts_data/...`, a file elsewhere by its name (the set's name
    and prompt hashes identify it)."""
    s = portable_paths(source)
    return PurePath(s).name if PurePath(s).is_absolute() or PureWindowsPath(s).is_absolute() else s


# Spec keys that mean nothing to the hf engine; left out of its reports to keep them readable.
_VLLM_ONLY = (
    "arm_switch", "backends", "enforce_eager", "fa_versions", "gpu_memory_utilization", "graphs_for_batches", "hf_overrides",
    "load_format", "max_model_len", "engine_args", "force_cascade",
)  # fmt: skip


def _flat(v) -> str:
    if isinstance(v, list | tuple):
        return ", ".join(_flat(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={_flat(x)}" for k, x in sorted(v.items()))
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    return str(v)
