"""order-fcfs: first come, first served."""

from __future__ import annotations

import numpy as np

from dataclasses import dataclass
from typing import ClassVar

from schedir.ir.array_step import ArrayStep
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import RankColumn, WindowContext
from schedir.lowering.steady_layout import WINDOW_NOBODY, window_steady_lowered
from schedir.passes.ordering import sort_arrays_by_columns, sort_by_columns


@dataclass(frozen=True)
class OrderFcfs(StepPass):
    """Order a queue by arrival time (ties keep queue order)."""

    name: ClassVar[str] = "order-fcfs"
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
        """Arrival, as `run` sorts the waiting queue (a ranked window for admission's walk: the
        runtime builds a step under a long queue over the head of this order, `schedir.ir.window`)."""
        if self.queue != "waiting" or ctx.column_of is None:
            return None
        return ctx.shared(("fcfs-rank", self), lambda: (ctx.column_of("arrival")[ctx.waiting],  # type: ignore[return-value]
                                                        ctx.column_of("arrival")[ctx.swapped]))

    def rank_columns(self, ctx: WindowContext) -> list[RankColumn] | None:
        """Arrival (its dense rank): the key's column where another order pass follows."""
        arrival = ctx.arrival_rank() if self.queue == "waiting" else None
        return None if arrival is None else [arrival]

    def run_arrays(self, step: ArrayStep) -> None:
        """`run` over an array step (`schedir.ir.array_step`)."""
        pending = step.pending(self.queue)
        if pending is not None:
            sort_arrays_by_columns(step, pending, ("arrival",))

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is not None:
            sort_by_columns(step, pending, ("arrival",))
