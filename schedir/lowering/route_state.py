"""A routing step inside one Numba kernel: the layout and the `RouteView` rules, over arrays.

A routing pipeline lowered to a program (`schedir.lowering.route_program`) runs every pass's
lowered form inside one kernel call; this module is what those forms share, written once, as
`RouteView` writes it once for the Python passes: which arrivals are still pending, each
instance's load (plus what the step routed so far), the leading prefix blocks each instance
holds (recomputed after a `cluster.replicate`), and appending decisions to a log that the
program reads back as the step's decisions, in the order the passes made them.

The step is three tuples: `F`, the fleet's columns (`FLEET_LAYOUT` order), `A`, the arrivals'
(`ARRIVAL_LAYOUT`), and `P`, the prefix and digest pairs with the chains grouped by arrival;
and the state `S` = (decided, extra load, hits, records, cols, counts, has_prefix):

- `records[:, r]` = (kind, first col, end col, operand): a decision op, its rows in `cols`, and
  for a `cluster.transfer` the record of the route it follows;
- `cols[:, c]` holds one decided row: for a route (id, instance id, decode id, hit blocks, why,
  arrival row, instance row, decode row); a reject (id, why); a replicate (hash, src id, dst id,
  bytes, benefit µs, -, -, dst row); a transfer (id, src id, dst id, bytes, latency µs).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from schedir.ir.route_step import _rows_of, chains_by_row, lower_bound, prefix_hit_kernel

# the fleet's and the arrivals' columns as the kernel takes them (F[i], A[i])
FLEET_LAYOUT = ("id", "role", "queued", "running", "free_blocks", "total_blocks", "position", "queued_tokens",
                "digest_blocks")
ARRIVAL_LAYOUT = ("id", "prompt", "output", "ttft_slo_ms", "tbt_slo_ms")
F_ID, F_ROLE, F_QUEUED, F_RUNNING, F_FREE, F_TOTAL, F_POSITION, F_QUEUED_TOKENS, F_DIGEST_BLOCKS = range(9)
A_ID, A_PROMPT, A_OUTPUT, A_TTFT, A_TBT = range(5)

# decision kinds of the log (records[0, r])
ROUTE, REJECT, REPLICATE, TRANSFER = 0, 1, 2, 3
COLS = 8  # rows of `cols`
ROLE_BOTH, ROLE_PREFILL, ROLE_DECODE = 0, 1, 2  # schedir.dialects.codes.Role


@nb.njit(cache=True)
def new_state(F, A, P, passes: int):  # noqa: ANN001, ANN201
    """The state of a step before its first pass: nobody decided, the hits of the digest."""
    m = F[F_ID].size
    k = A[A_ID].size
    p_rows, p_hash, chain, starts, d_col, d_hash, has_prefix = P
    hits = np.zeros((k, m), dtype=np.int64)
    if has_prefix and k and m and p_rows.size:
        hits = prefix_hit_kernel(k, m, p_rows, p_hash, d_col, d_hash)
    decided = np.zeros(k, dtype=np.bool_)
    extra = np.zeros(m, dtype=np.int64)
    records = np.empty((4, 2 * passes + 4), dtype=np.int64)
    cols = np.zeros((COLS, 4 * k + 8), dtype=np.int64)  # zeros: a reject's unused rows read as 0
    counts = np.zeros(2, dtype=np.int64)  # records, cols used
    return (decided, extra, hits, records, cols, counts, has_prefix)


@nb.njit(cache=True)
def decision_log(S) -> np.ndarray:  # noqa: ANN001
    """The step's decisions as one array (one boxed result): column 0 holds the number of records
    r, columns 1..r the records (rows 0-3), then the cols they index."""
    counts = S[5]
    r, c = counts[0], counts[1]
    out = np.empty((COLS, 1 + r + c), dtype=np.int64)
    out[0, 0] = r
    out[:4, 1:1 + r] = S[3][:, :r]
    out[:, 1 + r:] = S[4][:, :c]
    return out


@nb.njit(cache=True)
def rows_in(source: np.ndarray, query: np.ndarray) -> np.ndarray:
    """`schedir.ir.route_step._rows_of` (the row of each id, -1 where absent), without its sort
    when `source` is ascending already (a fleet's and a batch's ids usually are)."""
    for i in range(1, source.size):
        if source[i] <= source[i - 1]:
            return _rows_of(source, query)
    out = np.full(query.size, -1, dtype=np.int64)
    for i in range(query.size):
        j = lower_bound(source, query[i])
        if j < source.size and source[j] == query[i]:
            out[i] = j
    return out


@nb.njit(cache=True)
def pairs_of(F, A, p_ids: np.ndarray, p_hash: np.ndarray, d_ids: np.ndarray, d_hash: np.ndarray,
             has_prefix: bool):  # noqa: ANN001, ANN201
    """`P`: the pairs' rows (arrival rows, fleet rows; -1 where unknown) and the chains grouped
    by arrival row (`RouteView.chains`)."""
    p_rows = rows_in(A[A_ID], p_ids)
    chain, starts = chains_by_row(A[A_ID].size, p_rows, p_hash)
    return (p_rows, p_hash, chain, starts, rows_in(F[F_ID], d_ids), d_hash, has_prefix)


@nb.njit(cache=True)
def pending(S) -> np.ndarray:  # noqa: ANN001
    """Arrival rows no decision covers yet, in arrival order (`RouteView.pending`)."""
    decided = S[0]
    n = 0
    for i in range(decided.size):
        if not decided[i]:
            n += 1
    out = np.empty(n, dtype=np.int64)
    n = 0
    for i in range(decided.size):
        if not decided[i]:
            out[n] = i
            n += 1
    return out


@nb.njit(cache=True)
def load(F, S) -> np.ndarray:  # noqa: ANN001
    """Requests queued and running per instance, plus those routed to it this step (`RouteView.load`)."""
    return F[F_QUEUED] + F[F_RUNNING] + S[1]


@nb.njit(cache=True)
def role_is(F, role: int) -> np.ndarray:  # noqa: ANN001
    return F[F_ROLE] == role


@nb.njit(cache=True)
def _open(S, kind: int, operand: int) -> int:  # noqa: ANN001
    records, counts = S[3], S[5]
    r = counts[0]
    records[0, r] = kind
    records[1, r] = counts[1]
    records[3, r] = operand
    return r


@nb.njit(cache=True)
def _close(S, r: int, n: int) -> None:  # noqa: ANN001
    counts = S[5]
    counts[1] += n
    S[3][2, r] = counts[1]
    counts[0] = r + 1


@nb.njit(cache=True)
def route(F, A, S, rows: np.ndarray, inst: np.ndarray, why: np.ndarray, dec: np.ndarray,
          hit_blocks: np.ndarray) -> int:  # noqa: ANN001
    """A `cluster.route` of arrival rows `rows` to fleet rows `inst` (decode on `dec`), with these
    hits and whys; returns its record (-1: no rows, no op), which a transfer names."""
    if rows.size == 0:
        return -1
    r = _open(S, ROUTE, -1)
    at = S[5][1]
    for i in range(rows.size):
        _route_row(F, A, S, at + i, rows[i], inst[i], dec[i], hit_blocks[i], why[i])
    _close(S, r, rows.size)
    return r


@nb.njit(cache=True)
def _route_row(F, A, S, c: int, row: int, inst: int, dec: int, hit: int, why: int) -> None:  # noqa: ANN001
    """Column `c` of the log: arrival `row` routed to fleet row `inst` (decode on `dec`); the
    arrival is decided and the instance carries one more request this step."""
    cols = S[4]
    cols[0, c] = A[A_ID][row]
    cols[1, c] = F[F_ID][inst]
    cols[2, c] = F[F_ID][dec]
    cols[3, c] = hit
    cols[4, c] = why
    cols[5, c] = row
    cols[6, c] = inst
    cols[7, c] = dec
    S[0][row] = True
    S[1][inst] += 1


@nb.njit(cache=True)
def hits_at(S, rows: np.ndarray, inst: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """The prefix blocks each row's instance holds (zeros without prefix chains, as `route`'s default)."""
    out = np.zeros(rows.size, dtype=np.int64)
    if S[6]:
        hits = S[2]
        for i in range(rows.size):
            out[i] = hits[rows[i], inst[i]]
    return out


@nb.njit(cache=True)
def route_picks(F, A, S, rows: np.ndarray, hits: np.ndarray, pick: np.ndarray, by_cache: np.ndarray,  # noqa: ANN001
                cache_why: int, other_why: int) -> None:
    """A cache-aware choice's `cluster.route`: arrival `rows[i]` (hits `hits[i]`) to fleet row
    `pick[i]` where one was picked, why `cache_why` where picked for its cache, else `other_why`."""
    n = 0
    for i in range(pick.size):
        if pick[i] >= 0:
            n += 1
    if n == 0:
        return
    r = _open(S, ROUTE, -1)
    c = S[5][1]
    for i in range(pick.size):  # `route` of the picked rows, written in place (no temporaries)
        j = pick[i]
        if j >= 0:
            _route_row(F, A, S, c, rows[i], j, j, hits[i, j], cache_why if by_cache[i] == 1 else other_why)
            c += 1
    _close(S, r, n)


@nb.njit(cache=True)
def reject(A, S, rows: np.ndarray, why: int) -> None:  # noqa: ANN001
    """A `cluster.reject` of arrival rows `rows` with reason `why`."""
    if rows.size == 0:
        return
    decided, cols = S[0], S[4]
    r = _open(S, REJECT, -1)
    at = S[5][1]
    for i in range(rows.size):
        cols[0, at + i] = A[A_ID][rows[i]]
        cols[1, at + i] = why
        decided[rows[i]] = True
    _close(S, r, rows.size)


@nb.njit(cache=True)
def transfer(S, routed: int, ids: np.ndarray, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray,
             latency_us: np.ndarray) -> None:  # noqa: ANN001
    """A `cluster.transfer` (instance ids) following route record `routed`."""
    if ids.size == 0:
        return
    cols = S[4]
    r = _open(S, TRANSFER, routed)
    at = S[5][1]
    for i in range(ids.size):
        cols[0, at + i] = ids[i]
        cols[1, at + i] = src[i]
        cols[2, at + i] = dst[i]
        cols[3, at + i] = nbytes[i]
        cols[4, at + i] = latency_us[i]
    _close(S, r, ids.size)


@nb.njit(cache=True)
def replicate(F, P, S, hashes: np.ndarray, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray,
              benefit_us: np.ndarray) -> None:  # noqa: ANN001
    """A `cluster.replicate` of the chains ending at `hashes` from fleet rows `src` to `dst`;
    the hits then count the copies (`RouteView.prefix_hits` after a move)."""
    if hashes.size == 0:
        return
    cols = S[4]
    r = _open(S, REPLICATE, -1)
    at = S[5][1]
    for i in range(hashes.size):
        cols[0, at + i] = hashes[i]
        cols[1, at + i] = F[F_ID][src[i]]
        cols[2, at + i] = F[F_ID][dst[i]]
        cols[3, at + i] = nbytes[i]
        cols[4, at + i] = benefit_us[i]
        cols[7, at + i] = dst[i]
    _close(S, r, hashes.size)
    _rehit(F, P, S)


@nb.njit(cache=True)
def _chain_len(p_rows: np.ndarray, p_hash: np.ndarray, h: int) -> tuple[int, int]:
    """(first pair holding `h`, the length of its request's chain up to it); (-1, 1) if none."""
    for i in range(p_hash.size):
        if p_hash[i] == h:
            n = 0
            for j in range(i + 1):
                if p_rows[j] == p_rows[i]:
                    n += 1
            return i, n
    return -1, 1


@nb.njit(cache=True)
def _rehit(F, P, S) -> None:  # noqa: ANN001
    """Hits again over the digest plus every chain replicated so far: a target holds each block
    of the chain up to the moved hash (`schedir.ir.route_step._chain_to`: the first request whose
    chain holds it)."""
    p_rows, p_hash, _, _, d_col, d_hash, has_prefix = P
    hits = S[2]
    k, m = hits.shape
    if not (has_prefix and k and m and p_rows.size):
        return
    records, cols, counts = S[3], S[4], S[5]
    total = d_col.size
    for r in range(counts[0]):
        if records[0, r] == REPLICATE:
            for c in range(records[1, r], records[2, r]):
                total += _chain_len(p_rows, p_hash, cols[0, c])[1]
    all_col = np.empty(total, dtype=np.int64)
    all_hash = np.empty(total, dtype=np.int64)
    all_col[:d_col.size] = d_col
    all_hash[:d_col.size] = d_hash
    n = d_col.size
    for r in range(counts[0]):
        if records[0, r] != REPLICATE:
            continue
        for c in range(records[1, r], records[2, r]):
            h = cols[0, c]
            i, length = _chain_len(p_rows, p_hash, h)
            if i < 0:
                all_col[n] = cols[7, c]
                all_hash[n] = h
                n += 1
                continue
            for j in range(i + 1):
                if p_rows[j] == p_rows[i]:
                    all_col[n] = cols[7, c]
                    all_hash[n] = p_hash[j]
                    n += 1
    hits[:, :] = prefix_hit_kernel(k, m, p_rows, p_hash, all_col, all_hash)


@nb.njit(cache=True)
def routed_rows(S) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # noqa: ANN001
    """(arrival rows, instance rows, whys) of every route so far, in order (`RouteView.routed`)."""
    records, cols, counts = S[3], S[4], S[5]
    n = 0
    for r in range(counts[0]):
        if records[0, r] == ROUTE:
            n += records[2, r] - records[1, r]
    rows = np.empty(n, dtype=np.int64)
    inst = np.empty(n, dtype=np.int64)
    why = np.empty(n, dtype=np.int64)
    n = 0
    for r in range(counts[0]):
        if records[0, r] == ROUTE:
            for c in range(records[1, r], records[2, r]):
                rows[n] = cols[5, c]
                inst[n] = cols[6, c]
                why[n] = cols[4, c]
                n += 1
    return rows, inst, why
