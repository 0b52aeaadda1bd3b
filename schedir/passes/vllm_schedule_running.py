"""vllm-schedule-running: vLLM 0.32's RUNNING loop, preemption by recompute included."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from schedir.dialects.mem import AllocOp, FreeOp
from schedir.ir.pass_base import StepPass
from schedir.ir.running_step import RunningDecision, RunningStep
from schedir.ir.step import Step, identity_rows, pool_of
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import WINDOW_NOBODY, WINDOW_QUEUE, window_steady_lowered
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
    loop. A request waiting on its sampled token asks for nothing; with async scheduling
    (a `placeholders` column) that token is a placeholder and the decode goes ahead, as in
    vLLM's AsyncScheduler, unless the steps in flight already reach its max_tokens.
    """

    name: ClassVar[str] = "vllm-schedule-running"
    # steady decode steps: the steady decision itself: one token each, in order; its block checks never fail then
    steady_when: ClassVar[dict[str, str]] = {"queue": "running"}
    # running steps (nobody admissible waiting): it decides them alone, from the same kernel
    # (`decide_running`); a long-prefill cap counts the waiting requests, so not with one
    running_step_when: ClassVar[dict[str, str]] = {"queue": "running", "long_prefill": 0}
    requires: ClassVar[frozenset[str]] = frozenset({"kv-pool"})
    provides: ClassVar[frozenset[str]] = frozenset({"running-scheduled", "decode-overlap"})

    long_prefill: int = 0
    queue: str = "running"

    # its steady answer (its window's rule) reads the queues and max_seqs only: held with the others'
    steady_reads: ClassVar[frozenset[str]] = frozenset()
    # ... and lowered: nobody, but for a long-prefill cap (`waiting_window`)
    steady_lowered = staticmethod(window_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (WINDOW_NOBODY if not self.long_prefill and self.queue == "running" else WINDOW_QUEUE,)

    def waiting_window(self, ctx: WindowContext):  # noqa: ANN201
        """Nobody: it schedules the running queue (a long-prefill cap counts the waiting, so then all)."""
        return ctx.NONE if not self.long_prefill and self.queue == "running" else None

    def decide_running(self, step: RunningStep) -> RunningDecision:
        """A running step's decisions: `run`'s kernel over the whole running queue, with no
        long-prefill cap (declared only without one) and nothing deferred to record."""
        pool = step.pool
        dec, counts, _ = K.schedule_running(
            step.columns, step.index(K.RUNNING_COLUMNS_ASYNC), identity_rows(step.columns.shape[1]),
            step.token_budget, 0, step.max_model_len, step.policy == "priority", pool.ref, pool.bhash,
            pool.dup_next, pool.nxt, pool.prv, pool.meta, pool.cache, pool.table, pool.nblk, pool.ncached,
            pool.rhash, pool.nhash,
        )
        scheduled_n, _, preempted_n, _ = counts.tolist()
        return RunningDecision(dec[K.DEC_ID, :scheduled_n], dec[K.DEC_TOKENS, :scheduled_n],
                               dec[K.DEC_PRE_ID, :preempted_n])

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        facts = step.facts
        pool = pool_of(step)
        cols, at = step.source(pending)
        mat, cix = cols.matrix(K.RUNNING_COLUMNS_ASYNC if cols.has("placeholders") else K.RUNNING_COLUMNS)
        dec, counts, _ = K.schedule_running(
            mat, cix, at, facts.token_budget, long_prefill_cap(step, self.long_prefill), facts.max_model_len,
            facts.policy == "priority", pool.ref, pool.bhash, pool.dup_next, pool.nxt, pool.prv, pool.meta,
            pool.cache, pool.table, pool.nblk, pool.ncached, pool.rhash, pool.nhash,
        )
        scheduled_n, alloc_n, preempted_n, deferred_n = counts.tolist()
        if scheduled_n:
            scheduled = step.schedule(pending, "mixed", dec[K.DEC_ID, :scheduled_n], dec[K.DEC_TOKENS, :scheduled_n])
            if alloc_n:
                step.blocks(AllocOp, scheduled, dec[K.DEC_ALLOC_ID, :alloc_n], dec[K.DEC_ALLOC, :alloc_n])
        if preempted_n:  # in the order they were preempted
            gone = dec[K.DEC_PRE_ID, :preempted_n]
            victims = step.preempt(pending, "recompute", gone)
            # Blocks a victim allocated earlier in this step are counted in its alloc and its free.
            allocated = dec[K.DEC_PRE_ALLOC, :preempted_n]
            transient = allocated > 0
            if transient.any():
                step.blocks(AllocOp, pending, gone[transient], allocated[transient])
            step.blocks(FreeOp, victims, gone, dec[K.DEC_PRE_FREED, :preempted_n])
        if deferred_n:
            step.defer(pending, dec[K.DEC_DEFER_ID, :deferred_n], dec[K.DEC_REASON, :deferred_n])
