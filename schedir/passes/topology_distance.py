"""topology-distance: pull a longer cached prefix from a nearby instance when moving beats recomputing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.cluster import ReplicateOp
from schedir.dialects.codes import Why
from schedir.ir.route_step import RouteView, positions
from schedir.passes.route_kernels import LinkOptions, pull_kernel


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
