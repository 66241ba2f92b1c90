"""Requests the scheduler preempted in one step: the proof that a run under KV-cache pressure
(``-E num_gpu_blocks_override=N``, ``-E kv_cache_memory_bytes=N``) made vLLM evict running requests
and recompute them later, which the async-scheduling + preemption bug of vLLM 0.11.0 needs (PR #26385).

vLLM's V1 scheduler (``vllm/v1/core/sched/scheduler.py``, 0.10.2 to 0.34.0) preempts a running
request when the KV cache has no block for its next tokens: it frees the request's blocks, sets its
status to ``RequestStatus.PREEMPTED`` and puts it back at the head of the waiting queue, where it
stays at least until the next step. The probe's hook on ``Scheduler.schedule`` reads each request's
status before and after the call; a request that went to PREEMPTED during it was preempted in that
step. The status is compared by name, so nothing of vLLM is imported here.

Standard library only, as the probe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PREEMPTED = "PREEMPTED"


def status_name(request: Any) -> str:
    """A request's status as its enum member's name (``RequestStatus.PREEMPTED`` -> ``PREEMPTED``)."""
    status = getattr(request, "status", None)
    name = getattr(status, "name", None)
    return name if isinstance(name, str) else str(status).rpartition(".")[2]


def statuses(requests: Mapping[str, Any]) -> dict[str, str]:
    """Each request's status name, taken before a step."""
    return {rid: status_name(r) for rid, r in requests.items()}


def preempted(before: Mapping[str, str], requests: Mapping[str, Any]) -> int:
    """How many requests went to PREEMPTED between ``before`` and now."""
    return sum(
        1 for rid, r in requests.items() if before.get(rid) != PREEMPTED and status_name(r) == PREEMPTED
    )
