"""vllm-schedule-running: vLLM 0.32's RUNNING loop, preemption by recompute included."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.mem import AllocOp, FreeOp
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step, pool_of
from schedir.passes import vllm_kernels as K


def long_prefill_cap(step: Step, threshold: int) -> int:
    """vLLM applies `long_prefill_token_threshold` only when another request could use the budget."""
    if threshold <= 0:
        return 0
    eligible = sum(len(q) for q in step.queues() if q.queue.data in ("running", "waiting"))  # type: ignore[attr-defined]
    return threshold if eligible > 1 else 0


@dataclass(frozen=True)
class VllmScheduleRunning(StepPass):
    """Schedule running requests in order; preempt (recompute) when their blocks do not fit.

    Each running request asks for its remaining tokens, capped by
    `long-prefill` (when more than one request is eligible), the token budget
    and `max_model_len - 1`. Its new blocks come from the pool; when they do not
    fit, the victim is preempted — FCFS: the last running request; priority: the
    max (priority, arrival) — and its blocks freed; a victim already scheduled
    this step gives its tokens back. A request that is its own victim ends the
    loop. Requests in flight (scheduled, not yet updated) are skipped.
    """

    name: ClassVar[str] = "vllm-schedule-running"
    requires: ClassVar[frozenset[str]] = frozenset({"kv-pool"})
    provides: ClassVar[frozenset[str]] = frozenset({"running-scheduled"})

    long_prefill: int = 0
    queue: str = "running"

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        facts = step.facts
        pool = pool_of(step)
        cols, rows = step.source(pending)
        get = cols.get
        res, _ = K.schedule_running(
            get("id")[rows], get("computed")[rows], get("total")[rows], get("priority")[rows],
            get("arrival")[rows], get("in_flight")[rows], facts.token_budget,
            long_prefill_cap(step, self.long_prefill), facts.max_model_len, facts.policy == "priority",
            pool.ref, pool.bhash, pool.dup_next, pool.nxt, pool.prv, pool.meta, pool.cache, pool.table, pool.nblk,
            pool.ncached, pool.rhash, pool.nhash,
        )
        ids = step.ids(pending)
        tokens = res[K.RUN_TOKENS]
        run = tokens > 0
        if run.any():
            scheduled = step.schedule(pending, "mixed", ids[run], tokens[run])
            got = run & (res[K.RUN_ALLOC] > 0)
            step.blocks(AllocOp, scheduled, ids[got], res[K.RUN_ALLOC][got])
        seq = res[K.RUN_PREEMPT_SEQ]
        gone = np.flatnonzero(seq >= 0)
        if gone.size:
            gone = gone[np.argsort(seq[gone])]  # in the order they were preempted
            victims = step.preempt(pending, "recompute", ids[gone])
            # Blocks a victim allocated earlier in this step are counted in its alloc and its free.
            transient = res[K.RUN_ALLOC][gone] > 0
            if transient.any():
                step.blocks(AllocOp, pending, ids[gone][transient], res[K.RUN_ALLOC][gone][transient])
            step.blocks(FreeOp, victims, ids[gone], res[K.RUN_FREED][gone])
        wait = ~run & (seq < 0)
        if wait.any():
            step.defer(pending, ids[wait], res[K.RUN_REASON][wait])
