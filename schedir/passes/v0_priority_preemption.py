"""v0-priority-preemption: vLLM v0's `_schedule_priority_preemption` (the priority policy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba as nb
import numpy as np

from schedir.dialects.req import RejectOp, SortOp
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step, pool_of
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import ANSWERED, ASK_IR, MEMO_SET, ORDERED, SC_STEP
from schedir.passes import v0_kernels as K
from schedir.passes.order_v0_priority import deque_first, deque_head
from schedir.passes.ordering import sort_by_columns
from schedir.passes.v0_running import emit_preemptions, scheduled_from
from schedir.passes.v0_state import PRIORITY_STATE, SORT_HI, SORT_LO, SORT_STEP, SORTED_AT

_MODES = ("auto", "recompute")
_HEAD, _LOWEST, _HIGHEST = 1, 2, 3  # the lowered answer's memo: the deque's head when every waiting
#                                      request is in the sorted block, the lowest and highest FCFS place


@nb.njit(cache=True, nogil=True)
def _first_in_deque(D, ST, waiting, o, sort_step: float, lo: float, hi: float) -> int:  # noqa: ANN001
    """The row first in v0's deque (`deque_first` of one over the waiting rows' columns)."""
    n = waiting.size
    queued = np.empty(n, dtype=np.int64)
    priority = np.empty(n, dtype=np.int64)
    arrival = np.empty(n, dtype=np.int64)
    sorted_at = np.empty(n, dtype=np.int64)
    for k in range(n):
        r = waiting[k]
        queued[k], priority[k], arrival[k], sorted_at[k] = D[int(o[1]), r], D[int(o[2]), r], D[int(o[3]), r], \
            ST[int(o[4]), r]
    return waiting[deque_first(queued, priority, arrival, sorted_at, sort_step, lo, hi, 1)[0]]


@nb.njit(cache=True, nogil=True)
def priority_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, order, rows, w, m, over) -> int:  # noqa: ANN001
    """`V0PriorityPreemption.steady_state` and `steady_order` in the steady program. The waiting
    queue's lowest and highest FCFS place and its head once all of it is in the sorted block (the
    usual case after one steady step) are kept in the memo, so a steady step does not walk it."""
    if o[0] == 0:  # FCFS
        return ANSWERED
    qc, pc, ac = int(o[1]), int(o[2]), int(o[3])
    s_step, s_lo, s_hi = int(o[5]), int(o[6]), int(o[7])
    lo, hi = 0.0, -1.0
    if waiting.size:
        if m[MEMO_SET] == 0:
            lowest, highest = D[qc, waiting[0]], D[qc, waiting[0]]
            for r in waiting:
                lowest = min(lowest, D[qc, r])
                highest = max(highest, D[qc, r])
            m[_LOWEST], m[_HIGHEST] = lowest, highest
            m[_HEAD] = _first_in_deque(D, ST, waiting, o, -1.0, float(lowest), float(highest))
            m[MEMO_SET] = 1
        if SS[s_lo] <= m[_LOWEST] and m[_HIGHEST] <= SS[s_hi]:
            head = m[_HEAD]  # the record covers the whole queue: one sorted block
        else:
            head = _first_in_deque(D, ST, waiting, o, SS[s_step], SS[s_lo], SS[s_hi])
        hp, ha = D[pc, head], D[ac, head]
        for r in running:  # a running request ranking below the head: v0 preempts it (every seat taken)
            if D[pc, r] > hp or (D[pc, r] == hp and D[ac, r] > ha):
                return ASK_IR
        lo, hi = float(m[_LOWEST]), float(m[_HIGHEST])
    SS[s_step] = float(sc[SC_STEP])
    SS[s_lo] = lo
    SS[s_hi] = hi
    n = running.size
    sorted_already = True
    for k in range(n - 1):
        a, b = running[k], running[k + 1]
        if D[pc, a] > D[pc, b] or (D[pc, a] == D[pc, b] and D[ac, a] > D[ac, b]):
            sorted_already = False
            break
    if sorted_already:
        return ANSWERED
    keys = np.empty(n, dtype=np.int64)
    for k in range(n):
        keys[k] = D[ac, running[k]]
    by_arrival = np.argsort(keys, kind="mergesort")
    for k in range(n):
        keys[k] = D[pc, running[by_arrival[k]]]
    by_priority = np.argsort(keys, kind="mergesort")
    for k in range(n):
        order[k] = by_arrival[by_priority[k]]
    return ORDERED


@dataclass(frozen=True)
class V0PriorityPreemption(StepPass):
    """Preempt running requests of lower priority than the waiting queue's head; sort the queues.

    vLLM v0 under `--scheduling-policy priority` (`_schedule_default`, vllm/core/scheduler.py:1251,
    0.8.5; `_schedule_priority_preemption`, line 967), in a step that scheduled no prefill
    (v0-prefills admitted nobody, or requests are swapped out): the running queue is sorted
    by (priority, arrival) and stays so; while its last request ranks strictly below the
    waiting deque's head and the head cannot be allocated or does not fit the budget, that
    request is preempted by recompute and put in front of the deque (`v0_kernels.
    v0_priority_preemption`); then the whole deque is sorted by (priority, arrival). The head
    is not admitted in this step (v0-running decodes the rest next). This pass writes where the
    sorted block lies (v0_state), which order-v0-priority reads at the next step.

    `preemption`: `auto` is v0's choice for a single-sequence request, recompute. Swap is not
    offered: 0.8.5 swaps the victim out but queues it as waiting and drops its
    `blocks_to_swap_out`, so the next prefill pass fails (docs/vllm-v0-reference.md).
    Chunked prefill never calls this rule in v0 (`_schedule_chunked_prefill`).
    """

    name: ClassVar[str] = "v0-priority-preemption"
    queue_options: ClassVar[tuple[str, ...]] = ("queue", "running")
    requires: ClassVar[frozenset[str]] = frozenset({"kv-pool", "waiting-scheduled", "v0-priority-order"})
    provides: ClassVar[frozenset[str]] = frozenset({"v0-priority-preemption"})
    request_state: ClassVar[tuple] = (SORTED_AT,)
    scheduler_state: ClassVar[tuple] = PRIORITY_STATE
    stops_past_max_model_len: ClassVar[bool] = True  # v0's StopChecker: len > max_model_len
    no_prefix_cache: ClassVar[bool] = True
    prefix_cache_refusal: ClassVar[str] = ("v0's prefix caching under the priority policy is not "
                                           "reproduced yet; vllm-v0 (fcfs) caches")
    policies: ClassVar[tuple[str, ...]] = ("fcfs", "priority")  # under FCFS it does nothing

    preemption: str = "auto"
    queue: str = "waiting"
    running: str = "running"
    # steady decode steps: the rule preempts nobody while the deque's head does not outrank the
    # last running request; the step's sort is written (`steady_state`) and the batch decodes in
    # (priority, arrival) order (`steady_order`)
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting", "running": "running"}
    steady_lowered = staticmethod(priority_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (float(layout.policy == "priority"), layout.column("queued"), layout.column("priority"),
                layout.column("arrival"), layout.state(SORTED_AT.name), layout.scalar(SORT_STEP.name),
                layout.scalar(SORT_LO.name), layout.scalar(SORT_HI.name))

    def waiting_window(self, ctx: WindowContext) -> np.ndarray:
        """The waiting requests with the lowest and the highest FCFS place (the sorted block's record
        reads them); the deque's head is in v0-prefills' window (by order-v0-priority's rank).
        Nobody under FCFS."""
        if self.queue != "waiting" or ctx.policy != "priority" or not ctx.waiting.size:
            return ctx.NONE
        queued = ctx.column("queued", ctx.waiting)
        return np.unique(np.array([np.argmin(queued), np.argmax(queued)], dtype=np.int64))

    def steady_state(self, ctx: WindowContext) -> dict[str, float] | None:
        """What a steady step writes under the priority policy: the sort's record (this step, the
        FCFS places the waiting queue holds), when nobody is preempted: nobody waits, or the deque's
        head does not rank above the last running request (with every seat taken, as in any steady
        step with requests waiting, a head that does is always let in by a victim). Under FCFS
        nothing. Else None: the IR decides."""
        if ctx.policy != "priority":
            return {}
        waiting = ctx.waiting
        lo, hi = 0.0, -1.0
        if waiting.size:
            if ctx.column_of is None or ctx.state_of is None:
                return None
            queued = ctx.column_of("queued")[waiting]
            priority, arrival = ctx.column_of("priority"), ctx.column_of("arrival")
            state = ctx.scheduler_state
            head = deque_head(queued, priority[waiting], arrival[waiting], ctx.state_of(SORTED_AT.name)[waiting],
                              float(state.get(SORT_STEP.name, SORT_STEP.default)),
                              float(state.get(SORT_LO.name, SORT_LO.default)),
                              float(state.get(SORT_HI.name, SORT_HI.default)))
            key = (int(priority[waiting[head]]), int(arrival[waiting[head]]))
            running = ctx.running
            last = int(np.lexsort((arrival[running], priority[running]))[-1]) if running.size else -1
            if last >= 0 and (int(priority[running[last]]), int(arrival[running[last]])) > key:
                return None
            lo, hi = float(queued.min()), float(queued.max())
        return {SORT_STEP.name: float(ctx.step), SORT_LO.name: lo, SORT_HI.name: hi}

    def steady_order(self, ctx: WindowContext) -> np.ndarray | None:
        """The running queue sorted by (priority, arrival), stably (v0 keeps it so); None: already."""
        if ctx.policy != "priority" or ctx.column_of is None or ctx.running.size < 2:
            return None
        running = ctx.running
        order = np.lexsort((ctx.column_of("arrival")[running], ctx.column_of("priority")[running]))
        return None if (order[1:] > order[:-1]).all() else order

    def __post_init__(self) -> None:
        if self.preemption not in _MODES:
            raise ValueError(f"preemption must be one of {', '.join(_MODES)}, got '{self.preemption}' (v0 0.8.5 "
                             "loses a priority victim swapped out: it queues it as waiting without its blocks)")

    def run(self, step: Step) -> None:
        facts = step.facts
        if facts.policy != "priority" or scheduled_from(step, self.queue):
            return  # "if len(prefills.seq_groups) == 0 and policy == 'priority'"
        deque = self._deque(step)
        running = step.pending(self.running)
        victims = np.zeros(0, dtype=np.int64)
        if running is not None:
            running = sort_by_columns(step, running, ("priority", "arrival"))  # `deque(sorted(self.running, ...))`
            if deque is not None and deque["id"].size:
                victims = self._preempt_for_head(step, running, deque)
        # the sorted block's FCFS places (the queue's lowest and highest are in the step: its window);
        # an empty deque: whoever waits next arrived since, or was preempted after
        lo, hi = 0.0, -1.0
        root = step.queue(self.queue)
        if root is not None and len(step.ids(root.results[0])):
            queued = step.column(root.results[0], "queued")
            lo, hi = float(queued.min()), float(queued.max())
        step.set_state(**{SORT_STEP.name: float(facts.step), SORT_LO.name: lo, SORT_HI.name: hi})
        if victims.size:
            step.set_request_state(running, victims, **{SORTED_AT.name: np.full(victims.size, facts.step)})

    def _deque(self, step: Step) -> dict[str, np.ndarray] | None:
        """The waiting deque in its order (order-v0-priority's `req.sort` of the waiting queue),
        less what v0-prefills ignored: "id", "queued", "total", "priority", "arrival" (None: the
        step has no waiting queue, or nobody in it)."""
        root = step.queue(self.queue)
        if root is None:
            return None
        ordered = next((op.results[0] for op in reversed(step.ops_of(SortOp))
                        if step.root(op.results[0]) is root), None)
        if ordered is None:
            if len(step.ids(root.results[0])):
                raise ValueError("v0-priority-preemption: the waiting queue was not ordered (order-v0-priority)")
            return None
        names = ("queued", "total", "priority", "arrival")
        deque = {"id": step.ids(ordered), **dict(zip(names, step.columns(ordered, names), strict=True))}
        ignored = [op.ids for op in step.ops_of(RejectOp) if step.root(op.operands[0]) is root]  # type: ignore[attr-defined]
        if ignored:
            keep = ~np.isin(deque["id"], np.concatenate(ignored))
            deque = {n: c[keep] for n, c in deque.items()}
        return deque

    def _preempt_for_head(self, step: Step, running, deque: dict[str, np.ndarray]) -> np.ndarray:  # noqa: ANN001
        """The loop over the deque's head: its victims preempted (returned), the rest of the
        running queue kept pending for v0-running."""
        facts = step.facts
        pool = pool_of(step)
        ids = step.ids(running)
        priority, arrival = step.columns(running, ("priority", "arrival"))
        out, preempted = K.v0_priority_preemption(
            ids, priority, arrival, int(deque["total"][0]), int(deque["priority"][0]), int(deque["arrival"][0]),
            facts.token_budget, facts.max_seqs, pool.usable_blocks, pool.ref, pool.bhash, pool.dup_next, pool.nxt,
            pool.prv, pool.meta, pool.cache, pool.table, pool.nblk, pool.ncached)
        if not preempted:
            return np.zeros(0, dtype=np.int64)
        emit_preemptions(step, running, ids, out)
        alive = out[K.V0_SEQ] < 0
        step.keep(running, ids[alive], picked=np.flatnonzero(alive))
        return ids[~alive]
