"""route-cache-balance: the SGLang router's cache-aware + load-balance rule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba as nb
import numpy as np

from schedir.dialects.codes import Why
from schedir.ir.route_pass import RoutePass
from schedir.ir.route_step import RouteView, positions
from schedir.lowering import route_state as rs
from schedir.passes.route_kernels import cache_balance_kernel

_CACHE, _LEAST_LOAD = int(Why.CACHE), int(Why.LEAST_LOAD)


@nb.njit(cache=True)
def cache_balance_lowered(F, A, P, S, o) -> None:  # noqa: ANN001
    """`RouteCacheBalance.run` inside the routing program (the fleet's `digest_blocks` as the trees)."""
    rows = rs.pending(S)
    if rows.size == 0:
        return
    hits = S[2][rows]
    pick, by_cache = cache_balance_kernel(hits, A[rs.A_PROMPT][rows], rs.load(F, S), F[rs.F_DIGEST_BLOCKS].copy(),
                                          rs.role_is(F, rs.ROLE_BOTH), int(o[0]), o[1], o[2], o[3])
    rs.route_picks(F, A, S, rows, hits, pick, by_cache, _CACHE, _LEAST_LOAD)


@dataclass(frozen=True)
class RouteCacheBalance(RoutePass):
    """Route by prefix match while the fleet is balanced, to the shortest queue when it is not.

    The SGLang router's `cache_aware` policy (sgl-project/sglang, sgl-router
    src/policies/cache_aware.rs, header comment; options documented in its
    `launch_router --help` and in lightseekorg/smg docs/getting-started/load-balancing.md,
    whose defaults are used here): the fleet is imbalanced when max load - min load >
    `balance-abs-threshold` and max load > `balance-rel-threshold` x min load; then the least
    loaded instance wins. Otherwise the instance with the best prefix match wins if its
    match rate (matched / prompt tokens) exceeds `cache-threshold`, else the instance with the
    smallest tree: the fewest prefix blocks in its digest (the fleet's `digest_blocks` column
    when present, else the pairs of `cluster.digest`), ties to the least loaded. Load is
    requests queued and running."""

    name: ClassVar[str] = "route-cache-balance"
    provides: ClassVar[frozenset[str]] = frozenset({"routed"})

    cache_threshold: float = 0.3
    balance_abs_threshold: float = 64.0
    balance_rel_threshold: float = 1.5
    block_tokens: int = 512

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache-threshold must lie in [0, 1], got {self.cache_threshold}")
        if self.block_tokens < 1:
            raise ValueError(f"block-tokens must be positive, got {self.block_tokens}")

    lowered = staticmethod(cache_balance_lowered)

    def lowered_options(self) -> tuple[float, ...]:
        return (self.block_tokens, self.cache_threshold, self.balance_abs_threshold, self.balance_rel_threshold)

    def run(self, route: RouteView) -> None:
        rows = route.pending()
        if rows.size == 0:
            return
        hits = np.ascontiguousarray(route.prefix_hits()[rows])
        pick, by_cache = cache_balance_kernel(hits, route.arrival_col("prompt")[rows], route.load(),
                                              tree_sizes(route), route.serves_whole(),
                                              self.block_tokens, self.cache_threshold,
                                              self.balance_abs_threshold, self.balance_rel_threshold)
        ok = pick >= 0
        why = np.where(by_cache[ok] == 1, int(Why.CACHE), int(Why.LEAST_LOAD))
        route.route(rows[ok], pick[ok], why, hit_blocks=hits[ok, pick[ok]] if ok.any() else None)


def tree_sizes(route: RouteView) -> np.ndarray:
    """Prefix blocks each instance caches: the fleet's `digest_blocks`, else its digest pairs."""
    if route.has_fleet_col("digest_blocks"):
        return route.fleet_col("digest_blocks").copy()
    m = route.num_instances
    held = route.digest_ids()
    if held.size == 0:
        return np.zeros(m, dtype=np.int64)
    rows = positions(route.fleet_col("id"), held)
    return np.bincount(rows, minlength=m).astype(np.int64)
