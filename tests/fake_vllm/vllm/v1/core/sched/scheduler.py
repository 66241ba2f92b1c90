"""vLLM V1's scheduler, as far as the probe reads it: ``Scheduler.schedule`` and its ``requests``
(``num_computed_tokens``, ``num_prompt_tokens``), returning ``num_scheduled_tokens`` per request.

The fake LLM drives it once per prefill step: each step gives out at most ``budget`` prompt tokens,
request by request, so a prompt longer than what is left of the budget is a chunk; then once per
decode step, one token to every request.
"""

import types


class Request:
    def __init__(self, num_prompt_tokens):
        self.num_prompt_tokens = num_prompt_tokens
        self.num_computed_tokens = 0


class Scheduler:
    def __init__(self, budget):
        self.budget = budget
        self.requests = {}

    def add(self, req_id, num_prompt_tokens):
        self.requests[req_id] = Request(num_prompt_tokens)

    def pending(self):
        return any(r.num_computed_tokens < r.num_prompt_tokens for r in self.requests.values())

    def schedule(self):
        if not self.pending():  # a decode step: every request gets its next token
            return types.SimpleNamespace(num_scheduled_tokens=dict.fromkeys(self.requests, 1))
        left, out = self.budget, {}
        for rid, r in self.requests.items():
            need = r.num_prompt_tokens - r.num_computed_tokens
            if need <= 0 or left <= 0:
                continue
            n = min(need, left)
            out[rid] = n
            left -= n
        sched = types.SimpleNamespace(num_scheduled_tokens=dict(out))
        for rid, n in out.items():
            self.requests[rid].num_computed_tokens += n
        return sched
