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
from schedir.passes.route_kernels import LinkOptions, pull_kernel, pull_one

_DISAGGREGATED = int(Why.DISAGGREGATED)


@nb.njit(cache=True)
def topology_distance_lowered(F, A, P, S, o) -> None:  # noqa: ANN001
    """`TopologyDistance.run` inside the routing program; `o` = `LinkOptions.link_options`. The
    routes are read from the log in place and each tested by `pull_one` (the Python pass's
    `pull_kernel`, request by request): no temporaries but the moves'."""
    if not S[6]:
        return
    hits, records, cols, counts = S[2], S[3], S[4], S[5]
    chain, starts = P[2], P[3]
    n = 0
    for r in range(counts[0]):
        if records[0, r] == rs.ROUTE:
            n += records[2, r] - records[1, r]
    if n == 0:
        return
    last = np.empty(n, dtype=np.int64)  # the hash ending the moved chain
    src = np.empty(n, dtype=np.int64)
    dst = np.empty(n, dtype=np.int64)
    nbytes = np.empty(n, dtype=np.int64)
    gain = np.empty(n, dtype=np.int64)
    n = 0
    for r in range(counts[0]):  # the routes made so far, in order (`rs.routed_rows`)
        if records[0, r] != rs.ROUTE:
            continue
        for c in range(records[1, r], records[2, r]):
            if cols[4, c] == _DISAGGREGATED:  # moves its KV anyway (cluster.transfer)
                continue
            row, at = cols[5, c], cols[6, c]
            pick, size, g, best = pull_one(hits, row, at, F[rs.F_POSITION], int(o[0]), int(o[1]), o[2], o[3], o[4],
                                           o[5], o[6])
            if pick < 0:
                continue
            h = chain[starts[row] + best - 1]
            seen = False  # one move per (chain, target), the first
            for j in range(n):
                if last[j] == h and dst[j] == at:
                    seen = True
                    break
            if seen:
                continue
            last[n], src[n], dst[n], nbytes[n], gain[n] = h, pick, at, size, np.rint(g)
            n += 1
    rs.replicate(F, P, S, last[:n], src[:n], dst[:n], nbytes[:n], gain[:n])


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
