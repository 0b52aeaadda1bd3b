"""schedule-running: keep the running batch going before admitting anyone new."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from schedir.dialects.mem import AllocOp
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.passes.kernels import fit_pending


@dataclass(frozen=True)
class ScheduleRunning(StepPass):
    """Schedule running requests in queue order: each gets the tokens it still needs (1 for a decode).

    A request that does not fit the remaining token budget, sequence slots or
    free blocks is deferred with that reason (this pass never preempts). With
    `chunk`, a running request still in its prefill takes what budget is left.
    A request with nothing left to compute (its last step's tokens have not come
    back yet), or with a prefill chunk still in flight (`in_flight` column), is
    deferred as in-flight: it is never scheduled twice before its update.
    """

    name: ClassVar[str] = "schedule-running"
    provides: ClassVar[frozenset[str]] = frozenset({"running-scheduled"})

    chunk: bool = True
    queue: str = "running"

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        fit = fit_pending(step, pending, prefix_hits=False, chunk=self.chunk, stop_at_first=False)
        if fit is None:
            return
        if fit.run_ids.size:
            scheduled = step.schedule(pending, "decode" if fit.all_decode else "mixed", fit.run_ids, fit.run_tokens)
            step.blocks(AllocOp, scheduled, fit.alloc_ids, fit.alloc_blocks)
        step.defer(pending, fit.defer_ids, fit.defer_reasons)
