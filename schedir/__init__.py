"""schedir: a scheduler IR for LLM serving engines."""

from schedir.runtime import (
    BatchPlan,
    CachedRequest,
    NewRequest,
    Request,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
)

__all__ = ["BatchPlan", "CachedRequest", "NewRequest", "Request", "Scheduler", "SchedulerConfig", "SchedulerOutput"]
