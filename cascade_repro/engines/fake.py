"""A deterministic engine without weights, for testing the harness around the model (``--engine fake``).

lm-evaluation-harness ships its ``dummy`` model and simonw/llm its ``MockModel`` for the same reason:
the runner, resume, merge, shard and report paths do not depend on what a model computes, and a
test of them should not wait for one. Everything here is the standard library; a worker building
this engine imports neither torch nor transformers and starts in well under a second.

What it generates is a function of the prompt's token ids alone, row by row: each step's top-k
candidates and their log-probabilities come from a SHA-256 chain seeded by the prompt and advanced by
each chosen token, so an answer does not depend on the batch, the wave, the engine start or the arm.
The two arms are therefore exactly equal and a clean matrix is ``identical``. Cascade is counted by
the hf engine's rule (a block-aligned shared prefix of at least 256 tokens and at least 8 live
requests, checked every step), and an injected fault (``lse-layout``, ``lse-shift=X[@STEP]``) moves
the candidates' log-probabilities on exactly the steps that rule gives to cascade, by ``X`` nats at
most (``lse-layout``: 8), so a positive control or a calibration rung diverges or drifts as a real
fault would, and a fault where cascade cannot fire changes nothing (``not exercised``).

Any other twin (``--twin``) is simulated: its arms generate the same answers, and each wave of the
test arm reports the setting as taken effect on every step (``extra["effect"]``), or, with
``CASCADE_REPRO_FAKE_EFFECT=off`` in the worker's environment, as never taken effect, so the
harness's ``not exercised`` path is tested too; with ``=cascade``, cascade is counted in both of its
arms by the rule above, as in an engine started with cascade on, which no twin but cascade may be.
``out-scale=E`` (the positive control of a twin that runs no cascade merge) moves the logprobs on
every step of the test arm, by ``8 * E`` nats at most.

It has no reference pass (there are no weights to teacher-force): its runs are judged by the
arm-vs-arm rule, as a run with ``--reference off`` is, and the report says so. Its numbers mean
nothing about any model; its tokenizer (:class:`ByteTokenizer`) is its own.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cascade_repro import twin as twins
from cascade_repro import vllm_surface
from cascade_repro.engines.base import DEFAULT_TOPK, Completion, ModelLoader, WaveStats, completion_text
from cascade_repro.twin import CASCADE as TWIN
from cascade_repro.vllm_surface import inject as inj

if TYPE_CHECKING:
    from cascade_repro.rundir.cells import EnginePlan
    from cascade_repro.rundir.manifest import Manifest

MODEL_NAME = "fake (a deterministic function of the prompt's tokens; no weights)"
BLOCK_SIZE = 16  # the prefix is block-aligned before the cascade rule reads it, as the hf engine's is
LAYOUT_NATS = 8.0  # what ``lse-layout`` moves a log-probability by at most: gross, like the real bug
# Generated tokens are printable ASCII, so every answer decodes to plain text.
FIRST_TEXT_TOKEN, LAST_TEXT_TOKEN = 32, 126
MIN_ANSWER, ANSWER_SPREAD = 12, 48  # a prompt's answer stops after 12..59 tokens unless max_tokens cuts it
# The worker environment variable that makes a simulated twin's setting never take effect.
EFFECT_ENV = "CASCADE_REPRO_FAKE_EFFECT"


class ByteTokenizer:
    """A byte-level tokenizer with a ChatML template: the part of a Hugging Face tokenizer the harness
    calls (``apply_chat_template``, ``__call__``, ``decode``), with no files to load.

    Ids 0-255 are bytes; the three special tokens follow them.
    """

    EOS, IM_START, IM_END = 256, 257, 258
    SPECIAL = {EOS: "<|endoftext|>", IM_START: "<|im_start|>", IM_END: "<|im_end|>"}
    chat_template = "chatml"  # what render() checks for; the rendering is apply_chat_template's own
    eos_token_id = pad_token_id = EOS
    vocab_size = 259

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = False, tokenize: bool = True
    ) -> list[int] | str:
        ids: list[int] = []
        for m in messages:
            ids += [
                self.IM_START,
                *self.encode(f"{m['role']}\n{m['content']}"),
                self.IM_END,
                *self.encode("\n"),
            ]
        if add_generation_prompt:
            ids += [self.IM_START, *self.encode("assistant\n")]
        return ids if tokenize else self.decode(ids, skip_special_tokens=False)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        out, run = [], bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", "replace"))
            run = bytearray()
            if not skip_special_tokens:
                out.append(self.SPECIAL.get(i, ""))
        out.append(run.decode("utf-8", "replace"))
        return "".join(out)

    def token_bytes(self, token_id: int) -> bytes | None:
        """The bytes one id stands for (a byte, or a special token's text); None for an unknown id."""
        if 0 <= token_id < 256:
            return bytes([token_id])
        special = self.SPECIAL.get(token_id)
        return special.encode("utf-8") if special is not None else None


def _unit(digest: bytes, i: int) -> float:
    """The ``i``-th number in [0, 1) drawn from a digest (four bytes each)."""
    return struct.unpack_from(">I", digest, 4 * (i % 8))[0] / 2**32


class FakeEngine:
    """The engine protocol (engines/base.py) over :func:`step_candidates`, both arms from one object."""

    name = "fake"

    def __init__(
        self,
        topk: int = DEFAULT_TOPK,
        inject: str | None = None,
        ignore_eos: bool = False,
        dtype: str = "auto",
        twin: twins.TwinAxis = TWIN,
    ):
        self.twin = twin
        self.topk = max(1, min(int(topk), 8))  # one digest holds eight candidates
        self.inject = inject
        self.ignore_eos = ignore_eos
        self.dtype_name = "float32" if dtype == "auto" else dtype
        self._tok = ByteTokenizer()

    def tokenizer(self) -> ByteTokenizer:
        return self._tok

    def effective(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "device": "cpu",
            "dtype": self.dtype_name,
            "attention": "none: a deterministic fake, its tokens a function of the prompt's",
            "cascade_rule": f"prefix >= {vllm_surface.MIN_COMMON_PREFIX} tokens (block-aligned) and "
            f">= {vllm_surface.MIN_REQUESTS} requests",
            "cascade_supported": True,
            "inject": self.inject or "none",
        }

    def close(self) -> None:
        pass

    def run_wave(
        self,
        prompts: list[list[int]],
        arm: str,
        max_tokens: int,
        prefix_len: int | None = None,
    ) -> tuple[list[Completion], WaveStats]:
        """Generate for every row of the wave; cascade decided per step from the live rows, as hf does."""
        from cascade_repro.prompts.chat import common_prefix_len

        p = common_prefix_len(prompts) if prefix_len is None else prefix_len
        p = min(p, min(len(x) for x in prompts) - 1)
        aligned = (p // BLOCK_SIZE) * BLOCK_SIZE
        tw = self.twin
        fault = inj.try_parse(self.inject) if arm == tw.test else None
        mixed = tw is not TWIN and _effect_env() == TWIN.name  # cascade run in both arms anyway
        # The positive control of a twin without cascade: on every step of the test arm.
        scaled = fault is not None and fault.kind == inj.OUT_SCALE
        stop_at = [MIN_ANSWER + int(_unit(_seed(x), 7) * ANSWER_SPREAD) for x in prompts]
        rows = [_Row(_seed(x)) for x in prompts]
        stats = WaveStats(cascade_decode_steps=0)
        for step in range(max_tokens):
            live = [r for r in rows if not r.finished]
            if not live:
                break
            cascade = (
                (arm == TWIN.test or mixed)
                and aligned >= vllm_surface.MIN_COMMON_PREFIX
                and len(live) >= vllm_surface.MIN_REQUESTS
            )
            stats.total_steps += 1
            stats.cascade_steps += cascade
            stats.cascade_decode_steps += cascade and step > 0
            nats = _fault_nats(fault, step) if cascade or scaled else 0.0
            for i, row in enumerate(rows):
                if row.finished:
                    continue
                end = step == stop_at[i] and not self.ignore_eos
                row.advance(self.topk, nats, end)
        stats.cascade_calls = stats.cascade_steps
        stats.common_prefix_len = aligned if stats.cascade_steps else 0
        if tw is not TWIN:
            stats.extra["effect"] = self._effect(arm, stats.total_steps)
        completions = []
        for row in rows:
            reason = "stop" if row.finished else "length"
            text = completion_text(self._tok, row.tokens, reason)
            completions.append(Completion(row.tokens, text, reason, row.logprobs, row.topk))
        return completions, stats

    def _effect(self, arm: str, steps: int) -> dict[str, Any]:
        """The simulated proof of effect of a wave (see the module's docstring)."""
        tw = self.twin
        if arm != tw.test:
            return twins.effect_record(tw, 0, {"simulated": "reference arm"})
        if _effect_env() == "off":
            return twins.effect_record(
                tw, 0, {"simulated": "off"}, f"the fake engine was told to ignore it ({EFFECT_ENV}=off)"
            )
        return twins.effect_record(tw, steps, {"simulated": "on"})


def _effect_env() -> str:
    import os

    return os.environ.get(EFFECT_ENV, "").strip().lower()


def _seed(prompt: list[int]) -> bytes:
    return hashlib.sha256(",".join(map(str, prompt)).encode()).digest()


def _fault_nats(fault: inj.Injection | None, step: int) -> float:
    """How far a fault moves this step's log-probabilities at most (0: no fault on this step)."""
    if fault is None or not fault.active(step):
        return 0.0
    if fault.kind == inj.OUT_SCALE:
        return LAYOUT_NATS * min(abs(fault.nats), 1.0)
    return LAYOUT_NATS if fault.kind == inj.LSE_LAYOUT else abs(fault.nats)


class _Row:
    """One request's answer so far and the digest its next step is drawn from."""

    def __init__(self, seed: bytes) -> None:
        self.state = seed
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.topk: list[list[list[float]]] = []
        self.finished = False

    def advance(self, k: int, nats: float, end: bool) -> None:
        cands = step_candidates(self.state, k, end)
        if nats:
            # The fault moves each candidate by up to ``nats``, by an amount of its own: the chosen
            # token's log-probability drifts, and where the move exceeds the margin the token flips.
            shake = hashlib.sha256(self.state + b"fault").digest()
            cands = sorted(
                ([t, lp + nats * (2 * _unit(shake, j) - 1)] for j, (t, lp) in enumerate(cands)),
                key=lambda c: -c[1],
            )
        token, lp = int(cands[0][0]), float(cands[0][1])
        self.tokens.append(token)
        self.logprobs.append(lp)
        self.topk.append([[int(t), float(v)] for t, v in cands])
        self.finished = token == ByteTokenizer.EOS
        self.state = hashlib.sha256(self.state + token.to_bytes(2, "big")).digest()


def step_candidates(state: bytes, k: int, end: bool) -> list[list[float]]:
    """A step's ``k`` most likely tokens with their log-probabilities, most likely first.

    The margins between neighbours are drawn from the state in [0.05, 2.05) nats, so a small fault
    only drifts and a larger one flips tokens; ``end`` puts EOS first.
    """
    d = hashlib.sha256(state + b"step").digest()
    span = LAST_TEXT_TOKEN - FIRST_TEXT_TOKEN + 1
    tokens: list[int] = []
    j = 0
    while len(tokens) < k:
        t = FIRST_TEXT_TOKEN + d[j % 32] % span if j < 32 else FIRST_TEXT_TOKEN + (j % span)
        if t not in tokens:
            tokens.append(t)
        j += 1
    if end:
        tokens = [ByteTokenizer.EOS, *tokens[: k - 1]]
    lp = -0.02 - 0.5 * _unit(d, 0)
    out = []
    for i, t in enumerate(tokens):
        out.append([t, lp])
        lp -= 0.05 + 2.0 * _unit(d, i + 1)
    return out


def tokenizer() -> ByteTokenizer:
    """The registry's tokenizer (engines.ENGINES): what a run of this engine renders prompts with."""
    return ByteTokenizer()


def build(
    run: Manifest, eplan: EnginePlan, run_dir: Path | None, spec: Any, models: ModelLoader
) -> FakeEngine:
    """The registry's builder (engines.ENGINES): the engine of one engine plan of a run, ``spec`` its
    ``plan.matrix.MatrixSpec``."""
    return FakeEngine(topk=spec.topk, inject=spec.inject, ignore_eos=bool(spec.ignore_eos), dtype=eplan.dtype,
                      twin=spec.twin_axis)  # fmt: skip
