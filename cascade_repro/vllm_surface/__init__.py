"""What this harness knows of vLLM's internals, in one place: module paths, cascade's hard limits,
and how they differ between the releases it was written against.

Everything that patches, imports or mimics vLLM (the probe, the kernel check, the cascade rule,
``doctor``, the hf engine's reference cascade, the reports' warnings) asks this module. A vLLM
release that moves its attention backend or changes a threshold is one edit here.

Only the standard library, and no vLLM import: the probe loads this in every vLLM process, and
``--help`` must stay instant. (``minimize/standalone.py`` spells the module path out on purpose: it
is the template of a repro script that must run with vLLM alone.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cascade_repro.errors import UsageError  # standard library only, like this module
from cascade_repro.twin import CASCADE, FAMILIES  # standard library only too

# The FlashAttention backend holds use_cascade_attention, cascade_attention and the
# merge_attn_states it calls (same path and names in 0.10.2 and 0.26.0).
FLASH_ATTN_MODULE = "vllm.v1.attention.backends.flash_attn"
USE_CASCADE_ATTENTION = f"{FLASH_ATTN_MODULE}.use_cascade_attention"
# Where collective_rpc resolves a method name on WorkerWrapperBase: vllm/worker/worker_base.py up
# to at least 0.10.2, vllm/v1/worker/worker_base.py in 0.26.0. The probe hooks both; whichever the
# installed vLLM imports gets the method.
WORKER_BASE_MODULE = "vllm.v1.worker.worker_base"
WORKER_BASE_MODULES = (WORKER_BASE_MODULE, "vllm.worker.worker_base")
# The V1 scheduler (vllm/v1/core/sched/scheduler.py from 0.10.2 to 0.34.0): the probe counts its
# steps, prefill chunks and requests per step per wave (the chunked-prefill and batch twins' proof of
# effect), and the steps scheduled by its async subclass (``async_scheduler.AsyncScheduler``, what
# SchedulerConfig.get_scheduler_cls picks for async_scheduling=True: the async-scheduling twin's).
SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
ASYNC_SCHEDULER = "AsyncScheduler"
# Where a step's CUDA-graph mode is decided, per model runner (the cuda-graphs twin's proof of effect):
# the V1 runner's GPUModelRunner._determine_batch_execution_and_padding returns it first (0.26.0 to
# 0.33.0; 0.10.2 dispatches inline, so there the read-back config stands in); the V2 runner (0.26.0
# on, the only one in 0.34.0) replays through CudaGraphManager.run_fullgraph (FULL) or runs
# run_pw_graph (PIECEWISE), and calls the model itself when eager.
V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
V1_GRAPH_DECISION = "_determine_batch_execution_and_padding"
V2_GRAPHS_MODULE = "vllm.v1.worker.gpu.cudagraph_utils"
V2_GRAPH_RUNS = {"run_fullgraph": "FULL", "run_pw_graph": "PIECEWISE"}

# use_cascade_attention's hard conditions: a common prefix of at least this many tokens (after
# alignment to the KV block size) and at least this many requests in the step.
MIN_COMMON_PREFIX = 256
MIN_REQUESTS = 8


@dataclass(frozen=True)
class Release:
    """Facts read from one vLLM release's source: what the engine and the probe must do there."""

    version: str
    worker_base_module: str
    # How the attention backend and FlashAttention version are chosen: the ``attention_config``
    # engine argument, or the VLLM_ATTENTION_BACKEND / VLLM_FLASH_ATTN_VERSION variables.
    attention_via: str
    # The GPU model runners it has: "v1" (vllm/v1/worker/gpu_model_runner.py only), "v1+v2"
    # (VLLM_USE_V2_MODEL_RUNNER picks; the V2 runner in vllm/v1/worker/gpu/ has no cascade path) or
    # "v2" (V1 removed; vLLM refuses VLLM_USE_V2_MODEL_RUNNER set to anything but 1).
    model_runners: str
    # use_cascade_attention takes dcp_world_size (decode context parallelism) as its last argument;
    # None: the release has no cascade attention at all.
    rule_takes_dcp: bool | None
    # LLM.reset_prefix_cache() says whether the reset happened (0.10.2's V1 engine returns None).
    reset_returns_bool: bool
    source: str

    @property
    def has_cascade(self) -> bool:
        return self.rule_takes_dcp is not None

    @property
    def runner_env(self) -> str | None:
        """The VLLM_USE_V2_MODEL_RUNNER value the engine sets: "0" (the V1 runner, the only one with
        cascade, and the one every twin ran on in 0.26.0's evidence) where the variable picks the
        runner; None where there is no such variable (0.10.2) or vLLM refuses it (0.34.0)."""
        return "0" if self.model_runners == "v1+v2" else None


# Ordered by version, each read from its wheel's source (tests/data/vllm-surface-<version>.json,
# recorded by scripts/old-vllm/record_surface.py; tests/vllm_surface checks every entry against it).
# 0.10.2: vllm/worker/worker_base.py holds WorkerWrapperBase; backend and FA version through
# VLLM_ATTENTION_BACKEND / VLLM_FLASH_ATTN_VERSION (no attention_config); one model runner; the
# cascade rule without dcp_world_size; 0.11.0 the same (the bad release of the async-scheduling bugs,
# docs/real-bugs.md). 0.26.0 and 0.31.0: attention_config, both runners, the rule
# with dcp_world_size. 0.33.0: cascade gone (flash_attn.py has neither use_cascade_attention nor
# cascade_attention; removed in 0.32.0), both runners still. 0.34.0: the V1 model runner gone
# (vllm/v1/worker/gpu_model_runner.py and VllmConfig.use_v2_model_runner removed; the platform's
# validate_environ raises on VLLM_USE_V2_MODEL_RUNNER other than 1), so CUDA graphs are dispatched
# by the V2 runner's CudaGraphManager (vllm/v1/worker/gpu/cudagraph_utils.py).
RELEASES: tuple[Release, ...] = (
    Release("0.10.2", "vllm.worker.worker_base", "env", "v1", False, False, "vLLM 0.10.2 wheel"),
    Release("0.11.0", "vllm.worker.worker_base", "env", "v1", False, False, "vLLM 0.11.0 wheel"),
    Release("0.26.0", "vllm.v1.worker.worker_base", "attention_config", "v1+v2", True, True, "vLLM 0.26.0 wheel"),
    Release("0.31.0", "vllm.v1.worker.worker_base", "attention_config", "v1+v2", True, True, "vLLM 0.31.0 wheel"),
    Release("0.33.0", "vllm.v1.worker.worker_base", "attention_config", "v1+v2", None, True, "vLLM 0.33.0 wheel"),
    Release("0.34.0", "vllm.v1.worker.worker_base", "attention_config", "v2", None, True, "vLLM 0.34.0 wheel"),
)  # fmt: skip


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """``"0.10.2rc1+cu128"`` -> ``(0, 10, 2)``; None when it does not start with a number."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", version or "")
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def release_for(version: str | None) -> tuple[Release, bool]:
    """The known release whose surface applies to ``version`` and whether it is that very release.

    A version between two known releases gets the older one's facts (what its engine arguments
    and names looked like when last read), and ``False``: not verified.
    """
    vt = version_tuple(version)
    if vt is None:
        return RELEASES[-1], False
    best = RELEASES[0]
    for r in RELEASES:
        rt = version_tuple(r.version) or ()
        if rt <= vt:
            best = r
    return best, (version_tuple(best.version) or ()) == vt[:3]


# Cascade attention's life in vLLM (release notes and config sources): on by default through
# 0.17 (``disable_cascade_attn`` False), off by default from 0.18.0 (PR #36318) and removed in
# 0.32.0 (the flag is kept and has no effect).
CASCADE_OPT_IN_FROM = (0, 18, 0)
CASCADE_REMOVED_IN = (0, 32, 0)
# FA2's wrong LSE layout in the split-KV decode path (vllm-project/flash-attention PR #87): the
# fork commit pinned by vLLM 0.11.0 and earlier lacks it, 0.11.1's has it.
FA2_LSE_FIX_IN = (0, 11, 1)
FIRST_V1_CASCADE = (0, 7, 0)  # the first release whose fork carries PR #34's transpose
# The newest release whose engine arguments the twins were checked against (0.34.0, December 2026).
NEWEST_KNOWN = (0, 34, 0)
# The vLLM this tool can drive: the oldest release the probe knows up to the newest one known, every
# target checked against each one's source (targets.py). Cascade needs < 0.32 (TWIN_RELEASES);
# every other twin runs on 0.32 and later.
KNOWN_REQUIREMENT = f"vllm>={RELEASES[0].version},<{NEWEST_KNOWN[0]}.{NEWEST_KNOWN[1] + 1}.0"
# What the `vllm` extra installs: only a release the tool has run on a GPU, every single-GPU twin of
# it (gpu_runs.GPU_RUNS), and one pip installs as published. 0.26.0 is the newest such release: an
# unpinned `vllm` resolves to 0.33.0 (never run), and 0.34.0 cannot be installed as published (it
# pins flashinfer-python==0.7.3, which the package index does not have). pyproject.toml's extras and
# doctor's fix line say the same (tests/test_packaging.py).
VLLM_PIN = "0.26.0"
VLLM_REQUIREMENT = f"vllm=={VLLM_PIN}"
# Releases pip cannot install as published: why, and the pin that stands in for the missing one (what
# ran here, scripts/vllm-0.34/overrides.txt; uv installs it with --override). The extra's pin skips
# them even once they have run; a report's Reproduce block gives the uv line instead of pip's.
UNINSTALLABLE = {
    "0.34.0": (
        "it pins flashinfer-python==0.7.3, which the package index does not have",
        "flashinfer-python==0.7.4",
    ),
}
# The `cascade` extra: the newest vLLM that has cascade attention (0.31.0; removed in 0.32.0, no
# 0.31 patch release). Its probe targets are checked against its source; it has not run on a GPU.
CASCADE_PIN = "0.31.0"
CASCADE_REQUIREMENT = f"vllm=={CASCADE_PIN}"
CASCADE_EXTRA = "cascade-repro[cascade]"


@dataclass(frozen=True)
class TwinRelease:
    """Which vLLM releases can test a twin family (twin/): from ``first`` up to, not including,
    ``gone`` (None: every release since), with the reason it cannot be tested past that."""

    first: tuple[int, ...]
    gone: tuple[int, ...] | None = None
    why_gone: str = ""


# Read from the release notes and engine-argument sources of 0.10.2 and 0.26.0 (the recorded surfaces
# in tests/data hold every engine argument a twin sets: enable_prefix_caching, enable_chunked_prefill,
# max_num_batched_tokens, enforce_eager, async_scheduling, kv_cache_dtype, disable_cascade_attn).
TWIN_RELEASES: dict[str, TwinRelease] = {
    CASCADE.family: TwinRelease(
        (0, 10, 2), CASCADE_REMOVED_IN,
        "cascade attention was removed in vLLM 0.32.0 (disable_cascade_attn is kept and does nothing)",
    ),
}  # fmt: skip
# Every other family (a registered entry's too) runs on every release the harness knows; the
# attention backend is chosen by attention_config from 0.26.0, by VLLM_ATTENTION_BACKEND before
# (Release.attention_via).
EVERY_RELEASE = TwinRelease((0, 10, 2))


def twin_release(family: str) -> TwinRelease:
    """The releases that can test a twin family."""
    return TWIN_RELEASES.get(family, EVERY_RELEASE)


def twin_problem(family: str, version: str | None) -> str | None:
    """Why this vLLM cannot test a twin family, in one line; None when it can (or the version is
    unknown: the engine start will tell)."""
    rel = twin_release(family)
    vt = version_tuple(version)
    if vt is None:
        return None
    if vt[:3] < rel.first:
        return (
            f"vLLM {version} is older than every release the harness knows ({'.'.join(map(str, rel.first))})"
        )
    if rel.gone is not None and vt[:3] >= rel.gone:
        return f"--twin {family} cannot be tested on vLLM {version}: {rel.why_gone}"
    return None


def testable_twins(version: str | None) -> list[str]:
    """The twin families this vLLM can test, in the registry's order."""
    return [f for f in FAMILIES if twin_problem(f, version) is None]


def cascade_status(version: str | None) -> str:
    """``"default on"``, ``"opt-in"``, ``"removed"`` or ``"unknown"`` for a vLLM version."""
    vt = version_tuple(version)
    if vt is None:
        return "unknown"
    if vt >= CASCADE_REMOVED_IN:
        return "removed"
    if vt >= CASCADE_OPT_IN_FROM:
        return "opt-in"
    return "default on"


def installed_version() -> str | None:
    """The installed vLLM's version from its package metadata (no import: vLLM takes seconds to load)."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def cascade_note(version: str | None) -> str | None:
    """One line on what this vLLM does with cascade attention, for matrix, explain and doctor; None
    when cascade is on by default (nothing to say) or the version is unknown."""
    status = cascade_status(version)
    if status == "removed":
        return (
            f"vLLM {version} has no cascade attention (removed in 0.32.0; disable_cascade_attn has no "
            "effect): no pair can be exercised. Use a vLLM from 0.10.2 to 0.31"
        )
    if status == "opt-in":
        return (
            f"vLLM {version}: cascade attention is off by default from 0.18.0 (PR #36318); the harness "
            "turns it on for the cascade arm (disable_cascade_attn=False), as a user must to get it"
        )
    return None


def has_fa2_lse_bug(version: str | None) -> bool | None:
    """Whether this vLLM's FA2 has the split-KV LSE layout bug (None: too old or unknown to say)."""
    vt = version_tuple(version)
    if vt is None or vt < FIRST_V1_CASCADE:
        return None
    return vt < FA2_LSE_FIX_IN


# SamplingParams(flat_logprobs=True) (vLLM 0.11.1 on) returns a request's logprobs as one
# FlatLogprobs of flat lists instead of a dict of Logprob objects per token: a constant number of
# objects per request, so less for vLLM to build and for the garbage collector to scan, and a
# cheaper conversion (engines/vllm.py reads either).
FLAT_LOGPROBS = "flat_logprobs"

# SamplingParams(detokenize=False): vLLM's output processor (in the LLM process) then neither
# detokenizes each request's text step by step nor decodes each of the k + 1 logprob tokens of every
# position to a string (vllm/v1/engine/output_processor.py sets the request's tokenizer to None). At
# large batches that work, not the GPU, sets a flat wave's length. The engine decodes each
# completion once instead (engines/base.completion_text); the logprob tokens' strings are never read.
# Asked for only where FLAT_LOGPROBS exists too: the output path read for it is that of 0.11.1 on.
DETOKENIZE = "detokenize"


def output_asks(fields: frozenset[str] | set[str]) -> dict[str, bool]:
    """The SamplingParams keywords beyond ``logprobs`` that the engine sets on a release whose
    SamplingParams has ``fields`` (the raw loops of the benchmarks ask the same)."""
    if FLAT_LOGPROBS not in fields:
        return {}
    return {FLAT_LOGPROBS: True, **({DETOKENIZE: False} if DETOKENIZE in fields else {})}


def sampling_fields(sampling_params_cls: Any) -> frozenset[str]:
    """The keyword fields this vLLM's SamplingParams takes (a msgspec Struct, or a plain class)."""
    fields = getattr(sampling_params_cls, "__struct_fields__", None)
    if fields is None:
        import inspect

        try:
            fields = tuple(inspect.signature(sampling_params_cls).parameters)
        except (TypeError, ValueError):
            fields = ()
    return frozenset(fields)


# What vLLM reads from a model's config to decide on cascade: one parser for explain and doctor.

# The config keys vLLM's get_total_num_kv_heads reads the KV head count from, in its order.
KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")


@dataclass(frozen=True)
class ModelAttention:
    """What vLLM's rule reads from a model config."""

    num_attention_heads: int
    num_kv_heads: int
    use_alibi: bool = False
    use_sliding_window: bool = False
    use_local_attention: bool = False
    use_mla: bool = False
    notes: tuple[str, ...] = ()
    head_dim: int | None = None
    # (sliding-window layers, all layers) when only some layers slide; cascade fires in the others.
    sliding_layers: tuple[int, int] | None = None

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelAttention:
        """Read heads and attention variants from a config.json dict (``text_config`` if nested).

        Mirrors vLLM: ``ModelConfig.uses_alibi``; ``get_total_num_kv_heads`` (``n_head_kv``,
        ``num_kv_heads``, ``num_key_value_heads``, ``multi_query_group_num``; Falcon's
        ``multi_query``); a sliding window unless ``use_sliding_window`` is false. With
        ``layer_types`` mixing sliding and full attention, cascade can fire in the full layers
        (vLLM's sliding-window manager reports no common blocks), so the prediction is theirs.
        """
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
        t = text if text and text.get("num_attention_heads") else cfg
        heads = t.get("num_attention_heads") or t.get("n_head") or t.get("num_heads")
        if not isinstance(heads, int) or heads <= 0:
            raise UsageError("model config has no num_attention_heads")
        kv = None
        if t.get("multi_query") and not t.get("new_decoder_architecture"):
            kv = 1
        for name in KV_HEAD_KEYS:
            value = t.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                # Falling back to the query heads would predict for another model (an MQA model
                # read as MHA moves the decode threshold by its head count).
                raise UsageError(f"model config: {name} must be a positive integer, got {value!r}")
            if kv is None and value is not None:
                kv = value
        kv = kv or heads
        attn_cfg = cfg.get("attn_config")
        alibi = bool(
            cfg.get("alibi")
            or t.get("alibi")
            or "BloomForCausalLM" in (cfg.get("architectures") or [])
            or str(cfg.get("model_type", "")) == "bloom"
            or t.get("position_encoding_type") == "alibi"
            or (isinstance(attn_cfg, dict) and attn_cfg.get("alibi"))
        )
        notes: list[str] = []
        sw = t.get("sliding_window")
        if t.get("use_sliding_window") is False:
            sw = None
        layer_types = [str(x) for x in (t.get("layer_types") or [])]
        sliding_layers = sum("sliding" in x for x in layer_types)
        use_sw = bool(sw) or (bool(layer_types) and sliding_layers == len(layer_types))
        partial = None
        if use_sw and layer_types and sliding_layers < len(layer_types):
            partial = (sliding_layers, len(layer_types))
            notes.append(
                f"sliding window on {sliding_layers}/{len(layer_types)} layers: predicted for the full-attention layers"
            )
            use_sw = False
        if use_sw:
            notes.append(f"sliding window ({sw})")
        local = bool(t.get("attention_chunk_size"))
        if local:
            notes.append(f"chunked local attention ({t['attention_chunk_size']})")
        if alibi:
            notes.append("ALiBi")
        mla = t.get("kv_lora_rank") is not None
        if mla:
            notes.append("MLA: served by an MLA backend, not FLASH_ATTN's cascade path")
        head_dim = t.get("head_dim")
        if not isinstance(head_dim, int) or head_dim <= 0:
            hidden = t.get("hidden_size") or t.get("n_embd") or t.get("d_model")
            head_dim = hidden // heads if isinstance(hidden, int) and hidden % heads == 0 else None
        if sliding_layers and sliding_layers < len(layer_types):
            partial = (sliding_layers, len(layer_types))
        return cls(heads, kv, alibi, use_sw, local, mla, tuple(notes), head_dim, partial)

    def per_gpu(self, tp: int) -> tuple[int, int]:
        """Return (query heads, KV heads) per GPU at this TP, as vLLM computes them."""
        return self.num_attention_heads // tp, max(1, self.num_kv_heads // tp)


# The config keys vLLM reads a model's context length from (``_get_and_verify_max_len``): the
# smallest of those present counts.
CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# RoPE scalings whose config already gives the extended length (vLLM leaves them unscaled).
ROPE_ALREADY_EXTENDED = ("su", "longrope", "llama3")


def model_context(cfg: dict[str, Any]) -> int | None:
    """The longest sequence (prompt + generated tokens) a model config allows, as vLLM derives it:
    the smallest of :data:`CONTEXT_KEYS` (``text_config``'s where nested), times the RoPE scaling
    factor (from yarn's ``original_max_position_embeddings``) unless the scaling is one of
    :data:`ROPE_ALREADY_EXTENDED`. None when the config names no length."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
    t = text or cfg
    lengths = [
        v for k in CONTEXT_KEYS if isinstance(v := t.get(k), int) and not isinstance(v, bool) and v > 0
    ]
    if not lengths:
        return None
    length = float(min(lengths))
    rope = t.get("rope_scaling") or t.get("rope_parameters")
    if isinstance(rope, dict):
        kind = rope.get("rope_type") or rope.get("type")
        factor = rope.get("factor")
        if kind not in ROPE_ALREADY_EXTENDED and isinstance(factor, int | float) and factor > 0:
            if kind == "yarn" and isinstance(rope.get("original_max_position_embeddings"), int):
                length = float(rope["original_max_position_embeddings"])
            length *= factor
    return int(length)


# The twin the refusal of the default (cascade) on a vLLM without cascade hands the user: prefix
# caching is on by default in vLLM and serves the very shared prefix cascade attention split off,
# so it is what this vLLM does with the prefix the README's command builds.
NO_CASCADE_TWIN = "prefix-caching"


def default_twin_refusal(version: str | None, command: str) -> str | None:
    """The one line ``matrix`` refuses its default twin (cascade) with on a vLLM that has none, with
    the exact command to type instead: ``command`` (as typed) with ``--twin prefix-caching``.

    A refusal, not a run of another twin: a run would answer a question the command did not ask
    (its report, pair names and exit code about prefix caching while the README and the command
    say cascade; a CI job on this line would change meaning with the vLLM it installs), and it
    would spend GPU minutes to do so. The refusal costs no engine start, and the line is one paste.
    None where the version has cascade (or is unknown).
    """
    if cascade_status(version) != "removed":
        return None
    return (
        f"vLLM {version} has no cascade attention (the default --twin; removed in 0.32.0), so this command "
        f"would test nothing; to test what this vLLM does with the shared prefix, type: {command} "
        f"--twin {NO_CASCADE_TWIN}"
    )


def twin_refusal(
    family: str, name: str, gpus_needed: int, version: str | None, gpus: int | None
) -> str | None:
    """The one line ``matrix`` refuses a twin with on this box (None: it can run): a vLLM that cannot
    test it (with the twins it can), or fewer GPUs than its test arm needs."""
    if why := twin_problem(family, version):
        others = [f for f in testable_twins(version) if f != family]
        fix = (
            f'; for cascade itself: pip install "{CASCADE_EXTRA}" (vLLM {CASCADE_PIN})'
            if family == CASCADE.family
            else ""
        )
        return why + (f"; this vLLM can test --twin {', '.join(others)}" if others else "") + fix
    if gpus is not None and gpus < gpus_needed:
        return (f"--twin {name} needs {gpus_needed} GPUs for its test arm; this machine has {gpus} "
                "(run it where that many are visible)")  # fmt: skip
    return None
