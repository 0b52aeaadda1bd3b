"""topology-distance: pull a longer cached prefix from a nearby instance when moving beats recomputing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba as nb
import numpy as np

from schedir.dialects.cluster import ReplicateOp
from schedir.dialects.codes import Why
from schedir.ir.route_step import RouteView, positions
from schedir.lowering import route_state as rs
from schedir.passes.route_kernels import LinkOptions, pull_kernel

_DISAGGREGATED = int(Why.DISAGGREGATED)


@nb.njit(cache=True)
def topology_distance_lowered(F, A, P, S, o) -> None:  # noqa: ANN001
    """`TopologyDistance.run` inside the routing program; `o` = `LinkOptions.link_options`."""
    rows, inst, whys = rs.routed_rows(S)
    if rows.size == 0 or not S[6]:
        return
    hits = S[2][rows]
    want, src, nbytes, gain = pull_kernel(hits, inst, whys == _DISAGGREGATED, F[rs.F_POSITION], int(o[0]),
                                          int(o[1]), o[2], o[3], o[4], o[5], o[6])
    if want.size == 0:
        return
    chain, starts = P[2], P[3]
    last = np.empty(want.size, dtype=np.int64)
    for j in range(want.size):
        best = hits[want[j], 0]
        for c in range(1, hits.shape[1]):
            best = max(best, hits[want[j], c])
        last[j] = chain[starts[rows[want[j]]] + best - 1]  # the hash ending the moved chain
    dst = inst[want]
    keep = np.zeros(want.size, dtype=np.bool_)  # one move per (chain, target), the first
    for j in range(want.size):
        keep[j] = True
        for i in range(j):
            if keep[i] and last[i] == last[j] and dst[i] == dst[j]:
                keep[j] = False
                break
    at = np.flatnonzero(keep)
    rs.replicate(F, P, S, last[at], src[at], dst[at], nbytes[at], np.rint(gain[at]).astype(np.int64))


@dataclass(frozen=True)
class TopologyDistance(LinkOptions):
    """For each routed request, fetch the longer prefix another instance caches if the link is cheaper.

    Mooncake's Conductor weighs where a prefix's KV lives against where the request runs:
    moving KV costs latency + bytes / bandwidth over the link between their topology
    positions (a fast link within a position, the network across), recomputing it costs
    prefill time (the cost model). For a request routed where it hits fewer blocks than on
    some other instance, the nearest instance with the longest hit is the source; when moving
    the extra blocks is cheaper than recomputing them, a `cluster.replicate` copies the chain
    to the chosen instance, with the time saved as its benefit."""

    name: ClassVar[str] = "topology-distance"
    requires: ClassVar[frozenset[str]] = frozenset({"routed"})
    provides: ClassVar[frozenset[str]] = frozenset({"kv-moves"})

    lowered = staticmethod(topology_distance_lowered)

    def lowered_options(self) -> tuple[float, ...]:
        return self.link_options()

    def run(self, route: RouteView) -> None:
        routed_ids, inst_ids, _ = route.routed()
        if routed_ids.size == 0 or not route.has_prefix():
            return
        rows = positions(route.arrival_col("id"), routed_ids)
        fleet_ids = route.fleet_col("id")
        inst = positions(fleet_ids, inst_ids)
        hits = np.ascontiguousarray(route.prefix_hits()[rows])
        # disaggregated requests move their KV anyway (cluster.transfer): leave them
        whys = route.routed_whys()
        prefill_per_us, _, _ = self.rates()
        want, src, nbytes, gain = pull_kernel(hits, inst, whys == int(Why.DISAGGREGATED), route.fleet_col("position"),
                                              self.block_tokens, self.kv_bytes_per_token, self.intra_gbs,
                                              self.inter_gbs, self.intra_latency_us, self.inter_latency_us,
                                              prefill_per_us)
        if want.size == 0:
            return
        best = hits[want].max(axis=1)
        chain, starts = route.chains()
        last = chain[starts[rows[want]] + best - 1]  # the hash ending the moved chain
        dst = inst[want]
        seen: set[tuple[int, int]] = set()
        first = []
        for j, key in enumerate(zip(last.tolist(), dst.tolist(), strict=True)):  # one move per (chain, target)
            if key not in seen:
                seen.add(key)
                first.append(j)
        at = np.asarray(first, dtype=np.int64)
        route.move_prefix(ReplicateOp, last[at], fleet_ids[src[at]], fleet_ids[dst[at]],
                          nbytes[at].astype(np.int64), np.round(gain[at]).astype(np.int64))
