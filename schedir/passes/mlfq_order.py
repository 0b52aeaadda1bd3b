"""mlfq-order: FastServe's iteration-level preemptive MLFQ order over running and waiting jobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np
from xdsl.ir import SSAValue

from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.passes.mlfq_state import LEVEL, MLFQ_STATE, SERVED_DECODE, SERVED_PREFILL


@numba.njit(cache=True, nogil=True)
def mlfq_pick(run_level: np.ndarray, run_blocks: np.ndarray, run_total: np.ndarray, wait_level: np.ndarray,
              wait_total: np.ndarray, wait_fresh: np.ndarray, seats: int, free_blocks: int,
              block_size: int) -> np.ndarray:
    """Which running jobs give way (1) to new waiting jobs of a higher level, and which run on (0).

    Waiting jobs take free seats in (level, arrival) order; when none is free, a new job (never
    served) that is next in that order takes the seat of the lowest-ranked running job of a
    strictly lower level (a job already served stops the walk: a seat freed for a new job behind
    it would go to it instead, and the new job would displace again and again). When
    the jobs kept and taken need more KV blocks than are free and the queue's head is a new job,
    more running jobs of a level below it give way, the lowest-ranked first. Inputs are in (level, arrival)
    order per queue."""
    nr = run_level.size
    fate = np.zeros(nr, dtype=np.int64)
    need = 0
    for k in range(nr):
        need += max((run_total[k] + block_size) // block_size - run_blocks[k], 0)  # room for its next token
    free_seats = seats - nr
    worst = nr - 1  # the lowest-ranked running job still running
    for j in range(wait_level.size):
        if free_seats > 0:
            free_seats -= 1
        elif not wait_fresh[j]:
            break  # the next seat freed would go to this job, not to a new one behind it
        else:
            while worst >= 0 and fate[worst] == 1:
                worst -= 1
            if worst < 0 or run_level[worst] <= wait_level[j]:
                break
            fate[worst] = 1
            need -= max((run_total[worst] + block_size) // block_size - run_blocks[worst], 0)
        need += max(-(-wait_total[j] // block_size), 0)
    # memory goes to the waiting queue's head first: give KV up only for a new job there
    if wait_level.size == 0 or not wait_fresh[0]:
        return fate
    best = wait_level[0]
    short = need - free_blocks
    k = nr - 1
    while short > 0 and k >= 0:
        if fate[k] == 0 and run_level[k] > best and run_blocks[k] > 0:
            fate[k] = 1
            short -= run_blocks[k]
            need -= max((run_total[k] + block_size) // block_size - run_blocks[k], 0)
        k -= 1
    return fate


@dataclass(frozen=True)
class MlfqOrder(StepPass):
    """Order both queues by MLFQ level, then arrival; running jobs of a lower level give way
    to waiting jobs of a higher one.

    FastServe (§4.1) schedules at iteration granularity and preemptively: each iteration runs the
    highest-priority jobs, so a short new job (a high level, thanks to skip-join) overtakes long
    ones. A new job (never served) that finds no free seat takes the seat of the lowest-ranked
    running job of a strictly lower level, and running jobs of a level below the best new job
    give their KV up while the jobs chosen need more blocks than are free.

    Where this differs from the paper, and why: FastServe pauses such jobs and swaps their KV
    to host memory ahead of need; schedir has no CPU block pool yet, so they are preempted by
    recompute (and max_seqs stays the engine's cap on running requests, so a job cannot merely
    pause in its slot). Because a recompute loses the job's progress, only new jobs displace
    running ones: a job promoted by the starvation rule waits for a free seat, ahead of lower
    levels (letting promoted jobs displace each other livelocks: each loses its progress to the
    next before it finishes). Admission then takes waiting jobs in level order.
    """

    name: ClassVar[str] = "mlfq-order"
    requires: ClassVar[frozenset[str]] = frozenset({"mlfq-levels"})
    provides: ClassVar[frozenset[str]] = frozenset({"order"})
    request_state = MLFQ_STATE

    queue: str = "waiting"
    running: str = "running"

    def _sorted(self, step: Step, value: SSAValue | None) -> tuple[SSAValue | None, np.ndarray]:
        """`value` sorted by (level, arrival), with its levels in that order."""
        if value is None:
            return None, np.zeros(0, dtype=np.int64)
        level = step.state_column(value, LEVEL.name, LEVEL.default)
        arrival = step.column(value, "arrival")
        order = np.lexsort((arrival, level))
        ids = step.ids(value)
        return step.sort(value, ("mlfq_level", "arrival"), ids[order], picked=order), level[order]

    def run(self, step: Step) -> None:
        waiting, wait_level = self._sorted(step, step.pending(self.queue))
        running, run_level = self._sorted(step, step.pending(self.running))
        if running is None:
            return
        if waiting is None:
            return
        facts = step.facts
        fresh = (step.state_column(waiting, SERVED_PREFILL.name, 0) == 0) & (
            step.state_column(waiting, SERVED_DECODE.name, 0) == 0)
        used = step.usage()
        fate = mlfq_pick(run_level, step.column(running, "blocks"), step.column(running, "total"), wait_level,
                         step.column(waiting, "total"), fresh, facts.max_seqs - used.seqs, used.free_left(facts),
                         facts.block_size)
        if not fate.any():
            return
        ids = step.ids(running)
        step.preempt(running, "recompute", ids[fate == 1])
        keep = np.flatnonzero(fate == 0)
        if keep.size:
            step.keep(running, ids[keep], picked=keep)
