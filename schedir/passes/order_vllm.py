"""order-vllm: vLLM's waiting order — its FCFS deque, or its priority heap."""

from __future__ import annotations

import numpy as np

from dataclasses import dataclass
from typing import ClassVar

from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import WINDOW_NOBODY, window_steady_lowered
from schedir.passes.ordering import sort_by_columns


@dataclass(frozen=True)
class OrderVllm(StepPass):
    """Order the waiting queue as vLLM 0.32 does under the step's policy.

    FCFS is vLLM's deque: arrival order, except that a preempted request goes
    back to the *front* (the runtime's `queued` column is that position).
    Priority is vLLM's heap: lower priority value first, then arrival time,
    then request id (`rank`: the id's place in string order).
    """

    name: ClassVar[str] = "order-vllm"
    # steady decode steps: over the waiting queue: a steady step's is empty
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting"}
    # running steps: an empty waiting queue leaves it nothing to order
    running_step_when: ClassVar[dict[str, str]] = {"queue": "waiting"}
    provides: ClassVar[frozenset[str]] = frozenset({"order"})

    queue: str = "waiting"
    # its default steady answer lowered: its window is nobody
    steady_lowered = staticmethod(window_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (WINDOW_NOBODY,)

    def waiting_window(self, ctx: WindowContext) -> np.ndarray:
        """Nobody of its own: it orders what the step holds (admission declares what it picks from)."""
        return ctx.NONE

    def waiting_rank(self, ctx: WindowContext) -> tuple[np.ndarray, np.ndarray] | None:
        """Under FCFS the deque's place (`queued`), as `run` sorts the waiting queue: v0's prefill
        loops name the head of it they can reach (`schedir.ir.window`). None under priority."""
        if self.queue != "waiting" or ctx.column_of is None or ctx.policy != "fcfs":
            return None
        queued = ctx.column_of("queued")
        return ctx.shared(("vllm-fcfs-rank", self), lambda: (queued[ctx.waiting], queued[ctx.swapped]))  # type: ignore[return-value]

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        if step.facts.policy == "priority":
            sort_by_columns(step, pending, ("priority", "arrival", "rank"))
        else:
            sort_by_columns(step, pending, ("queued",))
