"""Zero prefix hits held across steps (`schedir.lowering.held_hits`) answer as a fresh lookup does."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedir import Request, Scheduler, SchedulerConfig
from schedir.lowering.held_hits import HeldHits
from schedir.lowering.kv_pool import REG_LOG_LEN, REG_SEQ, KVPool, cache_full_blocks, log_registration, match_rows
from schedir.runtime import table as T


def _fresh(s: Scheduler, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pool = s.pool
    return match_rows(rows, s.table.data[T.TOTAL, rows], s.config.block_size, pool.ref, pool.rhash, pool.nhash,
                      pool.cache)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), preset=st.sampled_from(["with-prefix-aware", "with-all-passes", "vllm"]),
       num_blocks=st.sampled_from([40, 120, 400]))
def test_held_hits_match_a_fresh_lookup_every_step(seed: int, preset: str, num_blocks: int) -> None:
    """Shared prefixes, a pool small enough to evict, requests finishing (their rows reused) and
    aborted, preemptions and prefix-cache resets: every step, the runtime's hits (held) equal
    `match_rows`' over the whole queue."""
    rng = np.random.default_rng(seed)
    cfg = SchedulerConfig(num_blocks=num_blocks, block_size=4, max_num_batched_tokens=64, max_num_seqs=8,
                          max_model_len=200, pipeline=preset)
    s = Scheduler(cfg, clock=lambda: 0.0)
    prefixes = [rng.integers(1, 50, size=int(rng.integers(1, 20))) for _ in range(5)]
    held = 0
    for i in range(250):
        for _ in range(int(rng.poisson(0.9))):
            shared = prefixes[int(rng.integers(len(prefixes)))] if rng.random() < 0.6 else np.zeros(0, np.int64)
            tokens = np.concatenate([shared, rng.integers(1, 50, size=int(rng.integers(1, 30)))]).astype(np.int64)
            s.add_request(Request(f"r{i}-{rng.integers(1 << 30)}", tokens, max_tokens=int(rng.integers(1, 25))))
        if s.waiting.size:
            got = s._match(s.waiting)
            want = _fresh(s, s.waiting)
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), f"step {i}"
            held += int((s._held_hits._at[s.waiting] >= 0).sum())
        out = s.schedule()
        s.update(out, rng.integers(1, 50, size=len(out.req_ids)))
        if s.running.size and rng.random() < 0.03:
            s.finish_requests(s.table.names[int(s.running[0])])
        if s.running.size and rng.random() < 0.02:  # preempted back to the queue, their blocks freed
            s.preempt_running()
        if rng.random() < 0.01:
            s.reset_prefix_cache()
    assert held > 0  # the holds were exercised, not bypassed


def _pool_with(rows: int = 4) -> KVPool:
    pool = KVPool.create(64, 4, 8, rows=rows)
    for r in range(rows):  # distinct two-block prompts: rows r's hashes
        pool.rhash[r, :2] = [100 + r, 200 + r]
        pool.nhash[r] = 2
    return pool


def _register(pool: KVPool, row: int, blocks: int) -> None:
    """Give `row` `blocks` blocks and register them, as a step that computed them does."""
    assert blocks <= 2 and 2 * row + blocks < pool.num_blocks  # (the kernels index without bounds checks)
    pool.table[row, :blocks] = np.arange(1, blocks + 1) + 2 * row
    pool.nblk[row] = blocks
    cache_full_blocks(row, blocks * pool.block_size, pool.bhash, pool.dup_next, pool.cache, pool.meta, pool.table,
                      pool.ncached, pool.rhash, pool.nhash)


def test_a_held_zero_ends_when_its_first_block_is_registered() -> None:
    """Row 1 holds a zero; another request registers row 1's first block (the same prefix): the
    next match looks row 1 up again and finds the hit."""
    pool = _pool_with()
    held = HeldHits()
    rows, total = np.array([1, 2]), np.array([9, 9])
    assert held.match(pool, rows, total)[0].tolist() == [0, 0]
    assert held._at[1] >= 0 and held._at[2] >= 0
    pool.rhash[3, :2] = pool.rhash[1, :2]  # row 3 shares row 1's prompt, computes and registers it
    _register(pool, 3, 2)
    assert held.match(pool, rows, total)[0].tolist() == [8, 0]
    assert held._at[1] >= 0 and held._at[2] >= 0  # the hit is held in turn


def test_a_row_taken_by_a_new_request_is_forgotten() -> None:
    """A row's hold belongs to its request: after `forget` the new request's hit is looked up."""
    pool = _pool_with()
    held = HeldHits()
    rows, total = np.array([1]), np.array([9])
    held.match(pool, rows, total)
    _register(pool, 0, 2)
    pool.rhash[1, :2] = pool.rhash[0, :2]  # a new request in row 1, with row 0's cached prompt
    assert held.match(pool, rows, total)[0].tolist() == [0]  # (held: the log never named its hash)
    held.forget(1)
    assert held.match(pool, rows, total)[0].tolist() == [8]


def test_registrations_the_log_cannot_name_drop_every_hold() -> None:
    """A prefix copied in (`adopt_cached`), or more registrations than the log's ring holds,
    drop the holds: the rows are looked up again."""
    pool = _pool_with()
    held = HeldHits()
    rows, total = np.array([1, 2]), np.array([9, 9])
    held.match(pool, rows, total)
    assert pool.adopt_cached(pool.rhash[1, :2].copy()) == 2
    assert held.match(pool, rows, total)[0].tolist() == [8, 0]
    other = _pool_with()
    held = HeldHits()
    one, nine = np.array([1]), np.array([9])
    held.match(other, one, nine)
    _register(other, 0, 2)
    other.rhash[1, :2] = other.rhash[0, :2]  # (behind the hold's back: only a lookup sees it)
    for h in range(REG_LOG_LEN - 2):  # others' blocks, none row 1's: the ring's worth with row 0's two
        log_registration(other.meta, np.int64(10_000 + h))
    assert held.match(other, one, nine)[0].tolist() == [0]  # the ring still names row 1's block
    held.forget(1)
    held.match(other, one, np.array([5]))  # held again at a hit of 4 tokens (one block: 5 tokens)
    for h in range(REG_LOG_LEN + 1):
        log_registration(other.meta, np.int64(20_000 + h))
    other.rhash[1, :2] = [300, 301]  # (behind the hold's back again)
    assert held.match(other, one, np.array([5]))[0].tolist() == [0]  # past the ring: looked up again
    assert held._at[1] == other.meta[REG_SEQ]


def test_a_held_hit_moves_with_the_cache() -> None:
    """A held hit of k blocks grows when block k is registered, shrinks when a block of its chain
    is evicted, and is looked up again for another total (a request back in the queue with more
    tokens); requests behind one chain check it once."""
    pool = KVPool.create(64, 4, 8, rows=6)
    for r in range(6):  # rows 1-5: one 3-block chain; row 0 computes it
        pool.rhash[r, :3] = [100, 200, 300]
        pool.nhash[r] = 3
    held = HeldHits()
    rows, total = np.arange(1, 6), np.full(5, 13)
    pool.table[0, :1] = [1]
    pool.nblk[0] = 1
    cache_full_blocks(0, 4, pool.bhash, pool.dup_next, pool.cache, pool.meta, pool.table, pool.ncached, pool.rhash,
                      pool.nhash)
    assert held.match(pool, rows, total)[0].tolist() == [4] * 5
    pool.table[0, 1:3] = [2, 3]  # row 0's next blocks registered: every hold grows to 3 blocks
    pool.nblk[0] = 3
    cache_full_blocks(0, 12, pool.bhash, pool.dup_next, pool.cache, pool.meta, pool.table, pool.ncached, pool.rhash,
                      pool.nhash)
    assert held.match(pool, rows, total)[0].tolist() == [12] * 5
    assert held.match(pool, rows, total)[0].tolist() == [12] * 5  # (held now: no lookup)
    assert held.match(pool, rows[:1], np.array([9]))[0].tolist() == [8]  # another total: looked up
    pool.ref[1:4] = 1
    pool.free_request(0)  # row 0's blocks to the free queue, then block 2 (hash 200) evicted
    assert held.match(pool, rows[1:], total[1:])[1].tolist() == [3] * 4  # all three in the free queue
    from schedir.lowering.kv_pool import evict_hash

    evict_hash(2, pool.bhash, pool.dup_next, pool.cache)
    assert held.match(pool, rows[1:], total[1:])[0].tolist() == [4] * 4


def test_the_runtime_forgets_a_row_a_new_request_takes() -> None:
    """A request aborted while waiting leaves its row held at zero; the request that takes the
    row next, with a prompt already cached, must see its hit (the runtime forgets the row)."""
    cfg = SchedulerConfig(num_blocks=64, block_size=4, max_num_batched_tokens=64, max_num_seqs=1, max_model_len=64,
                          pipeline="with-prefix-aware")
    s = Scheduler(cfg, clock=lambda: 0.0)
    cached = np.arange(1, 10, dtype=np.int64)
    s.add_request(Request("runs", cached, max_tokens=20))
    out = s.schedule()  # "runs" computes its prompt: its two full blocks are registered
    s.update(out, np.array([7]))
    s.add_request(Request("gone", np.arange(100, 109, dtype=np.int64), max_tokens=5))
    row = int(s.waiting[0])
    assert s._match(s.waiting)[0].tolist() == [0] and s._held_hits._at[row] >= 0
    s.finish_requests("gone")
    s.add_request(Request("same-prompt", cached.copy(), max_tokens=5))
    assert int(s.waiting[0]) == row  # (the freed row is taken again)
    assert s._match(s.waiting)[0].tolist() == [8]


def _shared_prefix_queue(arrays: bool, looked_up: list[int] | None = None) -> list[tuple]:
    """`base` (array steps) with 4 seats and 300 requests whose prompts share 32 cached tokens:
    every step's admitted ids, tokens and prefix-hit starts (computed), array steps or the IR."""
    cfg = SchedulerConfig(num_blocks=2000, block_size=4, max_num_batched_tokens=256, max_num_seqs=4,
                          max_model_len=200, pipeline="base")
    s = Scheduler(cfg, clock=lambda: 0.0)
    s._arrays_allowed = arrays
    if looked_up is not None:  # the lookups of array steps (an IR step looks its whole window up)
        match, decide, inside = s._match, s._decide_arrays, [False]

        def decide_arrays(*args):  # noqa: ANN002, ANN202
            inside[0] = True
            try:
                return decide(*args)
            finally:
                inside[0] = False

        s._decide_arrays = decide_arrays
        s._match = lambda rows: (inside[0] and looked_up.append(rows.size)) or match(rows)
    rng = np.random.default_rng(5)
    shared = rng.integers(1, 50, size=32)
    for i in range(300):
        tokens = np.concatenate([shared, rng.integers(1, 50, size=int(rng.integers(1, 20)))]).astype(np.int64)
        s.add_request(Request(f"r{i}", tokens, max_tokens=int(rng.integers(1, 6))))
    steps = []
    for _ in range(120):
        out = s.schedule()
        steps.append((tuple(out.names.tolist()), tuple(out.num_tokens.tolist()), tuple(out.computed.tolist())))
        s.update(out, np.full(len(out.req_ids), 7, dtype=np.int64))
    assert s.metrics.array_steps > 40 or not arrays
    return steps


def test_an_array_step_looks_up_the_hits_its_admission_reads() -> None:
    """An array step looks a waiting request's prefix hit up when a pass reads it: admission into
    4 seats from a queue of hundreds, all of them hitting a cached prefix, reads the first few
    (the seats and a few more, more where the walk goes past them), and decides as the IR, which
    looks up every request in the step."""
    looked_up: list[int] = []
    assert _shared_prefix_queue(True, looked_up) == _shared_prefix_queue(False)
    assert looked_up and max(looked_up) <= 8, looked_up


def _plain_match(s: Scheduler, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's hit walked block by block in the cache, no memo (the reference)."""
    from schedir.lowering.kv_pool import lookup_prefix

    pool, bs = s.pool, s.config.block_size
    scratch = np.empty(pool.rhash.shape[1], dtype=np.int32)
    hit, free = np.zeros(rows.size, dtype=np.int64), np.zeros(rows.size, dtype=np.int64)
    for i, r in enumerate(rows.tolist()):
        k = lookup_prefix(r, (int(s.table.data[T.TOTAL, r]) - 1) // bs, pool.rhash, pool.nhash, pool.cache, scratch)
        hit[i], free[i] = k * bs, int((pool.ref[scratch[:k]] == 0).sum())
    return hit, free


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), num_blocks=st.sampled_from([30, 80, 300]))
def test_a_match_remembers_shared_chains_exactly(seed: int, num_blocks: int) -> None:
    """`match_rows` remembers the chains the call's earlier rows walked (`kv_pool.chain_memo`:
    rows behind one prompt start at the deepest block it holds): every step of random runs with
    nested shared prefixes (a prompt, and longer ones that extend it), eviction, finishes and
    aborts, its hits and free-queue counts equal a block-by-block walk of each row, in queue
    order and shuffled."""
    rng = np.random.default_rng(seed)
    cfg = SchedulerConfig(num_blocks=num_blocks, block_size=4, max_num_batched_tokens=64, max_num_seqs=6,
                          max_model_len=200, pipeline="vllm")
    s = Scheduler(cfg, clock=lambda: 0.0)
    root = rng.integers(1, 50, size=24)
    prefixes = [root[: int(rng.integers(1, 25))] for _ in range(3)]
    prefixes += [np.concatenate([p, rng.integers(1, 50, size=int(rng.integers(1, 12)))]) for p in prefixes]
    for i in range(150):
        for _ in range(int(rng.poisson(1.2))):
            shared = prefixes[int(rng.integers(len(prefixes)))]
            tokens = np.concatenate([shared, rng.integers(1, 50, size=int(rng.integers(1, 10)))]).astype(np.int64)
            s.add_request(Request(f"r{i}-{rng.integers(1 << 30)}", tokens, max_tokens=int(rng.integers(1, 12))))
        rows = np.concatenate([s.waiting, s.running])
        if rows.size:
            for order in (rows, rng.permutation(rows)):
                got = match_rows(order, s.table.data[T.TOTAL, order], cfg.block_size, s.pool.ref, s.pool.rhash,
                                 s.pool.nhash, s.pool.cache)
                want = _plain_match(s, order)
                assert (got[0] == want[0]).all() and (got[1] == want[1]).all(), i
        if i % 17 == 0 and s.running.size:
            s.finish_requests(str(s.table.names[s.running[0]]))
        out = s.schedule()
        s.update(out, np.full(len(out.req_ids), 7, dtype=np.int64))
