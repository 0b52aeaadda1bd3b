"""batching-efficiency: the seed's BatchingEfficiency — batch requests of similar remaining length."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.ir.array_step import ArrayStep
from schedir.ir.errors import PassFailure
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import WINDOW_NOBODY, window_steady_lowered


def length_groups(remaining: np.ndarray, spread: float) -> np.ndarray:
    """Group number per request: lengths in one group differ by at most a factor (1 + spread)."""
    return np.floor(np.log(np.maximum(remaining, 1)) / math.log1p(spread)).astype(np.int64)


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
        """Nobody of its own: it orders what the step holds (admission declares what it picks from)."""
        return ctx.NONE

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
        group = length_groups(total - computed, self.spread)
        aged = (now_us - arrival) >= self.max_age_ms * 1000
        group = np.where(aged, -1, group)  # the aged are one group, first, FCFS
        uniq, inverse = np.unique(group, return_inverse=True)
        lead = np.full(uniq.size, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(lead, inverse, arrival)
        lead = np.where(uniq == -1, np.iinfo(np.int64).min, lead)
        return np.lexsort((arrival, inverse, lead[inverse])) if total.size else np.zeros(0, dtype=np.int64)

    def run(self, step: Step) -> None:
        self._check_spread()
        pending = step.pending(self.queue)
        if pending is None:
            return
        ids = step.ids(pending)
        total, computed, arrival = step.columns(pending, ("total", "computed", "arrival"))
        order = self._order(total, computed, arrival, step.facts.now_us)
        step.sort(pending, ("aged", "length_group", "arrival"), ids[order], picked=order)
