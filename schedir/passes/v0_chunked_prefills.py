"""v0-chunked-prefills: vLLM v0's `_schedule_prefills` with chunked prefill on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.codes import Reason
from schedir.dialects.req import PreemptOp, ScheduleOp
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step, pool_of, root_queue
from schedir.ir.window import WindowContext
from schedir.passes import v0_kernels as K
from schedir.passes.v0_chunked import long_threshold, slot_budget
from schedir.passes.v0_prefills import (
    delay_clock,
    emit_prefills,
    prefills_lowered_options,
    prefills_steady_lowered,
)
from schedir.passes.v0_state import (
    BAND,
    LAST_LATENCY,
    NEXT_RUN_POS,
    PREFILL_END,
    RUN_BANDS,
    RUN_POS,
    SCHEDULER_STATE,
)

_REJECT = (int(Reason.TOO_LONG), int(Reason.EXCEEDS_CACHE))


@dataclass(frozen=True)
class V0ChunkedPrefills(StepPass):
    """New prefills last, in chunks, with the budget the running and swapped requests left.

    vLLM v0 with chunked prefill (`_schedule_prefills(enable_chunking=True)`,
    vllm/core/scheduler.py:1035, 0.8.5): nothing when the token budget is spent; else, in
    waiting order, each request gets a chunk (its tokens cut to the budget left and one
    prefill slot's share) while the blocks of its whole sequence are allocated (`can_allocate`:
    never → ignored, later → stop). The prompt limit (max_model_len) is compared with the chunk,
    so a long prompt is not ignored here. With `partial` > 1, a long request (more new tokens
    than `long-threshold`; 0: 4% of max_model_len) is passed over while `max-long` long ones
    run. The delay rule and its state are v0-prefills'. Requests admitted take the last places
    of v0's running queue (`v0_run_pos`).
    """

    name: ClassVar[str] = "v0-chunked-prefills"
    requires: ClassVar[frozenset[str]] = frozenset({"kv-pool", "order", "running-scheduled", "swapped-scheduled"})
    provides: ClassVar[frozenset[str]] = frozenset({"admissible", "waiting-scheduled"})
    request_state: ClassVar[tuple] = (PREFILL_END, RUN_POS)
    scheduler_state: ClassVar[tuple] = (*SCHEDULER_STATE, NEXT_RUN_POS)
    reads_clock: ClassVar[bool] = True
    stops_past_max_model_len: ClassVar[bool] = True  # v0's StopChecker: len > max_model_len
    no_prefix_cache: ClassVar[bool] = True
    prefix_cache_refusal: ClassVar[str] = ("v0's prefix caching with chunked prefill is not reproduced "
                                           "yet; vllm-v0, chunking off, caches")
    policies: ClassVar[tuple[str, ...]] = ("fcfs",)

    delay_factor: float = 0.0
    partial: int = 1
    long_threshold: int = 0
    max_long: int = 1
    queue: str = "waiting"
    # steady decode steps: over the waiting queue; nobody admitted or ignored, the delay rule's clock
    # written (`steady_state`)
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting"}
    steady_lowered = staticmethod(prefills_steady_lowered)  # v0-prefills' kernel, with chunking

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return prefills_lowered_options(True, layout)

    def steady_state(self, ctx: WindowContext) -> dict[str, float] | None:
        """What a steady step writes: nothing when the decodes spend the whole budget (v0 returns
        before its delay rule), else the delay rule's clock, when it admits and ignores nobody:
        nobody waits, or every seat is taken and no waiting request could be one v0 ignores (a
        chunk over max_model_len, or a sequence the pool above the watermark can never hold).
        Else None: the IR decides."""
        if ctx.running.size >= ctx.token_budget:
            return {}
        waiting = ctx.waiting
        if waiting.size:
            if ctx.running.size < ctx.max_seqs:
                return None
            if ctx.queued("v0-chunked-any-ignorable", lambda: K.any_ignorable(
                    waiting, ctx.column_of("total"), ctx.column_of("computed"), ctx.max_model_len, ctx.total_blocks,
                    ctx.block_size)):  # held while the queue stays as it is (`WindowContext.queued`)
                return None
        return delay_clock(ctx.scheduler_state, float(max(ctx.now_us, 0)))

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """The requests v0 would ignore (a new-token count over max_model_len, or a sequence the
        pool above its watermark can never hold: its chunk is cut to the budget, so this is a
        superset) and the first free seats + 1 others in v0's order (`WindowContext.reach`). This
        loop runs after the running requests, whose preemptions free seats: all max_seqs count
        as free unless every running request's blocks fit (one block of slack each). With the
        delay rule (it reads the oldest arrival) or passed-over long prefills (`partial` > 1),
        the whole queue."""
        if self.queue != "waiting" or self.delay_factor > 0 or self.partial > 1 or ctx.column_of is None:
            return None
        column_of = ctx.column_of
        ignorable = ctx.queued("v0-chunked-ignorable", lambda: K.ignorable(
            ctx.waiting, column_of("total"), column_of("computed"), ctx.max_model_len, ctx.total_blocks,
            ctx.block_size, False))  # held while the queue stays as it is (`WindowContext.queued`)
        # each running request's known tokens and one block of slack
        need = ctx.running_growth(True, extra=1)
        seats = ctx.max_seqs - ctx.running.size if need <= ctx.free_blocks else ctx.max_seqs
        return ctx.reach(ignorable, max(seats, 0) + 1)  # type: ignore[arg-type]

    def run(self, step: Step) -> None:
        facts = step.facts
        usage = step.usage()
        if facts.token_budget - usage.tokens <= 0:
            return  # "Do nothing: Can't add any more prefill anyway" (no delay-rule call either)
        # v0 pops every running request it reached off `self.running` (scheduled or preempted): only
        # those it did not reach count as running for the delay rule
        running = step.queue("running")
        reached = sum(len(op) for op in step.ops_of(PreemptOp))  # type: ignore[arg-type]
        for op in step.ops_of(ScheduleOp):
            if root_queue(op.operands[0]).properties["queue"].data == "running":  # type: ignore[union-attr]
                reached += len(op)  # type: ignore[arg-type]
        left_running = (len(running) if running is not None else 0) - reached
        now = float(max(facts.now_us, 0))
        clock = delay_clock(step.states(), now)
        latency = clock[LAST_LATENCY.name]
        pending = step.pending(self.queue)
        if pending is None:
            step.set_state(**clock)
            return
        pool = pool_of(step)
        threshold = long_threshold(self.partial, self.long_threshold, facts.max_model_len)
        slot, long_running = slot_budget(step, self.partial, threshold, self.max_long)
        ids = step.ids(pending)
        total, computed, arrival = step.columns(pending, ("total", "computed", "arrival"))
        out, admitted, _ = K.v0_prefills(
            ids, total - computed, arrival, True, usage.tokens, usage.seqs, facts.token_budget, facts.max_seqs,
            facts.max_model_len, slot, self.partial, threshold, long_running, self.max_long, pool.usable_blocks,
            self.delay_factor * latency, self.delay_factor > 0, left_running > 0, int(now),
            pool.ref, pool.bhash, pool.dup_next, pool.nxt, pool.prv, pool.meta, pool.cache, pool.table, pool.nblk,
            False, pool.ncached, pool.rhash, pool.nhash, pool.v0_noted)
        take = out[K.V0_TOKENS] > 0
        base = int(step.state(NEXT_RUN_POS.name, 0.0)) - RUN_BANDS * BAND  # new prefills: the last band
        places = base + 5 * BAND + np.arange(int(take.sum()), dtype=np.int64)
        emit_prefills(step, pending, ids, out, admitted, now, latency,
                      **{RUN_POS.name: places, PREFILL_END.name: total[take]})
