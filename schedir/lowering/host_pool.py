"""The host (CPU) tier of the KV pool: where a request preempted by swap keeps its KV.

vLLM v0 preempts a request either by recompute (its blocks are dropped) or by swap: its
GPU blocks are copied to CPU blocks and freed, and the request waits in a `swapped`
queue until its blocks are copied back (`_swap_out` / `_swap_in` in v0's scheduler,
`swap_out` / `swap_in` in its block manager). The host tier is v0's naive CPU block
allocator: a free list, a block table per request row, and the list of this step's block
copies (source, destination), which the runtime hands the engine as `blocks_to_swap_out`
/ `blocks_to_swap_in` (the engine's cache engine copies them before the forward pass).

Arrays and Numba kernels, like the device pool (`kv_pool.py`), so a pass swaps inside its
kernel and a step dump prints the tier (`mem.pool`: `host_*` columns).
"""

from __future__ import annotations

import attrs
import numba as nb
import numpy as np

from schedir.lowering.kv_pool import NUM_FREE, allocate, free_row

# hmeta[] slots
HOST_FREE = 0  # free host blocks: hfree[:HOST_FREE] is the free stack (top last)
LOG_COUNT = 1  # block copies logged this step
HOST_META_SIZE = 2

# rows of the copy log (int64[3, capacity])
LOG_KIND = 0  # SWAP_OUT or SWAP_IN
LOG_SRC = 1
LOG_DST = 2
SWAP_OUT, SWAP_IN = 0, 1


@attrs.define(eq=False)
class HostPool:
    """Host blocks 0..num_blocks-1 (no null block: v0's CPU allocator hands out every id)."""

    num_blocks: int
    hfree: np.ndarray  # int32[N]: free stack, hfree[:count] free
    hmeta: np.ndarray  # int64[HOST_META_SIZE]
    htable: np.ndarray  # int32[R, W]: host block ids per request row
    hnblk: np.ndarray  # int32[R]: host blocks held
    log: np.ndarray  # int64[3, C]: this step's copies (kind, src, dst), C >= max blocks a step can move

    @classmethod
    def create(cls, num_blocks: int, rows: int, width: int, device_blocks: int) -> HostPool:
        if num_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_blocks}")
        hfree = np.arange(num_blocks - 1, -1, -1, dtype=np.int32)  # block 0 on top: handed out first
        hmeta = np.zeros(HOST_META_SIZE, dtype=np.int64)
        hmeta[HOST_FREE] = num_blocks
        # a step moves each device block out at most once and each host block in at most once
        cap = max(16, device_blocks + num_blocks + width)
        return cls(num_blocks=num_blocks, hfree=hfree, hmeta=hmeta,
                   htable=np.zeros((rows, width), dtype=np.int32), hnblk=np.zeros(rows, dtype=np.int32),
                   log=np.zeros((3, cap), dtype=np.int64))

    @property
    def num_free(self) -> int:
        return int(self.hmeta[HOST_FREE])

    def grow_rows(self, rows: int) -> None:
        if rows <= self.htable.shape[0]:
            return
        from schedir.lowering.rows import grown_rows  # each row's used prefix only, as the device tables

        extra = rows - self.htable.shape[0]
        self.htable = grown_rows(self.htable, self.hnblk, rows)
        self.hnblk = np.concatenate([self.hnblk, np.zeros(extra, dtype=np.int32)])

    def copy(self) -> HostPool:
        return HostPool(num_blocks=self.num_blocks, hfree=self.hfree.copy(), hmeta=self.hmeta.copy(),
                        htable=self.htable.copy(), hnblk=self.hnblk.copy(), log=self.log.copy())

    def free_request(self, row: int) -> int:
        """Give a row's host blocks back (an aborted or ignored swapped request)."""
        return int(free_host_row(row, self.hfree, self.hmeta, self.htable, self.hnblk))

    def take_log(self) -> tuple[np.ndarray, np.ndarray]:
        """This step's copies as (swap_out, swap_in) int64[k, 2] (src, dst) pairs, and clear the log."""
        n = int(self.hmeta[LOG_COUNT])
        if n == 0:
            return _NO_PAIRS, _NO_PAIRS
        log = self.log[:, :n]
        out = log[LOG_KIND] == SWAP_OUT
        pairs = log[LOG_SRC:].T
        self.hmeta[LOG_COUNT] = 0
        return pairs[out].copy(), pairs[~out].copy()

    def check(self) -> None:
        """Raise AssertionError unless every host block is either free or in exactly one row's table."""
        n = self.num_blocks
        free = self.hfree[: self.num_free]
        held = np.concatenate([self.htable[r, : self.hnblk[r]] for r in np.flatnonzero(self.hnblk)]
                              or [np.zeros(0, dtype=np.int32)])
        seen = np.concatenate([free, held]).astype(np.int64)
        if seen.size != n or np.unique(seen).size != n or (n and (seen.min() < 0 or seen.max() >= n)):
            raise AssertionError(f"host blocks are not conserved: {free.size} free + {held.size} held "
                                 f"of {n}, or a block appears twice")


_NO_PAIRS = np.zeros((0, 2), dtype=np.int64)
_NO_PAIRS.flags.writeable = False


@nb.njit(cache=True)
def free_host_row(row: int, hfree, hmeta, htable, hnblk) -> int:
    k = hnblk[row]
    for i in range(k - 1, -1, -1):
        hfree[hmeta[HOST_FREE]] = htable[row, i]
        hmeta[HOST_FREE] += 1
    hnblk[row] = 0
    return k


@nb.njit(cache=True)
def swap_out_row(row: int, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, ncached,
                 hfree, hmeta, htable, hnblk, log) -> int:
    """Copy `row`'s device blocks to host blocks and free them on the device (v0's `swap_out`).
    Returns the blocks moved, or -1 (nothing changed) when the host has too few free blocks."""
    k = nblk[row]
    if k > hmeta[HOST_FREE]:
        return -1
    at = hmeta[LOG_COUNT]
    for i in range(k):
        hmeta[HOST_FREE] -= 1
        h = hfree[hmeta[HOST_FREE]]
        htable[row, i] = h
        log[LOG_KIND, at] = SWAP_OUT
        log[LOG_SRC, at] = table[row, i]
        log[LOG_DST, at] = h
        at += 1
    hmeta[LOG_COUNT] = at
    hnblk[row] = k
    free_row(row, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, ncached)
    return k


@nb.njit(cache=True)
def swap_in_row(row: int, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk,
                hfree, hmeta, htable, hnblk, log) -> int:
    """Copy `row`'s host blocks into fresh device blocks and free them on the host (v0's
    `swap_in`). Returns the blocks moved, or -1 (nothing changed) when the device has too few."""
    k = hnblk[row]
    if k > meta[NUM_FREE] or nblk[row] != 0:
        return -1
    allocate(row, k, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk)
    at = hmeta[LOG_COUNT]
    for i in range(k):
        log[LOG_KIND, at] = SWAP_IN
        log[LOG_SRC, at] = htable[row, i]
        log[LOG_DST, at] = table[row, i]
        at += 1
    hmeta[LOG_COUNT] = at
    free_host_row(row, hfree, hmeta, htable, hnblk)
    return k


@nb.njit(cache=True)
def swap_rows(out_rows, in_rows, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, ncached,
              hfree, hmeta, htable, hnblk, log) -> tuple[int, int]:
    """`swap_out_row` for each of `out_rows`, then `swap_in_row` for each of `in_rows`, in one call
    (a rotation step of FastServe's swaps hundreds: one call each from Python cost ~4 µs a row).
    Returns (0, -1) when every one moved, else (0, i) for the first of `out_rows` that did not fit
    the host tier or (1, i) for the first of `in_rows` that did not fit the device, the rows
    before it moved (as the row-by-row calls left them)."""
    for i in range(out_rows.size):
        if swap_out_row(out_rows[i], ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, ncached,
                        hfree, hmeta, htable, hnblk, log) < 0:
            return 0, i
    for i in range(in_rows.size):
        if swap_in_row(in_rows[i], ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk,
                       hfree, hmeta, htable, hnblk, log) < 0:
            return 1, i
    return 0, -1
