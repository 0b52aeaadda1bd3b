"""batching-efficiency: the seed's BatchingEfficiency — batch requests of similar remaining length."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np

from schedir.ir.array_step import ArrayStep
from schedir.ir.errors import PassFailure
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import RankColumn, WindowContext
from schedir.lowering.steady_layout import WINDOW_NOBODY, window_steady_lowered


_GROUP_TABLES: dict[float, np.ndarray] = {}
_TABLE_LIMIT = 1 << 22  # longer remaining lengths are grouped by the formula, not a table


def _groups_by_formula(remaining: np.ndarray, spread: float) -> np.ndarray:
    return np.floor(np.log(np.maximum(remaining, 1)) / math.log1p(spread)).astype(np.int64)


def group_table(spread: float, longest: int) -> np.ndarray:
    """The group of every remaining length 0..longest (at least), by `length_groups`' formula over
    a range, kept per spread: the pass and the window's kernel read the same groups by index."""
    table = _GROUP_TABLES.get(spread)
    if table is None or table.size <= longest:
        size = max(longest + 1, 4096, 0 if table is None else min(2 * table.size, _TABLE_LIMIT))
        table = _GROUP_TABLES[spread] = _groups_by_formula(np.arange(size), spread)
    return table


def length_groups(remaining: np.ndarray, spread: float) -> np.ndarray:
    """Group number per request: lengths in one group differ by at most a factor (1 + spread)
    (floor of log(length) / log(1 + spread), a length under 1 as 1), read from `group_table`."""
    longest = int(remaining.max()) if remaining.size else 0
    if longest >= _TABLE_LIMIT:
        return _groups_by_formula(remaining, spread)
    return group_table(spread, longest)[np.maximum(remaining, 0)]


@numba.njit(cache=True, nogil=True)
def group_lead_columns(group: np.ndarray, aged: np.ndarray, arrival_rank: np.ndarray,
                       refused: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """`_order`'s key as dense columns over a queue, in one pass: (lead, group) per request, the
    aged (0, 0), the others (1 + their group's oldest arrival rank, 1 + group - the lowest group);
    each group's lead position (its first oldest member); the group column's bound. The requests
    `refused` (reject-oversized's: not in the step's queue when this pass runs) lead no group."""
    grouped = np.empty(group.size, dtype=np.int64)
    for i in range(group.size):
        grouped[i] = -1 if refused[i] or aged[i] else group[i]
    return _lead_columns(grouped, arrival_rank)


@numba.njit(cache=True, nogil=True)
def queue_group_leads(waiting: np.ndarray, total_of: np.ndarray, computed_of: np.ndarray, arrival_of: np.ndarray,
                      table: np.ndarray, now_us: int, max_age_us: int, arrival_rank: np.ndarray,
                      refused_at: np.ndarray) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray, int]:
    """`group_lead_columns` of the waiting queue read by ids from the table's columns: each
    request's length group (`group_table`'s), whether it aged past the bound, the requests at
    positions `refused_at` refused, in one kernel (a gathering kernel, a refused mask over the
    queue and `group_lead_columns` before); (False, ...) where a length outruns the table."""
    n = waiting.size
    grouped = np.empty(n, dtype=np.int64)
    for i in range(n):
        r = waiting[i]
        left = max(total_of[r] - computed_of[r], 0)
        if left >= table.size:
            return False, grouped, grouped, grouped, 0
        grouped[i] = -1 if now_us - arrival_of[r] >= max_age_us else table[left]
    for p in refused_at:
        grouped[p] = -1
    lead_col, group_col, leads_at, bound = _lead_columns(grouped, arrival_rank)
    return True, lead_col, group_col, leads_at, bound


@numba.njit(cache=True, nogil=True)
def _lead_columns(grouped: np.ndarray, arrival_rank: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """`group_lead_columns` over each request's group, -1 for those that lead none and sort
    first (the aged, the refused)."""
    n = grouped.size
    low = np.iinfo(np.int64).max
    high = np.iinfo(np.int64).min
    for i in range(n):
        if grouped[i] >= 0:
            low = min(low, grouped[i])
            high = max(high, grouped[i])
    size = high - low + 1 if high >= low else 0
    lead = np.full(size, -1, dtype=np.int64)
    at = np.full(size, -1, dtype=np.int64)
    for i in range(n):
        if grouped[i] >= 0:
            g = grouped[i] - low
            if lead[g] < 0 or arrival_rank[i] < lead[g]:
                lead[g] = arrival_rank[i]
                at[g] = i
    lead_col = np.zeros(n, dtype=np.int64)
    group_col = np.zeros(n, dtype=np.int64)
    for i in range(n):
        if grouped[i] >= 0:
            g = grouped[i] - low
            lead_col[i] = 1 + lead[g]
            group_col[i] = 1 + g
    m = 0
    for g in range(size):
        if at[g] >= 0:
            at[m] = at[g]
            m += 1
    return lead_col, group_col, at[:m].copy(), size + 1


@dataclass(frozen=True)
class BatchingEfficiency(StepPass):
    """Order the waiting set so that requests of similar remaining length are admitted together.

    The seed's BatchingEfficiency rule: a batch whose members need about the same number of
    tokens wastes less (padding, stragglers). Remaining length is `total - computed` (the prompt
    tokens still to compute). Requests fall into geometric groups whose lengths differ by at
    most a factor `1 + spread` (the bounded variance); groups are served in the order of their
    oldest member, and within a group by arrival, so the head of the FCFS queue always leads its
    group. A request waiting longer than `max_age_ms` (by the step's clock) is not regrouped: the
    aged ones go first, in FCFS order, so no length class starves.
    """

    name: ClassVar[str] = "batching-efficiency"
    provides: ClassVar[frozenset[str]] = frozenset({"order"})
    reads_clock: ClassVar[bool] = True  # the age bound (without it the step's clock is -1: nobody ages)
    # steady decode steps: over the waiting queue: a steady step's is empty
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting"}

    spread: float = 0.5
    max_age_ms: int = 2000
    queue: str = "waiting"

    # its default steady answer lowered: its window is nobody
    steady_lowered = staticmethod(window_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (WINDOW_NOBODY,)

    def waiting_window(self, ctx: WindowContext) -> np.ndarray:
        """Each length group's oldest waiting request where admission walks a ranked head
        (`ctx.head_size`): the order of a step over part of the queue is then that of the whole
        (a group served in its oldest member's turn needs that member in the step); else nobody
        of its own (it orders what the step holds; admission declares what it picks from)."""
        if not ctx.head_size:
            return ctx.NONE
        columns = self._lead_columns(ctx)
        return ctx.NONE if columns is None else columns[2]

    def steady_state(self, ctx: WindowContext) -> dict:
        """Nothing to write and nothing to decide: a steady step admits nobody, so its order is
        moot (the group leads of `waiting_window` matter to a ranked head only)."""
        return {}

    def rank_columns(self, ctx: WindowContext) -> list[RankColumn] | None:
        """(aged first, the group's oldest arrival, the group, arrival) as dense columns, over the
        whole queue: `_order`'s key where another order pass follows (the seed's `with-all-passes`)."""
        columns = self._lead_columns(ctx)
        if columns is None:
            return None
        lead, group, _, groups = columns
        arrival = ctx.arrival_rank()
        tag = f"{self.name}-{self.spread}-{self.max_age_ms}"
        return [RankColumn(f"{tag}-lead", lead, arrival.bound + 1), RankColumn(f"{tag}-group", group, groups),  # type: ignore[union-attr]
                arrival]  # type: ignore[list-item]

    def _lead_columns(self, ctx: WindowContext) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
        """`group_lead_columns` over the waiting queue, asked once a step; None outside a runtime,
        for another queue or a spread the pass refuses."""
        if self.queue != "waiting" or ctx.column_of is None or not self.spread > 0:
            return None

        def columns() -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
            rows, column = ctx.waiting, ctx.column_of
            total, computed, arrival = column("total"), column("computed"), column("arrival")  # type: ignore[misc]
            arrival_rank = ctx.arrival_rank().values  # type: ignore[union-attr]
            ok, lead, group, leads_at, bound = queue_group_leads(
                rows, total, computed, arrival, group_table(self.spread, 4095), ctx.now_us, self.max_age_ms * 1000,
                arrival_rank, ctx.oversized)
            if ok:
                return lead, group, leads_at, bound
            # a length past the table: by arrays
            refused = np.zeros(rows.size, dtype=np.bool_)
            refused[ctx.oversized] = True
            return group_lead_columns(length_groups(total[rows] - computed[rows], self.spread),
                                      (ctx.now_us - arrival[rows]) >= self.max_age_ms * 1000, arrival_rank, refused)

        return ctx.shared(("length-group-leads", self), columns)  # type: ignore[return-value]

    array_step_when: ClassVar[dict[str, str]] = {}  # `run_arrays`: any options

    def run_arrays(self, step: ArrayStep) -> None:
        """`run` over an array step (`schedir.ir.array_step`), rule for rule."""
        self._check_spread()
        pending = step.pending(self.queue)
        if pending is None:
            return
        rows = pending.pending
        total, computed, arrival = (step.column(name)[rows] for name in ("total", "computed", "arrival"))
        step.sort(pending, self._order(total, computed, arrival, step.facts.now_us))

    def _check_spread(self) -> None:
        if not self.spread > 0:
            raise PassFailure(self.name, f"spread must be > 0, got {self.spread}")

    def _order(self, total: np.ndarray, computed: np.ndarray, arrival: np.ndarray, now_us: int) -> np.ndarray:
        """Positions in (aged first, groups led by their oldest, arrival) order."""
        if not total.size:
            return np.zeros(0, dtype=np.int64)
        aged = (now_us - arrival) >= self.max_age_ms * 1000  # the aged are one group, first, FCFS
        # each group's oldest arrival and the group, as dense columns (the aged (0, 0)): the kernel
        # the composed rank reads, over arrivals counted from the earliest
        lead, group, _, _ = group_lead_columns(length_groups(total - computed, self.spread), aged,
                                               arrival - arrival.min(), np.zeros(total.size, dtype=np.bool_))
        return np.lexsort((arrival, group, lead))

    def run(self, step: Step) -> None:
        self._check_spread()
        pending = step.pending(self.queue)
        if pending is None:
            return
        ids = step.ids(pending)
        total, computed, arrival = step.columns(pending, ("total", "computed", "arrival"))
        order = self._order(total, computed, arrival, step.facts.now_us)
        step.sort(pending, ("aged", "length_group", "arrival"), ids[order], picked=order)
