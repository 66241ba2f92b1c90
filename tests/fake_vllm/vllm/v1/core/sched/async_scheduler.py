"""vLLM's async scheduler: a Scheduler subclass (what ``SchedulerConfig.get_scheduler_cls`` picks
for ``async_scheduling=True``), which the probe tells apart by its class name."""

from vllm.v1.core.sched.scheduler import Scheduler


class AsyncScheduler(Scheduler):
    pass
