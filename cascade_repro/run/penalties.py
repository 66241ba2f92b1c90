"""vLLM's sampling penalties applied to the reference pass's teacher-forced logits.

A run with ``--sampling`` (``vllm_surface/sampling.py``) had every arm choose each token from logits
vLLM's sampler penalized, and report the logprobs of that distribution (``processed_logprobs``). The
reference must score the same distribution, or a correct arm would look wrong wherever the penalty
changed the argmax, and an arm that dropped the penalty (the async-scheduling bug of vLLM 0.11.0)
would look closer to the reference than a correct one. So the reference applies the penalties as
vLLM's ``apply_penalties`` does (``vllm/model_executor/layers/utils.py``), position by position with
the output tokens generated before it:

- repetition: a token in the prompt or the output so far has a positive logit divided by the
  penalty, a negative one multiplied by it;
- frequency: the penalty times the token's count in the output so far is subtracted;
- presence: the penalty is subtracted once the token occurs in the output so far.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cascade_repro.vllm_surface import sampling


@dataclass(frozen=True)
class Penalties:
    repetition: float = 1.0
    frequency: float = 0.0
    presence: float = 0.0

    @classmethod
    def of(cls, spec_sampling: Mapping[str, Any] | None) -> Penalties | None:
        """The run's penalties, or None when none moves the logits (the reference pass unchanged)."""
        on = sampling.active(spec_sampling)
        if not on:
            return None
        return cls(
            on.get("repetition_penalty", 1.0),
            on.get("frequency_penalty", 0.0),
            on.get("presence_penalty", 0.0),
        )

    def apply(self, logits: Any, prompt: Sequence[int], gen: Sequence[int]) -> Any:
        """``logits`` [len(gen), vocab]: row t predicts ``gen[t]`` after ``prompt`` and ``gen[:t]``.
        Returns new logits with the penalties vLLM applies at each of those steps."""
        import torch

        n, vocab = logits.shape
        dev = logits.device
        out = logits.clone()
        if n == 0:
            return out
        ids = torch.tensor(list(gen), dtype=torch.long, device=dev).clamp(0, vocab - 1)
        # counts[t, v]: occurrences of v in gen[:t] (row 0 sees no output yet).
        counts = torch.zeros((n, vocab), dtype=out.dtype, device=dev)
        if n > 1:
            counts[torch.arange(1, n, device=dev), ids[: n - 1]] = 1
            counts = counts.cumsum(dim=0)
        seen = counts > 0
        if self.repetition != 1.0:
            in_prompt = torch.zeros(vocab, dtype=torch.bool, device=dev)
            p = [t for t in prompt if 0 <= t < vocab]
            if p:
                in_prompt[torch.tensor(p, dtype=torch.long, device=dev)] = True
            hit = seen | in_prompt[None, :]
            pen = torch.where(hit, torch.full_like(out, self.repetition), torch.ones_like(out))
            out = out * torch.where(out > 0, 1.0 / pen, pen)
        if self.frequency:
            out = out - self.frequency * counts
        if self.presence:
            out = out - self.presence * seen.to(out.dtype)
        return out

    def apply_rows(self, logits: Any, prompts: Sequence[Sequence[int]], gens: Sequence[Sequence[int]]) -> Any:
        """``logits`` holds each row's generated positions in turn (``len(gens[i])`` rows each)."""
        import torch

        parts, k = [], 0
        for prompt, gen in zip(prompts, gens, strict=True):
            parts.append(self.apply(logits[k : k + len(gen)], prompt, gen))
            k += len(gen)
        return torch.cat(parts, dim=0) if parts else logits
