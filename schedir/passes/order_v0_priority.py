"""order-v0-priority: vLLM v0's waiting deque under the priority policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba as nb
import numpy as np

from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import UNRANKED, WINDOW_SLACK, WindowContext
from schedir.lowering.steady_layout import WINDOW_NOBODY, window_steady_lowered
from schedir.passes.ordering import sort_by_columns
from schedir.passes.v0_state import PRIORITY_STATE, SORT_HI, SORT_LO, SORT_STEP, SORTED_AT

PREEMPTED_RUN, SORTED_RUN, ARRIVED_RUN = 0, 1, 2  # the deque's three runs, front to back
SORT_KEYS = ("v0_deque_run", "priority", "arrival", "queued")  # how the step's req.sort names its order


@nb.njit(cache=True, nogil=True, inline="always")
def run_of(queued: int, sorted_at: int, sort_step: float, lo: float, hi: float) -> int:
    """Which run of v0's deque a waiting request is in, from its FCFS place (`queued`) and the
    last sorting step's record (see v0_state): the sorted block (the places it held then, and the
    priority rule's victims of that step), those preempted since (places below it), the
    arrivals since (places above it)."""
    if sort_step >= 0 and sorted_at == int(sort_step):
        return SORTED_RUN
    return PREEMPTED_RUN if queued < lo else (ARRIVED_RUN if queued > hi else SORTED_RUN)


@nb.njit(cache=True, nogil=True)
def deque_runs(queued: np.ndarray, sorted_at: np.ndarray, sort_step: float, lo: float, hi: float) -> np.ndarray:
    """`run_of` each waiting request."""
    runs = np.empty(queued.size, dtype=np.int64)
    for i in range(queued.size):
        runs[i] = run_of(queued[i], sorted_at[i], sort_step, lo, hi)
    return runs


def deque_order(queued: np.ndarray, priority: np.ndarray, arrival: np.ndarray, sorted_at: np.ndarray,
                sort_step: float, lo: float, hi: float) -> np.ndarray:
    """Positions of the waiting requests in v0's deque: the runs front to back, the sorted block
    by (priority, arrival) as `sorted(waiting_queue, key=_get_priority)` left it (ties keep the
    deque's order, which is the FCFS places' order: see docs/policies.md), the other two runs by
    FCFS place."""
    runs = deque_runs(queued, sorted_at, sort_step, lo, hi)
    in_block = runs == SORTED_RUN
    return np.lexsort((queued, np.where(in_block, arrival, 0), np.where(in_block, priority, 0), runs))


def deque_head(queued: np.ndarray, priority: np.ndarray, arrival: np.ndarray, sorted_at: np.ndarray,
               sort_step: float, lo: float, hi: float) -> int:
    """The position of `deque_order`'s first (`deque_first` of one, no sort); -1 for an empty queue."""
    head = deque_first(queued, priority, arrival, sorted_at, sort_step, lo, hi, 1)
    return int(head[0]) if head.size else -1


@nb.njit(cache=True, nogil=True)
def deque_first(queued: np.ndarray, priority: np.ndarray, arrival: np.ndarray, sorted_at: np.ndarray,
                sort_step: float, lo: float, hi: float, k: int) -> np.ndarray:
    """Positions of `deque_order`'s first `k`, in that order, in one pass over the queue keeping
    them sorted (a request ranked past the k-th is one comparison): a window's head without a
    sort of thousands (`OrderV0Priority.waiting_rank`)."""
    n = queued.size
    k = min(k, n)
    held = np.empty((5, max(k, 1)), dtype=np.int64)  # run, priority, arrival, place, position
    size = 0
    for i in range(n):
        q = queued[i]
        run = run_of(q, sorted_at[i], sort_step, lo, hi)
        p = priority[i] if run == SORTED_RUN else 0
        a = arrival[i] if run == SORTED_RUN else 0
        j = size
        while j > 0 and (run, p, a, q) < (held[0, j - 1], held[1, j - 1], held[2, j - 1], held[3, j - 1]):
            j -= 1
        if j >= k:
            continue
        last = min(size, k - 1)
        for t in range(last, j, -1):
            held[:, t] = held[:, t - 1]
        held[0, j], held[1, j], held[2, j], held[3, j], held[4, j] = run, p, a, q, i
        size = min(size + 1, k)
    return held[4, :size].copy()


def step_deque_order(step: Step, value) -> np.ndarray:  # noqa: ANN001
    """`deque_order` of the requests of `value` (a waiting set of the step), from its columns and state."""
    queued, priority, arrival = step.columns(value, ("queued", "priority", "arrival"))
    sorted_at = step.state_column(value, SORTED_AT.name, SORTED_AT.default)
    return deque_order(queued, priority, arrival, sorted_at, float(step.state(SORT_STEP.name, SORT_STEP.default)),
                       float(step.state(SORT_LO.name, SORT_LO.default)),
                       float(step.state(SORT_HI.name, SORT_HI.default)))


@dataclass(frozen=True)
class OrderV0Priority(StepPass):
    """Order the waiting queue as vLLM v0's deque under the priority policy.

    v0 (vllm/core/scheduler.py, 0.8.5; 0.6.3 the same) keeps one waiting deque: arrivals join
    its back (`add_seq_group`), requests `_schedule_running` preempts its front, last
    preempted first (`extendleft`), and every step that schedules no prefill sorts it by
    `_get_priority` = (priority, arrival_time) at the end of `_schedule_priority_preemption`
    (line 1026), before `_schedule_running` preempts. So at a step's start the deque is three
    runs: those preempted in the last sorting step, the block it sorted, the arrivals since.
    v0-priority-preemption records the block (v0_state); this pass sorts the step's waiting
    queue into that order, for v0-prefills to walk. Under FCFS: the runtime's FCFS places, as
    order-vllm.
    """

    name: ClassVar[str] = "order-v0-priority"
    provides: ClassVar[frozenset[str]] = frozenset({"order", "v0-priority-order"})
    request_state: ClassVar[tuple] = (SORTED_AT,)
    scheduler_state: ClassVar[tuple] = PRIORITY_STATE
    policies: ClassVar[tuple[str, ...]] = ("fcfs", "priority")
    # steady decode steps: over the waiting queue; a steady step admits nobody, so its order decides nothing
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting"}
    # its default steady answer lowered: its window is nobody
    steady_lowered = staticmethod(window_steady_lowered)

    queue: str = "waiting"

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (WINDOW_NOBODY,)

    def waiting_window(self, ctx: WindowContext) -> np.ndarray:
        """Nobody of its own: it orders what the step holds (v0-prefills names the deque's head it
        can reach, by this pass's rank)."""
        return ctx.NONE

    def waiting_rank(self, ctx: WindowContext) -> tuple[np.ndarray, np.ndarray] | None:
        """The deque's order as rank keys (under FCFS the FCFS places, as order-vllm): its first
        max_seqs + 16 placed (`deque_first`, a partial rank: the rest after them), which is as far as
        v0-prefills' loop reaches with no request to ignore. Swapped requests are not in the deque
        (v0-swapped takes them in their own order): keys 0."""
        if self.queue != "waiting" or ctx.column_of is None or ctx.state_of is None:
            return None
        waiting = ctx.waiting
        queued = ctx.column_of("queued")[waiting]
        unranked = np.zeros(ctx.swapped.size, dtype=np.int64)
        if ctx.policy != "priority":
            return queued, unranked
        state = ctx.scheduler_state
        head = deque_first(queued, ctx.column_of("priority")[waiting], ctx.column_of("arrival")[waiting],
                           ctx.state_of(SORTED_AT.name)[waiting], float(state.get(SORT_STEP.name, SORT_STEP.default)),
                           float(state.get(SORT_LO.name, SORT_LO.default)),
                           float(state.get(SORT_HI.name, SORT_HI.default)), ctx.max_seqs + WINDOW_SLACK)
        keys = np.full(waiting.size, UNRANKED, dtype=np.int64)  # (a partial rank: the head placed)
        keys[head] = np.arange(head.size)
        return ctx.partial_rank(keys, head.size), unranked

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        if step.facts.policy != "priority":
            sort_by_columns(step, pending, ("queued",))
            return
        order = step_deque_order(step, pending)
        step.sort(pending, SORT_KEYS, step.ids(pending)[order], picked=order)
