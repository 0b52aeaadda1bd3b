"""memory-aware-preemption: the seed's MemoryAwarePreemption — pause low-priority decodes for an urgent prefill."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np

from schedir.ir.array_step import ArrayStep
from schedir.ir.errors import PassFailure
from schedir.ir.pass_base import StepPass
from schedir.ir.state import RequestState
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import ASK_IR, MEMO_SET, SC_BLOCK_SIZE, SC_FREE_BLOCKS, SC_STEP, WROTE

SEEN_COMPUTED = RequestState("map_seen_computed", default=-1,
                             doc="computed tokens when memory-aware-preemption last looked (-1: never)")
LAST_RUN = RequestState("map_last_run", default=-1, doc="step the request last ran in (-1: not yet); LRU victims")

VICTIM_POLICIES = ("lowest-priority", "least-progress", "lru")


def victim_order(policy: str, priority: np.ndarray, arrival: np.ndarray, progress: np.ndarray,
                 last_run: np.ndarray) -> np.ndarray:
    """Positions of the candidates, first victim first (ties: the latest arrival goes first)."""
    if policy == "lowest-priority":
        return np.lexsort((-arrival, -priority))  # largest priority value, then the newest
    if policy == "least-progress":
        return np.lexsort((-arrival, progress))  # fewest generated tokens: the least work lost
    return np.lexsort((-arrival, last_run))  # least recently run first


def _ran(computed: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """Which requests ran in the previous step: their computed count grew since the pass last looked."""
    return (computed > seen) & (seen >= 0) | ((seen < 0) & (computed > 0))


@numba.njit(cache=True, nogil=True)
def steady_tracking(running: np.ndarray, most_urgent: int, computed: np.ndarray, prompt: np.ndarray,
                    priority: np.ndarray, seen: np.ndarray, last: np.ndarray,
                    step: int) -> tuple[bool, np.ndarray, np.ndarray]:
    """A steady step's answer in one pass over whole-table views indexed by row id: (whether a
    running decode is less urgent than `most_urgent`, the waiting queue's least priority value,
    so that the pass could preempt; computed now and last run per running request: `_track`'s
    writes, its `_ran` rule)."""
    n = running.size
    now = np.empty(n, dtype=np.int64)
    last_run = np.empty(n, dtype=np.int64)
    least_urgent = np.iinfo(np.int64).min
    for i in range(n):
        r = running[i]
        c, s = computed[r], seen[r]
        now[i] = c
        last_run[i] = step - 1 if (c > s and s >= 0) or (s < 0 and c > 0) else last[r]
        if c >= prompt[r] and priority[r] > least_urgent:
            least_urgent = priority[r]
    return least_urgent > most_urgent, now, last_run


@numba.njit(cache=True, nogil=True)
def map_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, order, rows, w, m, over) -> int:  # noqa: ANN001
    """`MemoryAwarePreemption.steady_state` in the steady program (`schedir.lowering.steady_program`):
    the queue's most urgent priority value and the blocks its tokens fill kept in the memo while it
    stays as it is (`waiting_urgency_and_blocks`); the batch's computed tokens and last run into
    `rows[w]`, `rows[w + 1]` (`steady_tracking`), or the IR when a waiting request could be short."""
    priority, total, bs = D[int(o[2])], D[int(o[3])], sc[SC_BLOCK_SIZE]
    if m[MEMO_SET] == 0:
        m[1], m[2] = waiting_urgency_and_blocks(waiting, priority, total, bs)
        m[MEMO_SET] = 1
    urgent, now, last = steady_tracking(running, m[1], D[int(o[0])], D[int(o[1])], priority, ST[int(o[4])],
                                        ST[int(o[5])], sc[SC_STEP])
    if urgent:  # it could preempt: only if some waiting request is short of blocks
        growth = 0
        for r in running:
            growth += max(-(-total[r] // bs) - np.int64(NB[r]), 0)
        if m[2] > sc[SC_FREE_BLOCKS] - growth:
            return ASK_IR
    rows[w, :] = now
    rows[w + 1, :] = last
    return WROTE


@numba.njit(cache=True, nogil=True)
def waiting_urgency_and_blocks(waiting: np.ndarray, priority: np.ndarray, total: np.ndarray,
                               block_size: int) -> tuple[int, int]:
    """(the waiting queue's most urgent priority value, the blocks its requests' tokens fill), the
    columns by request id: what a steady step reads of the queue, held while the queue stays as
    it is (`WindowContext.queued`; the steady program's memo row)."""
    most_urgent, need = np.iinfo(np.int64).max, 0
    for r in waiting:
        most_urgent = min(most_urgent, priority[r])
        need += -(-total[r] // block_size)
    return most_urgent, need


def _less_urgent_running(running_priority: np.ndarray, most_urgent: int) -> bool:
    """Whether some running request is less urgent than the most urgent waiting one: else no
    request can be a victim (`_victims` takes only decodes less urgent than the request short of
    blocks), so the pass preempts nobody (its window names nobody; its step skips the search)."""
    return bool(running_priority.size) and int(running_priority.max()) > most_urgent


def blocks_for(tokens: np.ndarray, block_size: int) -> np.ndarray:
    return -(-tokens // block_size)


@dataclass(frozen=True)
class MemoryAwarePreemption(StepPass):
    """When an urgent waiting prefill cannot get blocks, preempt (recompute) less urgent decodes.

    The seed's MemoryAwarePreemption rule. Walking the waiting set in its order, the first
    request whose blocks (prompt minus prefix hit) do not fit in what is free, after the running
    requests' own growth this step, is the candidate. If the running decodes strictly less urgent
    than it (a larger priority value) hold enough blocks to cover the shortfall, the fewest of
    them are preempted, chosen by `victim`:
    - `lowest-priority`: the largest priority value first;
    - `least-progress`: the fewest generated tokens first (the least recompute lost);
    - `lru`: the one that ran least recently first. When a request last ran persists across
      steps as declared request state (`map_last_run`, with `map_seen_computed`: a request whose
      computed count grew since the pass last looked ran in the previous step).
    Otherwise nobody is preempted (pausing decodes that cannot make room only loses work). The
    victims' blocks return to the pool when the step is lowered, so the prefill is admitted from
    the next step on, ahead of its victims if the order is by priority (`priority-based`).
    """

    name: ClassVar[str] = "memory-aware-preemption"
    requires: ClassVar[frozenset[str]] = frozenset({"order"})
    request_state: ClassVar[tuple[RequestState, ...]] = (SEEN_COMPUTED, LAST_RUN)

    # steady decode steps: it preempts nobody then (`steady_state`), and writes when each ran
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting", "running": "running"}

    victim: str = "lowest-priority"
    queue: str = "waiting"
    running: str = "running"

    steady_lowered = staticmethod(map_steady_lowered)
    steady_lowered_writes = (SEEN_COMPUTED.name, LAST_RUN.name)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (layout.column("computed"), layout.column("prompt"), layout.column("priority"), layout.column("total"),
                layout.state(SEEN_COMPUTED.name), layout.state(LAST_RUN.name))

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """Nobody where it can preempt nobody: no running request is less urgent than the most
        urgent waiting one (a victim must be). Else it may free seats (`frees_seats`: admission
        then walks a ranked head, checked after the step) and needs the first waiting request
        short of blocks in the step's order (the one it preempts for): under a rank (`ctx.rank`)
        whose head (`ctx.head_size` first) already needs more blocks than are free, that head,
        which the step holds ahead of the rest in this order. Else None: the whole queue."""
        if (self.queue, self.running) != ("waiting", "running") or ctx.column_of is None:
            return None
        if not ctx.waiting.size:
            return ctx.NONE
        priority = ctx.column_of("priority")
        most_urgent, _ = self._urgency_and_blocks(ctx)
        if not _less_urgent_running(priority[ctx.running], most_urgent):
            return ctx.NONE
        ctx.frees_seats()  # its victims' seats: admission then walks a ranked head, checked after the step
        if ctx.rank is None or ctx.prefix_hit is None or not ctx.head_size or ctx.waiting.size <= ctx.head_size:
            return None
        head = ctx.first_by_rank(ctx.rank[0], ctx.head_size)
        if head is None:  # (a partial rank placed fewer)
            return None
        if ctx.oversized.size:  # refused before this pass: not in the step's queue
            head = head[~np.isin(head, ctx.oversized)]
        ids = ctx.waiting[head]
        bs = ctx.block_size
        need = int((blocks_for(ctx.column_of("total")[ids], bs) - ctx.prefix_hit(ids) // bs).sum())
        return head if need > ctx.free_blocks - ctx.running_growth(False) else None

    @staticmethod
    def _urgency_and_blocks(ctx: WindowContext) -> tuple[int, int]:
        """`waiting_urgency_and_blocks` over the queue, held while it stays as it is
        (`WindowContext.queued`): the window and a steady step read it alike."""
        return ctx.queued(  # type: ignore[return-value]
            "memory-aware-preemption-urgency-blocks",
            lambda: waiting_urgency_and_blocks(ctx.waiting, ctx.column_of("priority"), ctx.column_of("total"),
                                               ctx.block_size))

    def steady_state(self, ctx: WindowContext) -> dict[str, np.ndarray] | None:
        """What a steady step writes: when each running request last ran (`_track`'s rule), when
        it can preempt nobody: no running decode is less urgent than the most urgent waiting
        request, or the whole waiting queue's blocks, prefix hits aside, fit beside the running
        requests' growth (so no request is short). Else None: the IR decides."""
        running = ctx.running
        priority = ctx.column_of("priority")
        most_urgent, need = self._urgency_and_blocks(ctx)  # the queue's part: held across steady steps
        urgent, now, last = steady_tracking(running, most_urgent, ctx.column_of("computed"), ctx.column_of("prompt"),
                                            priority, ctx.state_of(SEEN_COMPUTED.name), ctx.state_of(LAST_RUN.name),
                                            ctx.step)
        if urgent:  # it could preempt: only if some waiting request is short of blocks
            if need > ctx.free_blocks - ctx.running_growth(False):
                return None
        return {SEEN_COMPUTED.name: now, LAST_RUN.name: last}

    array_step_when: ClassVar[dict[str, str]] = {}  # `run_arrays`: any options

    def run_arrays(self, step: ArrayStep) -> None:
        """`run` over an array step (`schedir.ir.array_step`), rule for rule."""
        self._check_victim()
        running = step.pending(self.running)
        if running is None:
            return
        rows = running.pending
        computed = step.column("computed")[rows]
        last_run = np.where(_ran(computed, step.state(SEEN_COMPUTED.name)[rows]), step.facts.step - 1,
                            step.state(LAST_RUN.name)[rows])
        step.set_state(rows, map_seen_computed=computed, map_last_run=last_run)
        waiting = step.pending(self.queue)
        if waiting is None:
            return
        w_rows = waiting.pending
        priority = step.column("priority")
        if not w_rows.size or not _less_urgent_running(priority[rows], int(priority[w_rows].min())):
            return
        hit, _ = step.prefix_hits(waiting)
        chosen = self._victims(step.facts.block_size, step.free_left(), last_run,
                               *(step.column(name)[rows] for name in
                                 ("total", "computed", "blocks", "prompt", "priority", "arrival")),
                               step.column("total")[w_rows], step.column("priority")[w_rows], hit)
        if chosen is None:
            return
        step.preempt(running, "recompute", rows[chosen])
        step.set_state(rows[chosen], map_seen_computed=np.full(chosen.size, -1, dtype=np.int64))
        step.keep(running, np.setdiff1d(np.arange(rows.size), chosen))

    def _check_victim(self) -> None:
        if self.victim not in VICTIM_POLICIES:
            raise PassFailure(self.name, f"victim must be one of {', '.join(VICTIM_POLICIES)}, got {self.victim!r}")

    def _victims(self, bs: int, free_left: int, last_run: np.ndarray, total: np.ndarray, computed: np.ndarray,
                 blocks: np.ndarray, prompt: np.ndarray, priority: np.ndarray, arrival: np.ndarray,
                 w_total: np.ndarray, w_priority: np.ndarray, hit: np.ndarray) -> np.ndarray | None:
        """Positions of the running requests to preempt for the first waiting prefill the free
        blocks cannot hold (the running ones' growth kept for them), by the victim policy among the
        decoding ones less urgent than it; None when none is short or no victims cover it."""
        growth = np.maximum(blocks_for(total, bs) - blocks, 0)
        need = np.cumsum(blocks_for(w_total, bs) - hit // bs)
        free = free_left - int(growth.sum())
        short = np.flatnonzero(need > free)
        if not short.size:
            return None
        first = short[0]
        shortfall = int(need[first]) - free
        decoding = computed >= prompt
        eligible = np.flatnonzero(decoding & (priority > w_priority[first]))
        if not eligible.size:
            return None
        order = eligible[victim_order(self.victim, priority[eligible], arrival[eligible],
                                      computed[eligible] - prompt[eligible], last_run[eligible])]
        gain = np.cumsum(blocks[order] + growth[order])
        enough = np.flatnonzero(gain >= shortfall)
        if not enough.size:
            return None
        return order[: enough[0] + 1]

    def run(self, step: Step) -> None:
        self._check_victim()
        running = step.pending(self.running)
        if running is None:
            return
        last_run = self._track(step, running)
        waiting = step.pending(self.queue)
        if waiting is None:
            return
        w_priority = step.column(waiting, "priority")
        if not w_priority.size or not _less_urgent_running(step.column(running, "priority"), int(w_priority.min())):
            return
        hit, _ = step.prefix_hits(waiting)
        chosen = self._victims(step.facts.block_size, step.usage().free_left(step.facts), last_run,
                               *step.columns(running, ("total", "computed", "blocks", "prompt", "priority", "arrival")),
                               *step.columns(waiting, ("total", "priority")), hit)
        if chosen is None:
            return
        ids = step.ids(running)
        step.preempt(running, "recompute", ids[chosen])
        step.set_request_state(running, ids[chosen], map_seen_computed=np.full(chosen.size, -1, dtype=np.int64))
        keep = np.setdiff1d(np.arange(ids.size), chosen)
        step.keep(running, ids[keep], picked=keep)

    def _track(self, step: Step, running) -> np.ndarray:
        """Update when each running request last ran (its computed count grew since last step)."""
        ids = step.ids(running)
        computed = step.column(running, "computed")
        seen = step.state_column(running, SEEN_COMPUTED.name, SEEN_COMPUTED.default)
        last = step.state_column(running, LAST_RUN.name, LAST_RUN.default)
        last = np.where(_ran(computed, seen), step.facts.step - 1, last)
        step.set_request_state(running, ids, map_seen_computed=computed, map_last_run=last)
        return last
