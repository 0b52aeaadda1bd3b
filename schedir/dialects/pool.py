"""`mem.pool`: the KV pool a step decides against, carried in the step so a dump replays.

Policies that decide block by block (the `vllm` preset: a hit revives cached
free blocks, an allocation evicts the oldest one, a preempted request's blocks
go back tail first) read and commit to the pool while they decide. In a live
run the op holds the runtime's pool object (no copy on the hot path); printing
writes the whole state, and parsing rebuilds a private pool from it:

    mem.pool {blocks = [8], block_size = [4], caching = [1], width = [4],
              free = [5, 6, 7, 3], cached = [3], cached_hash = [-812],
              rows = [0], row_blocks = [2], row_cached = [1], row_hashes = [1],
              table = [1, 2], hash = [-812]}

`free` is the free queue front to back, `cached`/`cached_hash` the registered
blocks (each hash's blocks in registration order), and per request row the
block table and chained block hashes. Reference counts follow from the tables.
A pool under vLLM v0's prefix-caching allocator (`caching = [2]`, `kv_pool.CACHE_V0`)
also prints its clock (`v0_clock`: the step being scheduled, the last access of
blocks freed now), three facts per block (`v0_blocks`: last accesses, depths,
registration steps) and per row the hit v0 noted and its last scheduled step
(`v0_noted`, `v0_access`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from xdsl.irdl import IRDLOperation, irdl_op_definition, prop_def
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from schedir.dialects.base import parse_attr_dict, parse_columns, print_attr_dict, print_columns
from schedir.dialects.columns import ColumnsAttr
from schedir.lowering.host_pool import HostPool
from schedir.lowering.kv_pool import (
    CACHE_V0,
    CACHE_V1,
    CACHED_FREE,
    V0_BLOCKS,
    V0_NOW,
    V0_TS,
    KVPool,
    forget_registrations,
    register_hash,
)
from schedir.lowering.radix_cache import ARENA_TOP, NODE_TOP, RadixCache
from schedir.lowering.radix_pool import RadixKVPool

_EMPTY_STATE = ColumnsAttr.of({})
_SCALARS = ("blocks", "block_size", "caching", "width")
_NAMES = (*_SCALARS, "free", "cached", "cached_hash", "rows", "row_blocks", "row_cached", "row_hashes",
          "table", "hash")


def pool_columns(pool: KVPool | RadixKVPool) -> dict[str, np.ndarray]:
    """The pool's state as named int64 lists (see the module docstring)."""
    if isinstance(pool, RadixKVPool):
        return radix_columns(pool)
    live = np.flatnonzero((pool.nblk > 0) | (pool.nhash > 0))
    cached, cached_hash = pool.cached_blocks()
    tables = [pool.table[r, : pool.nblk[r]] for r in live]
    hashes = [pool.rhash[r, : pool.nhash[r]] for r in live]
    i64 = np.int64
    return {
        "blocks": np.array([pool.num_blocks], dtype=i64),
        "block_size": np.array([pool.block_size], dtype=i64),
        "caching": np.array([pool.cache_kind], dtype=i64),
        "width": np.array([pool.width], dtype=i64),
        "free": pool.free_queue().astype(i64),
        "cached": cached,
        "cached_hash": cached_hash,
        "rows": live.astype(i64),
        "row_blocks": pool.nblk[live].astype(i64),
        "row_cached": pool.ncached[live].astype(i64),
        "row_hashes": pool.nhash[live].astype(i64),
        "table": np.concatenate(tables).astype(i64) if tables else np.zeros(0, dtype=i64),
        "hash": np.concatenate(hashes).astype(i64) if hashes else np.zeros(0, dtype=i64),
        **(host_columns(pool.host) if pool.host is not None else {}),
        **(_v0_columns(pool, live) if pool.cache_kind == CACHE_V0 else {}),
    }


_V0_NAMES = ("v0_clock", "v0_blocks", "v0_noted", "v0_access")


def _v0_columns(pool: KVPool, live: np.ndarray) -> dict[str, np.ndarray]:
    """A v0 pool's own state (see the module docstring)."""
    meta = pool.meta
    return {"v0_clock": meta[[V0_NOW, V0_TS]].copy(), "v0_blocks": meta[V0_BLOCKS:].copy(),
            "v0_noted": pool.v0_noted[live].copy(), "v0_access": pool.v0_access[live].copy()}


# The host tier (vLLM v0's CPU blocks for preemption by swap), when the pool has one:
#     host_blocks = [N], host_free = [free stack, bottom first], host_rows = [...],
#     host_row_blocks = [...], host_table = [...]
_HOST_NAMES = ("host_blocks", "host_free", "host_rows", "host_row_blocks", "host_table")


def host_columns(host: HostPool) -> dict[str, np.ndarray]:
    live = np.flatnonzero(host.hnblk > 0)
    tables = [host.htable[r, : host.hnblk[r]] for r in live]
    i64 = np.int64
    return {
        "host_blocks": np.array([host.num_blocks], dtype=i64),
        "host_free": host.hfree[: host.num_free].astype(i64),
        "host_rows": live.astype(i64),
        "host_row_blocks": host.hnblk[live].astype(i64),
        "host_table": np.concatenate(tables).astype(i64) if tables else np.zeros(0, dtype=i64),
    }


def check_host_columns(cols: ColumnsAttr) -> None:
    present = [n for n in _HOST_NAMES if cols.has(n)]
    if not present:
        return
    if len(present) != len(_HOST_NAMES):
        raise VerifyException(f"mem.pool: the host tier lacks {', '.join(n for n in _HOST_NAMES if n not in present)}")
    if cols.get("host_blocks").size != 1 or int(cols.get("host_blocks")[0]) < 1:
        raise VerifyException("mem.pool: 'host_blocks' must hold one positive value")
    n = int(cols.get("host_blocks")[0])
    if cols.get("host_row_blocks").size != cols.get("host_rows").size:
        raise VerifyException("mem.pool: 'host_row_blocks' must have one entry per host row")
    if int(cols.get("host_row_blocks").sum()) != cols.get("host_table").size:
        raise VerifyException("mem.pool: 'host_table' length differs from the sum of 'host_row_blocks'")
    seen = np.concatenate([cols.get("host_free"), cols.get("host_table")])
    if seen.size != n or np.unique(seen).size != n or (seen.min() < 0 or seen.max() >= n):
        raise VerifyException(f"mem.pool: host blocks 0..{n - 1} must each be free or in one host table")


def host_from_columns(cols: ColumnsAttr, rows: int, width: int, device_blocks: int) -> HostPool:
    n = int(cols.get("host_blocks")[0])
    host_rows = cols.get("host_rows")
    host = HostPool.create(n, max(rows, int(host_rows.max()) + 1 if host_rows.size else 1), width, device_blocks)
    free = cols.get("host_free")
    host.hfree[: free.size] = free
    host.hmeta[0] = free.size
    at = 0
    for row, k in zip(host_rows.tolist(), cols.get("host_row_blocks").tolist(), strict=True):
        host.htable[row, :k] = cols.get("host_table")[at: at + k]
        host.hnblk[row] = k
        at += k
    return host


def check_pool_columns(cols: ColumnsAttr) -> None:
    """Raise VerifyException naming what is inconsistent in a printed pool."""
    if cols.has("radix"):
        check_radix_columns(cols)
        return
    missing = [n for n in _NAMES if not cols.has(n)]
    if missing:
        raise VerifyException(f"mem.pool: missing {', '.join(missing)}")
    for name in _SCALARS:
        if cols.get(name).size != 1:
            raise VerifyException(f"mem.pool: '{name}' must hold one value")
    n = int(cols.get("blocks")[0])
    if int(cols.get("caching")[0]) not in (0, CACHE_V1, CACHE_V0):
        raise VerifyException(f"mem.pool: 'caching' must be 0 (off), {CACHE_V1} (vLLM v1's pool) or {CACHE_V0} "
                              "(vLLM v0's prefix-caching allocator)")
    if int(cols.get("caching")[0]) == CACHE_V0:
        missing = [name for name in _V0_NAMES if not cols.has(name)]
        if missing:
            raise VerifyException(f"mem.pool: a v0 pool (caching = [{CACHE_V0}]) needs {', '.join(missing)}")
        sizes = {"v0_clock": 2, "v0_blocks": 3 * n, "v0_noted": cols.get("rows").size,
                 "v0_access": cols.get("rows").size}
        for name, size in sizes.items():
            if cols.get(name).size != size:
                raise VerifyException(f"mem.pool: '{name}' must hold {size} values, not {cols.get(name).size}")
    if n < 2 or int(cols.get("block_size")[0]) < 1 or int(cols.get("width")[0]) < 1:
        raise VerifyException("mem.pool: blocks must be >= 2, block_size and width >= 1")
    for name in ("free", "cached", "table"):
        v = cols.get(name)
        if v.size and (v.min() < 1 or v.max() >= n):
            raise VerifyException(f"mem.pool: '{name}' holds a block id outside 1..{n - 1}")
    if np.unique(cols.get("free")).size != cols.get("free").size:
        raise VerifyException("mem.pool: a block appears twice in the free queue")
    if cols.get("cached").size != cols.get("cached_hash").size:
        raise VerifyException("mem.pool: 'cached' and 'cached_hash' differ in length")
    k = cols.get("rows").size
    for name in ("row_blocks", "row_cached", "row_hashes"):
        if cols.get(name).size != k:
            raise VerifyException(f"mem.pool: '{name}' must have one entry per row ({k})")
    width = int(cols.get("width")[0])
    if k and (cols.get("row_blocks").max() > width or cols.get("row_hashes").max() > width):
        raise VerifyException(f"mem.pool: a row holds more than width={width} blocks or hashes")
    if int(cols.get("row_blocks").sum()) != cols.get("table").size:
        raise VerifyException("mem.pool: 'table' length differs from the sum of 'row_blocks'")
    if int(cols.get("row_hashes").sum()) != cols.get("hash").size:
        raise VerifyException("mem.pool: 'hash' length differs from the sum of 'row_hashes'")
    held = np.zeros(n, dtype=bool)
    held[cols.get("table")] = True
    in_free = np.zeros(n, dtype=bool)
    in_free[cols.get("free")] = True
    if (held & in_free).any():
        raise VerifyException("mem.pool: a block is both in a table and in the free queue")
    if int((held | in_free)[1:].sum()) != n - 1:
        raise VerifyException("mem.pool: blocks are lost (neither held nor free)")
    check_host_columns(cols)


def pool_from_columns(cols: ColumnsAttr) -> KVPool | RadixKVPool:
    """Rebuild a pool from its printed state (the columns must pass `check_pool_columns`)."""
    if cols.has("radix"):
        return radix_from_columns(cols)
    n = int(cols.get("blocks")[0])
    width = int(cols.get("width")[0])
    rows = cols.get("rows")
    kind = int(cols.get("caching")[0])
    pool = KVPool.create(n, int(cols.get("block_size")[0]), width, rows=int(rows.max()) + 1 if rows.size else 1,
                         enable_caching=kind != 0, cache_kind=CACHE_V0 if kind == CACHE_V0 else CACHE_V1)
    free = cols.get("free").astype(np.int32)
    head, tail = n, n + 1
    pool.nxt[:] = -1
    pool.prv[:] = -1
    chain = np.concatenate(([head], free, [tail])).astype(np.int32)
    pool.nxt[chain[:-1]] = chain[1:]
    pool.prv[chain[1:]] = chain[:-1]
    pool.meta[0] = free.size
    at_t = at_h = 0
    for row, k, c, h in zip(rows, cols.get("row_blocks"), cols.get("row_cached"), cols.get("row_hashes"), strict=True):
        pool.table[row, :k] = cols.get("table")[at_t: at_t + k]
        pool.nblk[row] = k
        pool.ncached[row] = c
        pool.rhash[row, :h] = cols.get("hash")[at_h: at_h + h]
        pool.nhash[row] = h
        np.add.at(pool.ref, pool.table[row, :k], 1)
        at_t += int(k)
        at_h += int(h)
    for b, h in zip(cols.get("cached"), cols.get("cached_hash"), strict=True):
        register_hash(int(b), np.int64(h), pool.bhash, pool.dup_next, pool.cache)
    pool.meta[CACHED_FREE] = int(np.count_nonzero(pool.bhash[free]))
    forget_registrations(pool.meta)  # registered above, unlogged
    if kind == CACHE_V0:
        pool.meta[[V0_NOW, V0_TS]] = cols.get("v0_clock")
        pool.meta[V0_BLOCKS:] = cols.get("v0_blocks")
        pool.v0_noted[rows] = cols.get("v0_noted")
        pool.v0_access[rows] = cols.get("v0_access")
    if cols.has("host_blocks"):
        pool.host = host_from_columns(cols, pool.rows, width, n)
        pool.grow_rows(pool.host.htable.shape[0])
    return pool


# ---------------------------------------------------------------- SGLang's radix pool
# mem.pool {radix = [1], blocks = [..], block_size = [..], width = [..], free = [...],
#           nodes = [8 x count, row-major], tree_tokens = [...], tree_slots = [...], tree_meta = [8],
#           rows = [...], row_pages = [...], row_kv = [...], row_protected = [...], row_lock = [...],
#           row_prompt = [...], row_seq = [...], table = [...], seq = [...]}
_RADIX_NAMES = ("radix", "blocks", "block_size", "width", "free", "nodes", "tree_tokens", "tree_slots", "tree_meta",
                "rows", "row_pages", "row_kv", "row_protected", "row_lock", "row_prompt", "row_seq", "table", "seq")


def radix_columns(pool: RadixKVPool) -> dict[str, np.ndarray]:
    """A radix pool's state: free pages in order, the tree's node arrays and arenas, and per
    live row its pages, KV length, tree-owned prefix, locked node and token stream."""
    i64 = np.int64
    tree = pool.radix
    top = int(tree.meta[NODE_TOP])
    arena = int(tree.meta[ARENA_TOP])
    live = np.flatnonzero((pool.nblk > 0) | (pool.lock >= 0) | (pool.seq_len > 0))
    one = lambda v: np.array([v], dtype=i64)  # noqa: E731
    return {
        "radix": one(1), "blocks": one(pool.num_blocks), "block_size": one(pool.block_size), "width": one(pool.width),
        "free": pool.free_pages().astype(i64),
        "nodes": tree.nodes[:, :top].ravel().astype(i64), "tree_tokens": tree.tok[:arena].astype(i64),
        "tree_slots": tree.val[:arena].astype(i64), "tree_meta": tree.meta.astype(i64),
        "rows": live.astype(i64), "row_pages": pool.nblk[live].astype(i64), "row_kv": pool.kv_len[live].astype(i64),
        "row_protected": pool.protected[live].astype(i64), "row_lock": pool.lock[live].astype(i64),
        "row_prompt": pool.prompt_len[live].astype(i64), "row_seq": pool.seq_len[live].astype(i64),
        "table": np.concatenate([pool.table[r, : pool.nblk[r]] for r in live]).astype(i64) if live.size
        else np.zeros(0, dtype=i64),
        "seq": np.concatenate([pool.tokens(r) for r in live]).astype(i64) if live.size else np.zeros(0, dtype=i64),
    }


def check_radix_columns(cols: ColumnsAttr) -> None:
    missing = [n for n in _RADIX_NAMES if not cols.has(n)]
    if missing:
        raise VerifyException(f"mem.pool (radix): missing {', '.join(missing)}")
    n = int(cols.get("blocks")[0])
    if n < 2 or int(cols.get("block_size")[0]) < 1 or int(cols.get("width")[0]) < 1:
        raise VerifyException("mem.pool (radix): blocks must be >= 2, block_size and width >= 1")
    if cols.get("nodes").size % 8 or cols.get("tree_meta").size != 8:
        raise VerifyException("mem.pool (radix): 'nodes' must hold 8 values per node and 'tree_meta' 8 values")
    if cols.get("tree_tokens").size != cols.get("tree_slots").size:
        raise VerifyException("mem.pool (radix): 'tree_tokens' and 'tree_slots' differ in length")
    k = cols.get("rows").size
    for name in ("row_pages", "row_kv", "row_protected", "row_lock", "row_prompt", "row_seq"):
        if cols.get(name).size != k:
            raise VerifyException(f"mem.pool (radix): '{name}' must have one entry per row ({k})")
    if int(cols.get("row_pages").sum()) != cols.get("table").size:
        raise VerifyException("mem.pool (radix): 'table' length differs from the sum of 'row_pages'")
    if int(cols.get("row_seq").sum()) != cols.get("seq").size:
        raise VerifyException("mem.pool (radix): 'seq' length differs from the sum of 'row_seq'")
    for name in ("free", "table"):
        v = cols.get(name)
        if v.size and (v.min() < 1 or v.max() >= n):
            raise VerifyException(f"mem.pool (radix): '{name}' holds a page id outside 1..{n - 1}")
    try:
        radix_from_columns(cols).check()
    except AssertionError as exc:
        raise VerifyException(f"mem.pool (radix): {exc}") from None


def radix_from_columns(cols: ColumnsAttr) -> RadixKVPool:
    n, page, width = (int(cols.get(k)[0]) for k in ("blocks", "block_size", "width"))
    rows = cols.get("rows")
    pool = RadixKVPool(n, page, width, rows=int(rows.max()) + 1 if rows.size else 1)
    free = cols.get("free")
    pool.free[: free.size] = free
    pool.nfree = int(free.size)
    nodes = cols.get("nodes").reshape(8, -1)
    tree = RadixCache(page_size=page, nodes=max(nodes.shape[1] * 2, 16), tokens=max(cols.get("tree_tokens").size * 2, 64))
    tree.nodes[:, : nodes.shape[1]] = nodes
    tree.tok[: cols.get("tree_tokens").size] = cols.get("tree_tokens")
    tree.val[: cols.get("tree_slots").size] = cols.get("tree_slots")
    tree.meta[:] = cols.get("tree_meta")
    pool.radix = tree
    at_t = at_s = 0
    seq = cols.get("seq")
    for i, row in enumerate(rows.tolist()):
        k, m = int(cols.get("row_pages")[i]), int(cols.get("row_seq")[i])
        pool.table[row, :k] = cols.get("table")[at_t: at_t + k]
        pool.nblk[row] = k
        pool.kv_len[row] = cols.get("row_kv")[i]
        pool.protected[row] = cols.get("row_protected")[i]
        pool.lock[row] = cols.get("row_lock")[i]
        pool.prompt_len[row] = cols.get("row_prompt")[i]
        pool.load_tokens(row, seq[at_s: at_s + m], 2 * m)
        at_t += k
        at_s += m
    return pool


@irdl_op_definition
class PoolOp(IRDLOperation):
    """The KV pool of this step (see the module docstring).

        mem.pool {blocks = [8], block_size = [4], caching = [1], width = [4], free = [...], ...}
    """

    name = "mem.pool"
    state = prop_def(ColumnsAttr)

    @classmethod
    def of(cls, pool: KVPool) -> PoolOp:
        """An op over a live pool: its state is written only when printed."""
        from schedir.ir.fastop import new_op  # the fast constructor lives with the IR machinery

        op = new_op(cls, (), {"state": _EMPTY_STATE})
        op._live = pool
        return op

    def pool(self) -> KVPool:
        """The pool passes decide against (rebuilt once from the text when parsed)."""
        live = getattr(self, "_live", None)
        if live is None:
            live = self._live = pool_from_columns(self.state)
            # rows of the step's requests that hold nothing are not printed: give them table rows
            # too (a pass allocating for such a row would index past the tables)
            top = -1
            block = self.parent
            op = block.first_op if block is not None else None
            while op is not None:
                if op.name == "req.queue":
                    ids = op.properties["columns"].get("id")  # type: ignore[union-attr]
                    if ids.size:
                        top = max(top, int(ids.max()))
                op = op.next_op
            if top >= live.rows:
                live.grow_rows(top + 1)
        return live

    def materialize(self) -> None:
        """Write the live pool into the `state` property (before a generic print)."""
        live = getattr(self, "_live", None)
        if live is not None:
            self.state = ColumnsAttr.of(pool_columns(live))

    def verify_(self) -> None:
        if getattr(self, "_live", None) is None:
            check_pool_columns(self.state)

    def print(self, printer: Printer) -> None:
        self.materialize()
        print_columns(printer, self.state)
        print_attr_dict(printer, self)

    @classmethod
    def parse(cls, parser: Parser) -> Any:
        state = parse_columns(parser)
        return cls.create(properties={"state": state}, attributes=parse_attr_dict(parser))
