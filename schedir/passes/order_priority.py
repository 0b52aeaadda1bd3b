"""order-priority: the most urgent first (lower priority value), then first come."""

from __future__ import annotations

import numpy as np

from dataclasses import dataclass
from typing import ClassVar

from schedir.ir.array_step import ArrayStep
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import WINDOW_NOBODY, window_steady_lowered
from schedir.passes.ordering import sort_arrays_by_columns, sort_by_columns


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

    def run_arrays(self, step: ArrayStep) -> None:
        """`run` over an array step (`schedir.ir.array_step`)."""
        pending = step.pending(self.queue)
        if pending is not None:
            sort_arrays_by_columns(step, pending, ("priority", "arrival"))

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is not None:
            sort_by_columns(step, pending, ("priority", "arrival"))
