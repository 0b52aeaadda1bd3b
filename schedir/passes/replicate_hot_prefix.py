"""replicate-hot-prefix: copy a prefix many arrivals want off its overloaded holders."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.cluster import ReplicateOp
from schedir.ir.route_step import RouteStep
from schedir.ir.step import positions
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
    in `RouteStep.prefix_hits`)."""

    name: ClassVar[str] = "replicate-hot-prefix"
    provides: ClassVar[frozenset[str]] = frozenset({"hot-prefix"})

    min_requests: int = 2
    overload_ratio: float = 1.5
    overload_slack: float = 8.0

    def run(self, route: RouteStep) -> None:
        rows = route.pending()
        if rows.size < self.min_requests or route.prefix is None:
            return
        eligible = route.serves_whole()
        if eligible.sum() < 2:
            return
        p_rows = positions(route.arrival_col("id"), route.prefix.columns.get("id"))
        mine = np.isin(p_rows, rows)
        hashes, counts = np.unique(route.prefix.columns.get("hash")[mine], return_counts=True)
        hot = hashes[counts >= self.min_requests]
        if hot.size == 0:
            return
        load = route.load()
        least = np.flatnonzero(eligible)[np.argmin(load[eligible])]
        overloaded = load > self.overload_ratio * load[least] + self.overload_slack
        hits = route.prefix_hits()
        blocks = route.prefix_blocks()
        starts = np.concatenate(([0], np.cumsum(blocks)[:-1]))
        order = np.argsort(p_rows, kind="stable")
        chain_hash = route.prefix.columns.get("hash")[order]
        position = route.fleet_col("position")
        fleet_ids = route.fleet_col("id")
        prefill_per_us, _, _ = self.rates()
        out: dict[int, tuple[int, int, int, int]] = {}
        for r in rows.tolist():  # per pending request: its deepest hot block
            chain = chain_hash[starts[r]: starts[r] + blocks[r]]
            is_hot = np.isin(chain, hot)
            if not is_hot.any():
                continue
            depth = int(np.flatnonzero(is_hot)[-1]) + 1
            holders = np.flatnonzero((hits[r] >= depth) & eligible)
            if holders.size == 0 or hits[r, least] >= depth or not overloaded[holders].all():
                continue
            h = int(chain[depth - 1])
            if h in out:
                continue
            src = holders[np.argmin(np.abs(position[holders] - position[least]))]
            nbytes = depth * self.block_tokens * self.kv_bytes_per_token
            share = int(counts[np.searchsorted(hashes, h)])
            move = float(self.move_us(position[src: src + 1], position[least: least + 1], np.array([nbytes]))[0])
            benefit = share * depth * self.block_tokens / prefill_per_us - move
            if benefit > 0:
                out[h] = (int(fleet_ids[src]), int(fleet_ids[least]), nbytes, round(benefit))
        if out:
            cols = np.array(list(out.values()), dtype=np.int64)
            route.move_prefix(ReplicateOp, np.array(list(out), dtype=np.int64), cols[:, 0], cols[:, 1], cols[:, 2],
                              cols[:, 3])
