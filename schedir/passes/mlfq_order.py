"""mlfq-order: FastServe's iteration-level preemptive MLFQ order over running and waiting jobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np
from xdsl.ir import SSAValue

from schedir.ir.array_step import ArrayQueue, ArrayStep
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import ANSWERED, ASK_IR, MEMO_SET, ORDERED, SC_BLOCK_SIZE, SC_FREE_BLOCKS, \
    SC_HOST_FREE, SC_MAX_SEQS, running_state
from schedir.passes.mlfq_state import LEVEL, MLFQ_STATE, SERVED_DECODE, SERVED_PREFILL


KEEP, RECOMPUTE, SWAP = 0, 1, 2  # a running job's fate this step
_ARRIVAL_BITS = 47  # a rank key: level << 47 | arrival (µs; ~4 years)
_ARRIVAL_SPAN = 1 << _ARRIVAL_BITS


@numba.njit(cache=True, nogil=True)
def mlfq_pick(run_level: np.ndarray, run_blocks: np.ndarray, run_total: np.ndarray, run_swappable: np.ndarray,
              wait_level: np.ndarray, wait_total: np.ndarray, wait_fresh: np.ndarray, seats: int, free_blocks: int,
              block_size: int, host_free: int) -> np.ndarray:
    """Which running jobs give way to waiting (or swapped) jobs of a higher level, and how:
    KEEP, RECOMPUTE (KV dropped) or SWAP (KV copied to the host tier, `host_free` blocks there;
    -1: no swapping). A running job is swapped when it is `run_swappable` and its blocks fit
    in what the host tier has left, else recomputed.

    Waiting jobs take free seats in (level, arrival) order; when none is free, the next job in
    that order takes the seat of the lowest-ranked running job of a strictly lower level. A
    job that is not new (`wait_fresh` false: it was served before) displaces only by swap: a
    recompute would cost the victim its progress, and jobs displacing each other by recompute
    livelock (each loses its progress before it finishes); where it cannot, the walk stops (a
    seat freed later would go to it, not to a job behind it). When the jobs kept and taken
    need more KV blocks than are free, more running jobs of a level below the queue's head give
    way, the lowest-ranked first, under the same rule. Inputs are in (level, arrival) order."""
    nr = run_level.size
    fate = np.zeros(nr, dtype=np.int64)
    host_left = host_free
    need = 0
    for k in range(nr):  # room for its next token (a division only where it needs a block: most steps none)
        if run_total[k] >= run_blocks[k] * block_size:
            need += (run_total[k] + block_size) // block_size - run_blocks[k]
    free_seats = seats - nr
    worst = nr - 1  # the lowest-ranked running job still running
    for j in range(wait_level.size):
        if free_seats > 0:
            free_seats -= 1
        else:
            while worst >= 0 and fate[worst] != KEEP:
                worst -= 1
            if worst < 0 or run_level[worst] <= wait_level[j]:
                break
            swap = run_swappable[worst] and 0 <= run_blocks[worst] <= host_left
            if not swap and not wait_fresh[j]:
                break  # the next seat freed would go to this job, not to a new one behind it
            if swap:
                fate[worst] = SWAP
                host_left -= run_blocks[worst]
            else:
                fate[worst] = RECOMPUTE
            need -= max((run_total[worst] + block_size) // block_size - run_blocks[worst], 0)
        need += max(-(-wait_total[j] // block_size), 0)
    # memory goes to the queue's head first
    if wait_level.size == 0:
        return fate
    best = wait_level[0]
    short = need - free_blocks
    k = nr - 1
    while short > 0 and k >= 0:
        if fate[k] == KEEP and run_level[k] > best and run_blocks[k] > 0:
            swap = run_swappable[k] and run_blocks[k] <= host_left
            if not swap and not wait_fresh[0]:
                break  # give KV up by recompute only for a new job
            if swap:
                fate[k] = SWAP
                host_left -= run_blocks[k]
            else:
                fate[k] = RECOMPUTE
            short -= run_blocks[k]
            need -= max((run_total[k] + block_size) // block_size - run_blocks[k], 0)
        k -= 1
    return fate


@numba.njit(cache=True, nogil=True)
def rank_keys(rows: np.ndarray, levels: np.ndarray, arrival: np.ndarray) -> np.ndarray:
    """The rank key `level << 47 | arrival` of each of `rows` (`levels` aligned with `rows`,
    `arrival` by row id), or an empty array when a level or an arrival does not fit the key."""
    n = rows.size
    keys = np.empty(n, dtype=np.int64)
    for i in range(n):
        at = arrival[rows[i]]
        lv = levels[i]
        if at < 0 or at >= _ARRIVAL_SPAN or lv < 0 or lv >= 1 << 15:
            return np.empty(0, dtype=np.int64)
        keys[i] = (lv << _ARRIVAL_BITS) | at
    return keys


@numba.njit(cache=True, nogil=True)
def queue_head(swapped: np.ndarray, waiting: np.ndarray, level: np.ndarray, arrival: np.ndarray) -> int:
    """The row of the first of the lowest (level, arrival) among `swapped` then `waiting` (a
    stable sort's head), or -1 when both are empty."""
    head = -1
    for part in range(2):
        rows = swapped if part == 0 else waiting
        for r in rows:
            if head < 0 or level[r] < level[head] or (level[r] == level[head] and arrival[r] < arrival[head]):
                head = r
    return head


@numba.njit(cache=True, nogil=True)
def _in_arrival_order(running: np.ndarray, arrival: np.ndarray) -> bool:
    # (a loop of its own: with an array assigned inside it, Numba's refcounting cost ~25 ns an iteration)
    for i in range(running.size - 1):
        if arrival[running[i]] > arrival[running[i + 1]]:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def _arrival_sorted(running: np.ndarray, arrival: np.ndarray) -> np.ndarray:
    ar = np.empty(running.size, dtype=np.int64)
    for k in range(running.size):
        ar[k] = arrival[running[k]]
    return np.argsort(ar, kind="mergesort")


@numba.njit(cache=True, nogil=True)
def level_arrival_order(running: np.ndarray, lv: np.ndarray, arrival: np.ndarray) -> np.ndarray:
    """Positions of `running` in (level, arrival) order, ties in queue order (the stable sorts of
    `_sorted`): by arrival (no sort where the queue is in arrival order already: admission order,
    most batches), then a counting sort by level (a handful of levels), where two mergesorts of
    a batch of 256 cost ~12 µs a step."""
    nr = running.size
    by_arrival = np.arange(nr) if _in_arrival_order(running, arrival) else _arrival_sorted(running, arrival)
    low = lv.min()
    span = lv.max() - low + 1
    if span > 4 * nr + 64:  # levels too spread for counting: the stable sort
        return by_arrival[np.argsort(lv[by_arrival], kind="mergesort")]
    start = np.zeros(span + 1, dtype=np.int64)
    for i in range(nr):
        start[lv[i] - low + 1] += 1
    for b in range(span):
        start[b + 1] += start[b]
    order = np.empty(nr, dtype=np.int64)
    for i in range(nr):
        k = by_arrival[i]
        b = lv[k] - low
        order[start[b]] = k
        start[b] += 1
    return order


@numba.njit(cache=True, nogil=True)
def pick_against(running: np.ndarray, run_blocks: np.ndarray, lv: np.ndarray, head: int, level: np.ndarray,
                 arrival: np.ndarray, total: np.ndarray, prefill: np.ndarray, decode: np.ndarray, seats: int,
                 free_blocks: int, block_size: int, host_free: int) -> tuple[np.ndarray, bool]:
    """`steady_pick` with the running jobs' levels (`lv`, aligned with `running`: as this step's
    placement leaves them) and the head of the jobs that want a seat given (`queue_head`; -1: none)."""
    nr = running.size
    in_order = True  # already in (level, arrival) order (the batch of most steady steps): the stable sort
    for i in range(nr - 1):  # would leave it as it is
        if lv[i] > lv[i + 1] or (lv[i] == lv[i + 1] and arrival[running[i]] > arrival[running[i + 1]]):
            in_order = False
            break
    if in_order:
        order = np.arange(nr)
    else:
        order = level_arrival_order(running, lv, arrival)
    if head < 0:
        return order, True
    if nr < seats:
        return order, False
    run_level = np.empty(nr, dtype=np.int64)
    run_total = np.empty(nr, dtype=np.int64)
    blocks = np.empty(nr, dtype=np.int64)
    for k in range(nr):
        run_level[k] = lv[order[k]]
        run_total[k] = total[running[order[k]]]
        blocks[k] = run_blocks[order[k]]
    fate = mlfq_pick(run_level, blocks, run_total, np.ones(nr, dtype=np.bool_),
                     np.full(1, level[head], dtype=np.int64), np.full(1, total[head], dtype=np.int64),
                     np.full(1, prefill[head] == 0 and decode[head] == 0, dtype=np.bool_),
                     seats, free_blocks, block_size, host_free)
    return order, not fate.any()


@numba.njit(cache=True, nogil=True)
def steady_pick(running: np.ndarray, run_blocks: np.ndarray, run_level: np.ndarray, swapped: np.ndarray,
                waiting: np.ndarray, level: np.ndarray, arrival: np.ndarray, total: np.ndarray, prefill: np.ndarray,
                decode: np.ndarray, seats: int, free_blocks: int, block_size: int,
                host_free: int) -> tuple[np.ndarray, bool]:
    """A steady step's batch order and whether nobody gives way, in one call: (positions of
    `running` in (level, arrival) order, ties in queue order as `_sorted`'s stable lexsort; True
    when `mlfq_pick` keeps every running job against the jobs that want a seat, `swapped` then
    `waiting`, every running job swappable). False too when a seat is free for one of them
    (admission decides that step). The columns are indexed by row id (the runtime's whole-table
    views); `run_blocks` is `running`'s, in its order. With every seat taken the pick reads only
    the head of the wanting jobs in (level, arrival) order (its walk stops there or displaces
    someone, and its memory rule reads the head), so this is one pass over them, not a sort, and
    the steady program keeps the head while the queues stay as they are."""
    return pick_against(running, run_blocks, run_level, queue_head(swapped, waiting, level, arrival), level, arrival,
                        total, prefill, decode, seats, free_blocks, block_size, host_free)


@numba.njit(cache=True, nogil=True)
def order_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, order, rows, w, m, over) -> int:  # noqa: ANN001
    """`MlfqOrder.steady_state` and `steady_order` in the steady program: `steady_pick` over the
    same queues, the head of the queued jobs kept in the memo while they stay as they are; the
    batch order written when it is not running order."""
    swap = o[5] == 1
    if m[MEMO_SET] == 0:
        m[1] = queue_head(swapped if swap else _NONE, waiting, ST[int(o[0])], D[int(o[1])])
        m[MEMO_SET] = 1
    nr = running.size
    blocks = np.empty(nr, dtype=np.int64)
    for i in range(nr):
        blocks[i] = NB[running[i]]
    run_level = running_state(ST, rows, over, int(o[0]), running)  # as `mlfq-levels` leaves them (a demotion)
    picked, ok = pick_against(running, blocks, run_level, m[1], ST[int(o[0])], D[int(o[1])], D[int(o[2])],
                              ST[int(o[3])], ST[int(o[4])], sc[SC_MAX_SEQS], sc[SC_FREE_BLOCKS], sc[SC_BLOCK_SIZE],
                              sc[SC_HOST_FREE] if swap else -1)
    if not ok:
        return ASK_IR
    same = True
    for i in range(nr):
        if picked[i] != i:
            same = False
            break
    if same:
        return ANSWERED
    order[:] = picked
    return ORDERED


@dataclass(frozen=True)
class MlfqOrder(StepPass):
    """Order the queues by MLFQ level, then arrival; running jobs of a lower level give way to
    waiting (or swapped) jobs of a higher one, by swap or by recompute.

    FastServe (§4.1) schedules at iteration granularity and preemptively: each iteration runs the
    highest-priority jobs, so a short new job (a high level, thanks to skip-join) overtakes long
    ones. A job that finds no free seat takes the seat of the lowest-ranked running job of a
    strictly lower level, and running jobs of a level below the queue's head give their KV up
    while the jobs chosen need more blocks than are free (the head's need, not a failed
    allocation, triggers it: FastServe's proactive swap-out, §4.3).

    `preemption=swap` is FastServe's KV cache management: the victim's KV moves to the host tier
    (the runtime's `num_cpu_blocks`; the lowering copies it, `blocks_to_swap_out`) and the job
    waits in the `swapped` queue with its level and progress, ordered here with the others;
    `mlfq-swap-in` brings it back in its turn. Where the host tier is full (or absent, or the
    victim has tokens in flight) the victim is recomputed. `preemption=recompute` (the default)
    drops the victim's KV. Because a recompute loses the job's progress, only new jobs (never
    served) displace by recompute; any job displaces by swap (letting served jobs displace each
    other by recompute livelocks: each loses its progress to the next before it finishes).

    Where this differs from the paper, and why: max_seqs stays the engine's cap on running
    requests, so a job cannot pause in its slot with its KV on the device; a job whose turn
    comes is swapped in within the step that runs it (the engine copies before the forward
    pass), not a step ahead. Admission then takes waiting jobs in level order.
    """

    name: ClassVar[str] = "mlfq-order"
    queue_options: ClassVar[tuple[str, ...]] = ("queue", "running", "swapped")
    requires: ClassVar[frozenset[str]] = frozenset({"mlfq-levels"})
    provides: ClassVar[frozenset[str]] = frozenset({"order"})
    request_state = MLFQ_STATE

    queue: str = "waiting"
    running: str = "running"
    swapped: str = "swapped"
    preemption: str = "recompute"

    # steady decode steps: over the waiting and running queues, when nobody gives way (`steady_state`)
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting", "running": "running", "swapped": "swapped"}
    steady_swapped: ClassVar[bool] = True  # its answer judges the swapped jobs too

    steady_lowered = staticmethod(order_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (layout.state(LEVEL.name), layout.column("arrival"), layout.column("total"),
                layout.state(SERVED_PREFILL.name), layout.state(SERVED_DECODE.name),
                1.0 if self.preemption == "swap" else 0.0)

    def waiting_rank(self, ctx: WindowContext) -> tuple[np.ndarray, np.ndarray] | None:
        """(level, arrival) as one key, the levels as `mlfq-levels` places them this step (its
        `waiting_window` leaves them), as `run` sorts the waiting and swapped jobs."""
        if self.queue != "waiting" or ctx.column_of is None or ctx.state_of is None:
            return None
        return ctx.shared(("mlfq-rank", self), lambda: self._rank(ctx))  # type: ignore[return-value]

    def _rank(self, ctx: WindowContext) -> tuple[np.ndarray, np.ndarray] | None:
        placed = ctx.memo.get("mlfq-placed-levels")
        swapped = ctx.swapped if self.preemption == "swap" else _NONE
        if placed is None:  # no mlfq-levels before it: the levels as they stand
            level = ctx.state_of(LEVEL.name)
            placed = (level[ctx.waiting], level[swapped])
        arrival = ctx.column_of("arrival")
        keys = []
        for rows, levels in ((ctx.waiting, placed[0]), (swapped, placed[1][:swapped.size])):
            key = rank_keys(rows, levels, arrival)
            if key.size < rows.size:
                return None
            keys.append(key)
        return keys[0], keys[1]

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """The jobs its pick can reach: it walks the jobs that want a seat in rank order, each
        taking a free seat, displacing a running job or stopping the walk, and its memory rule
        reads the head. A job displaces only a running job of a lower level than its own, so at
        most the running jobs below the queue's best level give way (`displaceable`): the walk
        reaches the first free seats + those + 1 waiting jobs by rank (ties in queue order, as
        `run`'s stable sort), at most max_seqs + 1. The seats it frees go to waiting jobs: it
        says how many at most (`WindowContext.frees_seats`), so admission declares no empty
        window and walks a head that long (a batch of jobs all of the queue's best level frees
        none: the heads are the free seats + 16, not max_seqs + 16)."""
        rank = self.waiting_rank(ctx)
        if rank is None:
            ctx.frees_seats()  # its displacements give waiting jobs seats: admission needs more than nobody
            return None
        freed = self._displaceable(ctx, rank)
        ctx.frees_seats(freed)
        return ctx.first_by_rank(rank[0], self._reach(ctx, freed))

    def swapped_window(self, ctx: WindowContext) -> np.ndarray | None:
        """The swapped jobs its pick can reach: the first ones by rank, as many as `waiting_window`'s
        (the pick walks swapped and waiting jobs in one order); nobody when it preempts by
        recompute (it reads no swapped queue then)."""
        if self.preemption != "swap":
            return ctx.NONE
        rank = self.waiting_rank(ctx)
        if rank is None or self.swapped != "swapped":
            return None
        return ctx.first_by_rank(rank[1], self._reach(ctx, self._displaceable(ctx, rank)))

    @staticmethod
    def _reach(ctx: WindowContext, freed: int) -> int:
        """How many jobs of the rank the pick walks at most: one per free seat, one per job it can
        displace, and the one it stops at."""
        return min(max(ctx.max_seqs - ctx.running.size, 0) + freed, ctx.max_seqs) + 1

    def _displaceable(self, ctx: WindowContext, rank: tuple[np.ndarray, np.ndarray]) -> int:
        """The running jobs whose level (as `mlfq-levels` places them this step) is below the best
        level a waiting or swapped job has: the only ones `mlfq_pick` can make give way, for a
        seat or for memory (a victim's level is above the walking job's, or the head's)."""
        def count() -> int:
            best = min((int(keys.min()) for keys in rank if keys.size), default=None)
            if best is None:
                return 0
            run_level = ctx.memo.get("mlfq-placed-running")
            if run_level is None:  # no mlfq-levels before it: the levels as they stand
                run_level = ctx.state_of(LEVEL.name)[ctx.running]  # type: ignore[misc]
            return int(np.count_nonzero(run_level > (best >> _ARRIVAL_BITS)))

        return ctx.shared(("mlfq-displaceable", self), count)  # type: ignore[return-value]

    def steady_order(self, ctx: WindowContext) -> np.ndarray | None:
        """The batch in (level, arrival) order, as `run` sorts the running queue (None: already so)."""
        order = self._steady_pick(ctx)[0]
        return None if (order == np.arange(order.size)).all() else order

    def steady_state(self, ctx: WindowContext) -> dict[str, float] | None:
        """Nothing written, when no running job gives way (the batch decodes in (level, arrival)
        order: `steady_order`): `mlfq_pick` over the waiting and (with `preemption=swap`) swapped
        jobs keeps them all, asked with every running job swappable (none has a token in flight
        in a steady step) and the host tier's free blocks (`steady_pick`). Else None: the IR
        decides."""
        return {} if self._steady_pick(ctx)[1] else None

    def _steady_pick(self, ctx: WindowContext) -> tuple[np.ndarray, bool]:
        """`steady_pick` over the step's queues, once per step (both answers read it)."""
        def pick() -> tuple[np.ndarray, bool]:
            state_of = ctx.state_of
            swap = self.preemption == "swap"
            level = state_of(LEVEL.name)
            run_level = ctx.batch_state.get(LEVEL.name)  # a demotion `mlfq-levels` answered this step
            return steady_pick(ctx.running, ctx.column("blocks", ctx.running),
                               level[ctx.running] if run_level is None else run_level,
                               ctx.swapped if swap else _NONE, ctx.waiting, level, ctx.column_of("arrival"),
                               ctx.column_of("total"),
                               state_of(SERVED_PREFILL.name), state_of(SERVED_DECODE.name), ctx.max_seqs,
                               ctx.free_blocks, ctx.block_size, ctx.host_free_blocks if swap else -1)

        return ctx.shared("mlfq-steady-pick", pick)  # type: ignore[return-value]

    def __post_init__(self) -> None:
        if self.preemption not in ("recompute", "swap"):
            raise ValueError(f"preemption must be recompute or swap, got '{self.preemption}'")

    def _sorted(self, step: Step, value: SSAValue | None) -> tuple[SSAValue | None, np.ndarray]:
        """`value` sorted by (level, arrival), with its levels in that order."""
        if value is None:
            return None, np.zeros(0, dtype=np.int64)
        level = step.state_column(value, LEVEL.name, LEVEL.default)
        arrival = step.column(value, "arrival")
        order = np.lexsort((arrival, level))
        ids = step.ids(value)
        return step.sort(value, ("mlfq_level", "arrival"), ids[order], picked=order), level[order]

    array_step_when: ClassVar[dict[str, str]] = {}  # `run_arrays`: any options

    def _sorted_arrays(self, step: ArrayStep, q: ArrayQueue | None) -> np.ndarray:
        """`_sorted` over an array step: `q`'s pending requests sorted, their levels in that order."""
        if q is None:
            return _NONE
        rows = q.pending
        level = step.state(LEVEL.name)[rows]
        order = np.lexsort((step.column("arrival")[rows], level))
        step.sort(q, order)
        return level[order]

    def run_arrays(self, step: ArrayStep) -> None:
        """`run` over an array step (`schedir.ir.array_step`), rule for rule."""
        swap = self.preemption == "swap"
        if swap and step.queue(self.swapped) is None:
            raise ValueError(f"mlfq-order: preemption=swap needs the '{self.swapped}' queue: put mlfq-swap-in "
                             "(which brings swapped jobs back) in the pipeline")
        waiting = step.pending(self.queue)
        wait_level = self._sorted_arrays(step, waiting)
        swapped = step.pending(self.swapped) if swap else None
        swap_level = self._sorted_arrays(step, swapped)
        running = step.pending(self.running)
        run_level = self._sorted_arrays(step, running)
        if running is None or (waiting is None and swapped is None):
            return
        parts = [(q, lv) for q, lv in ((swapped, swap_level), (waiting, wait_level)) if q is not None]
        rows = np.concatenate([q.pending for q, _ in parts]) if len(parts) > 1 else parts[0][0].pending
        level = np.concatenate([lv for _, lv in parts]) if len(parts) > 1 else parts[0][1]
        arrival, total = step.column("arrival")[rows], step.column("total")[rows]
        fresh = (step.state(SERVED_PREFILL.name)[rows] == 0) & (step.state(SERVED_DECODE.name)[rows] == 0)
        if len(parts) > 1:
            order = np.lexsort((arrival, level))
            level, total, fresh = level[order], total[order], fresh[order]
        facts = step.facts
        run_rows = running.pending
        run_blocks = step.column("blocks")[run_rows]
        if swap:  # a job with a token in flight (async scheduling) has KV not written yet: recompute it
            swappable = step.column("in_flight")[run_rows] == 0
        else:
            swappable = np.zeros(run_rows.size, dtype=np.bool_)
        fate = mlfq_pick(run_level, run_blocks, step.column("total")[run_rows], swappable, level, total, fresh,
                         facts.max_seqs - step.seqs, step.free_left(), facts.block_size,
                         facts.host_free_blocks if swap else -1)
        if not fate.any():
            return
        step.preempt(running, "recompute", run_rows[fate == RECOMPUTE])
        step.preempt(running, "swap", run_rows[fate == SWAP])
        step.keep(running, np.flatnonzero(fate == KEEP))

    def run(self, step: Step) -> None:
        swap = self.preemption == "swap"
        if swap and step.queue(self.swapped) is None:
            raise ValueError(f"mlfq-order: preemption=swap needs the '{self.swapped}' queue: put mlfq-swap-in "
                             "(which brings swapped jobs back) in the pipeline")
        waiting, wait_level = self._sorted(step, step.pending(self.queue))
        swapped, swap_level = self._sorted(step, step.pending(self.swapped)) if swap else (None, _NONE)
        running, run_level = self._sorted(step, step.pending(self.running))
        if running is None or (waiting is None and swapped is None):
            return
        # the jobs that want a seat, in (level, arrival) order: swapped ones and waiting ones
        parts = [(v, lv) for v, lv in ((swapped, swap_level), (waiting, wait_level)) if v is not None]
        level = np.concatenate([lv for _, lv in parts])
        arrival = np.concatenate([step.column(v, "arrival") for v, _ in parts])
        total = np.concatenate([step.column(v, "total") for v, _ in parts])
        fresh = np.concatenate([(step.state_column(v, SERVED_PREFILL.name, 0) == 0)
                                & (step.state_column(v, SERVED_DECODE.name, 0) == 0) for v, _ in parts])
        if len(parts) > 1:
            order = np.lexsort((arrival, level))
            level, total, fresh = level[order], total[order], fresh[order]
        facts = step.facts
        used = step.usage()
        run_blocks = step.column(running, "blocks")
        swappable = np.zeros(run_blocks.size, dtype=np.bool_)
        if swap:  # a job with a token in flight (async scheduling) has KV not written yet: recompute it
            cols, rows = step.source(running)
            in_flight = cols.get_or("in_flight", _NONE)
            swappable = in_flight[rows] == 0 if in_flight.size else ~swappable
        fate = mlfq_pick(run_level, run_blocks, step.column(running, "total"), swappable, level, total, fresh,
                         facts.max_seqs - used.seqs, used.free_left(facts), facts.block_size,
                         facts.host_free_blocks if swap else -1)
        if not fate.any():
            return
        ids = step.ids(running)
        step.preempt(running, "recompute", ids[fate == RECOMPUTE])
        step.preempt(running, "swap", ids[fate == SWAP])
        keep = np.flatnonzero(fate == KEEP)
        if keep.size:
            step.keep(running, ids[keep], picked=keep)


_NONE = np.zeros(0, dtype=np.int64)
