"""The multi-instance simulator: N engines, a router running the cluster pipeline per arrival batch.

Each instance is an `Engine` (a schedir runtime with its own pipeline, KV pool, cost model
and clock). Events happen in simulated-time order: an arrival batch (the arrivals at one
instant) is routed by building a `cluster.route_step` from the instances' live state and
running the router pipeline (`round-robin`, `mooncake`, a pass list...) over it; otherwise
the instance whose step ends first runs its next step. Removing an instance mid-run aborts
its unfinished requests there and routes them again (they restart on their new instance:
none is lost, none finishes twice).

The router's prefix digest is its own approximate index, as the SGLang router keeps one:
each instance holds the block chains of the requests routed to it, least recently routed
evicted first beyond the instance's KV capacity. `cluster.replicate` / `cluster.migrate`
decisions are recorded with their bytes and link time (their KV is not copied into the
target's pool). With P/D roles (`prefill_instances`), a disaggregated request runs its
prefill and first token on its prefill instance, then, after the `cluster.transfer`'s link
time, continues on its decode instance, whose prefix cache receives the prompt's KV.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import attrs
import numba as nb
import numpy as np

from schedir.dialects.cluster import MigrateOp, RejectOp, ReplicateOp, RouteOp, TransferOp
from schedir.dialects.codes import Role, Why, keyword
from schedir.ir.errors import PipelineError
from schedir.ir.fastop import dispose
from schedir.ir.pipeline import PassManager
from schedir.ir.route_step import build_route_step
from schedir.lowering.kv_pool import allocate, cache_full_blocks, free_row
from schedir.runtime import table as T
from schedir.sim.config import SimConfig
from schedir.sim.engine import Engine, StepStatus, engine_sizes
from schedir.sim.records import RequestLog, SimResult, StepLog
from schedir.sim.simulator import plain_value
from schedir.sim.workloads import Workload

Progress = Callable[[int, int, float], None]


@attrs.frozen
class Removal:
    """Take instance `instance` out of the fleet at `at_s` simulated seconds."""

    at_s: float
    instance: int


def parse_removal(text: str) -> Removal:
    """`ID@SECONDS` (e.g. `3@120`) -> Removal; a bad one is a ValueError naming the flag."""
    head, at, tail = text.partition("@")
    try:
        if not at:
            raise ValueError
        removal = Removal(float(tail), int(head))
    except ValueError:
        raise ValueError(f"--remove-instance {text!r}: expected INSTANCE@SECONDS, e.g. 3@120") from None
    if removal.instance < 0 or not (removal.at_s >= 0 and math.isfinite(removal.at_s)):
        raise ValueError(f"--remove-instance {text!r}: the instance and the time must be >= 0")
    return removal


@attrs.frozen
class FleetConfig:
    """A fleet: how many instances, the router pipeline, the topology and what fails when."""

    instances: int = 8
    router: str = "round-robin"  # a router preset or a routing pass list
    instances_per_position: int = 8  # instances sharing one topology position (one node)
    prefill_instances: int = 0  # P/D: the first K instances prefill, the others decode (0: all do both)
    removals: tuple[Removal, ...] = ()
    label: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.instances < 1:
            raise ValueError(f"--instances must be >= 1, got {self.instances}")
        if self.instances_per_position < 1:
            raise ValueError(f"--instances-per-node must be >= 1, got {self.instances_per_position}")
        for r in self.removals:
            if r.instance >= self.instances:
                raise ValueError(f"--remove-instance {r.instance}@{r.at_s:g}: the fleet has instances "
                                 f"0..{self.instances - 1}")
        if len({r.instance for r in self.removals}) != len(self.removals):
            raise ValueError("--remove-instance: an instance is removed twice")
        if len(self.removals) >= self.instances:
            raise ValueError("--remove-instance: at least one instance must stay in the fleet")
        if not 0 <= self.prefill_instances < self.instances:
            raise ValueError(f"--prefill-instances must lie in 0..{self.instances - 1} (some instances must "
                             f"decode), got {self.prefill_instances}")
        if self.prefill_instances and self.removals:
            raise ValueError("--remove-instance is not simulated with P/D disaggregation (--prefill-instances)")

    def roles(self) -> np.ndarray:
        roles = np.full(self.instances, int(Role.BOTH), dtype=np.int64)
        if self.prefill_instances:
            roles[: self.prefill_instances] = int(Role.PREFILL)
            roles[self.prefill_instances:] = int(Role.DECODE)
        return roles

    @property
    def name(self) -> str:
        return self.label or self.router


@nb.njit(cache=True)
def chain_hashes(block_ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Chained prefix hashes per content block (block k's hash names blocks 0..k of its
    request): positive, nonzero int64, equal exactly when the whole prefix is equal."""
    out = np.empty(block_ids.size, dtype=np.int64)
    golden = np.uint64(0x9E3779B97F4A7C15)
    for r in range(offsets.size - 1):
        h = np.uint64(0x12345)
        for b in range(offsets[r], offsets[r + 1]):
            z = h ^ (np.uint64(block_ids[b]) + golden)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            h = z ^ (z >> np.uint64(31))
            v = np.int64(h >> np.uint64(1))
            out[b] = v if v != 0 else 1
    return out


class PrefixIndex:
    """The router's view of what each instance caches: per instance an LRU of chain hashes
    (capacity in prefix blocks), and per hash a bit mask of the instances holding it."""

    def __init__(self, capacity: Sequence[int]) -> None:
        self.capacity = list(capacity)
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in capacity]
        self.holders: dict[int, int] = {}

    def add(self, instance: int, hashes: Sequence[int]) -> None:
        lru = self.lru[instance]
        bit = 1 << instance
        holders = self.holders
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                holders[h] = holders.get(h, 0) | bit
        cap = self.capacity[instance]
        while len(lru) > cap:
            old, _ = lru.popitem(last=False)
            left = holders[old] & ~bit
            if left:
                holders[old] = left
            else:
                del holders[old]

    def drop(self, instance: int) -> None:
        for h in list(self.lru[instance]):
            left = self.holders[h] & ~(1 << instance)
            if left:
                self.holders[h] = left
            else:
                del self.holders[h]
        self.lru[instance].clear()

    def digest(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(instance, hash) pairs for the instances holding each of `hashes` (unique)."""
        get = self.holders.get
        masks = [get(h, 0) for h in hashes.tolist()]
        inst: list[int] = []
        held: list[int] = []
        for h, mask in zip(hashes.tolist(), masks, strict=True):
            while mask:
                low = mask & -mask
                inst.append(low.bit_length() - 1)
                held.append(h)
                mask ^= low
        return np.asarray(inst, dtype=np.int64), np.asarray(held, dtype=np.int64)


@attrs.frozen
class FleetResult:
    """A fleet run: the pooled records (a `SimResult`, so `summarize` reads it) and the fleet's own."""

    result: SimResult
    fleet: dict[str, object]
    instance_of: np.ndarray  # the instance that served (or last held) each request, -1: none
    finish_count: np.ndarray  # times each request finished (1 or 0)
    reject_why: dict[int, str]


class FleetSimulator:
    """Replays one workload through a fleet of identical engines behind a router."""

    def __init__(self, engine: SimConfig, fleet: FleetConfig) -> None:
        self.engine_config = engine
        self.fleet_config = fleet
        self.sizes = engine_sizes(engine)
        try:
            self.manager = PassManager.parse(fleet.router)
        except PipelineError as e:
            raise ValueError(f"--router {fleet.router!r}: {e}") from None
        if not self.manager.passes or any(getattr(p, "over", "") != "cluster.route_step" for p in self.manager.passes):
            raise ValueError(f"--router {fleet.router!r}: a router is a router preset (round-robin, least-load, "
                             "mooncake, sglang-router) or a list of routing passes")
        if fleet.prefill_instances and not any(p.name == "pd-disaggregate" for p in self.manager.passes):
            raise ValueError(f"--router {fleet.router!r}: with prefill and decode instances the router needs "
                             "pd-disaggregate (e.g. --router mooncake-pd)")

    def run(self, workload: Workload, progress: Progress | None = None, progress_every: int = 500) -> FleetResult:
        cfg, fc = self.engine_config, self.fleet_config
        n, m = len(workload), fc.instances
        arrivals = np.asarray(workload.arrival_s, dtype=np.float64)
        reqs = RequestLog(arrivals, workload.input_len, workload.output_len)
        logs = [StepLog(1024) for _ in range(m)]
        engines = [Engine(cfg, reqs, logs[i], self.sizes) for i in range(m)]
        vocab = engines[0].vocab_size
        block_tokens = workload.block_tokens
        capacity = [max(1, e.num_blocks * cfg.block_size // block_tokens) for e in engines]
        index = PrefixIndex(capacity)
        hashes = chain_hashes(np.ascontiguousarray(workload.block_ids), np.ascontiguousarray(workload.block_offsets))
        offsets = workload.block_offsets
        position = np.arange(m, dtype=np.int64) // fc.instances_per_position
        roles = fc.roles()
        handoff: dict[int, tuple[int, float]] = {}  # P/D: request -> (decode instance, transfer seconds)
        arriving: list[tuple[float, int, int]] = []  # P/D: (KV lands, request, decode instance), a heap
        alive = np.ones(m, dtype=bool)
        next_t = np.full(m, math.inf)
        instance_of = np.full(n, -1, dtype=np.int64)
        finish_count = np.zeros(n, dtype=np.int64)
        routed_to = np.zeros(m, dtype=np.int64)
        reject_why: dict[int, str] = {}
        arrival_at = arrivals.tolist()
        max_tokens = np.asarray(workload.output_len).tolist()
        priority = np.asarray(workload.priority).tolist()
        input_len = reqs.input_len
        output_len = reqs.output_len
        ttft_ms = round(cfg.ttft_slo_s * 1e3)
        tbt_ms = round(cfg.tbt_slo_s * 1e3)
        removals = sorted(fc.removals, key=lambda r: r.at_s)
        stats = {"route_steps": 0, "routed": 0, "route_wall_s": 0.0, "pipeline_wall_s": 0.0, "replicas": 0,
                 "replica_bytes": 0,
                 "migrations": 0, "transfers": 0, "rerouted": 0, "why": {}}
        manager = self.manager
        route_step_no = 0
        done = 0
        nxt = 0
        ri = 0
        stalled: str | None = None
        now = 0.0
        wall_start = time.perf_counter()

        def route(batch: list[int], at: float) -> None:
            nonlocal route_step_no, done
            t0 = time.perf_counter()
            ids = np.asarray(batch, dtype=np.int64)
            live = np.flatnonzero(alive)
            d = [engines[i] for i in live]
            queued = np.array([e.sched.waiting.size for e in d], dtype=np.int64)
            running = np.array([e.sched.running.size for e in d], dtype=np.int64)
            queued_tokens = np.array([int((e.sched.table.data[T.PROMPT, e.sched.waiting]
                                           - e.sched.table.data[T.COMPUTED, e.sched.waiting]).sum())
                                      if e.sched.waiting.size else 0 for e in d], dtype=np.int64)
            fleet = {"id": live, "role": roles[live], "queued": queued,
                     "running": running, "free_blocks": np.array([e.sched.pool.num_free for e in d], np.int64),
                     "total_blocks": np.array([e.sched.pool.usable_blocks for e in d], np.int64),
                     "position": position[live], "queued_tokens": queued_tokens,
                     "digest_blocks": np.array([len(index.lru[i]) for i in live.tolist()], np.int64)}
            k = ids.size
            arr = {"id": ids, "prompt": input_len[ids], "output": output_len[ids],
                   "ttft_slo_ms": np.full(k, ttft_ms, np.int64), "tbt_slo_ms": np.full(k, tbt_ms, np.int64)}
            starts, ends = offsets[ids], offsets[ids + 1]
            counts = ends - starts
            p_id = np.repeat(ids, counts)
            p_hash = hashes[np.concatenate([np.arange(s, e) for s, e in zip(starts.tolist(), ends.tolist(),
                                                                            strict=True)])] \
                if k > 1 else hashes[starts[0]:ends[0]]
            digest = index.digest(np.unique(p_hash))
            keep = alive[digest[0]]
            module = build_route_step(route_step_no, round(at * 1e6), fleet, arr, (digest[0][keep], digest[1][keep]),
                                      (p_id, p_hash))
            route_step_no += 1
            t1 = time.perf_counter()
            manager.run(module)
            stats["pipeline_wall_s"] += time.perf_counter() - t1  # type: ignore[operator]
            decided = np.zeros(0, dtype=np.int64)
            for op in module.body.block.first_op.body.block.ops:  # type: ignore[union-attr]
                kind = type(op)
                if kind is RouteOp:
                    rid, inst, dec, why = (op.ids, op.col("instance"), op.col("decode"),  # type: ignore[attr-defined]
                                           op.col("why"))  # type: ignore[attr-defined]
                    decided = np.concatenate([decided, rid])
                    for r, i, j, w in zip(rid.tolist(), inst.tolist(), dec.tolist(), why.tolist(), strict=True):
                        e = engines[i]
                        split = j != i and max_tokens[r] > 1
                        e.add(r, workload.prompt_tokens(r, vocab), 1 if split else max_tokens[r], priority[r],
                              arrival_at[r])
                        if split:
                            handoff[r] = (j, 0.0)
                        if next_t[i] == math.inf:
                            e.now = max(e.now, at)
                            next_t[i] = e.now
                        instance_of[r] = i
                        routed_to[i] += 1
                        index.add(i, hashes[offsets[r]:offsets[r + 1]].tolist())
                        name = keyword(Why, w)
                        stats["why"][name] = stats["why"].get(name, 0) + 1  # type: ignore[index]
                elif kind is RejectOp:
                    rid, why = op.ids, op.col("why")  # type: ignore[attr-defined]
                    decided = np.concatenate([decided, rid])
                    for r, w in zip(rid.tolist(), why.tolist(), strict=True):
                        reject_why[r] = reqs.rejected[r] = f"router: {keyword(Why, w)}"
                        done += 1
                elif kind is ReplicateOp or kind is MigrateOp:
                    key = "replicas" if kind is ReplicateOp else "migrations"
                    stats[key] += len(op.col("hash"))  # type: ignore[attr-defined, operator]
                    stats["replica_bytes"] += int(op.col("bytes").sum())  # type: ignore[attr-defined, operator]
                elif kind is TransferOp:
                    stats["transfers"] += len(op)  # type: ignore[arg-type, operator]
                    for r, j, lat in zip(op.ids.tolist(), op.col("dst").tolist(),  # type: ignore[attr-defined]
                                         op.col("latency_us").tolist(), strict=True):  # type: ignore[attr-defined]
                        if r in handoff:
                            handoff[r] = (j, lat * 1e-6)
            left = ids[~np.isin(ids, decided)]
            for r in left.tolist():  # no pass decided it: no instance can serve it
                reject_why[r] = reqs.rejected[r] = "router: no_instance"
                done += 1
            dispose(module)
            stats["route_steps"] += 1  # type: ignore[operator]
            stats["routed"] += k  # type: ignore[operator]
            stats["route_wall_s"] += time.perf_counter() - t0  # type: ignore[operator]

        while True:
            t_arr = arrival_at[nxt] if nxt < n else math.inf
            t_rm = removals[ri].at_s if ri < len(removals) else math.inf
            t_kv = arriving[0][0] if arriving else math.inf
            i = int(np.argmin(next_t))
            t_inst = next_t[i]
            t = min(t_arr, t_rm, t_inst, t_kv)
            if t == math.inf:
                break
            if t_kv == t:  # P/D: a request's KV reached its decode instance, which takes it from here
                _, r, j = heapq.heappop(arriving)
                e = engines[j]
                first = (r * 7919 + int(input_len[r])) % vocab  # the token the prefill sampled (account_step's)
                prompt = np.append(workload.prompt_tokens(r, vocab), np.int32(first))
                e.add(r, prompt, max_tokens[r] - 1, priority[r], arrival_at[r])
                receive_kv(e, str(r), int(input_len[r]))
                instance_of[r] = j
                if next_t[j] == math.inf:
                    e.now = max(e.now, t_kv)
                    next_t[j] = e.now
                continue
            if t_rm == t:
                victim = removals[ri].instance
                ri += 1
                now = max(now, t_rm)
                e = engines[victim]
                sched = e.sched
                rows = np.concatenate([sched.running, sched.waiting])
                names = [sched.table.names[r] for r in rows.tolist()]
                sched.finish_requests(names, reason="abort")
                alive[victim] = False
                next_t[victim] = math.inf
                index.drop(victim)
                back = sorted(int(x) for x in names)
                for r in back:  # they restart elsewhere: drop what the lost instance recorded
                    reqs.first_scheduled_s[r] = reqs.first_token_s[r] = reqs.last_token_s[r] = math.nan
                    reqs.tokens_out[r] = 0
                    reqs.prefix_hit_tokens[r] = -1
                stats["rerouted"] += len(back)  # type: ignore[operator]
                if back:
                    route(back, now)
                continue
            if t_arr == t:
                now = t_arr
                batch = []
                while nxt < n and arrival_at[nxt] <= now:
                    batch.append(nxt)
                    nxt += 1
                route(batch, now)
                continue
            e = engines[i]
            status = e.step()
            finished = e.finished
            if handoff and finished:
                kept = []
                for r in finished:
                    if r in handoff:  # prefilled: not finished, its KV goes to the decode instance
                        j, seconds = handoff.pop(r)
                        reqs.finish_s[r] = math.nan
                        heapq.heappush(arriving, (e.now + seconds, r, j))
                    else:
                        kept.append(r)
                finished = kept
            for r in finished:
                finish_count[r] += 1
            done += len(e.rejected) + len(finished)
            for r in e.rejected:
                reject_why[r] = reqs.rejected[r]
            if status is StepStatus.IDLE or not e.busy:
                next_t[i] = math.inf
            else:
                next_t[i] = e.now
            if progress is not None and (done % progress_every == 0):
                progress(done, n, float(e.now))
        unfinished = [i for i in range(m) if alive[i] and engines[i].busy]
        if unfinished:
            e = engines[unfinished[0]]
            stalled = (f"instance {unfinished[0]}: pipeline '{cfg.pipeline}' scheduled nothing with "
                       f"{e.sched.get_num_unfinished_requests()} requests unfinished and no arrivals left "
                       f"(first waiting: {e.first_waiting()})")
        wall = time.perf_counter() - wall_start
        if progress is not None:
            progress(done, n, now)
        steps = _merge(logs)
        metrics: dict[str, float] = {}
        result = SimResult(
            config_name=fc.name, config=attrs.asdict(cfg, value_serializer=plain_value),
            workload={"name": workload.name, "source": workload.source, **workload.stats()},
            num_blocks=self.sizes[3], max_model_len=self.sizes[2], peak_flops=self.sizes[0].peak_flops,
            requests=reqs, steps=steps, runtime_metrics=metrics, sim_wall_s=wall, stalled=stalled)
        per_instance = []
        for i in range(m):
            log = logs[i]
            busy = float(log.column("gpu_s").sum()) if log.size else 0.0
            per_instance.append({"instance": i, "alive": bool(alive[i]), "routed": int(routed_to[i]),
                                 "finished": int(((instance_of == i) & (finish_count > 0)).sum()),
                                 "steps": int(log.size), "gpu_busy_s": busy,
                                 "mean_running": float(log.column("num_reqs").mean()) if log.size else 0.0})
        rs = int(stats["route_steps"])  # type: ignore[arg-type]
        routed = max(int(stats["routed"]), 1)  # type: ignore[arg-type]
        load_t, load_running = [], []
        for log in logs:  # each instance's batch size over time, in at most 200 bins
            if log.size:
                t, running = _binned(log.column("start_s"), log.column("num_reqs"))
            else:
                t, running = [], []
            load_t.append(t)
            load_running.append(running)
        routed_at = np.where(finish_count > 0, instance_of, -1)
        fleet_info = {"router": fc.router, "pipeline": manager.spec, "instances": m,
                      "route_steps": rs, "routed": stats["routed"],
                      # the whole router (fleet state, IR, pipeline, queueing on the instances) and
                      # the routing step alone (IR built and run), per routed request
                      "route_us_per_request": float(stats["route_wall_s"]) * 1e6 / routed,  # type: ignore[arg-type]
                      "pipeline_us_per_request": float(stats["pipeline_wall_s"]) * 1e6 / routed,  # type: ignore[arg-type]
                      "replicas": stats["replicas"], "migrations": stats["migrations"],
                      "replica_bytes": stats["replica_bytes"], "transfers": stats["transfers"],
                      "rerouted": stats["rerouted"], "why": stats["why"], "per_instance": per_instance,
                      "series": {"load_t_s": load_t, "load_running": load_running,
                                 "arrival_s": [round(float(x), 3) for x in arrivals.tolist()],
                                 "instance": routed_at.tolist()}}
        return FleetResult(result=result, fleet=fleet_info, instance_of=instance_of, finish_count=finish_count,
                           reject_why=reject_why)


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


def _binned(t: np.ndarray, values: np.ndarray, bins: int = 200) -> tuple[list[float], list[float]]:
    edges = np.linspace(t[0], t[-1] + 1e-9, bins + 1)
    which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
    count = np.bincount(which, minlength=bins)
    keep = count > 0
    mean = np.bincount(which, weights=values, minlength=bins)[keep] / count[keep]
    mid = ((edges[:-1] + edges[1:]) / 2)[keep]
    return [round(float(x), 3) for x in mid], [round(float(x), 2) for x in mean]


def _merge(logs: Sequence[StepLog]) -> StepLog:
    """Every instance's steps in one log, by start time (the fleet's timeline)."""
    total = sum(log.size for log in logs)
    merged = StepLog(max(total, 1))
    if total:
        rows = np.concatenate([log._rows[: log.size] for log in logs])
        rows = rows[np.argsort(rows[:, 0], kind="stable")]
        merged._rows[:total] = rows
        merged.size = total
    return merged

