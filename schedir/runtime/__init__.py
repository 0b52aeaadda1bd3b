"""The runtime scheduler an engine calls (see `Scheduler`)."""

from schedir.runtime.config import Request, SchedulerConfig
from schedir.runtime.output import BatchPlan, CachedRequest, NewRequest, SchedulerOutput
from schedir.runtime.scheduler import Scheduler

__all__ = ["BatchPlan", "CachedRequest", "NewRequest", "Request", "Scheduler", "SchedulerConfig", "SchedulerOutput"]
