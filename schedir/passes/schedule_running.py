"""schedule-running: keep the running batch going before admitting anyone new."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.mem import AllocOp
from schedir.ir.array_step import ArrayStep
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import WINDOW_NOBODY, window_steady_lowered
from schedir.passes.kernels import fit_arrays, fit_pending


@dataclass(frozen=True)
class ScheduleRunning(StepPass):
    """Schedule running requests in queue order: each gets the tokens it still needs (1 for a decode).

    A request that does not fit the remaining token budget or sequence slots is
    deferred with that reason. With `chunk`, a running request still in its
    prefill takes what budget is left.

    One short of free blocks preempts (recompute) requests behind it, the lowest
    first (FCFS: the last in order; priority: the largest (priority, arrival)),
    until their blocks cover the shortfall, or itself when none is left to take
    (and the step preempted no one yet), as vLLM does; without that, decodes that
    outgrow the cache deadlock. This pass
    sees counts, not the pool (a victim's prefix blocks may stay shared), so it
    does not count the victims' blocks free this step: the request is deferred
    (memory) and the lowering frees them for the next step. `preempt=false`: the
    seed's behaviour, memory deferral only.
    A request with nothing left to compute (its last step's tokens have not come
    back yet), or with a prefill chunk still in flight (`in_flight` column), is
    deferred as in-flight: it is never scheduled twice before its update.
    """

    name: ClassVar[str] = "schedule-running"
    # steady decode steps: the steady decision itself: one token each, in order, no shortage to preempt for
    steady_when: ClassVar[dict[str, str]] = {"queue": "running"}
    steady_swapped: ClassVar[bool] = True  # it decides nothing about the swapped queue
    # its default steady answer lowered: its window is nobody
    steady_lowered = staticmethod(window_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (WINDOW_NOBODY,)
    provides: ClassVar[frozenset[str]] = frozenset({"running-scheduled"})

    chunk: bool = True
    preempt: bool = True
    queue: str = "running"

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """Nobody: it schedules the running queue (only preemption frees a sequence slot, and only
        for want of blocks: see `WindowContext.seats_stay_taken`)."""
        return ctx.NONE if self.queue != "waiting" else None

    def swapped_window(self, ctx: WindowContext) -> np.ndarray | None:
        """Nobody swapped: it schedules its own queue (the running one)."""
        return ctx.NONE if self.queue != "swapped" else None

    array_step_when: ClassVar[dict[str, str]] = {}  # `run_arrays`: any options

    def run_arrays(self, step: ArrayStep) -> None:
        """`run` over an array step (`schedir.ir.array_step`)."""
        pending = step.pending(self.queue)
        if pending is None:
            return
        fit = fit_arrays(step, pending, prefix_hits=False, chunk=self.chunk, stop_at_first=False,
                         preempt=self.preempt)
        step.schedule(pending, fit.run_ids, fit.run_tokens)
        step.alloc(fit.alloc_ids, fit.alloc_blocks)
        step.preempt(pending, "recompute", fit.preempt_ids)
        step.defer(pending, fit.defer_ids, fit.defer_reasons)
        step.decided(pending)

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        fit = fit_pending(step, pending, prefix_hits=False, chunk=self.chunk, stop_at_first=False,
                          preempt=self.preempt)
        if fit is None:
            return
        if fit.run_ids.size:
            scheduled = step.schedule(pending, "decode" if fit.all_decode else "mixed", fit.run_ids, fit.run_tokens)
            step.blocks(AllocOp, scheduled, fit.alloc_ids, fit.alloc_blocks)
        step.preempt(pending, "recompute", fit.preempt_ids)
        step.defer(pending, fit.defer_ids, fit.defer_reasons)
