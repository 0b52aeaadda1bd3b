"""vllm-admit: vLLM 0.32's WAITING loop, against the live prefix cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.codes import Reason
from schedir.dialects.mem import AllocOp, ShareOp
from schedir.dialects.req import PreemptOp
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step, pool_of
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import WINDOW_QUEUE, WINDOW_SEATS, window_steady_lowered
from schedir.passes import vllm_kernels as K
from schedir.passes.vllm_schedule_running import long_prefill_cap

_NONE = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class VllmAdmit(StepPass):
    """Admit waiting requests in order until one does not fit; none in a step that preempted.

    A request's prefix-cache hit (full blocks, never its last token) counts as
    computed; it is looked up when its turn comes, so it sees blocks that
    requests admitted before it in this step have just registered. The whole
    remaining sequence must fit in free blocks (`reserve-full`, vLLM's
    `scheduler_reserve_full_isl`), and so must this step's chunk; hit blocks
    that sat in the free queue count against free blocks. Admission stops at
    the first request that cannot be allocated, at the token budget and at
    `max_seqs` running requests. A preempted request whose outputs from before the preemption
    are still in flight (`stale` > 0) is skipped, not stopped at (vLLM's rule).
    """

    name: ClassVar[str] = "vllm-admit"
    # steady decode steps: over the waiting queue: a steady step's is empty
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting"}
    # running steps: an empty waiting queue leaves it nothing to admit
    running_step_when: ClassVar[dict[str, str]] = {"queue": "waiting"}
    requires: ClassVar[frozenset[str]] = frozenset({"kv-pool", "order", "running-scheduled"})
    provides: ClassVar[frozenset[str]] = frozenset({"waiting-scheduled"})

    long_prefill: int = 0
    reserve_full: bool = True
    queue: str = "waiting"
    running: str = "running"

    # its steady answer (its window's rule) reads the queues and max_seqs only: held with the others'
    steady_reads: ClassVar[frozenset[str]] = frozenset()
    # ... and lowered: nobody while max_seqs requests run (`waiting_window`)
    steady_lowered = staticmethod(window_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (WINDOW_SEATS if (self.queue, self.running) == ("waiting", "running") else WINDOW_QUEUE,)

    def waiting_window(self, ctx: WindowContext):  # noqa: ANN201
        """Nobody while max_seqs requests run (vLLM's waiting loop stops at once, and a step that
        preempts admits nobody either). Else, where the order pass before it ranks the queue by a
        declared key (`WindowContext.rank`: `vtc-order`, `order-slo`), the head of that order it
        can reach: the loop admits at most the free sequence slots, stops at the first request
        that does not fit and skips only requests whose stale outputs are in flight, so it walks
        no further than those and the first free slots + 1 others (`WindowContext.reach`).
        Exact before the step (nothing to check after it, so a pass that commits to the pool can
        have it). Else (no rank, or a long-prefill cap, which counts the waiting requests) the
        whole queue."""
        if (self.queue, self.running) != ("waiting", "running"):
            return None
        seats = ctx.max_seqs - ctx.running.size
        if seats <= 0:
            return ctx.NONE
        if ctx.rank is None or self.long_prefill or ctx.column_of is None:
            return None
        return ctx.reach(ctx.column_of("stale")[ctx.waiting] > 0, seats + 1)

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        ids = step.ids(pending)
        preempted = 0
        for op in step.ops_of(PreemptOp):
            preempted += len(op)  # type: ignore[arg-type]
        if preempted:
            step.defer(pending, ids, np.full(ids.size, int(Reason.POLICY), dtype=np.int64))
            return
        usage = step.usage()
        facts = step.facts
        running = step.queue(self.running)
        seqs_left = facts.max_seqs - (len(running) if running is not None else 0)
        if seqs_left <= 0:  # the kernel's first check stops the loop at once: every request waits
            why = Reason.BUDGET if facts.token_budget - usage.tokens <= 0 else Reason.MAX_SEQS
            step.defer(pending, ids, np.full(ids.size, int(why), dtype=np.int64))
            return
        pool = pool_of(step)
        cols, rows = step.source(pending)
        get = cols.get
        stale = cols.get_or("stale", _NONE)
        res, admitted, _ = K.admit_waiting(
            get("id")[rows], get("computed")[rows], get("total")[rows], stale[rows] if stale.size else _NONE,
            facts.token_budget - usage.tokens,
            seqs_left, long_prefill_cap(step, self.long_prefill), facts.max_model_len, self.reserve_full,
            pool.ref, pool.bhash, pool.dup_next, pool.nxt, pool.prv, pool.meta, pool.cache, pool.table, pool.nblk,
            pool.ncached, pool.rhash, pool.nhash,
        )
        if admitted:
            # the admitted requests: a prefix of the queue, unless stale ones were skipped
            at = res[K.ADM_TOKENS] > 0 if res[K.ADM_REASON, :admitted].any() else slice(0, admitted)
            take = ids[at]
            adm = res[:, at]
            step.match(pending, take, adm[K.ADM_HIT])
            scheduled = step.schedule(pending, "prefill", take, adm[K.ADM_TOKENS])
            shared = adm[K.ADM_SHARED] > 0
            step.blocks(ShareOp, scheduled, take[shared], adm[K.ADM_SHARED][shared],
                        revived=adm[K.ADM_REVIVED][shared])
            got = adm[K.ADM_ALLOC] > 0
            step.blocks(AllocOp, scheduled, take[got], adm[K.ADM_ALLOC][got])
        if admitted < ids.size:
            rest = res[K.ADM_REASON] > 0
            step.defer(pending, ids[rest], res[K.ADM_REASON][rest])

