"""Prefix hits of waiting requests held across steps: a zero hit stays zero until its hash comes.

An order that reads every waiting request's prefix hit (`prefix-cache-aware`, the seed's
`with-prefix-aware` and `with-all-passes`) looks up the whole queue each step: one probe of the
prefix cache per request, a cache miss each (~190-250 µs a step at 5,000 waiting). Most of a
long queue hits nothing, and a hit of zero can only become more when the request's first block
is registered: eviction only takes hits away, and a hash chain starts at its first block. The
pool logs the hashes of the first blocks it registers (`kv_pool.FIRST_SEQ`); a zero hit seen
at log position s stays zero while none of the first blocks logged since s is the request's.

`HeldHits` keeps, per request row, the log position its zero was last checked at and its first
block's hash (contiguous, so checking 5,000 held zeros reads two small arrays, not the
strided hash table): `match` answers `match_rows` exactly, looking up only the rows it does
not hold. The runtime forgets a row when a new request takes it (`forget`).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from schedir.lowering.kv_pool import FIRST_LOG, FIRST_LOG_LEN, FIRST_SEQ, chain_memo, KVPool, match_row

# a zero checked this many first-block registrations ago or more is looked up again, not compared
# with each of them (the log's ring holds FIRST_LOG_LEN)
HELD_SCAN = 16


@nb.njit(cache=True, inline="always")
def _slot(keys: np.ndarray, h: np.int64) -> int:
    """The slot of `h` in the small open-addressing table `keys` (power-of-two size), or the
    empty one where it would go."""
    mask = keys.size - 1
    j = (h ^ (h >> 29)) & mask
    while keys[j] != 0 and keys[j] != h:
        j = (j + 1) & mask
    return j


@nb.njit(cache=True)
def match_rows_held(rows: np.ndarray, total: np.ndarray, block_size: int, ref: np.ndarray, rhash: np.ndarray,
                    nhash: np.ndarray, cache: np.ndarray, meta: np.ndarray, held_at: np.ndarray,
                    held_first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`match_rows(rows, ...)`, the zero hits held: a row held at log position s (`held_at`,
    -1: not held) whose first-block hash (`held_first`) is none of the first blocks logged since
    has hit 0 still; the others are looked up, and held when they hit 0 with a first block to
    hit (the limit `match_rows` reads, at least one block)."""
    n = rows.size
    hit = np.zeros(n, dtype=np.int64)
    cached_free = np.zeros(n, dtype=np.int64)
    chains = chain_memo(n)
    now = meta[FIRST_SEQ]
    # the first blocks logged in the last HELD_SCAN positions: hash -> the latest position, in a
    # small open-addressing table (a held row probes it once instead of scanning the log)
    keys = np.zeros(4 * HELD_SCAN, dtype=np.int64)
    latest = np.full(4 * HELD_SCAN, -1, dtype=np.int64)
    for q in range(max(now - HELD_SCAN, 0), now):
        h = meta[FIRST_LOG + q % FIRST_LOG_LEN]
        j = _slot(keys, h)
        keys[j] = h
        latest[j] = q
    for i in range(n):
        r = rows[i]
        since = held_at[r]
        if since >= 0 and now - since < HELD_SCAN:
            came = False
            if since < now:
                h = held_first[r]
                j = _slot(keys, h)
                came = keys[j] == h and latest[j] >= since
            if not came:
                held_at[r] = now
                continue
        limit = (total[i] - 1) // block_size
        k, cached_free[i] = match_row(r, limit, ref, rhash, nhash, cache, chains)
        hit[i] = k * block_size
        if k == 0 and limit > 0 and nhash[r] > 0:
            held_at[r] = now
            held_first[r] = rhash[r, 0]
        else:
            held_at[r] = -1
    return hit, cached_free


class HeldHits:
    """The runtime's held zero hits over one pool (see the module docstring)."""

    def __init__(self) -> None:
        self._meta: np.ndarray | None = None  # the pool's log they were held against
        self._at = np.full(0, -1, dtype=np.int64)
        self._first = np.zeros(0, dtype=np.int64)

    def match(self, pool: KVPool, rows: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hit tokens, hit blocks in the free queue) of `rows` (request rows, their `total`
        tokens alongside), as `kv_pool.match_rows` over `pool` answers them."""
        if pool.meta is not self._meta or self._at.size < pool.rows:  # another pool (restored, copied): none held
            self._meta = pool.meta
            self._at = np.full(pool.rows, -1, dtype=np.int64)
            self._first = np.zeros(pool.rows, dtype=np.int64)
        return match_rows_held(rows, total, pool.block_size, pool.ref, pool.rhash, pool.nhash, pool.cache, pool.meta,
                               self._at, self._first)

    def forget(self, row: int) -> None:
        """A new request takes `row`: its hit is not the last one's."""
        if row < self._at.size:
            self._at[row] = -1
