"""route-cache-aware: Mooncake Conductor's cache-aware choice with a load check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba as nb
import numpy as np

from schedir.dialects.codes import Why
from schedir.ir.route_pass import RoutePass
from schedir.ir.route_step import RouteView
from schedir.lowering import route_state as rs
from schedir.passes.route_kernels import cache_aware_kernel

_CACHE, _LEAST_LOAD = int(Why.CACHE), int(Why.LEAST_LOAD)


@nb.njit(cache=True)
def cache_aware_lowered(F, A, P, S, o) -> None:  # noqa: ANN001
    """`RouteCacheAware.run` inside the routing program; `o` = its `lowered_options`."""
    rows = rs.pending(S)
    if rows.size == 0:
        return
    hits = S[2][rows]
    pick, by_cache = cache_aware_kernel(hits, A[rs.A_PROMPT][rows], rs.load(F, S), rs.role_is(F, rs.ROLE_BOTH),
                                        int(o[0]), o[1], o[2], o[3])
    rs.route_picks(F, A, S, rows, hits, pick, by_cache, _CACHE, _LEAST_LOAD)


@dataclass(frozen=True)
class RouteCacheAware(RoutePass):
    """Route to the instance caching the longest prefix, unless the hit is small or it is overloaded.

    Mooncake (FAST '25, section 5, the Conductor): per request, find the instance whose
    advertised cache holds the longest prefix of the request's block chain; take it when that
    prefix covers at least `hit-threshold` of the prompt and the instance is not overloaded
    (load <= `overload-ratio` x the least load + `overload-slack`), else the least loaded
    instance. Load is requests queued and running, plus those routed earlier in the step."""

    name: ClassVar[str] = "route-cache-aware"
    provides: ClassVar[frozenset[str]] = frozenset({"routed"})

    hit_threshold: float = 0.25
    overload_ratio: float = 1.5
    overload_slack: float = 8.0
    block_tokens: int = 512  # tokens per prefix hash

    def __post_init__(self) -> None:
        if not 0.0 <= self.hit_threshold <= 1.0:
            raise ValueError(f"hit-threshold must lie in [0, 1], got {self.hit_threshold}")
        if self.block_tokens < 1:
            raise ValueError(f"block-tokens must be positive, got {self.block_tokens}")

    lowered = staticmethod(cache_aware_lowered)

    def lowered_options(self) -> tuple[float, ...]:
        return (self.block_tokens, self.hit_threshold, self.overload_ratio, self.overload_slack)

    def run(self, route: RouteView) -> None:
        rows = route.pending()
        if rows.size == 0:
            return
        hits = np.ascontiguousarray(route.prefix_hits()[rows])
        pick, by_cache = cache_aware_kernel(hits, route.arrival_col("prompt")[rows], route.load(),
                                            route.serves_whole(), self.block_tokens, self.hit_threshold,
                                            self.overload_ratio, self.overload_slack)
        ok = pick >= 0
        why = np.where(by_cache[ok] == 1, int(Why.CACHE), int(Why.LEAST_LOAD))
        route.route(rows[ok], pick[ok], why, hit_blocks=hits[ok, pick[ok]] if ok.any() else None)
