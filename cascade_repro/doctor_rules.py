"""`cascade-repro doctor`'s rules: each a pure function from the gathered :class:`Facts` to a :class:`Check`.

Whether cascade attention can fire on this box, and whether the harness can see and steer it, is
judged here from the facts ``doctor.py`` gathers (tests hand them in directly); the exit code follows
from the checks (:func:`exit_code`). Every rule cites the vLLM 0.26 code it mirrors:

judged by pure rules (:func:`run_checks`). Every rule cites the vLLM 0.26 code it mirrors:

- ``vllm/v1/attention/backends/flash_attn.py`` ``use_cascade_attention``: prefix >= 256 tokens,
  >= 8 requests, no ALiBi, no sliding window, no chunked local attention, no DCP.
- ``vllm/config/model.py``: ``disable_cascade_attn`` defaults to True (the harness passes False).
- ``vllm/config/vllm.py``: ``VLLM_BATCH_INVARIANT=1`` forces ``disable_cascade_attn=True``;
  ``use_v2_model_runner`` follows ``VLLM_USE_V2_MODEL_RUNNER`` (the V2 runner has no cascade path).
- ``vllm/config/model.py`` ``verify_with_parallel_config``: attention heads divisible by TP;
  ``vllm/model_executor/layers/linear.py`` ``QKVParallelLinear``: KV heads divisible by TP, or TP a
  multiple of the KV heads (replication).
- ``vllm/v1/attention/backends/fa_utils.py`` ``get_flash_attn_version``: FA3 on compute
  capability 9.x, FA4 on 10.x, FA2 otherwise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from cascade_repro import exit_codes, vllm_surface
from cascade_repro.errors import UsageError
from cascade_repro.vllm_surface import gpu_runs

OK, WARN, FAIL = "ok", "warn", "fail"
MIN_PREFIX = vllm_surface.MIN_COMMON_PREFIX
MIN_REQUESTS = vllm_surface.MIN_REQUESTS
# The newest release the tool has run on a GPU (gpu_runs.GPU_RUNS).
TESTED_VLLM = gpu_runs.releases()[-1]
PLUGIN_NAME = "cascade_repro_probe"
PLUGIN_GROUP = "vllm.general_plugins"
# The README gives this line too: it works from a checkout and beside an installed wheel alike.
INSTALL_VLLM = f'pip install "{vllm_surface.VLLM_REQUIREMENT}"'
INSTALL_CASCADE_VLLM = f'pip install "{vllm_surface.CASCADE_REQUIREMENT}"'
TRUE_VALUES = ("1", "true", "yes", "on")


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Facts:
    """Everything the checks look at; ``None`` means "could not be determined" (see the *_error)."""

    tp: int = 1
    model: str = "embedded"
    vllm_version: str | None = None
    vllm_error: str | None = None
    plugin_registered: bool | None = None
    probe_targets: dict[str, bool] | None = None
    probe_targets_error: str | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    fa_support: dict[int, str | None] | None = None  # version -> None if supported, else the reason
    fa_default: int | None = None
    fa_error: str | None = None
    model_config: dict[str, Any] | None = None
    model_error: str | None = None
    shared_prefix: int | None = None
    block_size: int = 16
    prefix_error: str | None = None
    env: dict[str, str] = field(default_factory=dict)


def _env_true(env: dict[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in TRUE_VALUES


def check_vllm(f: Facts) -> Check:
    """Which vLLM, whether its cascade path is one the probe was written against, and what it runs."""
    if f.vllm_error:
        return Check("vLLM", FAIL, f"not importable ({f.vllm_error})", INSTALL_VLLM)
    v = f.vllm_version or "unknown"
    vt = vllm_surface.version_tuple(v)
    status = vllm_surface.cascade_status(v)
    bug = vllm_surface.has_fa2_lse_bug(v)
    bug_txt = {True: "; its FA2 has the split-KV LSE bug (PR #87 came in 0.11.1)", False: "", None: ""}[bug]
    ran = _gpu_note(v)
    if status == "removed":
        # The same sentence matrix and explain print (vllm_surface.cascade_note), then the fix. A
        # warning, not a failure: every other twin runs on this vLLM (the twins row).
        return Check(
            "vLLM",
            WARN,
            (vllm_surface.cascade_note(v) or status) + ran,
            f'{INSTALL_CASCADE_VLLM} (or pip install "{vllm_surface.CASCADE_EXTRA}") for --twin cascade; the '
            "other twins run on this vLLM (the twins row)",
        )
    if vt is None or vt < vllm_surface.version_tuple(vllm_surface.RELEASES[0].version):
        known = ", ".join(r.version for r in vllm_surface.RELEASES)
        return Check("vLLM", WARN, f"vLLM {v}: older than every release the probe knows ({known})",
                     f"use one of {known}")  # fmt: skip
    rel, exact = vllm_surface.release_for(v)
    if exact:
        return Check(
            "vLLM", OK, f"vLLM {v}: a release the probe was written against; cascade {status}{bug_txt}{ran}"
        )
    newer = vt[:2] > (vllm_surface.version_tuple(TESTED_VLLM) or ())[:2]
    where = (
        f"newer than the tested {TESTED_VLLM}" if newer else f"between known releases, read as {rel.version}"
    )
    return Check(
        "vLLM",
        WARN,
        f"vLLM {v}: {where}; cascade {status}{bug_txt}; the probe checks below say whether it still fits",
    )


def _gpu_note(version: str) -> str:
    """How much of the tool has run on a GPU with this release (gpu_runs.GPU_RUNS)."""
    vt = vllm_surface.version_tuple(version)
    runs = [
        r for r in gpu_runs.GPU_RUNS if vt is not None and vllm_surface.version_tuple(r.release) == vt[:3]
    ]
    if not runs:
        return f"; no twin has run on a GPU with it yet (last GPU runs on {TESTED_VLLM})"
    return f"; {len(runs)} twin{'s' if len(runs) > 1 else ''} ran on a GPU with it"


def check_plugin(f: Facts) -> Check:
    allowed = f.env.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in [p.strip() for p in allowed.split(",")]:
        return Check(
            "probe plugin",
            FAIL,
            f"VLLM_PLUGINS={allowed!r} excludes {PLUGIN_NAME}: decisions cannot be counted or toggled",
            f"add {PLUGIN_NAME} to VLLM_PLUGINS or unset it",
        )
    if f.plugin_registered is False:
        return Check(
            "probe plugin",
            FAIL,
            f"no '{PLUGIN_GROUP}' entry point named {PLUGIN_NAME} in this environment",
            "install cascade-repro into the same environment as vLLM (pip install -e . or the wheel)",
        )
    if f.plugin_registered is None:
        return Check("probe plugin", WARN, "could not read the installed entry points")
    return Check("probe plugin", OK, f"{PLUGIN_GROUP}: {PLUGIN_NAME} registered")


def check_probe_targets(f: Facts) -> Check:
    if f.vllm_error:
        return Check("probe targets", WARN, "skipped: vLLM is not importable", INSTALL_VLLM)
    if f.probe_targets is None:
        return Check(
            "probe targets",
            WARN,
            f"could not import vLLM's FlashAttention backend ({f.probe_targets_error or 'unknown'})",
            "run doctor on the GPU machine",
        )
    missing = [k for k, ok in f.probe_targets.items() if not ok]
    if missing:
        return Check(
            "probe targets",
            FAIL,
            f"this vLLM lacks {', '.join(missing)}: the probe cannot count, steer or prove what it relies on",
            f"use vLLM {TESTED_VLLM}, or --arm-switch restart (no counters)",
        )
    return Check(
        "probe targets",
        OK,
        f"all {len(f.probe_targets)} functions, classes and methods the probe and engine use found",
    )


def check_gpus(f: Facts) -> Check:
    if not f.gpus:
        return Check(
            "GPUs",
            FAIL,
            "no CUDA GPU visible",
            "vLLM's cascade path needs an NVIDIA GPU; on CPU use --engine hf",
        )
    groups: dict[str, int] = {}
    for g in f.gpus:
        desc = str(g.get("name", "GPU"))
        extra = []
        if g.get("sm_count"):
            extra.append(f"{g['sm_count']} SMs")
        if g.get("compute_capability"):
            extra.append(f"sm {g['compute_capability']}")
        if extra:
            desc += f" ({', '.join(extra)})"
        groups[desc] = groups.get(desc, 0) + 1
    return Check("GPUs", OK, "; ".join(f"{n} x {d}" for d, n in groups.items()))


def _divisors(n: int, limit: int = 8) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def check_tp(f: Facts) -> Check:
    tp = f.tp
    problems = []
    fixes = []
    if tp < 1:
        return Check("tensor parallel", FAIL, f"--tp {tp} is not a positive integer", "use --tp 1, 2, 4 or 8")
    if tp > len(f.gpus) and (f.gpus or tp > 1):  # no GPU at all is the GPUs check's failure
        problems.append(f"--tp {tp} needs {tp} GPUs, {len(f.gpus)} visible")
        fixes.append(f"use --tp {max(1, len(f.gpus))} or a machine with {tp} GPUs")
    cfg = f.model_config
    if cfg is None:
        detail = "; ".join(problems) or f"tp {tp}"
        return Check(
            "tensor parallel",
            FAIL if problems else WARN,
            detail + f" (model config unavailable: {f.model_error or 'unknown'})",
            "; ".join(fixes),
        )
    try:  # the same reading of heads as explain's (vllm_surface.ModelAttention)
        att = vllm_surface.ModelAttention.from_config(cfg)
        heads, kv = att.num_attention_heads, att.num_kv_heads
    except UsageError:
        heads = kv = None
    if isinstance(heads, int) and heads % tp:
        problems.append(f"{heads} heads not divisible by {tp}")
        fixes.append(
            f"use --tp in {_divisors(heads)}, or reshape with --load-format dummy --hf-overrides "
            '\'{"num_attention_heads": 8, "num_key_value_heads": 2}\''
        )
    if isinstance(kv, int) and kv > 0 and isinstance(heads, int) and not heads % tp:
        if kv >= tp and kv % tp:
            problems.append(f"{kv} KV heads not divisible by {tp}")
            fixes.append(f"use --tp in {_divisors(kv)}")
        elif kv < tp and tp % kv:
            problems.append(
                f"--tp {tp} is not a multiple of the {kv} KV heads (vLLM replicates whole KV heads)"
            )
            fixes.append(f"use --tp in {_divisors(kv)} or a multiple of {kv}")
    if problems:
        return Check("tensor parallel", FAIL, "; ".join(problems), "; ".join(fixes))
    return Check("tensor parallel", OK, f"tp {tp}: {heads} heads, {kv} KV heads")


def check_fa(f: Facts) -> Check:
    if f.vllm_error:
        return Check("FlashAttention", WARN, "skipped: vLLM is not importable", INSTALL_VLLM)
    if f.fa_support is None:
        return Check("FlashAttention", WARN, f"could not query vllm_flash_attn ({f.fa_error or 'unknown'})")
    ok = [v for v, why in f.fa_support.items() if why is None]
    parts = [
        f"FA{v} {'yes' if why is None else 'no (' + why + ')'}" for v, why in sorted(f.fa_support.items())
    ]
    detail = ", ".join(parts)
    if f.fa_default:
        detail += f"; default FA{f.fa_default}"
    if not ok:
        return Check(
            "FlashAttention",
            FAIL,
            detail,
            "the FLASH_ATTN backend (the only one with cascade) cannot run here",
        )
    majors = {str(g.get("compute_capability") or "").split(".")[0] for g in f.gpus}
    if "9" in majors and 3 not in ok:
        return Check(
            "FlashAttention",
            WARN,
            detail + "; Hopper GPU but no FA3",
            "FA3 needs a vLLM build with _vllm_fa3_C",
        )
    if 3 in ok and "9" not in majors:
        detail += " (FA3 needs compute capability 9.x)"
    if 2 not in ok:
        return Check("FlashAttention", WARN, detail + "; FA2 (where the field bug lived) unavailable")
    return Check("FlashAttention", OK, detail)


def check_model_runner(f: Facts) -> Check:
    raw = f.env.get("VLLM_USE_V2_MODEL_RUNNER")
    if f.vllm_version and vllm_surface.release_for(f.vllm_version)[0].model_runners == "v2":
        # vLLM 0.34.0 removed the V1 runner and refuses the variable at engine start unless it is 1.
        if raw is not None and raw.strip() != "1":
            return Check(
                "model runner",
                WARN,
                f"VLLM_USE_V2_MODEL_RUNNER={raw}: this vLLM has only the V2 model runner and refuses any other "
                "value at engine start; cascade-repro's vllm engine unsets it for its own engines",
                "unset VLLM_USE_V2_MODEL_RUNNER",
            )
        return Check("model runner", OK, "V2 (the only model runner of this vLLM)")
    if raw is not None and raw.strip().lower() in TRUE_VALUES:
        return Check(
            "model runner",
            WARN,
            f"VLLM_USE_V2_MODEL_RUNNER={raw}: the V2 model runner has no cascade attention; cascade-repro's "
            "vllm engine sets it to 0 for its own workers, other vLLM runs here would never use cascade",
            "unset VLLM_USE_V2_MODEL_RUNNER",
        )
    return Check("model runner", OK, "V1 (the vllm engine sets VLLM_USE_V2_MODEL_RUNNER=0)")


def check_batch_invariant(f: Facts) -> Check:
    if _env_true(f.env, "VLLM_BATCH_INVARIANT"):
        return Check(
            "batch invariance",
            FAIL,
            "VLLM_BATCH_INVARIANT is set: vLLM forces disable_cascade_attn=True, so cascade never fires",
            "unset VLLM_BATCH_INVARIANT",
        )
    return Check("batch invariance", OK, "VLLM_BATCH_INVARIANT not set")


def check_backend_env(f: Facts) -> Check | None:
    b = f.env.get("VLLM_ATTENTION_BACKEND")
    if b and b.strip().upper() not in ("FLASH_ATTN", "FLASH_ATTN_VLLM_V1"):
        return Check(
            "attention backend",
            WARN,
            f"VLLM_ATTENTION_BACKEND={b}: only FLASH_ATTN has cascade attention (the matrix passes --backend explicitly)",
            "unset VLLM_ATTENTION_BACKEND",
        )
    return None


def check_prefix(f: Facts) -> Check:
    if f.shared_prefix is None:
        why = f.prefix_error or f.model_error or "unknown"
        return Check(
            "shared prefix",
            WARN,
            f"could not measure the shared prefix ({why})",
            "check --model and --prompts",
        )
    n = f.shared_prefix
    aligned = n // f.block_size * f.block_size
    if aligned < MIN_PREFIX:
        return Check(
            "shared prefix",
            FAIL,
            f"{n} shared tokens ({aligned} block-aligned) < {MIN_PREFIX}: use_cascade_attention always says no",
            "use a longer --system-prompt (the built-in ko and en prompts are about 2,000 tokens)",
        )
    return Check(
        "shared prefix",
        OK,
        f"{n} shared tokens (cascade can use {aligned}); it also needs >= {MIN_REQUESTS} requests per step",
    )


def check_attention_variant(f: Facts) -> Check:
    cfg = f.model_config
    if cfg is None:
        return Check("attention variant", WARN, f"model config unavailable ({f.model_error or 'unknown'})")
    try:  # one reading of the config for doctor and explain (vllm_surface.ModelAttention)
        att = vllm_surface.ModelAttention.from_config(cfg)
    except UsageError as e:
        return Check("attention variant", WARN, f"model config unreadable ({e})")
    blockers = []
    partial = []
    if att.use_alibi:
        blockers.append("ALiBi")
    if att.use_sliding_window:
        blockers.append(f"sliding window ({cfg.get('sliding_window')})")
    elif att.sliding_layers:
        partial.append(f"sliding window on {att.sliding_layers[0]}/{att.sliding_layers[1]} layers")
    if att.use_local_attention:
        blockers.append(f"chunked local attention ({cfg.get('attention_chunk_size')})")
    if blockers:
        return Check(
            "attention variant",
            FAIL,
            f"{', '.join(blockers)}: use_cascade_attention returns False, cascade never fires",
            "pick a model with plain global attention",
        )
    if partial:
        return Check(
            "attention variant",
            WARN,
            f"{'; '.join(partial)}: cascade can only fire in the full-attention layers",
        )
    return Check("attention variant", OK, "global attention, no ALiBi, no sliding window")


def check_twins(f: Facts) -> Check:
    """Which --twin settings this vLLM and these GPUs can test (vllm_surface.TWIN_RELEASES; the tp
    twin's example needs 2 GPUs)."""
    from cascade_repro import twin as twins

    if f.vllm_error:
        return Check("twins", WARN, "skipped: no vLLM")
    fams = vllm_surface.testable_twins(f.vllm_version)
    spell = {t.family: t.name.split("=")[0] + ("=..." if "=" in t.name else "") for t in twins.all_examples()}
    notes = []
    if "tp" in fams and len(f.gpus) < 2:
        fams = [x for x in fams if x != "tp"]
        notes.append(f"tp needs 2 GPUs, {len(f.gpus)} visible")
    gone = [x for x in twins.FAMILIES if x not in vllm_surface.testable_twins(f.vllm_version)]
    if gone:
        notes += [vllm_surface.twin_problem(x, f.vllm_version) or x for x in gone]
    detail = "can test --twin " + ", ".join(spell[x] for x in fams) if fams else "no twin can be tested here"
    return Check("twins", OK if fams else FAIL, detail + "".join(f"; {n}" for n in notes))


def check_twin_runs(f: Facts) -> list[Check]:
    """One line per twin this vLLM can test: the releases it last ran on a GPU with (gpu_runs), and
    whether this release is one of them."""
    from cascade_repro import twin as twins

    if f.vllm_error:
        return []
    vt = vllm_surface.version_tuple(f.vllm_version)
    out = []
    for t in twins.all_examples():
        if vllm_surface.twin_problem(t.family, f.vllm_version) is not None:
            continue
        runs = gpu_runs.runs_of(t.family)
        here = vt is not None and any(vllm_surface.version_tuple(r.release) == vt[:3] for r in runs)
        detail = f"ran on a GPU with vLLM {gpu_runs.ran_on(t.family)}" if runs else "never run on a GPU"
        if runs and not here:
            detail += f"; not yet with {f.vllm_version}"
        out.append(Check(f"twin {t.family}", OK, detail))  # what ran where: facts, not a verdict on this box
    return out


def run_checks(f: Facts) -> list[Check]:
    checks = [
        check_vllm(f),
        check_twins(f),
        *check_twin_runs(f),
        check_plugin(f),
        check_probe_targets(f),
        check_gpus(f),
        check_tp(f),
        check_fa(f),
        check_model_runner(f),
        check_batch_invariant(f),
    ]
    backend = check_backend_env(f)
    if backend is not None:
        checks.append(backend)
    checks += [check_prefix(f), check_attention_variant(f)]
    return checks


def exit_code(checks: list[Check]) -> int:
    """A failing check means this box cannot run the GPU matrix: a code of its own, never 1 (a
    regression to a CI guard)."""
    return exit_codes.CANNOT_RUN if any(c.status == FAIL for c in checks) else exit_codes.OK
