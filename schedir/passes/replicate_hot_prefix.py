"""replicate-hot-prefix: copy a prefix many arrivals want off its overloaded holders."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.cluster import ReplicateOp
from schedir.ir.route_step import RouteView
from schedir.passes.route_kernels import LinkOptions


@dataclass(frozen=True)
class ReplicateHotPrefix(LinkOptions):
    """Replicate a hot prefix to the least loaded instance when the benefit beats the copy.

    Mooncake's hot-spot migration (FAST '25, section 5): a prefix that at least
    `min-requests` pending arrivals share, held only by instances that are overloaded
    (load > `overload-ratio` x the least load + `overload-slack`), is copied from its
    nearest holder to the least loaded instance. Cost: the link model's time for its KV;
    benefit: the prefill those requests skip there (cost model) minus the copy. Run before
    a cache-aware routing pass: it routes against the replica (`cluster.replicate` counts
    in `RouteView.prefix_hits`)."""

    name: ClassVar[str] = "replicate-hot-prefix"
    provides: ClassVar[frozenset[str]] = frozenset({"hot-prefix"})

    min_requests: int = 2
    overload_ratio: float = 1.5
    overload_slack: float = 8.0

    def run(self, route: RouteView) -> None:
        rows = route.pending()
        if rows.size < self.min_requests or not route.has_prefix():
            return
        eligible = route.serves_whole()
        if eligible.sum() < 2:
            return
        load = route.load()
        least = np.flatnonzero(eligible)[np.argmin(load[eligible])]
        overloaded = load > self.overload_ratio * load[least] + self.overload_slack
        if not (overloaded & eligible).any():
            return  # no holder to relieve
        chain_hash, starts = route.chains()
        blocks = route.prefix_blocks()
        pending = np.zeros(blocks.size, dtype=np.bool_)
        pending[rows] = True
        p_sorted = np.repeat(np.arange(starts.size), blocks)
        mine = pending[p_sorted]
        hashes, counts = np.unique(chain_hash[mine], return_counts=True)
        if counts.max(initial=0) < self.min_requests:
            return
        hits = route.prefix_hits()
        # per pending request, the depth of its deepest hot block (0: none)
        k = np.arange(p_sorted.size, dtype=np.int64) - starts[p_sorted]
        at = np.minimum(np.searchsorted(hashes, chain_hash), hashes.size - 1)
        is_hot = mine & (hashes[at] == chain_hash) & (counts[at] >= self.min_requests)
        depth = np.zeros(hits.shape[0], dtype=np.int64)
        np.maximum.at(depth, p_sorted[is_hot], k[is_hot] + 1)
        cand = rows[depth[rows] > 0]
        if cand.size == 0:
            return
        d = depth[cand]
        holders = (hits[cand] >= d[:, None]) & eligible[None, :]
        ok = holders.any(axis=1) & (hits[cand, least] < d) & ~(holders & ~overloaded[None, :]).any(axis=1)
        if not ok.any():
            return
        cand, d, holders = cand[ok], d[ok], holders[ok]
        position = route.fleet_col("position")
        fleet_ids = route.fleet_col("id")
        last = chain_hash[starts[cand] + d - 1]
        last, first = np.unique(last, return_index=True)  # one copy per chain
        d, holders = d[first], holders[first]
        dist = np.where(holders, np.abs(position[None, :] - position[least]), np.iinfo(np.int64).max)
        src = np.argmin(dist, axis=1)
        nbytes = d * self.block_tokens * self.kv_bytes_per_token
        move = self.move_us(position[src], np.full(src.size, position[least]), nbytes)
        share = counts[np.searchsorted(hashes, last)]
        prefill_per_us, _, _ = self.rates()
        benefit = share * d * self.block_tokens / prefill_per_us - move
        good = benefit > 0
        if good.any():
            route.move_prefix(ReplicateOp, last[good], fleet_ids[src[good]], np.full(int(good.sum()), fleet_ids[least]),
                              nbytes[good].astype(np.int64), np.round(benefit[good]).astype(np.int64))

