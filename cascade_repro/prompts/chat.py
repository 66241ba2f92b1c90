"""Render prompts through the tokenizer's chat template and measure the shared prefix."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cascade_repro import vllm_surface
from cascade_repro.errors import UsageError

MIN_CASCADE_PREFIX = vllm_surface.MIN_COMMON_PREFIX


def render(tokenizer: Any, system_prompt: str, user_prompt: str) -> list[int]:
    """Return the token ids of one chat turn, ready for generation."""
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": user_prompt})
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    # No template (base models): a plain concatenation keeps the system prompt a shared prefix.
    text = (system_prompt + "\n\n" if system_prompt else "") + user_prompt
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def common_prefix_len(token_lists: Sequence[Sequence[int]]) -> int:
    """Return the length of the longest prefix shared by every list.

    The prefix every list shares is the one the lexicographically smallest and largest share, and
    ``min``/``max`` compare lists at C speed: 100,000 prompts behind a 1,600-token system prompt
    took ~40 s position by position in Python, well under a second this way."""
    if not token_lists:
        return 0
    lists = [t if isinstance(t, list) else list(t) for t in token_lists]
    lo, hi = min(lists), max(lists)
    # The longest p with lo[:p] == hi[:p], by halving (each step one slice comparison).
    good, bad = 0, min(len(lo), len(hi)) + 1
    while bad - good > 1:
        mid = (good + bad) // 2
        if lo[:mid] == hi[:mid]:
            good = mid
        else:
            bad = mid
    return good


def prompt_hash(token_ids: Sequence[int]) -> str:
    """Return a stable short hash of a rendered prompt (its token ids)."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SharedPrefix:
    """Every prompt of a set rendered by one tokenizer, and the prefix in tokens they all share."""

    rendered: list[list[int]]
    tokens: int

    def hashes(self) -> list[str]:
        """Each prompt's :func:`prompt_hash`: what its samples must carry."""
        return [prompt_hash(r) for r in self.rendered]

    def warning(self) -> str | None:
        """:func:`short_prefix_warning` of this prefix."""
        return short_prefix_warning(self.tokens)


def measure_prefix(tokenizer: Any, system_prompt: str | None, prompts: Sequence[Any]) -> SharedPrefix:
    """Render every prompt after ``system_prompt`` and measure the prefix they all share.

    ``prompts``: the prompt texts, or records carrying them (a ``PromptRecord``'s ``prompt``, a
    prompts.jsonl dict's ``"prompt"``). An empty set is a UsageError.
    """
    if not prompts:
        raise UsageError("the prompt set is empty")
    texts = [p if isinstance(p, str) else p["prompt"] if isinstance(p, dict) else p.prompt for p in prompts]
    rendered = [render(tokenizer, system_prompt or "", t) for t in texts]
    shared = common_prefix_len(rendered)
    # Every request must keep at least one token of its own after the shared prefix.
    shared = min(shared, min(len(r) for r in rendered) - 1)
    return SharedPrefix(rendered, max(shared, 0))


@dataclass(frozen=True)
class PromptLengths:
    """Each prompt's rendered length and the shared prefix, without the token lists: what a plan
    needs of a prompt set (:func:`measure_lengths`)."""

    lengths: list[int]
    tokens: int

    def warning(self) -> str | None:
        """:func:`short_prefix_warning` of this prefix."""
        return short_prefix_warning(self.tokens)


def measure_lengths(
    tokenizer: Any,
    system_prompt: str | None,
    prompts: Sequence[Any],
    progress: Callable[[int], None] | None = None,
) -> PromptLengths:
    """:func:`measure_prefix`'s numbers holding one rendered prompt at a time (100,000 prompts of
    1,600 tokens as token lists took ~1.6 GB); ``progress`` is told the count rendered so far."""
    if not prompts:
        raise UsageError("the prompt set is empty")
    first: list[int] = []
    shared = 0
    lengths: list[int] = []
    for p in prompts:
        text = p if isinstance(p, str) else p["prompt"] if isinstance(p, dict) else p.prompt
        ids = render(tokenizer, system_prompt or "", text)
        if not lengths:
            first, shared = ids, len(ids)
        elif ids[:shared] != first[:shared]:
            shared = common_prefix_len([first[:shared], ids])
        lengths.append(len(ids))
        if progress is not None:
            progress(len(lengths))
    return PromptLengths(lengths, max(min(shared, min(lengths) - 1), 0))


def short_prefix_warning(shared: int | None) -> str | None:
    """The one line that says a shared prefix of ``shared`` tokens is too short for cascade to fire
    (vLLM's hard condition); None when it is long enough or unknown."""
    if shared is None or shared >= MIN_CASCADE_PREFIX:
        return None
    return f"shared prefix is {shared} tokens (< {MIN_CASCADE_PREFIX}): cascade cannot fire"


def check_context(
    rendered: Sequence[Sequence[int]], keys: Sequence[str], max_tokens: int, limit: int, of: str
) -> None:
    """:func:`check_lengths` of the rendered prompts."""
    check_lengths([len(r) for r in rendered], keys, max_tokens, limit, of)


def check_lengths(lengths: Sequence[int], keys: Sequence[str], max_tokens: int, limit: int, of: str) -> None:
    """Refuse prompts that with ``max_tokens`` generated tokens do not fit in ``limit`` tokens, in one
    line naming the longest and the numbers (``of``: whose limit, e.g. ``context 8,192 of MODEL``).

    ``max_tokens`` 0 asks whether each prompt leaves room for one generated token (``prompts show``,
    which generates nothing). Checked before any engine starts: an engine given such a prompt
    tries to allocate its whole length, one cell after another.
    """
    if not lengths:
        return
    if max_tokens >= limit:
        raise UsageError(f"--max-tokens {max_tokens:,} leaves no room for a prompt: {of}")
    over = [i for i, n in enumerate(lengths) if n + max(max_tokens, 1) > limit]
    if not over:
        return
    worst = max(over, key=lambda i: lengths[i])
    more = f" (and {len(over) - 1} more)" if len(over) > 1 else ""
    if max_tokens:
        raise UsageError(
            f"prompt {keys[worst]}: {lengths[worst]:,} tokens + --max-tokens {max_tokens:,} > {of}{more}"
        )
    raise UsageError(f"prompt {keys[worst]}: {lengths[worst]:,} tokens leave no room to generate: {of}{more}")
