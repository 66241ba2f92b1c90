"""What every engine provides to the worker: waves of token-id prompts in, completions out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

# The top-k logprobs every engine returns per generated step when the user has not chosen (--topk
# unset): the one place that default lives (MatrixSpec, the engines' own defaults, the benchmarks).
DEFAULT_TOPK = 5
MAX_TOPK = 20  # vLLM's default max_logprobs: more needs that engine argument raised as well


@dataclass
class Completion:
    """One generated completion with per-step logprobs."""

    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length"
    logprobs: list[float] = field(default_factory=list)  # of each chosen token
    topk: list[list[list[float]]] = field(default_factory=list)  # per step: [[token_id, logprob], ...]


def completion_text(tokenizer: Any, token_ids: list[int], finish_reason: str) -> str:
    """A completion's text, the same way for every engine: its tokens decoded once, special tokens
    skipped, and the token that stopped it (EOS or a stop token id) left out, as vLLM's own
    detokenizer leaves it out. (vLLM's incremental detokenizer also holds back a multi-byte character
    cut off by max_tokens, where a one-shot decode ends in U+FFFD.)"""
    ids = token_ids[:-1] if finish_reason == "stop" and token_ids else token_ids
    return tokenizer.decode(ids, skip_special_tokens=True)


@dataclass
class WaveStats:
    """What the engine (or the vLLM probe) saw while running one wave."""

    cascade_steps: int = 0
    total_steps: int = 0
    cascade_calls: int = 0
    common_prefix_len: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # Cascade steps on which every request had one query token (pure decode); None: not known.
    cascade_decode_steps: int | None = None


class ModelLoader(Protocol):
    """How an engine reads a model folder's tokenizer and config.json: ``plan/models``, handed over by
    ``run/worker.build_engine`` (engines/ builds from a run and never imports the planner)."""

    def load_tokenizer(self, model_path: str, trust_remote_code: bool = False) -> Any:
        """The model folder's HF tokenizer."""

    def load_config(self, path_or_id: str) -> dict:
        """The model's config.json as a dict."""


class Engine(Protocol):
    """One loaded model. Arms may share it (toggled per wave) or be fixed at start."""

    name: str
    inject: str | None  # the fault the cascade arm runs with from the next wave on (inject.py)

    def tokenizer(self) -> Any:
        """Return the HF tokenizer used to render prompts."""

    def effective(self) -> dict[str, Any]:
        """Return the flags in effect, read back from the engine (not the ones requested)."""

    def run_wave(
        self,
        prompts: list[list[int]],
        arm: str,
        max_tokens: int,
        prefix_len: int | None = None,
    ) -> tuple[list[Completion], WaveStats]:
        """Generate greedily for exactly these prompts, all submitted together.

        ``prefix_len`` is the shared prefix in tokens, as the worker measured it for the whole prompt
        set (None: the engine measures this wave's own); the vLLM engine warms exactly that much into
        its prefix cache, the hf engine's reference cascade splits there.
        """

    def close(self) -> None:
        """Release the engine."""
