"""The KV block pool and prefix cache, as plain arrays with Numba kernels.

Semantics follow vLLM's v1 `BlockPool` so that block ids and cache hits agree:
- block 0 is the null block and never handed out; the free queue starts as 1..N-1;
- allocation pops from the front of the free queue and drops the popped block's
  cached hash (eviction of the least recently freed cached block);
- freeing walks a request's blocks tail first; a block whose count drops to 0
  goes to the *back* of the free queue if it has a hash (it stays a cache hit
  until evicted, LRU), to the *front* if not (it will never hit);
- a hit on a cached free block takes it out of the free queue (`touch`);
- full blocks are registered under their chained hash; two blocks with one hash
  are both kept and the first registered one serves hits.

Per-request state lives here too, one row per request slot: the block table,
how many of its blocks are registered, and the request's chained block hashes.
Everything is an int array, so the step kernels (passes and lowering) index it
directly and a step dump can print it (`mem.pool`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import numba as nb
import numpy as np

if TYPE_CHECKING:
    from schedir.lowering.host_pool import HostPool

# meta[] slots
NUM_FREE = 0
CACHING = 1
BLOCK_SIZE = 2
CACHED_FREE = 3  # free blocks that still hold a registered hash (revivable by a hit)
# the registration log: how many block hashes were registered since the pool was made, and the
# last REG_LOG_LEN of them (a ring). A waiting request's prefix hit of k blocks grows only when
# its block k's hash is registered (and shrinks only when one of its k blocks is evicted), so a
# hit can be held across steps while that hash is not in the log (`schedir.lowering.held_hits`);
# registrations the log cannot name (a restored pool, a copied-in prefix) advance REG_SEQ past
# the ring, which drops every hold.
REG_SEQ = 4
REG_LOG = 5
REG_LOG_LEN = 1024
META_SIZE = REG_LOG + REG_LOG_LEN

# meta[CACHING]: 0 (off), CACHE_V1 (vLLM v1's BlockPool, this module's docstring) or CACHE_V0 (vLLM
# v0's PrefixCachingBlockAllocator with its LRU evictor, vllm/core/block/prefix_caching_block.py and
# vllm/core/evictor.py in 0.8.5), which differs in four rules (`v0_free_row`, `v0_cache_full_blocks`,
# `take_prefix` as each request is allocated, and `v0_computed_blocks`): a freed cached block is
# evicted by (last access, deepest first, block id), not by when it was freed; a block that fills with content already cached is
# given up for the cached one; an admitted request takes every cached block of its prompt as it is
# allocated (another admitted earlier in the step may have registered them); and a block counts as
# a prefix hit for the token budget only once "computed", after the step that registered it.
CACHE_V1, CACHE_V0 = 1, 2
# a v0 pool's meta goes on after the log: the step being scheduled (blocks registered in it are not
# computed yet), the last access given to the blocks freed now (their request's last scheduled
# step), then three facts per block: its last access, its depth in its chain (blocks; v0's
# num_hashed_tokens / block_size) and the step it was registered in
V0_NOW = META_SIZE
V0_TS = META_SIZE + 1
V0_BLOCKS = META_SIZE + 2


# rows of the prefix cache table (`KVPool.cache`, int64[2, capacity])
CACHE_KEY = 0  # a registered hash; 0 = empty slot (0 is never a block hash)
CACHE_HEAD = 1  # the first block registered under that hash
_FIB = np.uint64(0x9E3779B97F4A7C15)


def new_cache(num_blocks: int) -> np.ndarray:
    """An empty prefix cache for a pool of `num_blocks`: an open-addressing hash table
    (linear probing) in one int64 array, at most half full since every registered hash
    names at least one distinct block. Numba's typed `Dict` did the same job at ~150 ns a
    lookup plus ~0.8 µs to unbox per kernel call; probing an array costs a few ns."""
    capacity = 16
    while capacity < 2 * num_blocks:
        capacity *= 2
    return np.zeros((2, capacity), dtype=np.int64)


class BlockTables:
    """What the runtime reads from any pool kind: per-row block (page) tables and their shape.
    A pool has `num_blocks` (block 0 reserved), `table` (rows x width) and `nblk` (per row)."""

    num_blocks: int
    table: np.ndarray
    nblk: np.ndarray

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def rows(self) -> int:
        return self.table.shape[0]

    @property
    def width(self) -> int:
        return self.table.shape[1]

    def blocks_of(self, row: int) -> np.ndarray:
        return self.table[row, : self.nblk[row]]


@attrs.define(eq=False)
class KVPool(BlockTables):
    """Block pool + prefix cache + per-request block tables (arrays; see module docstring)."""

    num_blocks: int
    block_size: int
    ref: np.ndarray  # int32[N]: requests holding each block
    bhash: np.ndarray  # int64[N]: registered hash, 0 = none
    dup_next: np.ndarray  # int32[N]: next block registered under the same hash, -1 = none
    nxt: np.ndarray  # int32[N+2]: free queue links; N = head sentinel, N+1 = tail sentinel
    prv: np.ndarray  # int32[N+2]
    meta: np.ndarray  # int64[META_SIZE]: free count, caching flag, block size
    cache: np.ndarray  # int64[2, C]: hash -> first block registered under it (see `new_cache`)
    table: np.ndarray  # int32[R, W]: block ids per request row
    nblk: np.ndarray  # int32[R]: blocks held
    ncached: np.ndarray  # int32[R]: leading blocks already registered in the cache
    rhash: np.ndarray  # int64[R, W]: chained hashes of the row's full blocks
    nhash: np.ndarray  # int32[R]
    # the host tier a request preempted by swap keeps its KV in (vLLM v0); None: no swap space
    host: HostPool | None = None
    # a v0 pool's prefix hit noted per waiting request row (v0's ComputedBlocksTracker keeps the
    # first one it finds while the request waits; -1: none noted), see `v0_kernels.v0_prefills`
    v0_noted: np.ndarray = attrs.field(factory=lambda: np.full(0, -1, dtype=np.int64))
    # ... and per request row the last step it was scheduled in: the last access its blocks get
    # when it is freed (v0's LastAccessBlocksTracker), `meta[V0_TS]` for that free
    v0_access: np.ndarray = attrs.field(factory=lambda: np.zeros(0, dtype=np.int64))

    @classmethod
    def create(cls, num_blocks: int, block_size: int, max_blocks_per_request: int, rows: int = 16,
               enable_caching: bool = True, host_blocks: int = 0, cache_kind: int = CACHE_V1) -> KVPool:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (block 0 is reserved), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        n = num_blocks
        nxt = np.full(n + 2, -1, dtype=np.int32)
        prv = np.full(n + 2, -1, dtype=np.int32)
        order = np.arange(1, n, dtype=np.int32)
        chain = np.concatenate(([n], order, [n + 1])).astype(np.int32)
        nxt[chain[:-1]] = chain[1:]
        prv[chain[1:]] = chain[:-1]
        if cache_kind not in (CACHE_V1, CACHE_V0):
            raise ValueError(f"cache_kind must be CACHE_V1 or CACHE_V0, got {cache_kind}")
        v0 = enable_caching and cache_kind == CACHE_V0
        meta = np.zeros(V0_BLOCKS + 3 * n if v0 else META_SIZE, dtype=np.int64)
        meta[NUM_FREE] = n - 1
        meta[CACHING] = cache_kind if enable_caching else 0
        meta[BLOCK_SIZE] = block_size
        width = max(1, max_blocks_per_request)
        from schedir.lowering.host_pool import HostPool  # the host tier's kernels use this module's

        return cls(
            num_blocks=n, block_size=block_size,
            ref=np.zeros(n, dtype=np.int32), bhash=np.zeros(n, dtype=np.int64),
            dup_next=np.full(n, -1, dtype=np.int32), nxt=nxt, prv=prv, meta=meta, cache=new_cache(n),
            table=np.zeros((rows, width), dtype=np.int32), nblk=np.zeros(rows, dtype=np.int32),
            ncached=np.zeros(rows, dtype=np.int32), rhash=np.zeros((rows, width), dtype=np.int64),
            nhash=np.zeros(rows, dtype=np.int32),
            host=HostPool.create(host_blocks, rows, width, n) if host_blocks > 0 else None,
            v0_noted=np.full(rows, -1, dtype=np.int64), v0_access=np.zeros(rows, dtype=np.int64),
        )

    # ------------------------------------------------------------ facts
    @property
    def enable_caching(self) -> bool:
        return bool(self.meta[CACHING])

    @property
    def cache_kind(self) -> int:
        """CACHE_V1 or CACHE_V0 (see their comment), 0 without caching."""
        return int(self.meta[CACHING])

    @property
    def kind(self) -> str:
        """The runtime's name for this pool kind: "v0-blocks" under v0's allocator, else "blocks"."""
        return "v0-blocks" if self.meta[CACHING] == CACHE_V0 else "blocks"

    def v0_step(self, now: int) -> None:
        """A v0 pool's clock: the step being scheduled (blocks registered in it are computed after it)."""
        self.meta[V0_NOW] = now

    def v0_scheduled(self, rows: np.ndarray, step: int) -> None:
        """A v0 pool: `rows` were scheduled in `step` (the last access their blocks get when freed)."""
        self.v0_access[rows] = step

    def v0_forget(self, rows: np.ndarray) -> None:
        """A v0 pool: `rows` were freed or take a new request: the hits noted for them go (v0's
        `ComputedBlocksTracker.remove_seq`)."""
        self.v0_noted[rows] = -1

    @property
    def num_free(self) -> int:
        return int(self.meta[NUM_FREE])

    def num_cached_free(self) -> int:
        """Free blocks that still hold a cached prefix (revivable by a hit); kept as a counter."""
        return int(self.meta[CACHED_FREE])

    def free_queue(self) -> np.ndarray:
        return free_queue_order(self.nxt, self.num_blocks, int(self.meta[NUM_FREE]))

    # ------------------------------------------------------------ growth and copies
    def grow_rows(self, rows: int) -> None:
        """Make room for `rows` request rows (the runtime doubles its table). The wide tables
        keep only each row's used prefix (see `grown_rows`)."""
        if rows <= self.rows:
            return
        from schedir.lowering.rows import grown_rows  # see there: no copy of the unused columns

        extra = rows - self.rows
        self.table = grown_rows(self.table, self.nblk, rows)
        self.rhash = grown_rows(self.rhash, self.nhash, rows)
        self.nblk = np.concatenate([self.nblk, np.zeros(extra, dtype=np.int32)])
        self.ncached = np.concatenate([self.ncached, np.zeros(extra, dtype=np.int32)])
        self.nhash = np.concatenate([self.nhash, np.zeros(extra, dtype=np.int32)])
        self.v0_noted = np.concatenate([self.v0_noted, np.full(rows - self.v0_noted.size, -1, dtype=np.int64)])
        self.v0_access = np.concatenate([self.v0_access, np.zeros(rows - self.v0_access.size, dtype=np.int64)])
        if self.host is not None:
            self.host.grow_rows(rows)

    def grow_width(self, width: int) -> None:
        """Make each row's block table hold `width` blocks: a pipeline that runs a request longer
        than max_model_len (vLLM v0 with chunked prefill compares the prompt limit with the chunk)
        needs more than the width the runtime sized from max_model_len."""
        if width <= self.width:
            return
        extra = width - self.width
        self.table = np.concatenate([self.table, np.zeros((self.rows, extra), dtype=np.int32)], axis=1)
        self.rhash = np.concatenate([self.rhash, np.zeros((self.rows, extra), dtype=np.int64)], axis=1)
        if self.host is not None:
            host = self.host
            host.htable = np.concatenate([host.htable, np.zeros((host.htable.shape[0], extra), dtype=np.int32)],
                                         axis=1)
            host.log = np.zeros((3, host.log.shape[1] + extra), dtype=np.int64)

    def copy(self) -> KVPool:
        """A private copy (dumped steps run on one, so the dump shows the state they started from)."""
        return KVPool(
            num_blocks=self.num_blocks, block_size=self.block_size, ref=self.ref.copy(), bhash=self.bhash.copy(),
            dup_next=self.dup_next.copy(), nxt=self.nxt.copy(), prv=self.prv.copy(), meta=self.meta.copy(),
            cache=self.cache.copy(), table=self.table.copy(), nblk=self.nblk.copy(), ncached=self.ncached.copy(),
            rhash=self.rhash.copy(), nhash=self.nhash.copy(),
            host=self.host.copy() if self.host is not None else None, v0_noted=self.v0_noted.copy(),
            v0_access=self.v0_access.copy(),
        )

    def cached_blocks(self) -> tuple[np.ndarray, np.ndarray]:
        """(blocks, hashes) of every registered block, each hash's blocks in registration order,
        so registering them again in this order rebuilds the same cache. Hashes come in the
        order of their first block's id: the same for a pool and its reloaded dump."""
        blocks: list[int] = []
        hashes: list[int] = []
        slots = np.flatnonzero(self.cache[CACHE_KEY])
        slots = slots[np.argsort(self.cache[CACHE_HEAD, slots])]
        for h, head in zip(self.cache[CACHE_KEY, slots].tolist(), self.cache[CACHE_HEAD, slots].tolist(), strict=True):
            b = int(head)
            while b >= 0:
                blocks.append(b)
                hashes.append(int(h))
                b = int(self.dup_next[b])
        return np.asarray(blocks, dtype=np.int64), np.asarray(hashes, dtype=np.int64)

    def reset_prefix_cache(self) -> bool:
        """Drop every registered hash (free blocks stay in the free queue, in order); only when
        no block is held, else False and nothing changes (vLLM's rule)."""
        if self.num_free != self.usable_blocks:
            return False
        self.bhash[:] = 0
        self.dup_next[:] = -1
        self.cache[:] = 0
        self.meta[CACHED_FREE] = 0
        self.ncached[:] = 0
        return True

    def adopt_cached(self, hashes: np.ndarray) -> int:
        """Take in a prefix's KV copied from another pool (a fleet's replication or migration):
        the chained block `hashes` become cached free blocks here, so a later request with that
        prefix hits them. Hashes already registered stay (a free one moves to the back of the free
        queue, as if just freed); each missing one takes a block from the front of the free queue
        (evicting the least recently freed cached block, as an allocation does) and goes to the
        back, registered. Free and held counts do not change. Returns the blocks newly registered,
        or -1, changing nothing, when the missing ones outnumber the free blocks not in the chain
        (or caching is off): a copy never evicts its own chain nor touches a held block."""
        hashes = np.asarray(hashes, dtype=np.int64)
        if not self.enable_caching or (hashes == 0).any():  # 0 means "no hash"
            return -1
        n = self.num_blocks
        nxt, prv, meta = self.nxt, self.prv, self.meta
        present = np.array([cache_get(self.cache, h) for h in hashes.tolist()], dtype=np.int64)
        own_free = [b for b in present.tolist() if b >= 0 and self.ref[b] == 0]
        missing = hashes[present < 0]
        if missing.size > self.num_free - len(set(own_free)):
            return -1
        for b in own_free:  # refreshed: most recently freed
            _unlink(nxt, prv, b)
            _insert_after(nxt, prv, prv[n + 1], b)
        if missing.size:
            forget_registrations(meta)
        for h in missing.tolist():
            b = int(nxt[n])
            _unlink(nxt, prv, b)
            if self.bhash[b] != 0:
                evict_hash(b, self.bhash, self.dup_next, self.cache)
                meta[CACHED_FREE] -= 1
            register_hash(b, np.int64(h), self.bhash, self.dup_next, self.cache)
            _insert_after(nxt, prv, prv[n + 1], b)
            meta[CACHED_FREE] += 1
        return int(missing.size)

    def cached_tokens(self, rows: np.ndarray, total: np.ndarray) -> np.ndarray:
        """The prefix-cache question every pool answers: tokens of each row the cache holds
        (full blocks by chained hash, never the last known token)."""
        if not self.enable_caching or rows.size == 0:
            return np.zeros(rows.size, dtype=np.int64)
        hit, _ = match_rows(rows, total, self.block_size, self.ref, self.rhash, self.nhash, self.cache)
        return hit

    # ------------------------------------------------------------ request-level operations
    def free_request(self, row: int) -> int:
        """Free a row's blocks tail first (and its host blocks, if it was swapped out); returns
        how many device blocks went back to the free queue."""
        if self.host is not None and self.host.hnblk[row]:
            self.host.free_request(row)
        if self.meta[CACHING] == CACHE_V0:
            self.meta[V0_TS] = self.v0_access[row]
            if self.nblk[row]:
                self.v0_noted[row] = -1
        return int(free_row(row, self.ref, self.bhash, self.dup_next, self.nxt, self.prv, self.meta, self.cache,
                            self.table, self.nblk, self.ncached))

    def check(self) -> None:
        """Raise AssertionError if the pool's invariants do not hold (tests and debug runs)."""
        n = self.num_blocks
        free = self.free_queue()
        if free.size != self.num_free:
            raise AssertionError(f"free queue holds {free.size} blocks, counter says {self.num_free}")
        if np.unique(free).size != free.size or (free == 0).any():
            raise AssertionError("free queue repeats a block or holds the null block")
        refs = np.zeros(n, dtype=np.int64)
        for row in range(self.rows):
            k = int(self.nblk[row])
            if k:
                np.add.at(refs, self.table[row, :k].astype(np.int64), 1)
        if not np.array_equal(refs, self.ref.astype(np.int64)):
            bad = np.flatnonzero(refs != self.ref)[:10]
            raise AssertionError(f"ref counts disagree with block tables at blocks {bad.tolist()}")
        in_free = np.zeros(n, dtype=bool)
        in_free[free] = True
        held = self.ref > 0
        if (held & in_free).any() or (~held & ~in_free)[1:].any():
            raise AssertionError("a block is both held and free, or neither")
        if held.sum() + free.size != n - 1:
            raise AssertionError("blocks are not conserved: held + free != usable")
        walked = int(count_cached_free(self.nxt, self.bhash, n))
        if walked != self.num_cached_free():
            raise AssertionError(f"cached-free counter says {self.num_cached_free()}, the free queue holds {walked}")
        blocks, hashes = self.cached_blocks()
        if not np.array_equal(self.bhash[blocks], hashes) or np.count_nonzero(self.bhash) != blocks.size:
            raise AssertionError("cache map and block hashes disagree")
        if self.host is not None:
            self.host.check()
            both = np.flatnonzero((self.host.hnblk > 0) & (self.nblk > 0))
            if both.size:
                raise AssertionError(f"request rows {both[:10].tolist()} hold blocks on the device and the host")


# ---------------------------------------------------------------- free queue primitives
@nb.njit(cache=True, inline="always")
def _unlink(nxt: np.ndarray, prv: np.ndarray, b: int) -> None:
    p = prv[b]
    q = nxt[b]
    nxt[p] = q
    prv[q] = p
    nxt[b] = -1
    prv[b] = -1


@nb.njit(cache=True, inline="always")
def _insert_after(nxt: np.ndarray, prv: np.ndarray, at: int, b: int) -> None:
    q = nxt[at]
    nxt[at] = b
    prv[b] = at
    nxt[b] = q
    prv[q] = b


@nb.njit(cache=True)
def free_queue_order(nxt: np.ndarray, n: int, count: int) -> np.ndarray:
    out = np.empty(count, dtype=np.int64)
    b = nxt[n]
    k = 0
    while b != n + 1 and k < count:
        out[k] = b
        k += 1
        b = nxt[b]
    return out[:k]


@nb.njit(cache=True)
def count_cached_free(nxt: np.ndarray, bhash: np.ndarray, n: int) -> int:
    b = nxt[n]
    k = 0
    while b != n + 1:
        if bhash[b] != 0:
            k += 1
        b = nxt[b]
    return k


# ---------------------------------------------------------------- prefix cache primitives
@nb.njit(cache=True, inline="always")
def _home(h: np.int64, mask: int) -> int:
    return int((np.uint64(h) * _FIB) >> np.uint64(32)) & mask


@nb.njit(cache=True, inline="always")
def table_slot(keys: np.ndarray, h: np.int64) -> int:
    """The slot holding `h` in the open-addressing table `keys` (a power-of-two size, 0 an empty
    slot), or else the empty slot where it would go: the one probe loop of the prefix cache and
    of the small tables its readers build (`chain_memo`, `held_hits`)."""
    mask = keys.size - 1
    i = _home(h, mask)
    while keys[i] != 0 and keys[i] != h:
        i = (i + 1) & mask
    return i


@nb.njit(cache=True)
def cache_find(cache: np.ndarray, h: np.int64) -> int:
    """The slot holding hash `h`, or else the empty slot where it would go (lookups and inserts
    both start here)."""
    return table_slot(cache[CACHE_KEY], h)


@nb.njit(cache=True)
def cache_slot(cache: np.ndarray, h: np.int64) -> int:
    """The slot holding hash `h`, or -1."""
    i = cache_find(cache, h)
    return i if cache[CACHE_KEY, i] == h else -1


@nb.njit(cache=True)
def cache_get(cache: np.ndarray, h: np.int64) -> int:
    """The first block registered under `h`, or -1."""
    i = cache_slot(cache, h)
    return cache[CACHE_HEAD, i] if i >= 0 else -1


@nb.njit(cache=True)
def cache_put(cache: np.ndarray, h: np.int64, b: int) -> None:
    """Map `h` to block `b` (inserting `h` if absent)."""
    i = cache_find(cache, h)
    cache[CACHE_KEY, i] = h
    cache[CACHE_HEAD, i] = b


@nb.njit(cache=True)
def cache_delete(cache: np.ndarray, slot: int) -> None:
    """Empty `slot`, shifting later entries of its probe run back (no tombstones, so a
    lookup never walks past deleted entries)."""
    keys = cache[CACHE_KEY]
    mask = keys.size - 1
    i = slot
    j = slot
    while True:
        j = (j + 1) & mask
        if keys[j] == 0:
            break
        k = _home(keys[j], mask)
        # the entry at j may move to i unless its home lies cyclically in (i, j]
        if (i <= j and (k <= i or k > j)) or (i > j and k <= i and k > j):
            keys[i] = keys[j]
            cache[CACHE_HEAD, i] = cache[CACHE_HEAD, j]
            i = j
    keys[i] = 0
    cache[CACHE_HEAD, i] = 0


@nb.njit(cache=True)
def evict_hash(b: int, bhash: np.ndarray, dup_next: np.ndarray, cache) -> bool:
    """Drop block `b`'s registration (if any) from the cache."""
    h = bhash[b]
    if h == 0:
        return False
    slot = cache_slot(cache, h)
    head = cache[CACHE_HEAD, slot] if slot >= 0 else -1
    if head == b:
        nb_ = dup_next[b]
        if nb_ < 0:
            cache_delete(cache, slot)
        else:
            cache[CACHE_HEAD, slot] = nb_
    elif head >= 0:
        p = head
        while dup_next[p] >= 0 and dup_next[p] != b:
            p = dup_next[p]
        if dup_next[p] == b:
            dup_next[p] = dup_next[b]
    dup_next[b] = -1
    bhash[b] = 0
    return True


@nb.njit(cache=True)
def register_hash(b: int, h: np.int64, bhash: np.ndarray, dup_next: np.ndarray, cache) -> None:
    """Register block `b` under hash `h` (after any block already registered under it)."""
    if bhash[b] == h:
        return
    if bhash[b] != 0:
        evict_hash(b, bhash, dup_next, cache)
    bhash[b] = h
    dup_next[b] = -1
    slot = cache_find(cache, h)  # one probe: h's slot, or the empty one it takes
    if cache[CACHE_KEY, slot] != h:
        cache[CACHE_KEY, slot] = h
        cache[CACHE_HEAD, slot] = b
    else:
        p = cache[CACHE_HEAD, slot]
        while dup_next[p] >= 0:
            p = dup_next[p]
        dup_next[p] = b


@nb.njit(cache=True)
def lookup_prefix(row: int, max_blocks: int, rhash: np.ndarray, nhash: np.ndarray, cache, out: np.ndarray) -> int:
    """Leading blocks of `row`'s hash chain found in the cache (at most `max_blocks`), into `out`."""
    k = 0
    limit = min(nhash[row], max_blocks)
    while k < limit:
        b = cache_get(cache, rhash[row, k])
        if b < 0:
            break
        out[k] = b
        k += 1
    return k


@nb.njit(cache=True, inline="always")
def log_registration(meta: np.ndarray, h: np.int64) -> None:
    """Note in the registration log (`REG_SEQ`) that a block was registered under hash `h`."""
    seq = meta[REG_SEQ]
    meta[REG_LOG + seq % REG_LOG_LEN] = h
    meta[REG_SEQ] = seq + 1


def forget_registrations(meta: np.ndarray) -> None:
    """Registrations the log cannot name took place: advance it past its ring."""
    meta[REG_SEQ] += REG_LOG_LEN + 1


# ---------------------------------------------------------------- request-level kernels
@nb.njit(cache=True)
def allocate(row: int, count: int, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk) -> None:
    """Give `row` `count` blocks from the front of the free queue (evicting their cached hash)."""
    n = nxt.size - 2
    k = nblk[row]
    for _ in range(count):
        b = nxt[n]
        _unlink(nxt, prv, b)
        if bhash[b] != 0:
            evict_hash(b, bhash, dup_next, cache)
            meta[CACHED_FREE] -= 1
        ref[b] = 1
        table[row, k] = b
        k += 1
    nblk[row] = k
    meta[NUM_FREE] -= count


@nb.njit(cache=True)
def touch(blocks: np.ndarray, count: int, ref, bhash, nxt, prv, meta) -> None:
    """Take hit blocks: one more holder each; a cached free block leaves the free queue."""
    for i in range(count):
        _hold(blocks[i], ref, bhash, nxt, prv, meta)


@nb.njit(cache=True, inline="always")
def _hold(b: int, ref, bhash, nxt, prv, meta) -> None:
    """One more holder of block `b` (out of the free queue if it sat there)."""
    if ref[b] == 0:
        _unlink(nxt, prv, b)
        meta[NUM_FREE] -= 1
        if bhash[b] != 0:
            meta[CACHED_FREE] -= 1
    ref[b] += 1


@nb.njit(cache=True)
def take_prefix(row: int, want: int, ref, bhash, nxt, prv, meta, cache, table, nblk, ncached, rhash, nhash,
                scratch) -> int:
    """Give `row`, which holds no blocks, the leading cached blocks of its chain (at most `want`):
    one more holder each, out of the free queue if they sat there. Returns how many."""
    k = lookup_prefix(row, want, rhash, nhash, cache, scratch)
    touch(scratch, k, ref, bhash, nxt, prv, meta)
    for j in range(k):
        table[row, j] = scratch[j]
    nblk[row] = k
    ncached[row] = k
    return k


@nb.njit(cache=True)
def cache_full_blocks(row: int, num_tokens: int, bhash, dup_next, cache, meta, table, ncached, rhash, nhash) -> None:
    """Register `row`'s full blocks up to `num_tokens` tokens under their chained hashes."""
    if meta[CACHING] == 0:
        return
    full = min(num_tokens // meta[BLOCK_SIZE], nhash[row])
    for i in range(ncached[row], full):
        register_hash(table[row, i], rhash[row, i], bhash, dup_next, cache)
        log_registration(meta, rhash[row, i])
    ncached[row] = max(ncached[row], full)


@nb.njit(cache=True)
def free_row(row: int, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, ncached) -> int:
    """Free `row`'s blocks tail first: unhashed ones to the front of the free queue (in that
    order), hashed ones to the back (a v0 pool: `v0_free_row`). Returns how many blocks became free."""
    if meta[CACHING] == CACHE_V0:
        return v0_free_row(row, ref, bhash, nxt, prv, meta, table, nblk, ncached)
    n = nxt.size - 2
    k = nblk[row]
    caching = meta[CACHING] != 0
    cursor = n  # unhashed blocks are inserted after the head, keeping their order
    freed = 0
    for i in range(k - 1, -1, -1):
        b = table[row, i]
        ref[b] -= 1
        if ref[b] == 0:
            freed += 1
            if bhash[b] == 0 or not caching:
                _insert_after(nxt, prv, cursor, b)
                cursor = b
            else:
                _insert_after(nxt, prv, prv[n + 1], b)
                meta[CACHED_FREE] += 1
    meta[NUM_FREE] += freed
    nblk[row] = 0
    ncached[row] = 0
    return freed


# ---------------------------------------------------------------- vLLM v0's prefix-caching allocator
@nb.njit(cache=True, inline="always")
def _v0_evicted_before(meta: np.ndarray, n: int, a: int, b: int) -> bool:
    """Whether v0's LRUEvictor evicts free block `a` before `b`: the least recently accessed
    first, then the deepest in its chain (most hashed tokens), then the lower block id
    (evictor.py: its heap of (last_accessed, -num_hashed_tokens, block_id))."""
    la, lb = meta[V0_BLOCKS + a], meta[V0_BLOCKS + b]
    if la != lb:
        return la < lb
    da, db = meta[V0_BLOCKS + n + a], meta[V0_BLOCKS + n + b]
    if da != db:
        return da > db
    return a < b


@nb.njit(cache=True)
def v0_free_row(row: int, ref, bhash, nxt, prv, meta, table, nblk, ncached) -> int:
    """v0's `SelfAttnBlockSpaceManager.free`: every block of the row takes the request's last
    access (`meta[V0_TS]`; `mark_blocks_as_accessed`), then its blocks are freed in table order:
    an unhashed one to the front of the free queue (v0's hashless allocator hands out the last
    freed first), a cached one into the evictor's order, which the free queue after the unhashed
    blocks keeps (`_v0_evicted_before`), so `allocate` takes v0's next block from the front.
    Returns how many blocks became free."""
    n = nxt.size - 2
    k = nblk[row]
    ts = meta[V0_TS]
    for i in range(k):
        meta[V0_BLOCKS + table[row, i]] = ts
    freed = 0
    for i in range(k):
        b = table[row, i]
        ref[b] -= 1
        if ref[b] == 0:
            freed += 1
            if bhash[b] == 0:
                _insert_after(nxt, prv, n, b)
            else:
                p = prv[n + 1]  # the newest access is usually the latest: walk back from the tail
                while p != n and bhash[p] != 0 and _v0_evicted_before(meta, n, b, p):
                    p = prv[p]
                _insert_after(nxt, prv, p, b)
                meta[CACHED_FREE] += 1
    meta[NUM_FREE] += freed
    nblk[row] = 0
    ncached[row] = 0
    return freed


@nb.njit(cache=True)
def v0_cache_full_blocks(row: int, num_tokens: int, ref, bhash, dup_next, nxt, prv, meta, cache, table, ncached,
                         rhash, nhash) -> None:
    """v0's `promote_to_immutable_block` for `row`'s blocks full up to `num_tokens` tokens: a block
    whose content no block holds yet is registered (its depth and the step noted: it counts as
    computed once that step is over); one whose content a cached block holds is given up for it
    (the cached block gains a holder and leaves the free queue if it sat there; the given-up block
    goes to the front, unhashed)."""
    full = min(num_tokens // meta[BLOCK_SIZE], nhash[row])
    n = nxt.size - 2
    for i in range(ncached[row], full):
        b = table[row, i]
        h = rhash[row, i]
        c = cache_get(cache, h)
        if c < 0:
            register_hash(b, h, bhash, dup_next, cache)
            log_registration(meta, h)
            meta[V0_BLOCKS + n + b] = i + 1
            meta[V0_BLOCKS + 2 * n + b] = meta[V0_NOW]
        elif c != b:
            _hold(c, ref, bhash, nxt, prv, meta)
            table[row, i] = c
            ref[b] -= 1
            if ref[b] == 0:
                _insert_after(nxt, prv, n, b)
                meta[NUM_FREE] += 1
    ncached[row] = max(ncached[row], full)


@nb.njit(cache=True)
def register_full_blocks(row: int, num_tokens: int, ref, bhash, dup_next, nxt, prv, meta, cache, table, ncached,
                         rhash, nhash) -> None:
    """`cache_full_blocks`, or `v0_cache_full_blocks` on a v0 pool."""
    if meta[CACHING] == CACHE_V0:
        v0_cache_full_blocks(row, num_tokens, ref, bhash, dup_next, nxt, prv, meta, cache, table, ncached, rhash,
                             nhash)
    else:
        cache_full_blocks(row, num_tokens, bhash, dup_next, cache, meta, table, ncached, rhash, nhash)


@nb.njit(cache=True)
def v0_computed_blocks(row: int, ref, meta, cache, rhash, nhash) -> int:
    """v0's `find_cached_blocks_prefix` for the prefix hit the token budget counts: the leading
    full blocks of `row` whose content is cached and computed (registered before the step being
    scheduled, or free in the evictor; a block registered in this step is not, so two requests
    sharing a new prefix in one step are both charged for it)."""
    n = ref.size
    now = meta[V0_NOW]
    k = 0
    while k < nhash[row]:
        b = cache_get(cache, rhash[row, k])
        if b < 0 or (ref[b] > 0 and meta[V0_BLOCKS + 2 * n + b] >= now):
            break
        k += 1
    return k


@nb.njit(cache=True)
def match_rows(rows: np.ndarray, total: np.ndarray, block_size: int, ref, rhash, nhash, cache):
    """Prefix hits of each row as the pool stands (for count-level policies): hit tokens (full
    blocks, never the last known token) and how many hit blocks sit in the free queue."""
    n = rows.size
    hit = np.zeros(n, dtype=np.int64)
    cached_free = np.zeros(n, dtype=np.int64)
    chains = chain_memo(n)
    for i in range(n):
        k, cached_free[i] = match_row(rows[i], (total[i] - 1) // block_size, ref, rhash, nhash, cache, chains)
        hit[i] = k * block_size
    return hit, cached_free


# a match call's chain memo (`chain_memo`): at most this many chain blocks remembered
CHAIN_MEMO_MAX = 1 << 13


@nb.njit(cache=True)
def chain_memo(rows: int) -> np.ndarray:
    """The memo of one match call over `rows` rows (`match_row`): int64[3, slots], row 0 the
    cached chain blocks' hashes (0: empty slot), row 1 the free-queue blocks among the chain's
    blocks up to each, [2, 0] how many slots are taken and [2, 1] the last row's hit (the next
    row's first guess); a power-of-two size."""
    size = 64
    while size < min(8 * rows, CHAIN_MEMO_MAX):
        size *= 2
    return np.zeros((3, size), dtype=np.int64)


@nb.njit(cache=True)
def match_row(row: int, limit: int, ref, rhash, nhash, cache, chains: np.ndarray) -> tuple[int, int]:
    """One row's prefix hit in blocks (at most `limit`) and how many of them sit in the free
    queue, as `lookup_prefix` walks it, with the chains the call's other rows walked
    remembered (`chain_memo`): requests that share a prefix (a system prompt) share its chain
    hashes, so a row's hit starts at the deepest of its blocks the memo holds (a binary search:
    the memo holds a prefix of each chain, as the walks that filled it found them) and probes
    the cache only past it, the last row's hit tried first. 5,000 waiting requests behind a
    32-block system prompt: 2.8 ms -> 0.7 ms a call (two memo slots and one cache probe each,
    not 33 cache probes)."""
    keys = chains[0]
    limit = min(nhash[row], limit)
    lo, hi = 0, limit  # the deepest prefix of the row's chain the memo holds: lo blocks
    guess = min(chains[2, 1], limit)  # the last row's: rows behind one prompt hit alike
    if guess > 0:
        h = rhash[row, guess - 1]
        if h != 0 and keys[table_slot(keys, h)] == h:
            lo = guess
            if guess < limit:
                h = rhash[row, guess]
                if h == 0 or keys[table_slot(keys, h)] != h:
                    hi = guess
        else:
            hi = guess - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        h = rhash[row, mid - 1]
        if h != 0 and keys[table_slot(keys, h)] == h:
            lo = mid
        else:
            hi = mid - 1
    k = lo
    free = chains[1, table_slot(keys, rhash[row, k - 1])] if k > 0 else 0
    room = keys.size // 2  # (half full at most: short probes)
    while k < limit:
        h = rhash[row, k]
        b = cache_get(cache, h)
        if b < 0:
            break
        if ref[b] == 0:
            free += 1
        if chains[2, 0] < room:
            j = table_slot(keys, h)
            if keys[j] == 0:
                keys[j] = h
                chains[1, j] = free
                chains[2, 0] += 1
        k += 1
    chains[2, 1] = k
    return k, free


@nb.njit(cache=True)
def commit(preempted, admitted, admitted_hit, rows, tokens, computed, total, max_model_len: int,
           ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, ncached, rhash, nhash) -> int:
    """Apply a count-level policy's decisions to the pool, in batch order: free the preempted,
    take the admitted requests' hit blocks (all of them first, so no allocation evicts them),
    allocate what each scheduled request still lacks and register its full blocks.
    Returns -1, or the index of the first request whose blocks did not fit."""
    bs = meta[2]
    for i in range(preempted.size):
        if nblk[preempted[i]] > 0:
            free_row(preempted[i], ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, ncached)
    scratch = np.empty(table.shape[1], dtype=np.int32)
    # v1 takes the admitted requests' hits first; v0 takes every cached block of a request as it
    # allocates it (`BlockTable.allocate`: v0 evicts deepest first, so they lead its chain)
    v0 = meta[CACHING] == CACHE_V0
    if not v0:
        for i in range(admitted.size):
            r = admitted[i]
            want = admitted_hit[i] // bs
            if want > 0 and nblk[r] == 0:
                take_prefix(r, want, ref, bhash, nxt, prv, meta, cache, table, nblk, ncached, rhash, nhash, scratch)
    for i in range(rows.size):
        r = rows[i]
        end = computed[i] + tokens[i]
        if v0 and nblk[r] == 0:
            take_prefix(r, nhash[r], ref, bhash, nxt, prv, meta, cache, table, nblk, ncached, rhash, nhash, scratch)
        need = max(-(-min(end, max_model_len) // bs) - nblk[r], 0)
        if need > meta[NUM_FREE]:
            return i
        allocate(r, need, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk)
        register_full_blocks(r, min(end, total[i]), ref, bhash, dup_next, nxt, prv, meta, cache, table, ncached,
                             rhash, nhash)
    return -1
