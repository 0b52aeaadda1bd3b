"""The fleet's instances behind one interface, so the router's event loop does not care where they run.

`FleetSimulator` drives its instances only through `Instances`: add routed requests,
advance the instances to the next fleet event, read the live facts a route step needs,
abort or lose an instance, take a P/D request's KV. `LocalInstances` holds the engines in
process and shares the driver's `RequestLog`; `schedir.sim.ray_fleet.RayInstances` holds
each one in a Ray actor and ships back, per call, only what changed (the records of the
requests the calls touched, the token gaps and step rows they produced, the instance's
facts). Both run the same `InstanceCore`, so a run's decisions do not depend on the backend.

Between two fleet events (an arrival batch, a removal, a KV transfer landing) the instances
are independent: each runs its steps that start before the event, so the backend may run
them in parallel. The records they write are per request and each request is on one
instance at a time, so the order across instances does not change them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import attrs
import numpy as np

from schedir.lowering.hashing import extend_hashes
from schedir.lowering.kv_pool import CACHED_FREE, KVPool, allocate, cache_full_blocks, cache_get, evict_hash, free_row
from schedir.runtime import table as T
from schedir.sim.config import SimConfig
from schedir.sim.cost_model import CostModel
from schedir.sim.decode_run import MAX_RUN, run_decodes
from schedir.sim.engine import Engine, StepStatus
from schedir.sim.records import RequestLog, StepLog
from schedir.sim.workloads import Workload
from schedir.sim.workloads.tokens import block_tokens_of

FACTS = ("queued", "running", "queued_tokens", "free_blocks", "total_blocks")
NO_IDS = np.zeros(0, dtype=np.int64)


class InstanceLost(Exception):
    """An instance stopped answering (its Ray actor died, or it was killed): its requests
    must be routed again by the driver, which knows which ones it held."""

    def __init__(self, instance: int, why: str) -> None:
        super().__init__(f"instance {instance} lost: {why}")
        self.instance = instance
        self.why = why


@attrs.frozen
class Advanced:
    """What one instance did while advancing to a fleet event (its records are already in the driver's log)."""

    finished: list[int]  # request indices, in the order they finished
    rejected: list[int]
    next_t: float  # when its next step starts (inf: idle until a request arrives)
    busy: bool


@attrs.frozen
class Copied:
    """What a prefix copy did: engine blocks now cached on the target (0: none), and why not when
    it did not happen (`no_room`, `source_evicted`, `target_kind`: a real engine or no hashed
    prefix cache there, ...; "" when it did)."""

    blocks: int
    why: str = ""
    dropped: int = 0  # migrate: blocks dropped from the source (0 when it still uses them)


class InstanceCore:
    """One instance: its engine and when its next step starts. Everything it does is a call
    with plain arguments, so the same object serves in process and inside a Ray actor."""

    # a simulated engine runs its steady decode steps to the next event in one kernel call
    # (schedir.sim.decode_run: the same steps and records); off only to test that
    decode_runs: bool = True

    def __init__(self, engine: Engine, workload: Workload) -> None:
        self.engine = engine  # the simulator's Engine, or one with its interface (a real vLLM engine)
        self.workload = workload
        self.vocab = self.engine.vocab_size
        self.priority = workload.priority
        self.arrival = workload.arrival_s
        self.next_t = math.inf
        self.touched: list[np.ndarray] | None = None  # set by a backend that ships changed records

    def _wake(self, at: float) -> None:
        if self.next_t == math.inf:  # idle until now: its clock jumps to the arrival
            e = self.engine
            e.now = max(e.now, at)
            self.next_t = e.now

    def add(self, ids: np.ndarray, max_tokens: np.ndarray, at: float) -> None:
        """Queue routed requests `ids` (in routing order) at simulated time `at`."""
        e, wl = self.engine, self.workload
        for r, mt in zip(ids.tolist(), max_tokens.tolist(), strict=True):
            e.add(r, wl.prompt_tokens(r, self.vocab), mt, int(self.priority[r]), float(self.arrival[r]))
        self._wake(at)

    def receive(self, r: int, max_tokens: int, at: float) -> None:
        """P/D: request `r`'s prompt KV (and its first token) landed here at `at`; decode the rest."""
        e = self.engine
        if not isinstance(e, Engine):
            raise NotImplementedError(f"P/D hand-over to a {type(e).__name__} instance: simulated engines only")
        first = (r * 7919 + int(e.reqs.input_len[r])) % self.vocab  # the token the prefill sampled (account_step's)
        prompt = np.append(self.workload.prompt_tokens(r, self.vocab), np.int32(first))
        e.add(r, prompt, max_tokens, int(self.priority[r]), float(self.arrival[r]))
        receive_kv(e, str(r), int(e.reqs.input_len[r]))
        self._wake(at)

    def advance(self, until: float, max_steps: int = -1) -> Advanced:
        """Run the steps that start before `until` (at most `max_steps` when >= 0)."""
        e = self.engine
        finished: list[int] = []
        rejected: list[int] = []
        touched = self.touched
        ran = 0
        runs = self.decode_runs and isinstance(e, Engine)
        while self.next_t < until and ran != max_steps:
            status = e.step()
            ran += 1
            self._took(e, finished, rejected, touched)
            if runs and status is StepStatus.RAN and e.steady and e.now < until:
                # the steady decode steps that follow, to `until`, in one kernel (schedir.sim.decode_run)
                more = run_decodes(e, until, max_steps - ran if max_steps >= 0 else MAX_RUN)
                if more:
                    ran += more
                    self._took(e, finished, rejected, touched)
            self.next_t = math.inf if status is StepStatus.IDLE or not e.busy else e.now
        return Advanced(finished, rejected, self.next_t, e.busy)

    @staticmethod
    def _took(e: Engine, finished: list[int], rejected: list[int], touched: list[np.ndarray] | None) -> None:
        """Collect what the engine's last step (or decode run) finished, rejected and touched."""
        if e.finished:
            finished.extend(e.finished)
        if e.rejected:
            rejected.extend(e.rejected)
        if touched is not None:
            touched.append(e.batch)
            if e.rejected or e.preempted:
                touched.append(np.asarray(e.rejected + e.preempted, dtype=np.int64))

    def facts(self) -> tuple[int, int, int, int, int]:
        """The live facts a route step reads (FACTS order)."""
        s = self.engine.sched
        w = s.waiting
        queued_tokens = int((s.table.data[T.PROMPT, w] - s.table.data[T.COMPUTED, w]).sum()) if w.size else 0
        return w.size, s.running.size, queued_tokens, s.pool.num_free, s.pool.usable_blocks

    def prefix_hashes(self, content: np.ndarray) -> np.ndarray | None:
        """The engine's chained block hashes of the prefix made of `content` blocks (the workload's
        512-token block ids), or None when the instance cannot take a copied prefix: a real engine
        (its KV lives on its device, not in the simulator) or a pool without hashed prefix caching."""
        e = self.engine
        pool = e.sched.pool if isinstance(e, Engine) else None
        if not isinstance(pool, KVPool) or not pool.enable_caching:
            return None
        bt = self.workload.block_tokens
        tokens = block_tokens_of(content, content.size * bt, bt, self.vocab)
        out = np.empty(tokens.size // pool.block_size, dtype=np.int64)
        extend_hashes(tokens, tokens.size, out, 0, pool.block_size)
        return out

    def cached_prefix(self, content: np.ndarray) -> int:
        """Leading engine blocks of the prefix that this instance's cache holds (held or free)."""
        hashes = self.prefix_hashes(content)
        if hashes is None:
            return 0
        cache = self.engine.sched.pool.cache
        k = 0
        while k < hashes.size and cache_get(cache, hashes[k]) >= 0:
            k += 1
        return k

    def adopt_prefix(self, content: np.ndarray, blocks: int) -> int:
        """The first `blocks` engine blocks of the prefix land here, cached (`KVPool.adopt_cached`):
        the blocks newly cached, or -1 when they do not fit (nothing changed)."""
        hashes = self.prefix_hashes(content)
        if hashes is None:
            return -1
        return self.engine.sched.pool.adopt_cached(hashes[:blocks])

    def drop_prefix(self, content: np.ndarray, blocks: int) -> int:
        """Migrate: forget the prefix's first `blocks` cached blocks here, unless a request holds
        one (then -1, nothing changed). Their blocks stay free, uncached; returns how many."""
        hashes = self.prefix_hashes(content)
        if hashes is None:
            return 0
        return drop_cached(self.engine.sched.pool, hashes[:blocks])

    def abort_all(self) -> list[int]:
        """Removal: abort every unfinished request here; returns their indices (sorted)."""
        self.next_t = math.inf
        return self.engine.abort_all()

    def stalled(self) -> str:
        e = self.engine
        return f"{e.sched.get_num_unfinished_requests()} requests unfinished and no arrivals left " \
               f"(first waiting: {e.first_waiting()})"


class Instances(Protocol):
    """The fleet's instances as the router's event loop sees them. `next_t[i]` is when
    instance i's next step starts (inf: idle or gone). A call on a lost instance raises
    `InstanceLost` (`advance` reports lost instances instead of raising)."""

    next_t: np.ndarray
    busy: np.ndarray

    def add(self, batches: Mapping[int, tuple[np.ndarray, np.ndarray]], at: float) -> list[int]:
        """Queue each instance's routed requests (ids, max tokens); returns the instances lost."""
        ...

    def receive(self, instance: int, r: int, max_tokens: int, at: float) -> None: ...

    def advance(self, which: Sequence[int], until: float, max_steps: int = -1) \
            -> tuple[dict[int, Advanced], list[int]]:
        """Advance instances `which` to `until`: (what each did, the instances found lost)."""
        ...

    def facts(self, live: np.ndarray) -> np.ndarray:
        """(len(live), len(FACTS)) int64: each live instance's facts now."""
        ...

    def abort(self, instance: int) -> list[int]: ...

    def copy_prefix(self, src: int, dst: int, content: np.ndarray, migrate: bool) -> Copied:
        """A `cluster.replicate` / `cluster.migrate` landing: the prefix's KV that `src` caches
        (`content` blocks) becomes cached on `dst`; a migrate then drops it from `src`."""
        ...

    def kill(self, instance: int) -> None:
        """Make the instance fail (a crash, not a drain): later calls find it lost."""
        ...

    def stalled(self, instance: int) -> str: ...

    def close(self) -> None: ...


class LocalInstances:
    """The instances in this process, writing straight into the driver's `RequestLog` and step logs."""

    def __init__(self, config: SimConfig, reqs: RequestLog, logs: Sequence[StepLog],
                 sizes: tuple[CostModel, int, int, int], workload: Workload) -> None:
        self.cores: list[InstanceCore | None] = [InstanceCore(Engine(config, reqs, log, sizes), workload)
                                                 for log in logs]
        m = len(logs)
        self.next_t = np.full(m, math.inf)
        self.busy = np.zeros(m, dtype=bool)

    def _core(self, i: int) -> InstanceCore:
        core = self.cores[i]
        if core is None:
            raise InstanceLost(i, "killed")
        return core

    def add(self, batches: Mapping[int, tuple[np.ndarray, np.ndarray]], at: float) -> list[int]:
        lost = []
        for i, (ids, max_tokens) in batches.items():
            core = self.cores[i]
            if core is None:
                lost.append(i)
                continue
            core.add(ids, max_tokens, at)
            self.next_t[i] = core.next_t
            self.busy[i] = True
        return lost

    def receive(self, instance: int, r: int, max_tokens: int, at: float) -> None:
        core = self._core(instance)
        core.receive(r, max_tokens, at)
        self.next_t[instance] = core.next_t
        self.busy[instance] = True

    def advance(self, which: Sequence[int], until: float, max_steps: int = -1) \
            -> tuple[dict[int, Advanced], list[int]]:
        done: dict[int, Advanced] = {}
        lost = []
        for i in which:
            core = self.cores[i]
            if core is None:
                lost.append(i)
                continue
            a = done[i] = core.advance(until, max_steps)
            self.next_t[i] = a.next_t
            self.busy[i] = a.busy
        return done, lost

    def facts(self, live: np.ndarray) -> np.ndarray:
        return np.array([self._core(i).facts() for i in live.tolist()], dtype=np.int64).reshape(-1, len(FACTS))

    def abort(self, instance: int) -> list[int]:
        names = self._core(instance).abort_all()
        self.next_t[instance] = math.inf
        self.busy[instance] = False
        return names

    def copy_prefix(self, src: int, dst: int, content: np.ndarray, migrate: bool) -> Copied:
        source, target = self._core(src), self._core(dst)
        return copy_between(source.cached_prefix, target.adopt_prefix, source.drop_prefix, content, migrate,
                            target.prefix_hashes(content) is not None)

    def kill(self, instance: int) -> None:
        self.cores[instance] = None
        self.next_t[instance] = math.inf
        self.busy[instance] = False

    def stalled(self, instance: int) -> str:
        return self._core(instance).stalled()

    def close(self) -> None:
        pass


def copy_between(cached: Callable[[np.ndarray], int], adopt: Callable[[np.ndarray, int], int],
                 drop: Callable[[np.ndarray, int], int], content: np.ndarray, migrate: bool,
                 target_caches: bool) -> Copied:
    """One prefix copy through an instance pair's three calls (in process or on Ray actors):
    what the source still caches of it is what travels; the target takes it only if it fits."""
    if not target_caches:
        return Copied(0, "target_kind")
    have = cached(content)
    if have == 0:
        return Copied(0, "source_evicted")
    got = adopt(content, have)
    if got < 0:
        return Copied(0, "no_room")
    dropped = max(drop(content, have), 0) if migrate else 0
    return Copied(have, "", dropped)


def drop_cached(pool: KVPool, hashes: np.ndarray) -> int:
    """Forget `hashes` in `pool`'s prefix cache when no request holds any of their blocks (else
    -1, nothing changed). Only cached free blocks lose their hash; they stay in the free queue,
    so free and held counts and the pool's invariants hold (`KVPool.check`)."""
    blocks: list[int] = []
    for h in hashes.tolist():
        b = cache_get(pool.cache, h)
        while b >= 0:  # every block registered under h (duplicates follow the head)
            blocks.append(int(b))
            b = int(pool.dup_next[b])
    if any(pool.ref[b] > 0 for b in blocks):
        return -1
    for b in blocks:
        evict_hash(b, pool.bhash, pool.dup_next, pool.cache)
        pool.meta[CACHED_FREE] -= 1
    return len(blocks)


def receive_kv(engine: Engine, name: str, tokens: int) -> int:
    """The KV of a request's first `tokens` prompt tokens lands in `engine`'s prefix cache
    (P/D: the transfer from its prefill instance), as blocks registered under the request's
    chained hashes and left free-but-cached, so its first step there finds them as prefix hits.
    Returns the blocks received (0 when the pool has no room: the decode instance recomputes)."""
    pool = engine.sched.pool
    row = engine.sched.table.row_of[name]
    full = min(tokens // pool.block_size, int(pool.nhash[row]), pool.width)
    if full <= 0 or full > pool.num_free:
        return 0
    allocate(row, full, pool.ref, pool.bhash, pool.dup_next, pool.nxt, pool.prv, pool.meta, pool.cache, pool.table,
             pool.nblk)
    cache_full_blocks(row, full * pool.block_size, pool.bhash, pool.dup_next, pool.cache, pool.meta, pool.table,
                      pool.ncached, pool.rhash, pool.nhash)
    free_row(row, pool.ref, pool.bhash, pool.dup_next, pool.nxt, pool.prv, pool.meta, pool.cache, pool.table,
             pool.nblk, pool.ncached)
    return full
