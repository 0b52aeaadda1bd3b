"""Prefix hits of waiting requests held across steps: a hit stays what it was until the cache moves it.

An order that reads every waiting request's prefix hit (`prefix-cache-aware`, the seed's
`with-prefix-aware` and `with-all-passes`) looks up the whole queue each step: a walk of each
request's chain of block hashes in the prefix cache (~0.7 ms a step at 5,000 waiting behind one
system prompt, with the call's chain memo, `kv_pool.match_row`). A waiting request's hit of k
blocks changes only when the cache does, in one of two ways: it grows when its block k's hash
is registered (a chain is matched from its start, so nothing else can extend it), and it
shrinks when one of its k blocks is evicted. The pool logs the hashes it registers
(`kv_pool.REG_SEQ`, a ring of the last `REG_LOG_LEN`); evictions need no log, because the
requests behind one prompt share its chain, so checking that a chain is still cached costs one
walk per distinct chain, not one per request.

`HeldHits` keeps, per request row, the log position its hit was last checked at, the hit, the
total tokens it was matched for, the hash of its block k (0: none can come, the hit is at its
limit) and of its last hit block (contiguous arrays, so checking 5,000 held hits reads a few
small arrays, not the strided hash table): `match` answers `match_rows` exactly, looking up only
the rows whose hold ended. The runtime forgets a row when a new request takes it (`forget`).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from schedir.lowering.kv_pool import REG_LOG, REG_LOG_LEN, REG_SEQ, KVPool, chain_memo, match_row, table_slot


@nb.njit(cache=True, inline="always")
def _table(n: int) -> np.ndarray:
    """An empty open-addressing table with room for `n` keys (keys in row 0, values in row 1)."""
    size = 16
    while size < 2 * n:
        size *= 2
    return np.zeros((2, size), dtype=np.int64)


@nb.njit(cache=True)
def match_rows_held(rows: np.ndarray, total: np.ndarray, block_size: int, ref: np.ndarray, rhash: np.ndarray,
                    nhash: np.ndarray, cache: np.ndarray, meta: np.ndarray, held: np.ndarray) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
    """`match_rows(rows, ...)`, the hits held: a row held at log position s (`held[0]`, -1: not
    held) for `held[2]` total tokens (as now) with a hit of `held[1]` blocks has it still when
    the hash of its next block (`held[3]`, 0: none) is none of those logged since s and its
    chain up to its last hit block (`held[4]`) is still cached (the call's chain memo,
    `kv_pool.chain_memo`, holds the chains found cached and their blocks in the free queue, so a
    chain is walked once per call, not once per row); the others are looked up and held."""
    n = rows.size
    hit = np.zeros(n, dtype=np.int64)
    cached_free = np.zeros(n, dtype=np.int64)
    now = meta[REG_SEQ]
    oldest = now
    for i in range(n):  # the earliest hold still inside the log's ring
        s = held[0, rows[i]]
        if 0 <= s < oldest and now - s <= REG_LOG_LEN:
            oldest = s
    # the hashes logged since then -> the latest position each was logged at
    logged = _table(now - oldest)
    for q in range(oldest, now):
        h = meta[REG_LOG + q % REG_LOG_LEN]
        j = table_slot(logged[0], h)
        logged[0, j] = h
        logged[1, j] = q
    memo = chain_memo(n)
    for i in range(n):
        r = rows[i]
        s = held[0, r]
        k = held[1, r]
        ok = s >= 0 and now - s <= REG_LOG_LEN and held[2, r] == total[i]
        if ok and held[3, r] != 0 and s < now:  # its next block registered since?
            j = table_slot(logged[0], held[3, r])
            ok = not (logged[0, j] == held[3, r] and logged[1, j] >= s)
        free = 0
        if ok and k > 0:  # its chain still cached? (the call's chain memo holds chains found cached)
            last = held[4, r]
            j = table_slot(memo[0], last)
            if memo[0, j] == last:
                free = memo[1, j]
            else:  # walked once per chain: the walk fills the memo for the rows behind it
                found, free = match_row(r, k, ref, rhash, nhash, cache, memo)
                ok = found == k
        if ok:
            hit[i] = k * block_size
            cached_free[i] = free
            held[0, r] = now
            continue
        limit = min((total[i] - 1) // block_size, nhash[r])
        k, cached_free[i] = match_row(r, limit, ref, rhash, nhash, cache, memo)
        hit[i] = k * block_size
        held[0, r] = now
        held[1, r] = k
        held[2, r] = total[i]
        held[3, r] = rhash[r, k] if k < limit else 0
        held[4, r] = rhash[r, k - 1] if k > 0 else 0
    return hit, cached_free


class HeldHits:
    """The runtime's held prefix hits over one pool (see the module docstring)."""

    def __init__(self) -> None:
        self._meta: np.ndarray | None = None  # the pool's log they were held against
        self._held = np.zeros((5, 0), dtype=np.int64)

    @property
    def _at(self) -> np.ndarray:
        """Each row's hold: the log position it was checked at (-1: not held)."""
        return self._held[0]

    def match(self, pool: KVPool, rows: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hit tokens, hit blocks in the free queue) of `rows` (request rows, their `total`
        tokens alongside), as `kv_pool.match_rows` over `pool` answers them."""
        if pool.meta is not self._meta or self._held.shape[1] < pool.rows:  # another pool: none held
            self._meta = pool.meta
            self._held = np.zeros((5, pool.rows), dtype=np.int64)
            self._held[0] = -1
        return match_rows_held(rows, total, pool.block_size, pool.ref, pool.rhash, pool.nhash, pool.cache, pool.meta,
                               self._held)

    def forget(self, row: int) -> None:
        """A new request takes `row`: its hit is not the last one's."""
        if row < self._held.shape[1]:
            self._held[0, row] = -1
