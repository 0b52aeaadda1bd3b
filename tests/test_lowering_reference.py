"""The Numba lowering against plain-Python references.

Why: the kernels are fast loops over int arrays (linked free queue, hash chains kept as
`dup_next` links, per-row tables); a slip there silently hands out the wrong blocks. Each
kernel is compared, on random inputs and random operation sequences, with a few lines of
obvious Python: the batch plan, vLLM's BlockPool semantics, the chained hashes, and the
incremental `SchedulerOutput` an engine applies step by step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedir import Request, Scheduler, SchedulerConfig
from schedir.lowering import kv_pool as K
from schedir.lowering.batch_plan import batch_plan
from schedir.lowering.hashing import ROOT, block_hash, extend_hashes
from schedir.runtime.output import SchedulerOutput

SETTINGS = settings(deadline=None, derandomize=True, database=None, max_examples=60,
                    suppress_health_check=[HealthCheck.too_slow])
SEEDS = st.integers(0, 2**32 - 1)


# ---------------------------------------------------------------- (i) batch plan
def batch_plan_reference(rows: np.ndarray, tokens: np.ndarray, computed: np.ndarray, table: np.ndarray,
                         nblk: np.ndarray, block_size: int) -> tuple[np.ndarray, ...]:
    """What a model runner's input preparation computes, written the obvious way."""
    qsl = [0]
    positions: list[int] = []
    slots: list[int] = []
    seq_lens: list[int] = []
    width = max((int(nblk[r]) for r in rows), default=0)
    block_table = np.zeros((len(rows), width), dtype=np.int32)
    for i, r in enumerate(rows.tolist()):
        qsl.append(qsl[-1] + int(tokens[i]))
        seq_lens.append(int(computed[i] + tokens[i]))
        block_table[i, : nblk[r]] = table[r, : nblk[r]]
        for p in range(int(computed[i]), int(computed[i] + tokens[i])):
            positions.append(p)
            slots.append(int(table[r, p // block_size]) * block_size + p % block_size)
    return (np.array(qsl, dtype=np.int32), np.array(positions, dtype=np.int64), np.array(slots, dtype=np.int64),
            np.array(seq_lens, dtype=np.int32), block_table)


@SETTINGS
@given(seed=SEEDS, n=st.integers(0, 12), block_size=st.sampled_from((1, 2, 4, 16)))
def test_batch_plan_matches_reference(seed: int, n: int, block_size: int) -> None:
    rng = np.random.default_rng(seed)
    num_rows, width = 16, 12
    table = rng.integers(1, 1000, (num_rows, width)).astype(np.int32)
    rows = rng.permutation(num_rows)[:n].astype(np.int64)
    computed = rng.integers(0, (width - 1) * block_size, n).astype(np.int64)
    tokens = rng.integers(1, block_size * 2 + 2, n).astype(np.int64)
    tokens = np.minimum(tokens, width * block_size - computed)
    nblk = np.zeros(num_rows, dtype=np.int32)
    for i, r in enumerate(rows.tolist()):
        need = -(-int(computed[i] + tokens[i]) // block_size)
        nblk[r] = rng.integers(need, width + 1)  # a row may hold more blocks than this chunk needs
    got = batch_plan(rows, tokens, computed, table, nblk, block_size)
    want = batch_plan_reference(rows, tokens, computed, table, nblk, block_size)
    for name, g, w in zip(("query_start_loc", "positions", "slot_mapping", "seq_lens", "block_table"), got, want,
                          strict=True):
        assert g.dtype == w.dtype, name
        assert np.array_equal(g, w), name


# ---------------------------------------------------------------- (ii) KV pool vs BlockPool
class BlockPoolModel:
    """vLLM's BlockPool semantics as plain Python (lists and dicts, no cleverness).

    The free queue is a list, front first. Allocation pops from the front and drops the
    popped block's hash. Freeing walks a request's blocks tail first: blocks whose count
    drops to 0 go to the back if they hold a hash (they stay cache hits), to the front if
    not. A hash maps to its blocks in registration order; the first serves hits.
    """

    def __init__(self, num_blocks: int, block_size: int, caching: bool) -> None:
        self.block_size = block_size
        self.caching = caching
        self.free = list(range(1, num_blocks))
        self.ref = [0] * num_blocks
        self.bhash = [0] * num_blocks
        self.cache: dict[int, list[int]] = {}
        self.table: dict[int, list[int]] = {}
        self.ncached: dict[int, int] = {}
        self.rhash: dict[int, list[int]] = {}

    def evict(self, b: int) -> bool:
        h = self.bhash[b]
        if h == 0:
            return False
        self.cache[h].remove(b)
        if not self.cache[h]:
            del self.cache[h]
        self.bhash[b] = 0
        return True

    def register(self, b: int, h: int) -> None:
        if self.bhash[b] == h:
            return
        self.evict(b)
        self.bhash[b] = h
        self.cache.setdefault(h, []).append(b)

    def allocate(self, row: int, count: int) -> None:
        for _ in range(count):
            b = self.free.pop(0)
            self.evict(b)
            self.ref[b] = 1
            self.table[row].append(b)

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1

    def lookup(self, row: int, max_blocks: int) -> list[int]:
        out = []
        for h in self.rhash[row][:max_blocks]:
            if h not in self.cache:
                break
            out.append(self.cache[h][0])
        return out

    def cache_full_blocks(self, row: int, num_tokens: int) -> None:
        if not self.caching:
            return
        full = min(num_tokens // self.block_size, len(self.rhash[row]))
        for i in range(self.ncached[row], full):
            self.register(self.table[row][i], self.rhash[row][i])
        self.ncached[row] = max(self.ncached[row], full)

    def free_row(self, row: int) -> int:
        front: list[int] = []
        back: list[int] = []
        for b in reversed(self.table[row]):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (back if self.bhash[b] and self.caching else front).append(b)
        self.free = front + self.free + back
        self.table[row] = []
        self.ncached[row] = 0
        return len(front) + len(back)


def _cache_lists(pool: K.KVPool) -> dict[int, list[int]]:
    blocks, hashes = pool.cached_blocks()
    out: dict[int, list[int]] = {}
    for b, h in zip(blocks.tolist(), hashes.tolist(), strict=True):
        out.setdefault(h, []).append(b)
    return out


def assert_same(pool: K.KVPool, model: BlockPoolModel, what: str) -> None:
    pool.check()
    assert pool.free_queue().tolist() == model.free, f"free queue after {what}"
    assert pool.ref.tolist() == model.ref, f"ref counts after {what}"
    assert pool.bhash.tolist() == model.bhash, f"block hashes after {what}"
    assert _cache_lists(pool) == model.cache, f"cache contents after {what}"
    assert pool.num_free == len(model.free), f"free count after {what}"
    assert pool.num_cached_free() == sum(1 for b in model.free if model.bhash[b]), f"cached-free count after {what}"
    for row, blocks in model.table.items():
        assert pool.blocks_of(row).tolist() == blocks, f"row {row}'s table after {what}"
        assert int(pool.ncached[row]) == model.ncached[row], f"row {row}'s registered count after {what}"


@SETTINGS
@given(seed=SEEDS, num_blocks=st.integers(2, 24), block_size=st.sampled_from((1, 4, 16)),
       caching=st.booleans(), ops=st.integers(1, 60))
def test_kv_pool_matches_block_pool_model(seed: int, num_blocks: int, block_size: int, caching: bool,
                                          ops: int) -> None:
    rng = np.random.default_rng(seed)
    rows, width = 6, 10
    pool = K.KVPool.create(num_blocks, block_size, width, rows=rows, enable_caching=caching)
    model = BlockPoolModel(num_blocks, block_size, caching)
    # Rows draw their hash chains from a few shared stems, so hits and duplicate hashes are common.
    alphabet = np.array([5, -7, 11, 2**62 + 3, -(2**61), 99], dtype=np.int64)
    stems = [rng.choice(alphabet, width) for _ in range(3)]
    scratch = np.empty(width, dtype=np.int32)
    for row in range(rows):
        model.table[row], model.ncached[row], model.rhash[row] = [], 0, []
    assert_same(pool, model, "create")
    for _ in range(ops):
        row = int(rng.integers(rows))
        held = len(model.table[row])
        op = rng.choice(["admit", "allocate", "cache", "free", "register", "evict"])
        if op == "admit" and held == 0:
            # A new request: its chained hashes, then its prefix hit taken (lookup + touch).
            k = int(rng.integers(0, width + 1))
            hashes = stems[int(rng.integers(3))][:k].copy()
            if k and rng.random() < 0.3:
                hashes[int(rng.integers(k)):] = rng.choice(alphabet, 1)[0]
            pool.rhash[row, :k] = hashes
            pool.nhash[row] = k
            model.rhash[row] = hashes.tolist()
            limit = int(rng.integers(0, k + 1))
            got = K.lookup_prefix(row, limit, pool.rhash, pool.nhash, pool.cache, scratch)
            want = model.lookup(row, limit)
            assert scratch[:got].tolist() == want, "lookup_prefix"
            K.touch(scratch, got, pool.ref, pool.bhash, pool.nxt, pool.prv, pool.meta)
            model.touch(want)
            pool.table[row, :got] = scratch[:got]
            pool.nblk[row] = got
            pool.ncached[row] = got
            model.table[row] = list(want)
            model.ncached[row] = got
        elif op == "allocate" and held < width and pool.num_free:
            count = int(rng.integers(0, min(pool.num_free, width - held) + 1))
            K.allocate(row, count, pool.ref, pool.bhash, pool.dup_next, pool.nxt, pool.prv, pool.meta, pool.cache,
                       pool.table, pool.nblk)
            model.allocate(row, count)
        elif op == "cache":
            num_tokens = int(rng.integers(0, held * block_size + 1))
            K.cache_full_blocks(row, num_tokens, pool.bhash, pool.dup_next, pool.cache, pool.meta, pool.table,
                                pool.ncached, pool.rhash, pool.nhash)
            model.cache_full_blocks(row, num_tokens)
        elif op == "free":
            assert pool.free_request(row) == model.free_row(row)
        elif op == "register" and held and caching:
            # Only held blocks are (re)registered, and only with caching on, as cache_full_blocks does.
            b = int(model.table[row][int(rng.integers(held))])
            h = int(rng.choice(alphabet))
            K.register_hash(b, np.int64(h), pool.bhash, pool.dup_next, pool.cache)
            model.register(b, h)
        elif op == "evict" and held:
            b = int(model.table[row][int(rng.integers(held))])
            assert K.evict_hash(b, pool.bhash, pool.dup_next, pool.cache) == model.evict(b)
        else:
            continue
        assert_same(pool, model, op)
    copy = pool.copy()
    assert_same(copy, model, "copy")


@SETTINGS
@given(seed=SEEDS, keys=st.integers(1, 40), ops=st.integers(1, 300))
def test_prefix_cache_table_matches_a_dict(seed: int, keys: int, ops: int) -> None:
    """The open-addressing table behind the prefix cache, against a dict: a small table
    (16 slots) and up to 8 live keys, so probe runs collide, wrap around the end and are
    shifted back by deletions all the time."""
    rng = np.random.default_rng(seed)
    cache = K.new_cache(8)
    assert cache.shape == (2, 16)
    universe = np.unique(rng.integers(-(2**63), 2**63 - 1, keys, dtype=np.int64, endpoint=True))
    universe = universe[universe != 0]
    model: dict[int, int] = {}
    for _ in range(ops):
        h = np.int64(universe[int(rng.integers(universe.size))])
        if int(h) in model and rng.random() < 0.5:
            K.cache_delete(cache, K.cache_slot(cache, h))
            del model[int(h)]
        elif int(h) in model or len(model) < 8:
            b = int(rng.integers(1, 1000))
            K.cache_put(cache, h, b)
            model[int(h)] = b
        for k in universe.tolist():
            assert K.cache_get(cache, np.int64(k)) == model.get(k, -1), f"key {k} after {len(model)} live"
        assert np.count_nonzero(cache[K.CACHE_KEY]) == len(model)


@SETTINGS
@given(seed=SEEDS, block_size=st.sampled_from((1, 4)))
def test_match_rows_matches_lookup_and_free_state(seed: int, block_size: int) -> None:
    """The count-level prefix hit (base pipeline): full blocks of at most total - 1 tokens."""
    rng = np.random.default_rng(seed)
    pool = K.KVPool.create(16, block_size, 8, rows=6)
    model = BlockPoolModel(16, block_size, True)
    for row in range(6):
        hashes = np.arange(1, 9, dtype=np.int64) * (1 + (row % 2))
        pool.rhash[row] = hashes
        pool.nhash[row] = 8
        model.rhash[row] = hashes.tolist()
    for row in (0, 1):  # two rows compute 3 blocks each and register them; row 1 then frees its own
        count = int(rng.integers(1, 4))
        K.allocate(row, count, pool.ref, pool.bhash, pool.dup_next, pool.nxt, pool.prv, pool.meta, pool.cache,
                   pool.table, pool.nblk)
        K.cache_full_blocks(row, count * block_size, pool.bhash, pool.dup_next, pool.cache, pool.meta, pool.table,
                            pool.ncached, pool.rhash, pool.nhash)
    pool.free_request(1)
    rows = np.arange(2, 6, dtype=np.int64)
    total = rng.integers(1, 8 * block_size + 1, rows.size).astype(np.int64)
    hit, cached_free = K.match_rows(rows, total, block_size, pool.ref, pool.rhash, pool.nhash, pool.cache)
    for i, row in enumerate(rows.tolist()):
        blocks = [int(b) for b in _lookup(pool, row, int((total[i] - 1) // block_size))]
        assert hit[i] == len(blocks) * block_size
        assert cached_free[i] == sum(1 for b in blocks if pool.ref[b] == 0)


def _lookup(pool: K.KVPool, row: int, limit: int) -> np.ndarray:
    out = np.empty(pool.width, dtype=np.int32)
    k = K.lookup_prefix(row, limit, pool.rhash, pool.nhash, pool.cache, out)
    return out[:k]


# ---------------------------------------------------------------- (iii) hashing
_HASH_SCRIPT = """
import json, sys
import numpy as np
from schedir.lowering.hashing import extend_hashes
out = []
for toks, bs in json.loads(sys.stdin.read()):
    t = np.asarray(toks, dtype=np.int32)
    h = np.zeros(len(toks) // bs + 1, dtype=np.int64)
    n = extend_hashes(t, t.size, h, 0, bs)
    out.append(h[:n].tolist())
print(json.dumps(out))
"""


def _hashes(tokens: list[int], block_size: int) -> list[int]:
    t = np.asarray(tokens, dtype=np.int32)
    h = np.zeros(len(tokens) // block_size + 1, dtype=np.int64)
    n = extend_hashes(t, t.size, h, 0, block_size)
    return h[:n].tolist()


def test_hashes_agree_across_processes() -> None:
    """Prefix caching across restarts and between engine and a replayed dump needs hashes that
    do not depend on the process (Python's str/bytes hash() is salted per process)."""
    rng = np.random.default_rng(3)
    cases = [(rng.integers(0, 2**31 - 1, int(rng.integers(0, 70))).tolist(), bs) for bs in (1, 4, 16) for _ in range(4)]
    here = [_hashes(toks, bs) for toks, bs in cases]
    for salt in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": salt}
        proc = subprocess.run([sys.executable, "-c", _HASH_SCRIPT], input=json.dumps(cases), capture_output=True,
                              text=True, check=True, env=env, timeout=120)
        assert json.loads(proc.stdout) == here


@SETTINGS
@given(seed=SEEDS, block_size=st.sampled_from((1, 4, 16)), blocks=st.integers(1, 6))
def test_hash_chains_tell_prefixes_apart(seed: int, block_size: int, blocks: int) -> None:
    """Equal chains up to the first differing block, different from there on; never 0;
    extending a chain block by block gives the chain computed at once."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 50, blocks * block_size + int(rng.integers(0, block_size))).astype(np.int32)
    b = a.copy()
    k = int(rng.integers(blocks))
    at = k * block_size + int(rng.integers(block_size))
    b[at] += 1
    ha, hb = _hashes(a.tolist(), block_size), _hashes(b.tolist(), block_size)
    assert len(ha) == len(hb) == blocks
    assert ha[:k] == hb[:k]
    assert all(x != y for x, y in zip(ha[k:], hb[k:], strict=True))
    assert 0 not in ha and len(set(ha)) == len(ha)
    step = np.zeros(blocks + 1, dtype=np.int64)
    n = 0
    for end in range(a.size + 1):
        n = extend_hashes(a, end, step, n, block_size)
    assert step[:n].tolist() == ha
    assert ha[0] == int(block_hash(ROOT, a, 0, block_size))


def test_same_block_under_different_parents_hashes_differently() -> None:
    """A block's hash covers its whole prefix, not just its own tokens."""
    x = np.array([1, 2, 3, 4, 9, 9, 9, 9], dtype=np.int32)
    y = np.array([5, 6, 7, 8, 9, 9, 9, 9], dtype=np.int32)
    assert _hashes(x.tolist(), 4)[1] != _hashes(y.tolist(), 4)[1]
    assert _hashes([9, 9, 9, 9, 9, 9, 9, 9], 4)[0] != _hashes([9, 9, 9, 9, 9, 9, 9, 9], 4)[1]


# ---------------------------------------------------------------- (iv) SchedulerOutput arrays
class EngineTables:
    """An engine's block tables, built only from the outputs (applied in order), as vLLM's
    model runner keeps them: a new request whole, a running one its new block ids, a
    resumed one its whole new table; preempted and finished requests are dropped."""

    def __init__(self) -> None:
        self.blocks: dict[str, list[int]] = {}

    def apply(self, out: SchedulerOutput) -> None:
        for rid in out.finished_req_ids | out.preempted_req_ids | set(out.rejected):
            self.blocks.pop(rid, None)
        new_ids = {r.req_id for r in out.new_reqs}
        for r in out.new_reqs:
            assert r.req_id not in self.blocks, f"{r.req_id} sent whole twice"
            self.blocks[r.req_id] = r.block_ids.tolist()
        for r in out.cached_reqs:
            assert r.req_id not in new_ids
            if r.resumed:
                self.blocks[r.req_id] = r.new_block_ids.tolist()
            else:
                assert r.req_id in self.blocks, f"{r.req_id} sent as cached before being sent whole"
                self.blocks[r.req_id] += r.new_block_ids.tolist()


def check_output_arrays(sched: Scheduler, out: SchedulerOutput, engine: EngineTables) -> None:
    bs = sched.config.block_size
    pool = sched.pool
    b = out.batch
    assert out.block_table is b.block_table
    names = {sched.table.names[r]: r for r in sched.running.tolist()}
    for i, rid in enumerate(out.req_ids):
        row = int(out.rows[i])
        lo, hi = int(b.query_start_loc[i]), int(b.query_start_loc[i + 1])
        pos = b.positions[lo:hi]
        assert np.array_equal(b.slot_mapping[lo:hi], b.block_table[i, pos // bs].astype(np.int64) * bs + pos % bs)
        k = int(out.nblk_after[i])
        assert np.array_equal(b.block_table[i, :k], pool.table[row, :k]), rid
        assert not b.block_table[i, k:].any(), f"{rid}: block_table is not 0-padded"
        assert engine.blocks[rid] == pool.blocks_of(row).tolist(), f"{rid}: engine table drifted"
    for r in out.new_reqs:
        row = names[r.req_id]
        assert r.block_ids.tolist() == pool.blocks_of(row).tolist(), f"{r.req_id}: new request lacks blocks"
        assert r.prompt_token_ids.tolist() == sched.table.prompts[row].tolist()
        assert r.num_computed_tokens % bs == 0
    # Running requests not scheduled this step keep the blocks the engine knows.
    for rid, row in names.items():
        if rid in engine.blocks:
            assert engine.blocks[rid] == pool.blocks_of(row).tolist(), f"{rid}: blocks changed while unscheduled"


@settings(SETTINGS, max_examples=25)
@given(seed=SEEDS, block_size=st.sampled_from((1, 4, 16)), cache_tokens=st.integers(16, 200),
       budget=st.sampled_from((4, 16, 64)), caching=st.booleans(), policy=st.sampled_from(("fcfs", "priority")),
       overlap=st.booleans(), pipeline=st.sampled_from(("vllm", "vllm", "base")))
def test_output_arrays_and_incremental_block_ids(seed: int, block_size: int, cache_tokens: int, budget: int,
                                                 caching: bool, policy: str, overlap: bool, pipeline: str) -> None:
    rng = np.random.default_rng(seed)
    mml = 64
    n = int(rng.integers(1, 10))
    sched = Scheduler(SchedulerConfig(num_blocks=max(2, cache_tokens // block_size + 1), block_size=block_size,
                                      max_num_batched_tokens=budget, max_model_len=mml, max_num_seqs=4,
                                      enable_prefix_caching=caching, policy=policy, pipeline=pipeline))
    stem = rng.integers(3, 30, mml).tolist()
    arrivals = sorted(int(a) for a in rng.integers(0, 8, n))
    pending = deque((f"q{i}", a) for i, a in enumerate(arrivals))
    engine = EngineTables()
    flying: deque[SchedulerOutput] = deque()
    clock = steps = 0
    while pending or sched.has_unfinished_requests() or flying:
        while pending and pending[0][1] <= clock:
            rid, _ = pending.popleft()
            length = int(rng.integers(1, mml))
            prompt = (stem[: int(rng.integers(0, length + 1))] + rng.integers(3, 30, mml).tolist())[:length]
            sched.add_request(Request(rid, prompt, max_tokens=int(rng.integers(1, 20)), priority=int(rng.integers(3)),
                                      arrival_time=float(clock), ignore_eos=True))
        clock += 1
        if sched.has_unfinished_requests():
            out = sched.schedule()
            steps += 1
            assert steps < 3000
            engine.apply(out)
            check_output_arrays(sched, out, engine)
            flying.append(out)
        while flying and (len(flying) > int(overlap and rng.random() < 0.5) or not sched.has_unfinished_requests()):
            done = flying.popleft()
            sched.update(done, np.where(done.sampled, rng.integers(3, 30, len(done)), -1))
    assert sched.pool.num_free == sched.pool.usable_blocks


def test_resumed_request_sends_its_whole_new_table() -> None:
    """After a preemption the engine's table is replaced, not extended (`resumed`)."""
    sched = Scheduler(SchedulerConfig(num_blocks=7, block_size=4, max_num_batched_tokens=64, max_model_len=64))
    for rid, base in (("a", 3), ("b", 40)):
        sched.add_request(Request(rid, list(range(base, base + 8)), max_tokens=12, ignore_eos=True, arrival_time=0.0))
    engine = EngineTables()
    resumed = []
    for _ in range(60):
        if not sched.has_unfinished_requests():
            break
        out = sched.schedule()
        engine.apply(out)
        check_output_arrays(sched, out, engine)
        resumed += [r.req_id for r in out.cached_reqs if r.resumed]
        sched.update(out, np.where(out.sampled, 5, -1))
    assert resumed == ["b"]
    assert not sched.has_unfinished_requests()


@pytest.mark.parametrize("caching", [True, False])
def test_prefix_hit_blocks_are_shared_by_the_new_request(caching: bool) -> None:
    """A second request with the first one's prompt gets the first's full blocks in its new_reqs."""
    sched = Scheduler(SchedulerConfig(num_blocks=40, block_size=4, enable_prefix_caching=caching))
    prompt = list(range(3, 21))  # 18 tokens: 4 full blocks
    sched.add_request(Request("a", prompt, max_tokens=4, arrival_time=0.0))
    first = sched.schedule()
    sched.update(first, {"a": [7]})
    sched.add_request(Request("b", prompt, max_tokens=4, arrival_time=1.0))
    second = sched.schedule()
    (new,) = second.new_reqs
    a_blocks = first.new_reqs[0].block_ids.tolist()
    if caching:
        assert new.num_computed_tokens == 16
        assert new.block_ids.tolist()[:4] == a_blocks[:4]
    else:
        assert new.num_computed_tokens == 0
        assert not set(new.block_ids.tolist()) & set(a_blocks)
