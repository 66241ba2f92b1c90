"""vLLM V1's scheduler, as far as the probe reads it: ``Scheduler.schedule`` and its ``requests``
(``num_computed_tokens``, ``num_prompt_tokens``), returning ``num_scheduled_tokens`` per request.

The fake LLM drives it once per prefill step: each step gives out at most ``budget`` prompt tokens,
request by request, so a prompt longer than what is left of the budget is a chunk; then once per
decode step, one token to every request.

With ``kv_tokens`` (``num_gpu_blocks_override`` x the block size) a decode step that would need
more KV than that preempts the newest running requests, as vLLM does: status PREEMPTED (an enum
member the probe reads by name), computed tokens reset; a preempted request comes back in a later
step, once the others leave room, with its tokens recomputed.
"""

import types


class Status:
    def __init__(self, name):
        self.name = name


RUNNING, PREEMPTED = Status("RUNNING"), Status("PREEMPTED")


class Request:
    def __init__(self, num_prompt_tokens):
        self.num_prompt_tokens = num_prompt_tokens
        self.num_computed_tokens = 0
        self.status = RUNNING
        self.generated = 0


class Scheduler:
    def __init__(self, budget, kv_tokens=None):
        self.budget = budget
        self.kv_tokens = kv_tokens
        self.requests = {}

    def add(self, req_id, num_prompt_tokens):
        self.requests[req_id] = Request(num_prompt_tokens)

    def pending(self):
        return any(r.num_computed_tokens < r.num_prompt_tokens for r in self.requests.values())

    def schedule(self):
        if not self.pending():  # a decode step: every request gets its next token
            if self.kv_tokens is not None:
                return self._decode_under_pressure()
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

    def _decode_under_pressure(self):
        def used(r):
            return r.num_prompt_tokens + r.generated + 1

        def live():
            return sum(used(x) for x in self.requests.values() if x.status is RUNNING)

        out = {}
        for rid, r in self.requests.items():  # the preempted that fit again come back, oldest first
            if r.status is PREEMPTED and live() + used(r) <= self.kv_tokens:
                r.status = RUNNING
                r.num_computed_tokens = r.num_prompt_tokens + r.generated  # recomputed in this step
                out[rid] = r.num_computed_tokens + 1
        running = [rid for rid, r in self.requests.items() if r.status is RUNNING]
        while len(running) > 1 and live() > self.kv_tokens:
            rid = running.pop()  # the newest request goes first
            self.requests[rid].status, self.requests[rid].num_computed_tokens = PREEMPTED, 0
            out.pop(rid, None)
        for rid in running:
            out.setdefault(rid, 1)
            self.requests[rid].generated += 1
        return types.SimpleNamespace(num_scheduled_tokens=out)
