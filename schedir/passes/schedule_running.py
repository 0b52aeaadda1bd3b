"""schedule-running: keep the running batch going before admitting anyone new."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.codes import Reason
from schedir.dialects.mem import AllocOp
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.passes.kernels import greedy_fit


@dataclass(frozen=True)
class ScheduleRunning(StepPass):
    """Schedule running requests in queue order: each gets the tokens it still needs (1 for a decode).

    A request that does not fit the remaining token budget, sequence slots or
    free blocks is deferred with that reason (this pass never preempts). With
    `chunk`, a running request still in its prefill takes what budget is left.
    A request with nothing left to compute (its last step's tokens have not come
    back yet) is deferred as in-flight.
    """

    name: ClassVar[str] = "schedule-running"
    provides: ClassVar[frozenset[str]] = frozenset({"running-scheduled"})

    chunk: bool = True
    queue: str = "running"

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        ids = step.ids(pending)
        if ids.size == 0:
            return
        computed, total, held = step.columns(pending, ("computed", "total", "blocks"))
        need = total - computed
        facts, used = step.facts, step.usage()
        tokens, new_blocks, reason, *_ = greedy_fit(
            need, computed, held, np.zeros_like(held),
            facts.token_budget - used.tokens, facts.max_seqs - used.seqs, used.free_left(facts),
            facts.block_size, self.chunk, False,
        )
        reason[need <= 0] = int(Reason.IN_FLIGHT)
        run = tokens > 0
        if run.any():
            phase = "decode" if bool((need[run] == 1).all()) else "mixed"
            scheduled = step.schedule(pending, phase, ids[run], tokens[run])
            grows = run & (new_blocks > 0)
            step.blocks(AllocOp, scheduled, ids[grows], new_blocks[grows])
        step.defer(pending, ids[~run], reason[~run])
