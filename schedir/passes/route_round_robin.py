"""route-round-robin: each request to the next instance in turn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba as nb
import numpy as np

from schedir.dialects.codes import Why
from schedir.ir.route_pass import RoutePass
from schedir.ir.route_step import RouteView
from schedir.lowering import route_state as rs

_WHY = int(Why.ROUND_ROBIN)


@nb.njit(cache=True)
def round_robin_lowered(F, A, P, S, o) -> None:  # noqa: ANN001
    """`RouteRoundRobin.run` inside the routing program (`schedir.lowering.route_program`)."""
    rows = rs.pending(S)
    eligible = np.flatnonzero(rs.role_is(F, rs.ROLE_BOTH))
    if rows.size == 0 or eligible.size == 0:
        return
    inst = eligible[A[rs.A_ID][rows] % eligible.size]
    rs.route(F, A, S, rows, inst, np.full(rows.size, _WHY, np.int64), inst, rs.hits_at(S, rows, inst))


@dataclass(frozen=True)
class RouteRoundRobin(RoutePass):
    """Route each pending request to the next instance in turn (request id modulo the instances).

    Request ids are issued in arrival order, so `id mod n` over the instances serving whole
    requests is the turn order, with no router state outside the IR: a dumped step re-runs
    to the same decisions."""

    name: ClassVar[str] = "route-round-robin"
    provides: ClassVar[frozenset[str]] = frozenset({"routed"})

    lowered = staticmethod(round_robin_lowered)

    def lowered_options(self) -> tuple[float, ...]:
        return ()

    def run(self, route: RouteView) -> None:
        rows = route.pending()
        eligible = np.flatnonzero(route.serves_whole())
        if rows.size == 0 or eligible.size == 0:
            return
        ids = route.arrival_col("id")[rows]
        route.route(rows, eligible[ids % eligible.size], Why.ROUND_ROBIN)
