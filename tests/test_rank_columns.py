"""Composed ranks (`StepPass.rank_columns`, `WindowContext.composed_rank`): several order passes
in a row rank the queue as their stable sorts, run one after the other, order it."""

from __future__ import annotations

import numpy as np
import pytest

from schedir.ir.window import RankColumn, WindowContext, arrival_rank_column, pack_rank_columns
from schedir.passes.batching_efficiency import BatchingEfficiency
from schedir.passes.order_fcfs import OrderFcfs
from schedir.passes.prefix_cache_aware import PrefixCacheAware
from schedir.passes.priority_based import PriorityBased

BLOCK = 4


def _queue(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Columns by request id (row) for n waiting requests with many ties: a few arrival times
    (out of order in some queues), priorities 0-2, remaining lengths across groups, hits."""
    arrival = rng.integers(0, 6, n) * 1_000_000
    if rng.random() < 0.5:
        arrival = np.sort(arrival)
    total = rng.integers(1, 300, n)
    return {"arrival": arrival, "priority": rng.integers(0, 3, n), "total": total,
            "computed": np.minimum(rng.integers(0, 40, n) * (rng.random(n) < 0.3), total - 1),
            "hit": rng.integers(0, 6, n) * BLOCK}


def _context(cols: dict[str, np.ndarray], waiting: np.ndarray, oversized: np.ndarray, now_us: int) -> WindowContext:
    zeros = lambda name, rows: np.zeros(rows.size, dtype=np.int64)  # noqa: E731
    return WindowContext(running=WindowContext.NONE, waiting=waiting, max_seqs=4, free_blocks=0, total_blocks=8,
                         token_budget=64, block_size=BLOCK, max_model_len=512, oversized=oversized,
                         scheduler_state={}, request_state=zeros, column=zeros, column_of=lambda name: cols[name],
                         now_us=now_us, prefix_hit=lambda ids: cols["hit"][ids])


def _sorted_by_the_passes(orders, cols, kept: np.ndarray, now_us: int) -> np.ndarray:
    """The step's order: each pass's own sort of the current order, one after the other."""
    rows = kept.copy()
    for p in orders:
        arrival = cols["arrival"][rows]
        if isinstance(p, PrefixCacheAware):
            hit = p._counted(cols["hit"][rows], BLOCK)
            order = np.lexsort((arrival, -hit))
        elif isinstance(p, BatchingEfficiency):
            order = p._order(cols["total"][rows], cols["computed"][rows], arrival, now_us)
        elif isinstance(p, PriorityBased):
            order = np.lexsort((arrival, cols["priority"][rows]))
        else:
            order = np.argsort(arrival, kind="stable")
        rows = rows[order]
    return rows


@pytest.mark.parametrize("orders", [
    (PrefixCacheAware(), BatchingEfficiency(), PriorityBased()),  # the seed's with-all-passes
    (OrderFcfs(), BatchingEfficiency(spread=0.2, max_age_ms=2500)),
    (BatchingEfficiency(spread=1.0), PriorityBased()),
    (PrefixCacheAware(min_blocks=2), PriorityBased()),
    (PriorityBased(), PrefixCacheAware()),
])
def test_a_composed_rank_orders_as_the_passes_sort(orders):
    rng = np.random.default_rng(11)
    for _ in range(300):
        n = int(rng.integers(1, 80))
        cols = _queue(rng, n)
        waiting = rng.permutation(n) if rng.random() < 0.3 else np.arange(n)
        oversized = np.flatnonzero(rng.random(n) < 0.1)  # refused before the orders run: lead no group
        now_us = int(rng.integers(0, 8)) * 1_000_000
        ctx = _context(cols, waiting, oversized, now_us)
        keys, swapped = ctx.composed_rank(list(orders))
        assert swapped.size == 0
        kept = np.setdiff1d(np.arange(n), oversized)  # positions in `waiting`, queue order
        by_rank = waiting[kept[np.argsort(keys[kept], kind="stable")]]
        assert by_rank.tolist() == _sorted_by_the_passes(orders, cols, waiting[kept], now_us).tolist()


def test_a_group_lead_kept_in_the_window_keeps_the_order():
    """batching-efficiency's window under a ranked head names each length group's oldest waiting
    request, so a step over part of the queue orders its groups as the whole queue does."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(2, 60))
        cols = _queue(rng, n)
        ctx = _context(cols, np.arange(n), WindowContext.NONE, 0)
        ctx.head_size = 8
        p = BatchingEfficiency()
        leads = p.waiting_window(ctx)
        part = np.union1d(leads, rng.choice(n, size=int(rng.integers(1, n)), replace=False))
        whole = _sorted_by_the_passes([p], cols, np.arange(n), 0)
        assert _sorted_by_the_passes([p], cols, part, 0).tolist() == [r for r in whole if r in set(part.tolist())]


def test_dense_arrival_rank_and_packing():
    rng = np.random.default_rng(3)
    for _ in range(200):
        arrival = rng.integers(0, 5, int(rng.integers(0, 40)))
        waiting = np.arange(arrival.size) if rng.random() < 0.5 else rng.permutation(arrival.size)
        if rng.random() < 0.5:
            waiting = waiting[np.argsort(arrival[waiting], kind="stable")]
        col = arrival_rank_column(arrival, waiting)
        assert col.values.tolist() == np.searchsorted(np.unique(arrival), arrival[waiting]).tolist()
    a, b = RankColumn("a", np.array([1, 0, 1]), 2), RankColumn("b", np.array([2, 5, 0]), 6)
    assert pack_rank_columns([a, b, a]).tolist() == [8, 5, 6]  # a repeated column adds nothing
    assert pack_rank_columns([RankColumn("x", np.zeros(2, np.int64), 1 << 40)] * 1 +
                             [RankColumn("y", np.zeros(2, np.int64), 1 << 30)]) is None  # 70 bits


def test_distinct_arrivals_end_the_composed_rank_at_the_last_order():
    """With no two requests arriving together, priority-based's (priority, arrival) orders every
    request: the passes before it are not asked for columns (nor is one that declares none), and
    the rank is the passes' sorts' order all the same."""
    asked: list[str] = []

    class Spied(PrefixCacheAware):
        def rank_columns(self, ctx):  # type: ignore[no-untyped-def]
            asked.append(self.name)
            return super().rank_columns(ctx)

    class NoColumns(BatchingEfficiency):
        def rank_columns(self, ctx):  # type: ignore[no-untyped-def]
            asked.append(self.name)
            return None

    rng = np.random.default_rng(3)
    for _ in range(100):
        n = int(rng.integers(2, 80))
        cols = _queue(rng, n)
        cols["arrival"] = rng.permutation(n) * 1000 + 7  # distinct
        waiting = rng.permutation(n)
        ctx = _context(cols, waiting, WindowContext.NONE, 0)
        orders = [Spied(), NoColumns(), PriorityBased()]
        keys, _ = ctx.composed_rank(orders)
        by_rank = waiting[np.argsort(keys, kind="stable")]
        assert by_rank.tolist() == _sorted_by_the_passes([Spied(), PriorityBased()], cols, waiting, 0).tolist()
    assert asked == []
    cols["arrival"][waiting[:2]] = 5  # two arrive together: the earlier orders break that tie
    ctx = _context(cols, waiting, WindowContext.NONE, 0)
    assert ctx.composed_rank([Spied(), NoColumns(), PriorityBased()]) is None
    assert asked == ["batching-efficiency"]


def test_the_window_kernels_equal_their_numpy_forms():
    """The one-pass kernels of the rank columns and the ranked window (`above_least`,
    `pack_column_into`, `hit_blocks_below_most`, `ranked_window_marks`) equal the numpy passes
    they replace, on random queues, empty ones included."""
    from schedir.ir.window import above_least, pack_column_into, ranked_window_marks
    from schedir.passes.prefix_cache_aware import hit_blocks_below_most

    rng = np.random.default_rng(15)
    for _ in range(400):
        n = int(rng.integers(0, 40))
        table = rng.integers(-5, 9, 64)
        rows = rng.permutation(64)[:n]
        got, span = above_least(table, rows)
        values = table[rows]
        assert np.array_equal(got, values - (values.min() if n else 0))
        assert span == (int(values.max() - values.min()) + 1 if n else 1)
        keys, extra, bound = rng.integers(0, 50, n), rng.integers(0, 7, n), 7
        packed = keys.copy()
        pack_column_into(packed, extra, bound)
        assert np.array_equal(packed, keys * bound + extra)
        hit = rng.integers(0, 9, n) * 3
        below, most = hit_blocks_below_most(hit, 4, 8)
        blocks = np.where(hit >= 8, hit, 0) // 4
        assert most == (int(blocks.max()) if n else 0) and np.array_equal(below, most - blocks)
        if not n:
            continue
        head = rng.permutation(n)[: int(rng.integers(0, n + 1))]
        named = rng.integers(0, n, int(rng.integers(0, 5)))
        keys = rng.integers(0, 100, n)
        at, beyond, least = ranked_window_marks(n, named, head, keys)
        inside = np.zeros(n, dtype=bool)
        inside[named] = inside[head] = True
        in_head = np.zeros(n, dtype=bool)
        in_head[head] = True
        assert np.array_equal(at, np.flatnonzero(inside))
        assert np.array_equal(beyond, np.flatnonzero(inside & ~in_head))
        assert least == (keys[~inside].min() if (~inside).any() else np.iinfo(np.int64).max)


def test_the_growth_and_group_kernels_equal_their_numpy_forms():
    """`running_block_need` (the running requests' missing blocks, `WindowContext.running_growth`)
    and `queue_group_leads` (batching-efficiency's window columns read by ids) equal the numpy
    forms they replace, on random queues, empty ones included; a length past the group table
    is refused (False), for the caller's numpy path."""
    from schedir.ir.window import running_block_need
    from schedir.passes.batching_efficiency import group_lead_columns, group_table, length_groups, queue_group_leads

    rng = np.random.default_rng(21)
    table = group_table(0.5, 4095)
    for _ in range(400):
        n = int(rng.integers(0, 40))
        rows = rng.permutation(64)[:n]
        total, placeholders = rng.integers(0, 300, 64), rng.integers(0, 3, 64) * (rng.random(64) < 0.3)
        blocks = rng.integers(0, 40, 64).astype(np.int32)
        cap, extra, bs = int(rng.integers(1, 400)), int(rng.integers(0, 2)), int(rng.integers(1, 17))
        for with_placeholders in (False, True):
            known = total[rows] + (placeholders[rows] if with_placeholders else 0)
            want = int(np.maximum(-(-np.minimum(known, cap) // bs) + extra - blocks[rows], 0).sum())
            got = running_block_need(rows, total, placeholders if with_placeholders else WindowContext.NONE, blocks,
                                     bs, cap, extra)
            assert got == want
        computed = np.minimum(rng.integers(0, 50, 64), total)
        arrival = rng.integers(0, 9, 64) * 1_000_000
        ranks = arrival_rank_column(arrival, rows).values
        refused_at = np.flatnonzero(rng.random(n) < 0.15)
        now_us, max_age = int(rng.integers(0, 9)) * 1_000_000, 4_000_000
        ok, lead, group, leads_at, bound = queue_group_leads(rows, total, computed, arrival, table, now_us, max_age,
                                                             ranks, refused_at)
        refused = np.zeros(n, dtype=np.bool_)
        refused[refused_at] = True
        want = group_lead_columns(length_groups(total[rows] - computed[rows], 0.5), now_us - arrival[rows] >= max_age,
                                  ranks, refused)
        assert ok and np.array_equal(lead, want[0]) and np.array_equal(group, want[1])
        assert np.array_equal(leads_at, want[2]) and bound == want[3]
    long = np.array([table.size + 5])
    assert not queue_group_leads(np.zeros(1, dtype=np.int64), long, np.zeros(1, dtype=np.int64),
                                 np.zeros(1, dtype=np.int64), table, 0, 1, np.zeros(1, dtype=np.int64),
                                 WindowContext.NONE)[0]
