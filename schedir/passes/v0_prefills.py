"""v0-prefills: vLLM v0's `_schedule_prefills` (chunked prefill off), prefill-first steps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numba as nb
import numpy as np

from schedir.dialects.codes import Reason
from schedir.dialects.mem import AllocOp
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step, pool_of
from schedir.ir.window import WindowContext
from schedir.lowering.kv_pool import CACHE_V0
from schedir.lowering.steady_layout import (
    ANSWERED,
    ASK_IR,
    MEMO_SET,
    SC_BLOCK_SIZE,
    SC_MAX_MODEL_LEN,
    SC_MAX_SEQS,
    SC_NOW_US,
    SC_TOKEN_BUDGET,
    SC_TOTAL_BLOCKS,
)
from schedir.passes import v0_kernels as K
from schedir.passes.v0_state import LAST_LATENCY, ORDER_UNDER_PRIORITY, PREV_PROMPT, PREV_TIME, SCHEDULER_STATE

_REJECT = (int(Reason.TOO_LONG), int(Reason.EXCEEDS_CACHE))


@nb.njit(cache=True, nogil=True)
def prefills_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, order, rows, w, m, over) -> int:  # noqa: ANN001
    """`V0Prefills.steady_state` (o[0] 0) and `V0ChunkedPrefills.steady_state` (o[0] 1: chunked
    prefill, which returns before the delay rule when the decodes spend the budget, and judges a
    waiting request's chunk against max_model_len) in the steady program
    (`schedir.lowering.steady_program`): whether v0 could ignore a waiting request kept in the
    memo while the queue stays (`m[1]`, as the Python answers keep it with
    `WindowContext.queued`); the delay rule's clock into its slots (o[3:6])."""
    chunked = o[0] != 0
    if chunked and running.size >= sc[SC_TOKEN_BUDGET]:
        return ANSWERED
    if waiting.size:
        if running.size < sc[SC_MAX_SEQS]:
            return ASK_IR
        if m[MEMO_SET] == 0:
            total = D[int(o[1])]
            if chunked:
                m[1] = K.any_ignorable(waiting, total, D[int(o[2])], sc[SC_MAX_MODEL_LEN], sc[SC_TOTAL_BLOCKS],
                                       sc[SC_BLOCK_SIZE])
            else:
                m[1] = K.any_ignorable(waiting, total, None, min(sc[SC_MAX_MODEL_LEN], sc[SC_TOKEN_BUDGET]),
                                       sc[SC_TOTAL_BLOCKS], sc[SC_BLOCK_SIZE])
            m[MEMO_SET] = 1
        if m[1]:
            return ASK_IR
    delay_clock_lowered(SS, float(max(sc[SC_NOW_US], 0)), int(o[3]), int(o[4]), int(o[5]))
    return ANSWERED


def prefills_lowered_options(chunked: bool, layout) -> tuple[float, ...]:  # noqa: ANN001
    """`prefills_steady_lowered`'s options for v0-prefills or v0-chunked-prefills."""
    return (float(chunked), layout.column("total"), layout.column("computed"), layout.scalar(PREV_TIME.name),
            layout.scalar(PREV_PROMPT.name), layout.scalar(LAST_LATENCY.name))


@dataclass(frozen=True)
class V0Prefills(StepPass):
    """Admit whole prompts in waiting order, as vLLM v0 does with chunked prefill off.

    v0's `_schedule_default` (vllm/core/scheduler.py:1230, 0.8.5) runs this first and only
    when nothing is swapped out (swapped requests resume before new ones). In order, each
    waiting request prefills its whole sequence (a recomputed one: prompt plus outputs):
    one longer than the prompt limit (min(max_model_len, token budget), `_get_prompt_limit`)
    or needing more blocks than the pool minus the watermark can ever give (`can_allocate`
    NEVER) is ignored (v0's FINISHED_IGNORED: `req.reject` with reason too-long or
    exceeds-cache) and the loop goes on; it stops at a request that must wait for blocks,
    at the token budget and at max_seqs running requests. With `delay-factor` > 0 prompts
    wait, while requests run, until the oldest waiting one has waited longer than
    delay-factor times the last prompt step's latency (`_passed_delay`, state in v0_state).
    """

    name: ClassVar[str] = "v0-prefills"
    requires: ClassVar[frozenset[str]] = frozenset({"kv-pool", "order", "swapped-queue"})
    provides: ClassVar[frozenset[str]] = frozenset({"admissible", "waiting-scheduled"})
    stops_past_max_model_len: ClassVar[bool] = True  # v0's StopChecker: len > max_model_len
    v0_prefix_cache: ClassVar[bool] = True  # (`v0_kernels.v0_prefills`: hits counted v0's way)
    policies: ClassVar[tuple[str, ...]] = ("fcfs", "priority")
    # v0's priority policy: its deque order and its priority preemption (the vllm-v0-priority preset)
    policy_requires: ClassVar[Mapping[str, frozenset[str]]] = ORDER_UNDER_PRIORITY
    scheduler_state: ClassVar[tuple] = SCHEDULER_STATE
    reads_clock: ClassVar[bool] = True
    # steady decode steps: over the waiting queue; nobody admitted or ignored, the delay rule's clock
    # written (`steady_state`)
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting"}

    delay_factor: float = 0.0
    queue: str = "waiting"

    steady_lowered = staticmethod(prefills_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return prefills_lowered_options(False, layout)

    def steady_state(self, ctx: WindowContext) -> dict[str, float] | None:
        """What a steady step writes: `_passed_delay`'s clock (it runs every step nothing is
        swapped out), when the step admits and ignores nobody: nobody waits, or every seat is
        taken and no waiting request is one v0 would ignore (those ahead of the first that
        stops the loop are ignored whatever stops it). Else None: the IR decides."""
        if ctx.waiting.size:
            if ctx.running.size < ctx.max_seqs or ctx.queued("v0-any-ignorable", lambda: K.any_ignorable(
                    ctx.waiting, ctx.column_of("total"), None, min(ctx.max_model_len, ctx.token_budget),
                    ctx.total_blocks, ctx.block_size)):  # held while the queue stays as it is (`WindowContext.queued`)
                return None
        return delay_clock(ctx.scheduler_state, float(max(ctx.now_us, 0)))

    @staticmethod
    def _ignored(ctx: WindowContext) -> np.ndarray:
        """Which waiting requests v0 ignores when it reaches them: longer than the prompt limit, or
        needing more blocks than the pool above the watermark can ever give (`K.ignorable`)."""
        return ctx.queued("v0-ignorable", lambda: K.ignorable(  # type: ignore[return-value]
            ctx.waiting, ctx.column_of("total"), None, min(ctx.max_model_len, ctx.token_budget), ctx.total_blocks,
            ctx.block_size, False))

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """While max_seqs requests run, the loop ignores (rejects) every request it reaches that
        could never run and stops at the first other one, whatever stops it (blocks, budget or
        the seat): so the requests v0 would ignore, and the first other one in v0's FCFS order
        (`queued`; under the priority policy its deque's, order-v0-priority's rank). With seats
        free, those it would ignore and the first free seats + 1 others in that order
        (`WindowContext.reach`: v0 runs this loop first, so the running requests hold their seats).
        With the delay rule (it reads the oldest arrival), the whole queue."""
        if self.queue != "waiting" or self.delay_factor > 0:
            return None
        seats = max(ctx.max_seqs - ctx.running.size, 0)
        # (every seat taken: one request past the ignored ones, in v0's FCFS order with or without a
        # rank; under the priority policy in the deque's, order-v0-priority's rank, or the whole queue)
        fcfs = None if seats or ctx.policy != "fcfs" else ctx.column("queued", ctx.waiting)
        return ctx.reach(self._ignored(ctx), seats + 1, fcfs)

    def run(self, step: Step) -> None:
        swapped = step.queue("swapped")
        if swapped is not None and len(swapped):
            return  # `if not self.swapped:` — swapped requests come back first
        facts = step.facts
        pending = step.pending(self.queue)
        running = step.queue("running")
        seqs = len(running) if running is not None else 0
        # `_passed_delay` runs once the loop starts, even over an empty queue (its clock moves)
        now = float(max(facts.now_us, 0))
        clock = delay_clock(step.states(), now)
        latency = clock[LAST_LATENCY.name]
        if pending is None:
            step.set_state(**clock)
            return
        pool = pool_of(step)
        ids = step.ids(pending)
        total, arrival = step.columns(pending, ("total", "arrival"))
        limit = min(facts.max_model_len, facts.token_budget)
        out, admitted, hits = K.v0_prefills(
            ids, total, arrival, False, 0, seqs, facts.token_budget, facts.max_seqs, limit, facts.token_budget, 1, 0, 0,
            1, pool.usable_blocks, self.delay_factor * latency, self.delay_factor > 0, seqs > 0, int(now),
            pool.ref, pool.bhash, pool.dup_next, pool.nxt, pool.prv, pool.meta, pool.cache, pool.table, pool.nblk,
            pool.cache_kind == CACHE_V0, pool.ncached, pool.rhash, pool.nhash, pool.v0_noted)
        if admitted and pool.cache_kind == CACHE_V0:  # the prefix each admitted request starts from
            took = hits >= 0
            step.match(pending, ids[took], hits[took])
        emit_prefills(step, pending, ids, out, admitted, now, latency)


def delay_clock(state: Mapping[str, float], now: float) -> dict[str, float]:
    """What `_passed_delay` writes in a step that admits nobody (from the scheduler `state`, at
    the step's clock `now`, µs): the clock, no prompt step, and the last prompt step's latency,
    measured now when the step before scheduled prompts."""
    latency = float(state.get(LAST_LATENCY.name, 0.0))
    if state.get(PREV_PROMPT.name, 0.0):
        latency = now - float(state.get(PREV_TIME.name, 0.0))
    return {PREV_TIME.name: now, PREV_PROMPT.name: 0.0, LAST_LATENCY.name: latency}


def emit_prefills(step: Step, pending, ids: np.ndarray, out: np.ndarray, admitted: int, now: float,  # noqa: ANN001
                  latency: float, **admitted_state: np.ndarray) -> None:
    """A prefill pass's decisions: the delay rule's clock, the ignored (`req.reject`), the admitted
    (`req.schedule` prefill, `mem.alloc`, and `admitted_state` for them) and the rest deferred."""
    step.set_state(**{PREV_TIME.name: now, PREV_PROMPT.name: 1.0 if admitted else 0.0, LAST_LATENCY.name: latency})
    reasons = out[K.V0_REASON]
    ignored = (reasons == _REJECT[0]) | (reasons == _REJECT[1])
    if ignored.any():
        step.reject(pending, ids[ignored], reasons[ignored])
    if admitted:
        take = out[K.V0_TOKENS] > 0
        if admitted_state:
            step.set_request_state(pending, ids[take], **admitted_state)
        scheduled = step.schedule(pending, "prefill", ids[take], out[K.V0_TOKENS][take])
        step.blocks(AllocOp, scheduled, ids[take], out[K.V0_ALLOC][take])
    rest = (reasons > 0) & ~ignored
    if rest.any():
        step.defer(pending, ids[rest], reasons[rest])


@nb.njit(cache=True, nogil=True)
def delay_clock_lowered(SS: np.ndarray, now: float, prev_time: int, prev_prompt: int, last_latency: int) -> None:
    """`delay_clock` in a lowered answer: the same values into the scheduler state's slots."""
    latency = SS[last_latency]
    if SS[prev_prompt] != 0.0:
        latency = now - SS[prev_time]
    SS[prev_time] = now
    SS[prev_prompt] = 0.0
    SS[last_latency] = latency
