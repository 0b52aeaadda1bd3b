"""admit-greedy: the seed's admission — walk the waiting queue in order, take what fits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.mem import AllocOp, ShareOp
from schedir.dialects.req import PreemptOp
from schedir.ir.array_step import ArrayStep
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step, Usage
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import WINDOW_SEATS, window_steady_lowered
from schedir.passes.kernels import count_members, fit_arrays, fit_pending


def running_not_scheduled(step: Step, used: Usage, queue: str = "running") -> int:
    """Running requests this step left out (in flight, deferred): they keep their slots,
    so max_seqs caps the running set, as in vLLM, not just this step's batch."""
    running = step.queue(queue)
    if running is None or len(running) == 0:
        return 0
    ids = step.ids(running.result)
    taken = used.scheduled_ids
    gone = [op.ids for op in step.ops_of(PreemptOp)]  # type: ignore[attr-defined]
    if gone:  # preempted ones give their slots back
        taken = np.concatenate([taken, *gone])
    return ids.size - count_members(ids, taken)


@dataclass(frozen=True)
class AdmitGreedy(StepPass):
    """Admit waiting requests in order while the token budget, max sequences and free blocks allow.

    Prefix-cache hits (`mem.match`) count as computed tokens: their blocks are
    shared (`mem.share`), and hit blocks that sat in the free queue are charged
    against free blocks. A full-prompt hit still recomputes the last token. A
    request that does not fit is deferred with its reason and the walk goes on
    (greedy); running requests left out of the step keep their sequence slots; with `stop-at-first` the first misfit blocks everyone behind it.
    With `chunk` (the default, as in schedule-running), a prompt larger than the remaining budget
    gets a partial chunk; `chunk=false` is the seed's admission, under which a prompt longer
    than the whole budget would wait forever.
    """

    name: ClassVar[str] = "admit-greedy"
    # steady decode steps: over the waiting queue: a steady step's is empty
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting", "running": "running"}
    steady_swapped: ClassVar[bool] = True  # it decides nothing about the swapped queue
    # its default steady answer lowered: nobody while every slot is taken
    steady_lowered = staticmethod(window_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (WINDOW_SEATS,)
    requires: ClassVar[frozenset[str]] = frozenset({"order", "running-scheduled"})
    provides: ClassVar[frozenset[str]] = frozenset({"waiting-scheduled"})

    chunk: bool = True
    stop_at_first: bool = False
    queue: str = "waiting"
    running: str = "running"

    # its walk admits in the step's order while seats and tokens last: a ranked window applies
    walks_ranked: ClassVar[bool] = True

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """Nobody while every sequence slot is taken and stays taken this step (no block shortage
        to preempt for: `WindowContext.seats_stay_taken`); else the whole queue (a ranked window
        where an order pass ranks it: `walks_ranked`)."""
        return ctx.nobody_while_seats_stay_taken(self.queue, self.running)

    def swapped_window(self, ctx: WindowContext) -> np.ndarray | None:
        """Nobody swapped, unless its queue is the swapped one."""
        return ctx.NONE if self.queue != "swapped" else None

    array_step_when: ClassVar[dict[str, str]] = {}  # `run_arrays`: any options

    def run_arrays(self, step: ArrayStep) -> None:
        """`run` over an array step (`schedir.ir.array_step`)."""
        pending = step.pending(self.queue)
        if pending is None:
            return
        fit = fit_arrays(step, pending, prefix_hits=True, chunk=self.chunk, stop_at_first=self.stop_at_first,
                         seated=step.running_not_scheduled(self.running))
        step.schedule(pending, fit.run_ids, fit.run_tokens)
        step.share(fit.share_ids, fit.share_blocks, fit.share_revived)
        step.alloc(fit.alloc_ids, fit.alloc_blocks)
        step.defer(pending, fit.defer_ids, fit.defer_reasons)
        step.decided(pending)

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        used = step.usage()
        fit = fit_pending(step, pending, prefix_hits=True, chunk=self.chunk, stop_at_first=self.stop_at_first,
                          seated=running_not_scheduled(step, used, self.running), used=used)
        if fit is None:
            return
        if fit.run_ids.size:
            scheduled = step.schedule(pending, "prefill", fit.run_ids, fit.run_tokens)
            step.blocks(ShareOp, scheduled, fit.share_ids, fit.share_blocks, revived=fit.share_revived)
            step.blocks(AllocOp, scheduled, fit.alloc_ids, fit.alloc_blocks)
        step.defer(pending, fit.defer_ids, fit.defer_reasons)
