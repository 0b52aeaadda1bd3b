"""priority-based: the seed's PriorityBased pass — most urgent first, then first come."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.passes.ordering import sort_by_columns


@dataclass(frozen=True)
class PriorityBased(StepPass):
    """Order a queue by priority (lower value more urgent), ties by arrival (the seed's PriorityBased).

    The seed's rule is the same as `order-priority`; it is its own pass so that seed pipelines
    (`with-all-passes`) read as the seed wrote them, and so that it can follow another order pass:
    the sort is stable, so requests equal on priority and arrival keep the earlier order.
    """

    name: ClassVar[str] = "priority-based"
    provides: ClassVar[frozenset[str]] = frozenset({"order"})

    queue: str = "waiting"

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is not None:
            sort_by_columns(step, pending, ("priority", "arrival"))
