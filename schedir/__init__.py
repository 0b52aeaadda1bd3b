"""schedir: a scheduler IR for LLM serving engines."""

from schedir._kernel_cache import ensure_fresh

ensure_fresh()  # before any Numba kernel loads from the disk cache


from schedir.ir.pipeline import Instrumentation, PassManager
from schedir.runtime import (
    BatchPlan,
    CachedRequest,
    NewRequest,
    Request,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
)

__all__ = [
    "BatchPlan", "CachedRequest", "Instrumentation", "NewRequest", "PassManager", "Request", "Scheduler",
    "SchedulerConfig", "SchedulerOutput",
]
