"""order-priority: the most urgent first (lower priority value), then first come."""

from __future__ import annotations

import numpy as np

from dataclasses import dataclass
from typing import ClassVar

from schedir.ir.array_step import ArrayStep
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import RankColumn, WindowContext, above_least
from schedir.lowering.steady_layout import WINDOW_NOBODY, window_steady_lowered
from schedir.passes.ordering import sort_arrays_by_columns, sort_by_columns, then_arrival_keys


def priority_keys(priority: np.ndarray, arrival: np.ndarray, waiting: np.ndarray,
                  swapped: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Rank keys `(priority - lowest) << 47 | arrival` of the waiting and swapped rows (by row
    id), or None when the priorities span 2**15 or more or an arrival does not fit 47 bits."""
    rows = np.concatenate([waiting, swapped]) if swapped.size else waiting
    keys = then_arrival_keys(priority[rows], arrival[rows])
    if keys is None:
        return None
    return keys[:waiting.size], keys[waiting.size:]


@dataclass(frozen=True)
class OrderPriority(StepPass):
    """Order a queue by priority (lower value first), then by arrival time."""

    name: ClassVar[str] = "order-priority"
    # steady decode steps: over the waiting queue: a steady step's is empty
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting"}
    provides: ClassVar[frozenset[str]] = frozenset({"order"})

    queue: str = "waiting"

    # its default steady answer lowered: its window is nobody
    steady_lowered = staticmethod(window_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (WINDOW_NOBODY,)

    def waiting_window(self, ctx: WindowContext) -> np.ndarray:
        """Nobody of its own: it orders what the step holds (admission declares what it picks from)."""
        return ctx.NONE

    array_step_when: ClassVar[dict[str, str]] = {}  # `run_arrays`: any queue

    def waiting_rank(self, ctx: WindowContext) -> tuple[np.ndarray, np.ndarray] | None:
        """(priority, arrival) as one key, as `run` sorts the waiting queue (a ranked window for
        admission's walk, `schedir.ir.window`); None where the priorities or arrivals do not fit it."""
        if self.queue != "waiting" or ctx.column_of is None:
            return None
        return ctx.shared(("priority-rank", self), lambda: priority_keys(  # type: ignore[return-value]
            ctx.column_of("priority"), ctx.column_of("arrival"), ctx.waiting, ctx.swapped))

    def rank_columns(self, ctx: WindowContext) -> list[RankColumn] | None:
        """(priority above the queue's lowest, arrival's dense rank): the key's columns where
        another order pass follows or precedes it (the seed's `with-all-passes`)."""
        arrival = ctx.arrival_rank() if self.queue == "waiting" else None
        if arrival is None:
            return None
        priority, span = above_least(ctx.column_of("priority"), ctx.waiting)  # type: ignore[misc]
        return [RankColumn("priority", priority, span), arrival]

    def run_arrays(self, step: ArrayStep) -> None:
        """`run` over an array step (`schedir.ir.array_step`)."""
        pending = step.pending(self.queue)
        if pending is not None:
            sort_arrays_by_columns(step, pending, ("priority", "arrival"))

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is not None:
            sort_by_columns(step, pending, ("priority", "arrival"))
