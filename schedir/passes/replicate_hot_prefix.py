"""replicate-hot-prefix: copy a prefix many arrivals want off its overloaded holders."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba as nb
import numpy as np

from schedir.dialects.cluster import ReplicateOp
from schedir.ir.route_step import RouteView
from schedir.lowering import route_state as rs
from schedir.passes.route_kernels import LinkOptions, one_move_us


@nb.njit(cache=True)
def replicate_hot_prefix_lowered(F, A, P, S, o) -> None:  # noqa: ANN001
    """`ReplicateHotPrefix.run` inside the routing program, step for step; `o` = `link_options`,
    then min-requests, overload-ratio, overload-slack."""
    min_requests, ratio, slack = int(o[7]), o[8], o[9]
    rows = rs.pending(S)
    if rows.size < min_requests or not S[6]:
        return
    eligible = rs.role_is(F, rs.ROLE_BOTH)
    if eligible.sum() < 2:
        return
    load = rs.load(F, S)
    least = -1
    for j in range(load.size):
        if eligible[j] and (least < 0 or load[j] < load[least]):
            least = j
    overloaded = load > ratio * load[least] + slack
    if not (overloaded & eligible).any():
        return  # no holder to relieve
    chain, starts = P[2], P[3]
    k = starts.size
    # each chain entry's arrival row and depth in its chain
    owner = np.empty(chain.size, dtype=np.int64)
    for r in range(k):
        end = starts[r + 1] if r + 1 < k else chain.size
        for i in range(starts[r], end):
            owner[i] = r
    pending = np.zeros(k, dtype=np.bool_)
    pending[rows] = True
    mine = pending[owner]
    hashes = np.sort(chain[mine])  # the distinct hashes of the pending chains, and how often each
    distinct = np.zeros(hashes.size, dtype=np.int64)
    counts = np.zeros(hashes.size, dtype=np.int64)
    u = 0
    for i in range(hashes.size):
        if u == 0 or hashes[i] != distinct[u - 1]:
            distinct[u] = hashes[i]
            u += 1
        counts[u - 1] += 1
    hashes, counts = distinct[:u], counts[:u]
    if u == 0 or counts.max() < min_requests:
        return
    hits = S[2]
    depth = np.zeros(k, dtype=np.int64)  # per pending request, the depth of its deepest hot block
    for i in range(chain.size):
        if not mine[i]:
            continue
        at = min(np.searchsorted(hashes, chain[i]), u - 1)
        if hashes[at] == chain[i] and counts[at] >= min_requests:
            depth[owner[i]] = max(depth[owner[i]], i - starts[owner[i]] + 1)
    m = load.size
    lasts = np.empty(rows.size, dtype=np.int64)
    d = np.empty(rows.size, dtype=np.int64)
    src = np.empty(rows.size, dtype=np.int64)
    n = 0
    for r in rows:
        if depth[r] == 0:
            continue
        held = False
        relieved = False  # a holder that is not overloaded
        for j in range(m):
            if hits[r, j] >= depth[r] and eligible[j]:
                held = True
                relieved = relieved or not overloaded[j]
        if not held or hits[r, least] >= depth[r] or relieved:
            continue
        lasts[n] = chain[starts[r] + depth[r] - 1]
        d[n] = depth[r]
        pick = -1  # the nearest holder (first among equals)
        for j in range(m):
            if hits[r, j] >= depth[r] and eligible[j]:
                if pick < 0 or abs(F[rs.F_POSITION][j] - F[rs.F_POSITION][least]) < \
                        abs(F[rs.F_POSITION][pick] - F[rs.F_POSITION][least]):
                    pick = j
        src[n] = pick
        n += 1
    if n == 0:
        return
    order = np.argsort(lasts[:n], kind="mergesort")  # one copy per chain (its first request), by hash
    out_hash = np.empty(n, dtype=np.int64)
    out_src = np.empty(n, dtype=np.int64)
    out_bytes = np.empty(n, dtype=np.int64)
    out_gain = np.empty(n, dtype=np.int64)
    g = 0
    position = F[rs.F_POSITION]
    for at in range(n):
        i = order[at]
        if at and lasts[i] == lasts[order[at - 1]]:
            continue
        nbytes = d[i] * int(o[0]) * int(o[1])
        move = one_move_us(position[src[i]], position[least], nbytes, o[2], o[3], o[4], o[5])
        share = counts[np.searchsorted(hashes, lasts[i])]
        benefit = np.float64(share * d[i] * int(o[0])) / o[6] - move
        if benefit > 0:
            out_hash[g] = lasts[i]
            out_src[g] = src[i]
            out_bytes[g] = nbytes
            out_gain[g] = np.int64(np.rint(benefit))
            g += 1
    rs.replicate(F, P, S, out_hash[:g], out_src[:g], np.full(g, least, np.int64), out_bytes[:g], out_gain[:g])


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

    lowered = staticmethod(replicate_hot_prefix_lowered)

    def lowered_options(self) -> tuple[float, ...]:
        return (*self.link_options(), self.min_requests, self.overload_ratio, self.overload_slack)

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

