"""SGLang's KV memory as a pool kind: a page allocator under a radix prefix cache.

The `vllm`-style `KVPool` keeps freed blocks in an LRU free queue with their block hashes,
so "cached" and "free" are one list. SGLang keeps them apart: a page is either free
(`TokenToKVPoolAllocator.available_size`), owned by a running request, or owned by the radix
tree, where an unlocked leaf can be evicted (`RadixCache.evictable_size`). Requests lock the
tree path of their cached prefix; their computed KV is inserted into the tree after each
prefill (`checkpoint_kv_cache`) and when they finish (`release_kv_cache`); a retracted
request's KV is freed without insertion. This module is that model over arrays, with the
radix tree of `schedir.lowering.radix_cache`:

- `match(row, limit)`: SGLang's `match_prefix` on the row's tokens (cut to whole pages);
- `lock_row` / `unlock_row`: `inc_lock_ref` / `dec_lock_ref` of the row's path;
- `extend(rows, prefix, ends)`: `prepare_for_extend` (evict the shortfall, allocate pages);
- `decode(rows)`: `prepare_for_decode` (one token each);
- `checkpoint(row, up_to)`: insert the computed prefix, free duplicate pages, re-lock;
- `release(row, insert)`: `release_kv_cache` (finish: insert; retract: free only);
- `evict(tokens)`: LRU leaves first, their pages back to the free list.

It presents the arrays the runtime's generic code reads from any pool (`table`, `nblk`,
`num_free`, `usable_blocks`, ...): `table` holds a row's pages, `num_free` counts free plus
evictable pages (what an allocation can get). Block 0 is reserved, as in SGLang's allocator.
The row token streams (prompt + outputs) are kept here because the tree is keyed by tokens.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from schedir.lowering.kv_pool import BlockTables
from schedir.lowering.radix_cache import EVICTABLE, ROOT, RadixCache

KIND = "radix"


class RadixKVPool(BlockTables):
    """Pages + radix tree + per-row page tables, prefix locks and token streams."""

    kind = KIND
    fact = "radix-pool"  # what a step carrying this pool records (pool-level passes require it)
    enable_caching = True

    def __init__(self, num_blocks: int, block_size: int, max_blocks_per_request: int, rows: int = 16) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (block 0 is reserved), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.radix = RadixCache(page_size=block_size, nodes=1024, tokens=max(1 << 12, 2 * num_blocks * block_size))
        # free pages, taken from the front as SGLang's allocator takes `free_pages[:need]`
        self.free = np.arange(1, num_blocks, dtype=np.int64)  # a ring: free[head:][:nfree], wrapping
        self.head = 0
        self.nfree = num_blocks - 1
        width = max(1, max_blocks_per_request)
        self.table = np.zeros((rows, width), dtype=np.int32)
        self.nblk = np.zeros(rows, dtype=np.int32)
        self.kv_len = np.zeros(rows, dtype=np.int64)  # tokens whose KV the row holds (prefix included)
        self.protected = np.zeros(rows, dtype=np.int64)  # leading tokens owned by the tree (cache_protected_len)
        self.lock = np.full(rows, -1, dtype=np.int64)  # the tree node the row has locked, -1: none
        # each row's token stream (prompt + outputs) in one arena: row r holds arena[start[r]:][:seq_len[r]],
        # with room for cap[r] tokens (prompt + max_tokens + 1), so appending a step's tokens is one scatter
        self.arena = np.zeros(1 << 12, dtype=np.int64)
        self.arena_top = 0
        self.start = np.zeros(rows, dtype=np.int64)
        self.cap = np.zeros(rows, dtype=np.int64)
        self.seq_len = np.zeros(rows, dtype=np.int64)
        self.prompt_len = np.zeros(rows, dtype=np.int64)
        # arrays the runtime's token bookkeeping writes for any pool (hashes are unused here)
        self.ncached = np.zeros(rows, dtype=np.int32)
        self.rhash = np.zeros((rows, width), dtype=np.int64)
        self.nhash = np.zeros(rows, dtype=np.int32)
        self.bhash = np.zeros(num_blocks, dtype=np.int64)
        self.dup_next = np.full(num_blocks, -1, dtype=np.int32)
        self.cache = np.zeros((2, 2), dtype=np.int64)
        self.meta = np.zeros(4, dtype=np.int64)
        # the extend batch of the last schedule(): rows and the token each prefill reaches
        self.extend_rows = np.zeros(0, dtype=np.int64)
        self.extend_ends = np.zeros(0, dtype=np.int64)
        # rows whose prefill stopped mid-prompt: checkpointed at the next step's start
        self.stash: list[tuple[int, int]] = []

    # ------------------------------------------------------------ sizes (tokens)
    @property
    def page(self) -> int:
        return self.block_size

    @property
    def available(self) -> int:
        """Free tokens (SGLang's `allocator.available_size()`)."""
        return self.nfree * self.block_size

    @property
    def evictable(self) -> int:
        return self.radix.evictable_size

    @property
    def protected_size(self) -> int:
        return self.radix.protected_size

    @property
    def cache_tokens(self) -> int:
        return self.radix.total_size()

    # ------------------------------------------------------------ the generic pool facts (pages)
    @property
    def num_free(self) -> int:
        return self.nfree + int(self.radix.meta[EVICTABLE]) // self.block_size  # (read every step: no property hops)

    def num_cached_free(self) -> int:
        return self.evictable // self.block_size

    def grow_rows(self, rows: int) -> None:
        if rows <= self.rows:
            return
        extra = rows - self.rows

        def more(a: np.ndarray, fill: int = 0) -> np.ndarray:
            pad = np.full((extra, *a.shape[1:]), fill, dtype=a.dtype)
            return np.concatenate([a, pad])

        self.table, self.rhash = more(self.table), more(self.rhash)
        self.nblk, self.kv_len, self.protected = more(self.nblk), more(self.kv_len), more(self.protected)
        self.lock, self.seq_len, self.prompt_len = more(self.lock, -1), more(self.seq_len), more(self.prompt_len)
        self.ncached, self.nhash = more(self.ncached), more(self.nhash)
        self.start, self.cap = more(self.start), more(self.cap)

    def copy(self) -> RadixKVPool:
        """A private copy (a dumped step runs on one)."""
        new = object.__new__(RadixKVPool)
        new.__dict__.update({k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in self.__dict__.items()})
        new.stash = list(self.stash)
        radix = object.__new__(RadixCache)
        radix.__dict__.update({k: (v.copy() if isinstance(v, np.ndarray) else v)
                               for k, v in self.radix.__dict__.items()})
        new.radix = radix
        return new

    # ------------------------------------------------------------ rows and tokens
    def add_row(self, row: int, prompt: np.ndarray, max_tokens: int) -> None:
        """A new request: its token stream, no KV, no lock."""
        self.load_tokens(row, prompt, prompt.size + max_tokens + 1)
        self.prompt_len[row] = prompt.size
        self.nblk[row] = 0
        self.kv_len[row] = 0
        self.protected[row] = 0
        self.lock[row] = -1

    def load_tokens(self, row: int, tokens: np.ndarray, capacity: int) -> None:
        """Give `row` a stream holding `tokens` with room for `capacity` in all."""
        capacity = max(capacity, tokens.size, 1)
        if self.arena_top + capacity > self.arena.size:
            self._compact(capacity)
        at = self.arena_top
        self.arena[at: at + tokens.size] = tokens
        self.start[row], self.cap[row], self.seq_len[row] = at, capacity, tokens.size
        self.arena_top = at + capacity

    def _compact(self, more: int) -> None:
        """Move the live streams to the front of a big enough arena (released rows leave gaps)."""
        live = np.flatnonzero(self.cap > 0)
        need = int(self.cap[live].sum()) + more
        arena = np.zeros(max(self.arena.size, 2 * need), dtype=np.int64)
        top = 0
        for r in live.tolist():
            n = int(self.seq_len[r])
            arena[top: top + n] = self.arena[self.start[r]: self.start[r] + n]
            self.start[r] = top
            top += int(self.cap[r])
        self.arena, self.arena_top = arena, top

    def append_tokens(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """Sampled tokens (one per row, -1: none) join the rows' streams (one scatter)."""
        take = (tokens >= 0) & (self.cap[rows] > 0)
        rows, tokens = rows[take], tokens[take]
        full = self.seq_len[rows] >= self.cap[rows]
        for r in rows[full].tolist():  # past its room (not expected: max_tokens bounds it): move it
            self.load_tokens(r, self.tokens(r).copy(), 2 * int(self.cap[r]))
        self.arena[self.start[rows] + self.seq_len[rows]] = tokens
        self.seq_len[rows] += 1

    def tokens(self, row: int) -> np.ndarray:
        at = self.start[row]
        return self.arena[at: at + self.seq_len[row]]

    # ------------------------------------------------------------ the tree
    def match(self, row: int, limit: int) -> tuple[int, int]:
        """The cached prefix of the row's first `limit` tokens (whole pages): (tokens, node)."""
        return self.radix.match_prefix(self.tokens(row)[: max(limit, 0)])

    def cached_tokens(self, rows: np.ndarray, total: np.ndarray) -> np.ndarray:
        """The prefix-cache question every pool answers: tokens of each row's first `total - 1`
        the cache holds (whole pages), without touching the tree."""
        out = np.zeros(rows.size, dtype=np.int64)
        for i, (r, t) in enumerate(zip(rows.tolist(), total.tolist(), strict=True)):
            out[i] = self.radix.peek(self.tokens(r)[: max(t - 1, 0)])
        return out

    def match_tokens(self, tokens: np.ndarray) -> tuple[int, int]:
        return self.radix.match_prefix(tokens)

    def lock_node(self, node: int) -> None:
        self.radix.inc_lock(node)

    def unlock_node(self, node: int) -> None:
        self.radix.dec_lock(node)

    def lock_row(self, row: int, node: int) -> None:
        self.radix.inc_lock(node)
        self.lock[row] = node

    def unlock_row(self, row: int) -> None:
        node = int(self.lock[row])
        if node >= 0:
            self.radix.dec_lock(node)
            self.lock[row] = -1

    def evict(self, num_tokens: int) -> int:
        """Evict unlocked leaves (LRU) until `num_tokens` are freed or none is left; returns tokens freed."""
        if num_tokens <= 0:
            return 0
        slots = self.radix.evict(num_tokens)
        if slots.size:
            self._free_pages(np.unique(slots // self.block_size) if self.block_size > 1 else slots)
        return int(slots.size)

    def evict_for(self, num_tokens: int) -> None:
        """SGLang's `evict_to_free_tokens`: evict the shortfall of `num_tokens` free tokens."""
        short = num_tokens - self.available
        if short > 0:
            self.evict(short)

    # ------------------------------------------------------------ pages
    def _free_pages(self, pages: np.ndarray) -> None:
        k = pages.size
        if not k:
            return
        if self.nfree + k > self.free.size:
            raise AssertionError("radix pool: more pages freed than exist")
        self.free[(self.head + self.nfree + np.arange(k)) % self.free.size] = pages
        self.nfree += k

    def _take_pages(self, count: int) -> np.ndarray:
        if count > self.nfree:
            raise MemoryError(f"radix pool: {count} pages asked, {self.nfree} free")
        out = self.free[(self.head + np.arange(count)) % self.free.size]
        self.head = (self.head + count) % self.free.size
        self.nfree -= count
        return out

    def free_pages(self) -> np.ndarray:
        """The free pages in the order they will be handed out."""
        return self.free[(self.head + np.arange(self.nfree)) % self.free.size]

    def _set_pages(self, row: int, start_page: int, pages: np.ndarray) -> None:
        end = start_page + pages.size
        if end > self.width:
            raise MemoryError(f"radix pool: row {row} needs {end} pages, the table holds {self.width}")
        self.table[row, start_page:end] = pages
        self.nblk[row] = max(int(self.nblk[row]), end)

    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # ------------------------------------------------------------ what a step does
    def begin(self, row: int, prefix: int, node: int) -> None:
        """A request (new or retracted) starts from its cached prefix: the tree's pages head its
        table; its lock was taken at admission (`lock_row`)."""
        pages = self.radix.values(node)[: prefix]
        self.nblk[row] = 0
        if prefix:
            self._set_pages(row, 0, (pages[:: self.block_size] // self.block_size) if self.block_size > 1 else pages)
        self.kv_len[row] = prefix
        self.protected[row] = prefix

    def extend(self, rows: np.ndarray, ends: np.ndarray) -> None:
        """`prepare_for_extend`: evict the batch's shortfall once, then give each row the pages
        that take it to `ends[i]` tokens (a partly used last page is filled first)."""
        need = 0
        for r, e in zip(rows.tolist(), ends.tolist(), strict=True):
            need += self._pages_for(e) - self._pages_for(int(self.kv_len[r]))
        extend_tokens = int(sum(int(e) - int(self.kv_len[r]) for r, e in zip(rows.tolist(), ends.tolist(), strict=True)))
        demand = extend_tokens if self.block_size == 1 else extend_tokens + rows.size * self.block_size
        self.evict_for(demand)
        for r, e in zip(rows.tolist(), ends.tolist(), strict=True):
            have = self._pages_for(int(self.kv_len[r]))
            k = self._pages_for(e) - have
            if k > 0:
                self._set_pages(r, have, self._take_pages(k))
            self.kv_len[r] = e
        self.extend_rows = np.asarray(rows, dtype=np.int64)
        self.extend_ends = np.asarray(ends, dtype=np.int64)

    def decode_pages_needed(self, rows: np.ndarray) -> int:
        """Tokens the next decode of `rows` allocates (a new page where the last one is full)."""
        return int(np.count_nonzero(self.kv_len[rows] % self.block_size == 0)) * self.block_size

    def decode_fits(self, rows: np.ndarray) -> bool:
        """`check_decode_mem`: evict the shortfall, then whether the decode's pages are free."""
        need = self.decode_pages_needed(rows)
        self.evict_for(need)
        return self.available >= need

    def decode_if_free(self, rows: np.ndarray) -> bool:
        """`check_decode_mem` then `prepare_for_decode` in one call when the free pages alone
        cover a page per row (both evictions would then be no-ops): True if it decoded the rows,
        False (nothing done) when the caller must take the general path (`decode_fits`, then
        `decode`). SGLang's steady decode step, in one kernel instead of a dozen numpy calls."""
        if self.nfree < rows.size:
            return False
        self._decode_rows(rows)
        self.extend_rows = _NO_ROWS
        self.extend_ends = _NO_ROWS
        return True

    def decode(self, rows: np.ndarray, mixed: bool = False) -> None:
        """`prepare_for_decode`: one more token of KV for each row (a new page where the last is full).
        `mixed`: the rows decode in a prefill step (the extend batch stays recorded)."""
        self.evict_for(rows.size * self.block_size)  # alloc_token_slots / alloc_paged_token_slots_decode's demand
        self._decode_rows(rows)
        if not mixed:
            self.extend_rows = _NO_ROWS
            self.extend_ends = _NO_ROWS

    def _decode_rows(self, rows: np.ndarray) -> None:
        taken = _decode_rows(self.kv_len, self.table, self.nblk, rows, self.free, self.head, self.nfree,
                             self.block_size)
        if taken == _TOO_WIDE:
            raise MemoryError(f"radix pool: a row needs more than {self.width} pages")
        if taken == _TOO_FEW:
            need = int(np.count_nonzero(self.kv_len[rows] % self.block_size == 0))
            raise MemoryError(f"radix pool: {need} pages asked, {self.nfree} free")
        self.took_pages(taken)

    def took_pages(self, taken: int) -> None:
        """`taken` pages left the front of the free ring (`_decode_rows`, here or in a kernel)."""
        self.head = (self.head + taken) % self.free.size
        self.nfree -= taken

    def stash_chunked(self) -> None:
        """`Scheduler.stash_chunked_request`: put what a chunked request computed into the tree."""
        for row, end in self.stash:
            if self.nblk[row] > 0 or self.lock[row] >= 0:
                self.checkpoint(row, end)
        self.stash = []

    def idle(self) -> None:
        self.extend_rows = _NO_ROWS  # shared and read-only: the extend batch is only ever replaced
        self.extend_ends = _NO_ROWS

    def checkpoint(self, row: int, up_to: int) -> None:
        """Insert the row's first `up_to` tokens (whole pages; the prompt boundary split off) into
        the tree, free the pages the tree already had, and move the row's lock to the new node."""
        page = self.block_size
        key_len = up_to - up_to % page
        protected = int(self.protected[row])
        # no early return when nothing is new: SGLang's checkpoint still inserts and matches,
        # which refreshes the path's LRU time (eviction order depends on it)
        toks = self.tokens(row)[:key_len]
        slots = self._slots(row, key_len)
        prefix, _ = self.radix.insert(toks, slots)
        plen = int(self.prompt_len[row])
        prompt_key = plen - plen % page
        if 0 < prompt_key < key_len:
            self.radix.insert(toks[:prompt_key], slots[:prompt_key])
        if prefix > protected:  # the tree already held [protected, prefix): this row's copies are duplicates
            first, last = protected // page, prefix // page
            self._free_pages(self.table[row, first:last].astype(np.int64))
        matched, node = self.radix.match_prefix(toks)
        values = self.radix.values(node)
        pages = values[::page] // page if page > 1 else values
        self.table[row, protected // page: matched // page] = pages[protected // page: matched // page]
        self.protected[row] = matched
        self.unlock_row(row)
        self.lock_row(row, node)

    def _slots(self, row: int, tokens: int) -> np.ndarray:
        page = self.block_size
        pages = self.table[row, : self._pages_for(tokens)].astype(np.int64)
        if page == 1:
            return pages[:tokens].copy()
        return (pages[:, None] * page + np.arange(page)[None, :]).ravel()[:tokens]

    def release(self, row: int, insert: bool) -> None:
        """`release_kv_cache`: with `insert` (a finished request) the computed KV goes into the
        tree first; the row's own pages are freed and its lock dropped."""
        if self.lock[row] < 0 and self.nblk[row] == 0:
            return
        owned = int(self.kv_len[row])
        if insert:
            self.checkpoint(row, owned)
        page = self.block_size
        first = -(-int(self.protected[row]) // page)
        self._free_pages(self.table[row, first: self.nblk[row]].astype(np.int64))
        self.unlock_row(row)
        self.nblk[row] = 0
        self.kv_len[row] = 0
        self.protected[row] = 0

    def free_request(self, row: int, insert: bool = True) -> int:
        """The runtime's hook when a request ends (insert) or is preempted (`insert=False`)."""
        held = int(self.nblk[row])
        self.release(row, insert)
        return held

    def forget_row(self, row: int) -> None:
        """The request left the table: its stream's room is reclaimed at the next compaction."""
        self.seq_len[row] = 0
        self.cap[row] = 0

    def reset_prefix_cache(self) -> bool:
        """Drop the tree when no request holds KV (SGLang's `flush_cache` rule)."""
        if (self.nblk > 0).any() or (self.lock >= 0).any():
            return False
        slots = self.radix.evict(self.radix.evictable_size)
        if slots.size:
            self._free_pages(np.unique(slots // self.block_size) if self.block_size > 1 else slots)
        return True

    # ------------------------------------------------------------ invariants
    def check(self) -> None:
        """Pages conserved: free + held by rows beyond their tree prefix + the tree's = usable;
        no page twice; locked nodes never evicted (their rows' prefixes are still in the tree)."""
        page = self.block_size
        own: list[np.ndarray] = [self.free_pages()]
        for row in np.flatnonzero(self.nblk > 0).tolist():
            first = -(-int(self.protected[row]) // page)
            own.append(self.table[row, first: self.nblk[row]].astype(np.int64))
            node = int(self.lock[row])
            if node < 0 and self.protected[row] > 0:
                raise AssertionError(f"row {row} holds a tree prefix but no lock")
            if node >= 0 and node != ROOT and self.radix.nodes[0, node] < 0:
                raise AssertionError(f"row {row} locks node {node}, which was evicted")
        total_tokens = self.radix.total_size()
        if total_tokens % page:
            raise AssertionError("the tree holds a partial page")
        pages = np.concatenate(own) if own else np.zeros(0, dtype=np.int64)
        if np.unique(pages).size != pages.size:
            raise AssertionError("a page is free or owned twice")
        if pages.size + total_tokens // page != self.num_blocks - 1:
            raise AssertionError(f"pages not conserved: {pages.size} free/owned + {total_tokens // page} in the "
                                 f"tree != {self.num_blocks - 1}")


_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_ROWS.flags.writeable = False


_TOO_WIDE, _TOO_FEW = -1, -2


@nb.njit(cache=True)
def _decode_rows(kv_len, table, nblk, rows, free, head, nfree, page):
    """One more token of KV for each of `rows`: a row whose last page is full takes the next
    free page (the ring `free` from `head`, in row order). Returns the number of pages taken;
    `_TOO_WIDE` if a row would outgrow its page table, `_TOO_FEW` if fewer than that many pages
    are free (nothing is changed then)."""
    width = table.shape[1]
    fresh = 0
    for i in range(rows.size):
        r = rows[i]
        if kv_len[r] % page == 0:
            if kv_len[r] // page >= width:
                return _TOO_WIDE
            fresh += 1
    if fresh > nfree:
        return _TOO_FEW
    size = free.size
    taken = 0
    for i in range(rows.size):
        r = rows[i]
        n = kv_len[r]
        if n % page == 0:
            at = n // page
            table[r, at] = free[(head + taken) % size]
            taken += 1
            if nblk[r] < at + 1:
                nblk[r] = at + 1
        kv_len[r] = n + 1
    return taken
