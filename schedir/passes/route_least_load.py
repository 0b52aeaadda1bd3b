"""route-least-load: each request to the least loaded instance."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba as nb
import numpy as np

from schedir.dialects.codes import Why
from schedir.ir.route_pass import RoutePass
from schedir.ir.route_step import RouteView
from schedir.lowering import route_state as rs
from schedir.passes.route_kernels import least_load_kernel

_WHY = int(Why.LEAST_LOAD)


@nb.njit(cache=True)
def least_load_lowered(F, A, P, S, o) -> None:  # noqa: ANN001
    """`RouteLeastLoad.run` inside the routing program (`schedir.lowering.route_program`)."""
    rows = rs.pending(S)
    if rows.size == 0:
        return
    pick = least_load_kernel(rs.load(F, S), rs.role_is(F, rs.ROLE_BOTH), rows.size)
    ok = pick >= 0
    rows, pick = rows[ok], pick[ok]
    rs.route(F, A, S, rows, pick, np.full(rows.size, _WHY, np.int64), pick, rs.hits_at(S, rows, pick))


@dataclass(frozen=True)
class RouteLeastLoad(RoutePass):
    """Route each pending request to the instance with the fewest requests queued and running.

    Requests of one step are placed in arrival order, each adding to its instance's load
    before the next is placed (ties: the lowest instance row)."""

    name: ClassVar[str] = "route-least-load"
    provides: ClassVar[frozenset[str]] = frozenset({"routed"})

    lowered = staticmethod(least_load_lowered)

    def lowered_options(self) -> tuple[float, ...]:
        return ()

    def run(self, route: RouteView) -> None:
        rows = route.pending()
        if rows.size == 0:
            return
        pick = least_load_kernel(route.load(), route.serves_whole(), rows.size)
        ok = pick >= 0
        route.route(rows[ok], pick[ok], Why.LEAST_LOAD)
