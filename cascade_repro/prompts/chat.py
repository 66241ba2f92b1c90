"""Render prompts through the tokenizer's chat template and measure the shared prefix."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
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
    """Return the length of the longest prefix shared by every list."""
    if not token_lists:
        return 0
    first = token_lists[0]
    n = min(len(t) for t in token_lists)
    for i in range(n):
        tok = first[i]
        if any(t[i] != tok for t in token_lists):
            return i
    return n


def prompt_hash(token_ids: Sequence[int]) -> str:
    """Return a stable short hash of a rendered prompt (its token ids)."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:16]


def render_all(tokenizer: Any, system_prompt: str, prompts: Sequence[str]) -> tuple[list[list[int]], int]:
    """Render every prompt; return the token lists and the shared prefix length in tokens."""
    if not prompts:
        raise UsageError("the prompt set is empty")
    rendered = [render(tokenizer, system_prompt, p) for p in prompts]
    shared = common_prefix_len(rendered)
    # Every request must keep at least one token of its own after the shared prefix.
    shared = min(shared, min(len(r) for r in rendered) - 1)
    return rendered, max(shared, 0)


def check_context(
    rendered: Sequence[Sequence[int]], keys: Sequence[str], max_tokens: int, limit: int, of: str
) -> None:
    """Refuse prompts that with ``max_tokens`` generated tokens do not fit in ``limit`` tokens, in one
    line naming the longest and the numbers (``of``: whose limit, e.g. ``context 8,192 of MODEL``).

    ``max_tokens`` 0 asks whether each prompt leaves room for one generated token (``prompts show``,
    which generates nothing). Checked before any engine starts: an engine given such a prompt
    tries to allocate its whole length, one cell after another.
    """
    lengths = [len(r) for r in rendered]
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
            f"prompt {keys[worst]}: {lengths[worst]:,} tokens + {max_tokens:,} max tokens > {of}{more}"
        )
    raise UsageError(f"prompt {keys[worst]}: {lengths[worst]:,} tokens leave no room to generate: {of}{more}")
