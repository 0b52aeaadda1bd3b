"""schedir: a scheduler IR for LLM serving engines."""

from schedir._kernel_cache import ensure_fresh
from schedir._llvmlite_compat import patch as _patch_llvmlite

ensure_fresh()  # before any Numba kernel loads from the disk cache
_patch_llvmlite()  # vLLM's CPU worker must not trip over llvmlite's library handle (see the module)


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
