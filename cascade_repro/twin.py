"""The twin axes: every engine setting that must leave greedy outputs alone, named in one place.

Each cell of a setting's test arm is judged against its twin of the reference arm: the same engine
configuration and prompts with only that setting changed. ``--twin NAME`` picks the setting
(:func:`resolve`); ``cascade``, the default, is the first and best-proven one. The arm names are
data on disk (cells.parquet's ``arm`` column, run.json's cells, the samples' records, pair ids such
as ``tp1-b8-cascade~flat`` or ``tp1-b8-prefix-on~prefix-off``), so an entry's names must never
change; the planner, the pairing, the engines and the reports read them from here instead of
spelling them.

An entry says how its arms differ (the vLLM engine arguments or environment of each arm, or a
toggle one engine serves through the plugin, or the cell axis ``tp``/``batch``), what proves the
setting took effect (:attr:`TwinAxis.effect`, counted per wave by the engine), which vLLM releases
have it (``vllm_surface.TWIN_RELEASES``), its labels, its pair kind, and whether a difference is
expected (a lossy setting such as an FP8 KV cache: its error ratio is reported, and it fails the
run only under ``--fail-on expected``).

Standard library only, and nothing from this package: every layer imports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# What proves a setting took effect, per wave (the wave record's ``extra["effect"]`` and, summed,
# the cell's effect count), observed as vLLM ran: cascade steps; prefix-cache hit tokens; prefill
# steps that ran a request's prompt in part (chunks); steps run through a CUDA graph; or steps (or
# decode tokens) under a fact observed in the engine (the steps its async scheduler scheduled, the
# attention implementation class and KV cache dtype each layer was built with, the TP world size,
# the requests one scheduler step held).
EFFECTS = ("cascade_steps", "prefix_hits", "prefill_chunks", "graph_steps", "config")
EFFECT_LABELS = {
    "cascade_steps": "cascade steps",
    "prefix_hits": "prefix-cache hits",
    "prefill_chunks": "prefill chunks",
    "graph_steps": "graph steps",
    "config": "steps with the setting",
}


@dataclass(frozen=True)
class TwinAxis:
    """One setting with two arms, as the matrix, the engines, the pairs and the reports name it."""

    # As ``--twin`` spells it, parameters included (``attention-backend=FLASH_ATTN:FLASHINFER``).
    name: str
    # The registry's entry (``attention-backend``): the pairs table's kind of a test cell against
    # its twin, and how reports group it.
    family: str
    # The arm with the setting under test: the cells judged.
    test: str
    # The arm each test cell is judged against, and the arm the noise controls compare with itself.
    ref: str
    # How the reports head a test sample and its twin's.
    test_label: str
    ref_label: str
    # One sentence: what the two arms are.
    summary: str
    # True: one engine serves both arms, switched per wave (vLLM: the plugin forces
    # use_cascade_attention off; the hf and fake engines: their own switch). False: each arm is an
    # engine start of its own with its own engine arguments and environment.
    toggle: bool = False
    # vLLM engine arguments and environment variables each arm is started with.
    test_args: tuple[tuple[str, Any], ...] = ()
    ref_args: tuple[tuple[str, Any], ...] = ()
    test_env: tuple[tuple[str, str], ...] = ()
    ref_env: tuple[tuple[str, str], ...] = ()
    # The cell axis the arms differ in (``tp``, ``batch``, ``backend``) and each arm's value on it;
    # None: the arms share every axis and differ in the engine's setting only.
    axis: str | None = None
    test_value: int | str | None = None
    ref_value: int | str | None = None
    # What proves the setting took effect (one of EFFECTS) and, in words, what it counts.
    effect: str = "config"
    effect_doc: str = ""
    # The setting may change results by design (a lossy KV cache): the pair's verdict stands but
    # does not fail the run unless the user asks (``--fail-on expected``).
    expected_change: bool = False
    # Engines besides vLLM that can serve it (the fake engine simulates every twin).
    engines: tuple[str, ...] = ("vllm", "fake")
    # GPUs the test arm needs.
    gpus: int = 1
    # The MatrixSpec field holding which arms run (on: the test arm, off: the reference arm).
    spec_field: str = field(default="cascade")

    @property
    def pair_kind(self) -> str:
        return self.family

    @property
    def effect_label(self) -> str:
        """The reports' heading of the effect count (the tables' ``cascade_steps`` column)."""
        return EFFECT_LABELS[self.effect]

    @property
    def arms(self) -> tuple[str, str]:
        """Both arm names, test first."""
        return (self.test, self.ref)

    def arm(self, on: bool) -> str:
        """The arm name of the setting's value ``on``."""
        return self.test if on else self.ref

    def engine_args(self, arm: str) -> dict[str, Any]:
        """The vLLM engine arguments an engine started for ``arm`` takes from this twin."""
        return dict(self.test_args if arm == self.test else self.ref_args if arm == self.ref else ())

    def env(self, arm: str) -> dict[str, str]:
        """The environment an engine started for ``arm`` takes from this twin."""
        return dict(self.test_env if arm == self.test else self.ref_env if arm == self.ref else ())

    def axis_value(self, arm: str) -> int | str | None:
        """The arm's value on the cell axis the arms differ in (None: they share every axis)."""
        return self.test_value if arm == self.test else self.ref_value


# vLLM's cascade attention on (disable_cascade_attn=False, or the hf engine's reference cascade)
# against the same engine with it off.
CASCADE = TwinAxis(
    name="cascade",
    family="cascade",
    test="cascade",
    ref="flat",
    test_label="cascade (test)",
    ref_label="flat (ref)",
    summary="cascade attention on (disable_cascade_attn=False) vs forced off in the same engine",
    toggle=True,
    ref_args=(("disable_cascade_attn", True),),
    effect="cascade_steps",
    effect_doc="steps vLLM ran with cascade attention (the plugin counts its decisions)",
    engines=("vllm", "hf", "fake"),
)

# A prefill chunk small enough that every rendered prompt of the built-in sets (a system prompt of
# a few hundred tokens and the question) is cut into several chunks; vLLM needs it >= max_num_seqs,
# which the engine sets to the largest batch for both arms of this twin.
CHUNK_TOKENS = 128

PREFIX_CACHING = TwinAxis(
    name="prefix-caching",
    family="prefix-caching",
    test="prefix-on",
    ref="prefix-off",
    test_label="prefix caching (test)",
    ref_label="no prefix caching (ref)",
    summary="enable_prefix_caching=True (the shared prefix served from the cache) vs False",
    test_args=(("enable_prefix_caching", True), ("disable_cascade_attn", True)),
    ref_args=(("enable_prefix_caching", False), ("disable_cascade_attn", True)),
    effect="prefix_hits",
    effect_doc="prompt tokens served from the prefix cache (RequestOutput.num_cached_tokens)",
)

CHUNKED_PREFILL = TwinAxis(
    name="chunked-prefill",
    family="chunked-prefill",
    test="chunked",
    ref="unchunked",
    test_label="chunked prefill (test)",
    ref_label="whole prefill (ref)",
    summary=f"max_num_batched_tokens={CHUNK_TOKENS} (every prompt prefilled in chunks) vs vLLM's default budget",
    test_args=(("enable_chunked_prefill", True), ("max_num_batched_tokens", CHUNK_TOKENS),
               ("disable_cascade_attn", True)),
    ref_args=(("disable_cascade_attn", True),),
    effect="prefill_chunks",
    effect_doc="prefill steps that ran part of a request's prompt (scheduled < prompt left)",
)  # fmt: skip

CUDA_GRAPHS = TwinAxis(
    name="cuda-graphs",
    family="cuda-graphs",
    test="graphs",
    ref="eager",
    test_label="CUDA graphs (test)",
    ref_label="eager (ref)",
    summary="decode steps replayed from CUDA graphs vs enforce_eager=True",
    test_args=(("enforce_eager", False), ("disable_cascade_attn", True)),
    ref_args=(("enforce_eager", True), ("disable_cascade_attn", True)),
    effect="graph_steps",
    effect_doc="steps the model runner ran through a CUDA graph (a FULL replay or PIECEWISE graphs; the "
    "engine's config stands in where the vLLM has no such hook)",
)

ASYNC_SCHEDULING = TwinAxis(
    name="async-scheduling",
    family="async-scheduling",
    test="async",
    ref="sync",
    test_label="async scheduling (test)",
    ref_label="sync scheduling (ref)",
    summary="async_scheduling=True (the next step scheduled while one runs) vs False",
    test_args=(("async_scheduling", True), ("disable_cascade_attn", True)),
    ref_args=(("async_scheduling", False), ("disable_cascade_attn", True)),
    effect="config",
    effect_doc="steps scheduled by vLLM's async scheduler (AsyncScheduler, what async_scheduling=True installs)",
)

KV_CACHE_FP8 = TwinAxis(
    name="kv-cache-dtype=fp8",
    family="kv-cache-dtype",
    test="kv-fp8",
    ref="kv-auto",
    test_label="FP8 KV cache (test)",
    ref_label="model-dtype KV cache (ref)",
    summary="kv_cache_dtype=fp8 vs the model's dtype (auto): lossy by design, a difference is expected",
    test_args=(("kv_cache_dtype", "fp8"), ("disable_cascade_attn", True)),
    ref_args=(("kv_cache_dtype", "auto"), ("disable_cascade_attn", True)),
    effect="config",
    effect_doc="decode tokens generated with every attention layer's KV cache fp8, stored in 1-byte elements "
    "(read from every worker)",
    expected_change=True,
)

# Attention backends as vLLM's AttentionBackendEnum names them; an arm's name is the lower-case
# name with the underscores dropped (``flashinfer``, ``tritonattn``), prefixed ``attn-``.
BACKEND = re.compile(r"[A-Z][A-Z0-9_]*")


def _backend_twin(a: str, b: str) -> TwinAxis:
    def arm(x: str) -> str:
        return "attn-" + x.lower().replace("_", "")

    return TwinAxis(
        name=f"attention-backend={a}:{b}",
        family="attention-backend",
        test=arm(b),
        ref=arm(a),
        test_label=f"{b} (test)",
        ref_label=f"{a} (ref)",
        summary=f"attention backend {b} vs {a}",
        test_args=(("disable_cascade_attn", True),),
        ref_args=(("disable_cascade_attn", True),),
        axis="backend",
        test_value=b,
        ref_value=a,
        effect="config",
        effect_doc="decode tokens generated with the test backend's implementation class in the model's layers "
        "(read back from every worker through the plugin)",
    )


def _tp_twin(a: int, b: int) -> TwinAxis:
    return TwinAxis(
        name=f"tp={a}:{b}",
        family="tp",
        test=f"tp{b}",
        ref=f"tp{a}",
        test_label=f"TP {b} (test)",
        ref_label=f"TP {a} (ref)",
        summary=f"tensor_parallel_size={b} vs {a}",
        test_args=(("disable_cascade_attn", True),),
        ref_args=(("disable_cascade_attn", True),),
        axis="tp",
        test_value=b,
        ref_value=a,
        effect="config",
        effect_doc="decode tokens generated in a TP group of the test arm's size (read back from every worker)",
        gpus=max(a, b),
    )


def _batch_twin(a: int, b: int) -> TwinAxis:
    return TwinAxis(
        name=f"batch={a}:{b}",
        family="batch",
        test=f"batch{b}",
        ref=f"batch{a}",
        test_label=f"batch {b} (test)",
        ref_label=f"batch {a} (ref)",
        summary=f"each prompt in a wave of {b} concurrent requests vs of {a} (batch invariance)",
        toggle=True,
        test_args=(("disable_cascade_attn", True),),
        ref_args=(("disable_cascade_attn", True),),
        axis="batch",
        test_value=b,
        ref_value=a,
        effect="config",
        effect_doc=f"decode tokens (the fake engine: steps) of waves whose scheduler ran {b} requests in one step",
        engines=("vllm", "hf", "fake"),
    )


FIXED: dict[str, TwinAxis] = {
    t.name: t for t in (CASCADE, PREFIX_CACHING, CHUNKED_PREFILL, CUDA_GRAPHS, ASYNC_SCHEDULING, KV_CACHE_FP8)
}
# The parameterised entries: how --help and errors spell them, and an example each.
PARAMETERISED = {
    "attention-backend": ("attention-backend=A:B", "attention-backend=FLASH_ATTN:FLASHINFER"),
    "tp": ("tp=A:B", "tp=1:2"),
    "batch": ("batch=1:N", "batch=1:8"),
}
FAMILIES = (*(t.family for t in FIXED.values()), *PARAMETERISED)
# Every pair kind a twin gives a test cell against its twin.
PAIR_KINDS = frozenset(FAMILIES)
# The names as --help lists them.
SPELLINGS = (*FIXED, *(s for s, _ in PARAMETERISED.values()))
MAX_AXIS = 1 << 16


def resolve(name: str | None) -> TwinAxis:
    """The registry's entry for ``--twin NAME`` (None: cascade); ValueError in one line otherwise."""
    if name is None:
        return CASCADE
    text = str(name).strip()
    if text in FIXED:
        return FIXED[text]
    family, eq, arg = text.partition("=")
    if family in PARAMETERISED and eq:
        spelling, example = PARAMETERISED[family]
        a, colon, b = arg.partition(":")
        if family == "attention-backend":
            a, b = a.strip().upper(), b.strip().upper()
            if not (colon and BACKEND.fullmatch(a) and BACKEND.fullmatch(b)) or a == b:
                raise ValueError(
                    f"--twin {spelling}: two different backend names, as in {example}; got {text!r}"
                )
            return _backend_twin(a, b)
        try:
            x, y = int(a), int(b)
        except ValueError:
            raise ValueError(f"--twin {spelling}: two integers, as in {example}; got {text!r}") from None
        if not (0 < x < y <= MAX_AXIS):
            raise ValueError(f"--twin {spelling}: A < B, both positive, as in {example}; got {text!r}")
        if family == "batch":
            if x != 1:
                raise ValueError(
                    f"--twin {spelling}: the reference arm runs one request at a time; got {text!r}"
                )
            return _batch_twin(x, y)
        return _tp_twin(x, y)
    if family in PARAMETERISED:
        spelling, example = PARAMETERISED[family]
        raise ValueError(f"--twin {family} takes its arms: {spelling}, as in {example}")
    raise ValueError(f"--twin must be one of {', '.join(SPELLINGS)}; got {text!r}")


def all_examples() -> list[TwinAxis]:
    """One entry per family, the parameterised ones with their example arms (docs, doctor, tests)."""
    return [*FIXED.values(), *(resolve(ex) for _, ex in PARAMETERISED.values())]


def of(spec: Any) -> TwinAxis:
    """The twin a run's spec compares its arms on (a spec or run.json from before --twin: cascade)."""
    name = getattr(spec, "twin", None) if not isinstance(spec, dict) else spec.get("twin")
    return resolve(name or CASCADE.name)


def effect_record(twin: TwinAxis, count: int, evidence: dict[str, Any], why: str = "") -> dict[str, Any]:
    """A wave's proof of effect (the wave record's ``extra["effect"]``): the twin, how many steps (or
    for ``prefix_hits`` tokens) it took effect on, what the engine read to say so, and when the count
    is 0 on the test arm, why."""
    out: dict[str, Any] = {"twin": twin.name, "kind": twin.effect, "count": int(count), "evidence": evidence}
    if why:
        out["why"] = why
    return out
