"""A token-granular radix prefix cache (SGLang's `RadixCache`) on arrays, for Numba.

SGLang matches prompts against a radix tree of token ids instead of vLLM's chained block
hashes: any prefix length is a hit (page-aligned when pages are larger than a token), running
requests lock the path they use, and LRU eviction takes unlocked leaves first. The rules here
follow SGLang 0.5.23's `python/sglang/srt/mem_cache/radix_cache.py`:

- `match_prefix` walks from the root while a child starts with the key's next page; a match
  that ends inside a node splits it there (`_match_prefix_helper`, `_split_node`); every node
  on the path is touched (LRU time);
- `insert` walks the same way, splitting at the first mismatch, and hangs the rest of the key
  under the last node as one new leaf (`_insert_helper`); new tokens count as evictable;
- `inc_lock_ref` / `dec_lock_ref` walk from a node to the root; a node whose count leaves or
  reaches 0 moves its tokens between `protected_size` and `evictable_size`;
- `evict` pops unlocked leaves by least recent access, frees their values, and offers a parent
  that became an unlocked leaf (`evict`, `_delete_leaf`, `_update_leaf_status`);
- keys (and values) are cut to a multiple of `page_size` (`RadixKey.page_aligned`), and a
  child is found by its first page (`child_key`).

Ties in LRU time break by node creation order (SGLang's heap compares `last_access_time`, so
its order among equal times depends on a set's iteration order). Time is a counter that
advances once per operation: the whole path of one match shares one time, as in SGLang.

Nodes are rows of a few int64 arrays (parent, first child, next sibling, where the key starts
in the token arena, its length, lock count, last access, birth serial); a node's token ids and
KV slot values sit side by side in two arenas, so a split moves no data. Deleted nodes go to a
free list; the arenas are compacted when full.
"""

from __future__ import annotations

import numba as nb
import numpy as np

ROOT = 0
# rows of `meta`
EVICTABLE, PROTECTED, CLOCK, NODE_TOP, ARENA_TOP, FREE_NODE, BORN, PAGE = range(8)
# rows of the node matrix
PARENT, CHILD, SIBLING, KSTART, KLEN, LOCK, ACCESS, SERIAL = range(8)
_CHUNK = 64  # tokens compared per vectorized chunk in `_common`


@nb.njit(cache=True)
def _find_child(nodes, tok, node, keys, at, page):
    """The child of `node` whose key starts with keys[at:at + page], or -1."""
    c = nodes[CHILD, node]
    while c >= 0:
        start = nodes[KSTART, c]
        same = True
        for j in range(page):
            if tok[start + j] != keys[at + j]:
                same = False
                break
        if same:
            return c
        c = nodes[SIBLING, c]
    return -1


@nb.njit(cache=True)
def _common(nodes, tok, c, keys, at, n, page):
    """Tokens node `c`'s key shares with keys[at:n], rounded down to whole pages.

    Compared 64 tokens at a time without an early exit inside a chunk, over slices (indices
    LLVM knows are in range): the chunk loop vectorizes, a full-hit match of an 8k-token
    prompt reads its tokens at memory speed instead of one branch per token."""
    start = nodes[KSTART, c]
    most = min(nodes[KLEN, c], n - at)
    ours = tok[start:start + most]
    theirs = keys[at:at + most]
    m = 0
    whole = most - most % _CHUNK
    for base in range(0, whole, _CHUNK):
        diff = 0
        for j in range(base, base + _CHUNK):
            diff |= ours[j] ^ theirs[j]
        if diff != 0:
            break
        m += _CHUNK
    while m < most and ours[m] == theirs[m]:
        m += 1
    return m - m % page


@nb.njit(cache=True)
def _new_node(nodes, meta):
    node = meta[FREE_NODE]
    if node >= 0:
        meta[FREE_NODE] = nodes[SIBLING, node]
    else:
        node = meta[NODE_TOP]
        meta[NODE_TOP] = node + 1
    nodes[PARENT, node] = -1
    nodes[CHILD, node] = -1
    nodes[SIBLING, node] = -1
    nodes[LOCK, node] = 0
    nodes[ACCESS, node] = meta[CLOCK]
    nodes[SERIAL, node] = meta[BORN]
    meta[BORN] += 1
    return node


@nb.njit(cache=True)
def _replace_child(nodes, parent, old, new):
    """Put `new` where `old` is in `parent`'s child list."""
    c = nodes[CHILD, parent]
    if c == old:
        nodes[CHILD, parent] = new
    else:
        while nodes[SIBLING, c] != old:
            c = nodes[SIBLING, c]
        nodes[SIBLING, c] = new
    nodes[SIBLING, new] = nodes[SIBLING, old]


@nb.njit(cache=True)
def _split(nodes, meta, c, split_len):
    """Split node `c` after `split_len` tokens: a new node takes the head (and `c`'s place and
    lock count); `c` keeps the tail as its only child (SGLang's `_split_node`)."""
    head = _new_node(nodes, meta)
    parent = nodes[PARENT, c]
    _replace_child(nodes, parent, c, head)
    nodes[PARENT, head] = parent
    nodes[KSTART, head] = nodes[KSTART, c]
    nodes[KLEN, head] = split_len
    nodes[LOCK, head] = nodes[LOCK, c]
    nodes[CHILD, head] = c
    nodes[PARENT, c] = head
    nodes[SIBLING, c] = -1
    nodes[KSTART, c] += split_len
    nodes[KLEN, c] -= split_len
    return head


@nb.njit(cache=True)
def match_prefix(nodes, tok, meta, keys, n):
    """Longest cached prefix of keys[:n] (cut to whole pages). Returns (tokens matched, the
    node where the match ends: its path from the root holds the prefix's values)."""
    page = meta[PAGE]
    n -= n % page
    meta[CLOCK] += 1
    now = meta[CLOCK]
    nodes[ACCESS, ROOT] = now
    node = ROOT
    at = 0
    while at < n:
        c = _find_child(nodes, tok, node, keys, at, page)
        if c < 0:
            break
        nodes[ACCESS, c] = now
        m = _common(nodes, tok, c, keys, at, n, page)
        at += m
        if m < nodes[KLEN, c]:
            node = _split(nodes, meta, c, m)
            break
        node = c
    return at, node


@nb.njit(cache=True)
def peek_prefix(nodes, tok, meta, keys, n):
    """How many tokens of keys[:n] (cut to whole pages) the tree holds, changing nothing: no
    split, no access time (a question, not SGLang's `match_prefix`)."""
    page = meta[PAGE]
    n -= n % page
    node = ROOT
    at = 0
    while at < n:
        c = _find_child(nodes, tok, node, keys, at, page)
        if c < 0:
            break
        m = _common(nodes, tok, c, keys, at, n, page)
        at += m
        if m < nodes[KLEN, c]:
            break
        node = c
    return at


@nb.njit(cache=True)
def insert(nodes, tok, val, meta, keys, values, n):
    """Insert keys[:n] with their KV slot `values` (cut to whole pages). Returns (tokens that
    were already cached: the caller frees their duplicate values, the last node)."""
    page = meta[PAGE]
    n -= n % page
    meta[CLOCK] += 1
    now = meta[CLOCK]
    nodes[ACCESS, ROOT] = now
    node = ROOT
    at = 0
    while at < n:
        c = _find_child(nodes, tok, node, keys, at, page)
        if c < 0:
            break
        nodes[ACCESS, c] = now
        m = _common(nodes, tok, c, keys, at, n, page)
        at += m
        if m < nodes[KLEN, c]:
            c = _split(nodes, meta, c, m)
        node = c
    prefix = at
    if at < n:
        leaf = _new_node(nodes, meta)
        start = meta[ARENA_TOP]
        tok[start:start + n - at] = keys[at:n]  # slice copies: memcpy, not a loop per token
        val[start:start + n - at] = values[at:n]
        meta[ARENA_TOP] = start + n - at
        nodes[KSTART, leaf] = start
        nodes[KLEN, leaf] = n - at
        nodes[PARENT, leaf] = node
        nodes[SIBLING, leaf] = nodes[CHILD, node]
        nodes[CHILD, node] = leaf
        meta[EVICTABLE] += n - at
        node = leaf
    return prefix, node


@nb.njit(cache=True)
def inc_lock(nodes, meta, node):
    """A running request uses the path to `node`: lock it (SGLang's `inc_lock_ref`)."""
    while node != ROOT:
        if nodes[LOCK, node] == 0:
            meta[EVICTABLE] -= nodes[KLEN, node]
            meta[PROTECTED] += nodes[KLEN, node]
        nodes[LOCK, node] += 1
        node = nodes[PARENT, node]


@nb.njit(cache=True)
def dec_lock(nodes, meta, node):
    """Release a lock taken with `inc_lock` (SGLang's `dec_lock_ref`)."""
    while node != ROOT:
        if nodes[LOCK, node] == 1:
            meta[EVICTABLE] += nodes[KLEN, node]
            meta[PROTECTED] -= nodes[KLEN, node]
        nodes[LOCK, node] -= 1
        node = nodes[PARENT, node]


@nb.njit(cache=True)
def _evictable_leaf(nodes, node):
    return node != ROOT and nodes[LOCK, node] == 0 and nodes[CHILD, node] < 0


@nb.njit(cache=True)
def evict(nodes, val, meta, num_tokens):
    """Free at least `num_tokens` tokens from unlocked leaves, least recently used first (ties:
    oldest node first); a parent left an unlocked leaf joins the candidates. Returns the freed
    KV slot values, in eviction order."""
    heap = [(np.int64(0), np.int64(0), np.int64(0))]
    heap.pop()
    for node in range(1, meta[NODE_TOP]):
        if nodes[PARENT, node] >= 0 and _evictable_leaf(nodes, node):
            heap.append((nodes[ACCESS, node], nodes[SERIAL, node], np.int64(node)))
    _heapify(heap)
    freed = np.empty(max(num_tokens, 0) + 64, dtype=np.int64)
    count = 0
    while count < num_tokens and len(heap):
        _, _, x = _heappop(heap)
        start = nodes[KSTART, x]
        length = nodes[KLEN, x]
        if count + length > freed.size:
            bigger = np.empty(max(freed.size * 2, count + length), dtype=np.int64)
            bigger[:count] = freed[:count]
            freed = bigger
        freed[count: count + length] = val[start: start + length]
        count += length
        parent = nodes[PARENT, x]
        c = nodes[CHILD, parent]  # unlink x from its parent's children
        if c == x:
            nodes[CHILD, parent] = nodes[SIBLING, x]
        else:
            while nodes[SIBLING, c] != x:
                c = nodes[SIBLING, c]
            nodes[SIBLING, c] = nodes[SIBLING, x]
        meta[EVICTABLE] -= length
        nodes[PARENT, x] = -1  # dead: onto the free list
        nodes[SIBLING, x] = meta[FREE_NODE]
        meta[FREE_NODE] = x
        if _evictable_leaf(nodes, parent):
            _heappush(heap, (nodes[ACCESS, parent], nodes[SERIAL, parent], np.int64(parent)))
    return freed[:count]


@nb.njit(cache=True)
def _sift_down(heap, pos, end):
    item = heap[pos]
    while True:
        child = 2 * pos + 1
        if child >= end:
            break
        if child + 1 < end and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] < item:
            heap[pos] = heap[child]
            pos = child
        else:
            break
    heap[pos] = item


@nb.njit(cache=True)
def _heapify(heap):
    for pos in range(len(heap) // 2 - 1, -1, -1):
        _sift_down(heap, pos, len(heap))


@nb.njit(cache=True)
def _heappush(heap, item):
    heap.append(item)
    pos = len(heap) - 1
    while pos > 0:
        parent = (pos - 1) // 2
        if item < heap[parent]:
            heap[pos] = heap[parent]
            pos = parent
        else:
            break
    heap[pos] = item


@nb.njit(cache=True)
def _heappop(heap):
    last = heap.pop()
    if len(heap) == 0:
        return last
    top = heap[0]
    heap[0] = last
    _sift_down(heap, 0, len(heap))
    return top


@nb.njit(cache=True)
def path_values(nodes, val, node):
    """The KV slot values of the prefix that ends at `node`, root first."""
    length = 0
    x = node
    while x != ROOT:
        length += nodes[KLEN, x]
        x = nodes[PARENT, x]
    out = np.empty(length, dtype=np.int64)
    end = length
    x = node
    while x != ROOT:
        k = nodes[KLEN, x]
        out[end - k: end] = val[nodes[KSTART, x]: nodes[KSTART, x] + k]
        end -= k
        x = nodes[PARENT, x]
    return out


@nb.njit(cache=True)
def _compact(nodes, tok, val, meta, new_tok, new_val):
    """Copy every live node's tokens and values into fresh arenas (dead nodes leave gaps)."""
    top = 0
    for node in range(1, meta[NODE_TOP]):
        if nodes[PARENT, node] < 0:
            continue
        start, k = nodes[KSTART, node], nodes[KLEN, node]
        new_tok[top: top + k] = tok[start: start + k]
        new_val[top: top + k] = val[start: start + k]
        nodes[KSTART, node] = top
        top += k
    meta[ARENA_TOP] = top


class RadixCache:
    """SGLang's radix prefix cache over arrays: the Python side only grows the arrays.

    `match_prefix(tokens)` -> (matched tokens, node); `insert(tokens, values)` -> (already
    cached tokens, node); `inc_lock(node)` / `dec_lock(node)`; `evict(n)` -> freed values;
    `evictable_size` / `protected_size`; `values(node)`: the prefix's KV slots.
    """

    def __init__(self, page_size: int = 1, nodes: int = 1024, tokens: int = 1 << 16) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.nodes = np.full((8, nodes), -1, dtype=np.int64)
        self.tok = np.zeros(tokens, dtype=np.int64)
        self.val = np.zeros(tokens, dtype=np.int64)
        self.meta = np.zeros(8, dtype=np.int64)
        self.meta[FREE_NODE] = -1
        self.meta[PAGE] = page_size
        self.meta[NODE_TOP] = 1  # node 0 is the root: parent 0 marks it live
        self.nodes[PARENT, ROOT] = ROOT
        self.nodes[KLEN, ROOT] = 0
        self.nodes[LOCK, ROOT] = 1  # SGLang's root is never evicted
        self.nodes[ACCESS, ROOT] = 0
        self.nodes[SERIAL, ROOT] = 0
        self.meta[BORN] = 1

    # ------------------------------------------------------------ sizes
    @property
    def evictable_size(self) -> int:
        return int(self.meta[EVICTABLE])

    @property
    def protected_size(self) -> int:
        return int(self.meta[PROTECTED])

    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    # ------------------------------------------------------------ operations
    def match_prefix(self, tokens: np.ndarray) -> tuple[int, int]:
        keys = np.ascontiguousarray(tokens, dtype=np.int64)
        self._room(0, 1)
        matched, node = match_prefix(self.nodes, self.tok, self.meta, keys, keys.size)
        return int(matched), int(node)

    def peek(self, tokens: np.ndarray) -> int:
        """Cached tokens of `tokens` (whole pages), leaving the tree as it is."""
        keys = np.ascontiguousarray(tokens, dtype=np.int64)
        return int(peek_prefix(self.nodes, self.tok, self.meta, keys, keys.size))

    def insert(self, tokens: np.ndarray, values: np.ndarray | None = None) -> tuple[int, int]:
        keys = np.ascontiguousarray(tokens, dtype=np.int64)
        vals = keys if values is None else np.ascontiguousarray(values, dtype=np.int64)
        if vals.size < keys.size - keys.size % self.page_size:
            raise ValueError(f"insert: {vals.size} values for {keys.size} tokens")
        self._room(keys.size, 2)
        prefix, node = insert(self.nodes, self.tok, self.val, self.meta, keys, vals, keys.size)
        return int(prefix), int(node)

    def inc_lock(self, node: int) -> None:
        inc_lock(self.nodes, self.meta, node)

    def dec_lock(self, node: int) -> None:
        if node != ROOT and self.nodes[LOCK, node] <= 0:
            raise ValueError(f"dec_lock: node {node} is not locked")
        dec_lock(self.nodes, self.meta, node)

    def evict(self, num_tokens: int) -> np.ndarray:
        return evict(self.nodes, self.val, self.meta, num_tokens)

    def values(self, node: int) -> np.ndarray:
        return path_values(self.nodes, self.val, node)

    # ------------------------------------------------------------ growth
    def _room(self, tokens: int, nodes: int) -> None:
        if self.meta[NODE_TOP] + nodes > self.nodes.shape[1]:
            grown = np.full((8, self.nodes.shape[1] * 2 + nodes), -1, dtype=np.int64)
            grown[:, : self.nodes.shape[1]] = self.nodes
            self.nodes = grown
        if self.meta[ARENA_TOP] + tokens > self.tok.size:
            live = self.total_size()
            size = max(self.tok.size, 2 * (live + tokens))
            new_tok = np.zeros(size, dtype=np.int64)
            new_val = np.zeros(size, dtype=np.int64)
            _compact(self.nodes, self.tok, self.val, self.meta, new_tok, new_val)
            self.tok, self.val = new_tok, new_val
