"""`RoutePass`: a routing pass over `cluster.route_step` IR, with its declared dependencies.

The cluster dialect's counterpart of `StepPass`, and a `StepPass` itself, so one registry,
one pipeline parser, one dependency check and `schedir passes` serve both: a pass is a
frozen dataclass whose fields are its options (`route-cache-aware{hit-threshold=0.5}`),
with `requires` / `provides` / `invalidates` facts. It differs in what it runs on: a
`RouteStep` view of each `cluster.route_step` of the input, never a `sched.step`. The pass
manager refuses a pipeline that mixes the two kinds on one input.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from schedir.ir.pass_base import StepPass
from schedir.ir.route_step import RouteStep, RouteView, route_steps_of


@dataclass(frozen=True)
class RoutePass(StepPass):
    """Base of every routing pass: override `run(route)`."""

    queue_options: ClassVar[tuple[str, ...]] = ()
    over: ClassVar[str] = "cluster.route_step"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for step_op in route_steps_of(op):
            self.run(RouteStep(step_op))

    @abstractmethod
    def run(self, route: RouteView) -> None:  # type: ignore[override]
        """Read the fleet and the pending arrivals, append this pass's decisions: through the
        `RouteView` interface only, which the IR (`RouteStep`) and plain arrays (`RouteArrays`,
        the fleet simulator's routing) both give, with the same decisions (tested)."""
