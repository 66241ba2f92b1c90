"""A twin entry's type (:class:`TwinAxis`) and the facts its behaviour reads: a wave's
(:class:`WaveFacts`, for its effect reader) and a planned cell's (:class:`CellFacts`, for its
prediction); what may prove a setting took effect (:data:`EFFECTS`) and a wave's proof of effect as
recorded (:func:`effect_record`). Standard library only."""

from __future__ import annotations

from collections.abc import Callable
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


# vLLM's default largest CUDA-graph capture size (CompilationConfig, 0.10.2 to 0.26.0).
DEFAULT_MAX_CAPTURE = 512


@dataclass(frozen=True)
class WaveFacts:
    """What an engine saw in one wave, for a twin's effect reader (:meth:`TwinAxis.wave_effect`)."""

    # The arm the wave ran (the counts are of the test arm's setting: on the reference arm they say
    # whether it leaked there, 0 expected).
    arm: str
    # What the engine says it runs with, read once per start (vLLM: its config, and from every
    # worker the attention classes, KV cache dtypes and TP size; which probe hooks run).
    readback: dict[str, Any]
    # The probe's counters of the wave (scheduler steps, partial prefills, CUDA-graph steps, ...).
    counters: dict[str, Any]
    # Decode tokens the wave generated, and its requests.
    tokens: int
    batch: int
    # Prompt tokens served from the prefix cache (RequestOutput.num_cached_tokens, summed).
    cached_tokens: int = 0


@dataclass(frozen=True)
class CellFacts:
    """What the planner knows of a test cell before running, for a twin's effect prediction."""

    batch: int
    shared_prefix: int | None
    prompt_lens: list[int] | None
    block_size: int
    gpus: int | None
    captured: list[int] | None = None


# An entry's effect reader: the wave's proof of effect (an ``effect_record``) from its facts.
EffectReader = Callable[["TwinAxis", WaveFacts], dict[str, Any]]
# An entry's effect prediction: ``yes``, ``no`` or ``?`` (known once the engine starts), and why.
EffectPredictor = Callable[["TwinAxis", CellFacts], tuple[str, str]]


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
    # What proves the setting took effect in a wave, read from its facts (None: the engine cannot
    # tell), and whether it will in a planned cell (None: known once the engine starts).
    reader: EffectReader | None = field(default=None, compare=False, repr=False)
    predictor: EffectPredictor | None = field(default=None, compare=False, repr=False)

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

    def engine_args(self, arm: str | None) -> dict[str, Any]:
        """The vLLM engine arguments an engine started for ``arm`` takes from this twin; ``None`` (one
        engine that switches the arms per wave): the arguments both arms declare alike."""
        if arm is None:
            return {k: v for k, v in self.test_args if (k, v) in self.ref_args}
        return dict(self.test_args if arm == self.test else self.ref_args if arm == self.ref else ())

    def env(self, arm: str) -> dict[str, str]:
        """The environment an engine started for ``arm`` takes from this twin."""
        return dict(self.test_env if arm == self.test else self.ref_env if arm == self.ref else ())

    def axis_value(self, arm: str) -> int | str | None:
        """The arm's value on the cell axis the arms differ in (None: they share every axis)."""
        return self.test_value if arm == self.test else self.ref_value

    def wave_effect(self, facts: WaveFacts) -> dict[str, Any]:
        """A wave's proof that the setting took effect (``effect_record``), read from its facts."""
        if self.reader is None:
            return effect_record(self, 0, {}, "this engine cannot tell")
        return self.reader(self, facts)

    def predict_effect(self, cell: CellFacts) -> tuple[str, str]:
        """Whether the setting takes effect in a test cell (``yes``, ``no`` or ``?``), and why."""
        if self.predictor is None:
            return "?", f"read back from the engine once it starts ({self.effect_doc})"
        return self.predictor(self, cell)


def effect_record(twin: TwinAxis, count: int, evidence: dict[str, Any], why: str = "") -> dict[str, Any]:
    """A wave's proof of effect (the wave record's ``extra["effect"]``): the twin, how many steps (or
    for ``prefix_hits`` tokens) it took effect on, what the engine read to say so, and when the count
    is 0 on the test arm, why."""
    out: dict[str, Any] = {"twin": twin.name, "kind": twin.effect, "count": int(count), "evidence": evidence}
    if why:
        out["why"] = why
    return out
