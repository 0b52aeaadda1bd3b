"""route-least-load: each request to the least loaded instance."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from schedir.dialects.codes import Why
from schedir.ir.route_pass import RoutePass
from schedir.ir.route_step import RouteView
from schedir.passes.route_kernels import least_load_kernel


@dataclass(frozen=True)
class RouteLeastLoad(RoutePass):
    """Route each pending request to the instance with the fewest requests queued and running.

    Requests of one step are placed in arrival order, each adding to its instance's load
    before the next is placed (ties: the lowest instance row)."""

    name: ClassVar[str] = "route-least-load"
    provides: ClassVar[frozenset[str]] = frozenset({"routed"})

    def run(self, route: RouteView) -> None:
        rows = route.pending()
        if rows.size == 0:
            return
        pick = least_load_kernel(route.load(), route.serves_whole(), rows.size)
        ok = pick >= 0
        route.route(rows[ok], pick[ok], Why.LEAST_LOAD)
