"""vllm.logprobs: ``Logprob`` and ``FlatLogprobs`` with vLLM 0.26.0's fields and layout."""

from dataclasses import dataclass, field


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class FlatLogprobs:
    """Per position: the sampled token first (its own rank), then the top-k in rank order."""

    start_indices: list = field(default_factory=list)
    end_indices: list = field(default_factory=list)
    token_ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    ranks: list = field(default_factory=list)
    decoded_tokens: list = field(default_factory=list)

    def append_fast(self, token_ids, logprobs, ranks, decoded_tokens):
        self.start_indices.append(len(self.logprobs))
        for t, lp, r, d in zip(token_ids, logprobs, ranks, decoded_tokens, strict=False):
            self.token_ids.append(t)
            self.logprobs.append(lp)
            self.ranks.append(r)
            self.decoded_tokens.append(d)
        self.end_indices.append(len(self.logprobs))

    def __len__(self):
        return len(self.start_indices)

    def __getitem__(self, i):  # the dict form of one position, as vLLM rebuilds it
        return {self.token_ids[j]: Logprob(self.logprobs[j], self.ranks[j], self.decoded_tokens[j])
                for j in range(self.start_indices[i], self.end_indices[i])}

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]
