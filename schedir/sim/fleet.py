"""The multi-instance simulator: N engines, a router running the cluster pipeline per arrival batch.

Each instance is an `Engine` (a schedir runtime with its own pipeline, KV pool, cost model
and clock). Events happen in simulated-time order: an arrival batch (the arrivals at one
instant) is routed by building a `cluster.route_step` from the instances' live state and
running the router pipeline (`round-robin`, `mooncake`, a pass list...) over it; otherwise
every instance runs its steps that start before that next fleet event (the instances are
independent in between, so a backend may run them in parallel: `schedir.sim.fleet_instances`).
Removing an instance mid-run aborts its unfinished requests there and routes them again
(they restart on their new instance: none is lost, none finishes twice); an instance that
fails (killed, or a Ray actor that stops answering) has the requests the router knows it
held routed again the same way.

The router's prefix digest is its own approximate index, as the SGLang router keeps one:
each instance holds the block chains of the requests routed to it, least recently routed
evicted first beyond the instance's KV capacity. A `cluster.replicate` / `cluster.migrate`
copies the prefix's KV: after the link model's time (the replicating pass's bandwidth, latency
and topology) the target's pool caches what the source still held of it (if it fits: else the
copy is skipped with its reason), a migrate then drops it from the source unless a request
there uses it; the requests routed onto the replica join the target when the copy lands. With
P/D roles (`prefill_instances`), a disaggregated request runs its
prefill and first token on its prefill instance, then, after the `cluster.transfer`'s link
time, continues on its decode instance, whose prefix cache receives the prompt's KV.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
import numba as nb
import numpy as np

from schedir.dialects.cluster import MigrateOp, RejectOp, ReplicateOp, RouteOp, TransferOp
from schedir.dialects.codes import Role, Why, keyword
from schedir.ir.errors import PipelineError
from schedir.ir.pipeline import Instrumentation, PassManager
from schedir.ir.route_arrays import ArrayRouteSteps, RouteArrays
from schedir.ir.route_step import RouteStep, build_route_step, route_steps_of
from schedir.lowering import route_state as rs
from schedir.lowering.route_program import lower_router
from schedir.passes.route_kernels import LinkOptions
from schedir.sim.config import SimConfig
from schedir.sim.cost_model import CostModel
from schedir.sim.engine import engine_sizes
from schedir.sim.fleet_instances import Advanced, Copied, InstanceLost, Instances, LocalInstances, receive_kv
from schedir.sim.records import RequestLog, SimResult, StepLog
from schedir.sim.workloads import Workload

Progress = Callable[[int, int, float], None]
# builds a fleet's instances: (engine config, the driver's request log, per-instance step logs, sizes, workload)
Backend = Callable[[SimConfig, RequestLog, list[StepLog], tuple[CostModel, int, int, int], Workload], Instances]

__all__ = ["Backend", "FleetConfig", "FleetResult", "FleetSimulator", "PrefixIndex", "Removal", "chain_hashes",
           "parse_removal", "receive_kv"]


@attrs.frozen
class Removal:
    """Take instance `instance` out of the fleet at `at_s` simulated seconds: drained (its
    requests aborted there) or, with `kill`, crashed (it stops answering; the router re-routes
    what it knew the instance held)."""

    at_s: float
    instance: int
    kill: bool = False

    @property
    def flag(self) -> str:
        return "--kill-instance" if self.kill else "--remove-instance"


def parse_removal(text: str, kill: bool = False) -> Removal:
    """`ID@SECONDS` (e.g. `3@120`) -> Removal; a bad one is a ValueError naming the flag."""
    flag = "--kill-instance" if kill else "--remove-instance"
    head, at, tail = text.partition("@")
    try:
        if not at:
            raise ValueError
        removal = Removal(float(tail), int(head), kill)
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected INSTANCE@SECONDS, e.g. 3@120") from None
    if removal.instance < 0 or not (removal.at_s >= 0 and math.isfinite(removal.at_s)):
        raise ValueError(f"{flag} {text!r}: the instance and the time must be >= 0")
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
    copy_kv: bool = True  # apply replicate / migrate decisions to the pools (False: count them only)
    # routing steps (numbered from 1, as their IR shows them) whose IR to write after every pass
    # to `dump_dir` (route-step-00005-01-slo-early-reject.mlir ...): a tuple of numbers or "all"
    dump_steps: tuple[int, ...] | str = ()
    dump_dir: Path | None = None

    def __attrs_post_init__(self) -> None:
        if self.instances < 1:
            raise ValueError(f"--instances must be >= 1, got {self.instances}")
        if self.instances_per_position < 1:
            raise ValueError(f"--instances-per-node must be >= 1, got {self.instances_per_position}")
        for r in self.removals:
            if r.instance >= self.instances:
                raise ValueError(f"{r.flag} {r.instance}@{r.at_s:g}: the fleet has instances "
                                 f"0..{self.instances - 1}")
        if len({r.instance for r in self.removals}) != len(self.removals):
            raise ValueError("--remove-instance/--kill-instance: an instance is removed twice")
        if len(self.removals) >= self.instances:
            raise ValueError("--remove-instance/--kill-instance: at least one instance must stay in the fleet")
        if not 0 <= self.prefill_instances < self.instances:
            raise ValueError(f"--prefill-instances must lie in 0..{self.instances - 1} (some instances must "
                             f"decode), got {self.prefill_instances}")
        if self.dump_steps and self.dump_dir is None:
            raise ValueError("--dump-steps needs --dump-dir (where to write the IR)")
        if self.prefill_instances and self.removals:
            raise ValueError(f"{self.removals[0].flag} is not simulated with P/D disaggregation "
                             "(--prefill-instances)")

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

    def forget(self, instance: int, hashes: Sequence[int]) -> None:
        """The instance no longer caches `hashes` (a migrated prefix left it)."""
        lru = self.lru[instance]
        for h in hashes:
            if h in lru:
                del lru[h]
                left = self.holders[h] & ~(1 << instance)
                if left:
                    self.holders[h] = left
                else:
                    del self.holders[h]

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


@attrs.define
class PendingCopy:
    """A prefix copy on the link (`cluster.replicate` / `cluster.migrate`): the workload blocks
    of the prefix, and the requests routed onto the replica, queued on `dst` when it lands."""

    src: int
    dst: int
    content: np.ndarray  # the prefix's workload block ids
    chain: list[int]  # its router chain hashes
    migrate: bool
    decided_s: float
    waiting: list[tuple[int, int]]  # (request, max tokens) in routing order


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

    # what builds each routing step: arrays the passes run over (`RouteArrays`), or its IR
    # (`RecycledRouteStep`, `build_route_step`: a module); the same decisions (tested)
    route_steps: type = ArrayRouteSteps
    # over arrays, a pipeline whose every pass has a lowered form runs as one kernel call a step
    # (`schedir.lowering.route_program`; the same decisions, tested); False: pass by pass
    lowered: bool = True

    def __init__(self, engine: SimConfig, fleet: FleetConfig, backend: Backend = LocalInstances) -> None:
        self.engine_config = engine
        self.fleet_config = fleet
        self.backend = backend  # where the instances run: in process, or Ray actors (schedir.sim.ray_fleet)
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

    def _decide(self, manager: PassManager, built: object, dumped: bool,
                step_no: int) -> list[tuple[type, Mapping[str, np.ndarray]]]:
        """Run the router's passes over a step built as arrays or as IR; a dumped step is verified
        and written after every pass (it replays with `schedir opt`)."""
        if type(built) is RouteArrays:
            manager.run_view(built)
            return built.decisions()
        if dumped:
            fc = self.fleet_config
            instrument = Instrumentation(dump_dir=fc.dump_dir, prefix=f"route-step-{step_no:05d}-")
            PassManager.parse(fc.router, verify_each=True, instrument=instrument).run(built)  # type: ignore[arg-type]
        else:
            manager.run(built)  # type: ignore[arg-type]
        return RouteStep(route_steps_of(built)[0]).decisions()  # type: ignore[arg-type]

    def run(self, workload: Workload, progress: Progress | None = None, progress_every: int = 500) -> FleetResult:
        cfg, fc = self.engine_config, self.fleet_config
        m = fc.instances
        arrivals = np.asarray(workload.arrival_s, dtype=np.float64)
        reqs = RequestLog(arrivals, workload.input_len, workload.output_len)
        logs = [StepLog(1024) for _ in range(m)]
        instances = self.backend(cfg, reqs, logs, self.sizes, workload)
        try:
            return self._run(workload, reqs, logs, instances, progress, progress_every)
        finally:
            instances.close()

    def _run(self, workload: Workload, reqs: RequestLog, logs: list[StepLog], instances: Instances,
             progress: Progress | None, progress_every: int) -> FleetResult:
        cfg, fc = self.engine_config, self.fleet_config
        n, m = len(workload), fc.instances
        arrivals = reqs.arrival_s
        block_tokens = workload.block_tokens
        capacity = [max(1, self.sizes[3] * cfg.block_size // block_tokens)] * m
        index = PrefixIndex(capacity)
        hashes = chain_hashes(np.ascontiguousarray(workload.block_ids), np.ascontiguousarray(workload.block_offsets))
        offsets = workload.block_offsets
        position = np.arange(m, dtype=np.int64) // fc.instances_per_position
        roles = fc.roles()
        handoff: dict[int, tuple[int, float]] = {}  # P/D: request -> (decode instance, transfer seconds)
        handing = np.zeros(m, dtype=np.int64)  # P/D: requests each instance will hand off after their prefill
        expecting = np.zeros(m, dtype=np.int64)  # P/D: requests each instance will receive
        arriving: list[tuple[float, int, int]] = []  # P/D: (KV lands, request, decode instance), a heap
        landing: list[tuple[float, int]] = []  # prefix copies: (KV lands, copy number), a heap
        pending: dict[int, PendingCopy] = {}  # copy number -> the copy on the link
        # prefix copies done or skipped: (decided, landed, src, dst, blocks, migrate, why)
        copies: list[tuple[float, float, int, int, int, int, str]] = []
        moved: list[tuple[float, float, int, int, int]] = []  # P/D transfers: (sent, landed, request, src, dst)
        copy_no = itertools.count()
        link = next((p for p in self.manager.passes if isinstance(p, LinkOptions)), LinkOptions())
        alive = np.ones(m, dtype=bool)
        next_t = instances.next_t
        instance_of = np.full(n, -1, dtype=np.int64)
        settled = np.zeros(n, dtype=bool)  # finished or rejected: no instance holds it any more
        finish_count = np.zeros(n, dtype=np.int64)
        routed_to = np.zeros(m, dtype=np.int64)
        reject_why: dict[int, str] = {}
        arrival_at = arrivals.tolist()
        max_tokens = np.asarray(workload.output_len).tolist()
        input_len = reqs.input_len
        output_len = reqs.output_len
        ttft_ms = round(cfg.ttft_slo_s * 1e3)
        tbt_ms = round(cfg.tbt_slo_s * 1e3)
        removals = sorted(fc.removals, key=lambda r: r.at_s)
        stats = {"route_steps": 0, "routed": 0, "route_wall_s": 0.0, "pipeline_wall_s": 0.0, "replicas": 0,
                 "replica_bytes": 0,
                 "migrations": 0, "transfers": 0, "copied_blocks": 0, "copy_skipped": {}, "rerouted": 0, "lost": [],
                 "why": {}}
        manager = self.manager
        skeleton = self.route_steps()  # builds each arrival batch's routing step (arrays, or a recycled IR)
        program = lower_router(manager) if self.lowered and self.route_steps is ArrayRouteSteps else None
        if program is not None:
            program.warm()  # its compile is not the routing's cost (the timing below)
        route_step_no = 1  # as the IR numbers it (engine steps count from 1 too)
        dumps = fc.dump_steps if isinstance(fc.dump_steps, str) else frozenset(fc.dump_steps)
        done = 0
        reported = 0
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
            f = instances.facts(live).T  # a row per fact (FACTS order)
            k = ids.size
            F = np.empty((len(rs.FLEET_LAYOUT), live.size), dtype=np.int64)  # the lowered router's layout
            F[rs.F_ID], F[rs.F_ROLE], F[rs.F_POSITION] = live, roles[live], position[live]
            F[rs.F_QUEUED], F[rs.F_RUNNING], F[rs.F_QUEUED_TOKENS], F[rs.F_FREE], F[rs.F_TOTAL] = f
            F[rs.F_DIGEST_BLOCKS] = [len(index.lru[i]) for i in live.tolist()]
            A = np.empty((len(rs.ARRIVAL_LAYOUT), k), dtype=np.int64)
            A[rs.A_ID], A[rs.A_PROMPT], A[rs.A_OUTPUT] = ids, input_len[ids], output_len[ids]
            A[rs.A_TTFT], A[rs.A_TBT] = ttft_ms, tbt_ms
            starts, ends = offsets[ids], offsets[ids + 1]
            counts = ends - starts
            p_id = np.repeat(ids, counts)
            p_hash = hashes[np.concatenate([np.arange(s, e) for s, e in zip(starts.tolist(), ends.tolist(),
                                                                            strict=True)])] \
                if k > 1 else hashes[starts[0]:ends[0]]
            digest = index.digest(np.unique(p_hash))
            keep = alive[digest[0]]
            pairs = (digest[0][keep], digest[1][keep])
            dumped = bool(dumps) and (dumps == "all" or route_step_no in dumps)
            if program is not None and not dumped:  # the pipeline lowered: one kernel call
                t1 = time.perf_counter()
                decisions = [(kind, cols) for kind, _, cols in program.decide(F, A, pairs, (p_id, p_hash))]
            else:
                fleet, arr = dict(zip(rs.FLEET_LAYOUT, F, strict=True)), dict(zip(rs.ARRIVAL_LAYOUT, A, strict=True))
                built = (build_route_step(route_step_no, round(at * 1e6), fleet, arr, pairs, (p_id, p_hash))
                         if dumped else skeleton.build(route_step_no, round(at * 1e6), fleet, arr, pairs,
                                                       (p_id, p_hash)))
                t1 = time.perf_counter()
                decisions = [(kind, {name: v.tolist() for name, v in cols.items()})
                             for kind, cols in self._decide(manager, built, dumped, route_step_no)]
            route_step_no += 1
            stats["pipeline_wall_s"] += time.perf_counter() - t1  # type: ignore[operator]
            decided: list[int] = []
            moves: list[tuple[bool, int, int, int, int]] = []  # (migrate, hash, src, dst, bytes)
            adds: dict[int, tuple[list[int], list[int]]] = {}  # instance -> (requests, max tokens), routing order
            for kind, cols in decisions:
                if kind is RouteOp:
                    rid, inst, dec, why = cols["id"], cols["instance"], cols["decode"], cols["why"]
                    decided += rid
                    for r, i, j, w in zip(rid, inst, dec, why, strict=True):
                        split = j != i and max_tokens[r] > 1
                        queue = adds.get(i)
                        if queue is None:
                            queue = adds[i] = ([], [])
                        queue[0].append(r)
                        queue[1].append(1 if split else max_tokens[r])
                        if split:
                            handoff[r] = (j, 0.0)
                            handing[i] += 1
                            expecting[j] += 1
                        instance_of[r] = i
                        routed_to[i] += 1
                        index.add(i, hashes[offsets[r]:offsets[r + 1]].tolist())
                        name = keyword(Why, w)
                        stats["why"][name] = stats["why"].get(name, 0) + 1  # type: ignore[index]
                elif kind is RejectOp:
                    rid, why = cols["id"], cols["why"]
                    decided += rid
                    for r, w in zip(rid, why, strict=True):
                        reject_why[r] = reqs.rejected[r] = f"router: {keyword(Why, w)}"
                        settled[r] = True
                        done += 1
                elif kind is ReplicateOp or kind is MigrateOp:
                    key = "replicas" if kind is ReplicateOp else "migrations"
                    stats[key] += len(cols["hash"])  # type: ignore[operator]
                    stats["replica_bytes"] += sum(cols["bytes"])  # type: ignore[operator]
                    lists = [cols[c] for c in ("hash", "src", "dst", "bytes")]
                    moves.extend((kind is MigrateOp, *move) for move in zip(*lists, strict=True))
                elif kind is TransferOp:
                    stats["transfers"] += len(cols["id"])  # type: ignore[operator]
                    for r, j, lat in zip(cols["id"], cols["dst"], cols["latency_us"], strict=True):
                        if r in handoff:
                            handoff[r] = (j, lat * 1e-6)
            left = ids[~np.isin(ids, decided)]
            for r in left.tolist():  # no pass decided it: no instance can serve it
                reject_why[r] = reqs.rejected[r] = "router: no_instance"
                settled[r] = True
                done += 1
            if moves and self.fleet_config.copy_kv:
                holders: dict[int, tuple[int, int]] = {}  # router hash -> (a request with it, its depth there)
                for r in ids.tolist():
                    for depth, h in enumerate(hashes[offsets[r]:offsets[r + 1]].tolist(), 1):
                        holders.setdefault(h, (r, depth))
                for move in moves:
                    send_copy(move, adds, at, holders)
            lost = instances.add({i: (np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
                                  for i, (a, b) in adds.items()}, at) if adds else []
            stats["route_steps"] += 1  # type: ignore[operator]
            stats["routed"] += k  # type: ignore[operator]
            stats["route_wall_s"] += time.perf_counter() - t0  # type: ignore[operator]
            for i in lost:
                lose(i, at)

        def send_copy(move: tuple[bool, int, int, int, int], adds: dict[int, tuple[list[int], list[int]]],
                      at: float, holders: dict[int, tuple[int, int]]) -> None:
            """Put a replicate / migrate decision on the link; the requests routed to its target
            that want the prefix wait for it there."""
            migrate, h, src, dst, nbytes = move
            holder = holders.get(h)
            why = ("unknown_prefix" if holder is None else "target_lost" if not alive[dst]
                   else "source_lost" if not alive[src] else "")
            if why:
                skipped(why)
                copies.append((at, at, src, dst, 0, int(migrate), why))
                return
            r, depth = holder  # type: ignore[misc]
            start = offsets[r]
            seconds = float(link.move_us(position[src:src + 1], position[dst:dst + 1], np.array([nbytes]))[0]) * 1e-6
            waiting: list[tuple[int, int]] = []
            queue = adds.get(dst)
            if queue is not None:
                keep: tuple[list[int], list[int]] = ([], [])
                for q, mt in zip(*queue, strict=True):
                    if h in hashes[offsets[q]:offsets[q + 1]]:  # its chain holds the prefix: it waits for it
                        waiting.append((q, mt))
                    else:
                        keep[0].append(q)
                        keep[1].append(mt)
                if keep[0]:
                    adds[dst] = keep
                else:
                    del adds[dst]
            cid = next(copy_no)
            pending[cid] = PendingCopy(src, dst, workload.block_ids[start:start + depth].copy(),
                                       hashes[start:start + depth].tolist(), migrate, at, waiting)
            heapq.heappush(landing, (at + seconds, cid))

        def skipped(why: str) -> None:
            table = stats["copy_skipped"]
            table[why] = table.get(why, 0) + 1  # type: ignore[union-attr, index, attr-defined]

        def land(cid: int, at: float) -> None:
            """A prefix copy reached its target: the target's pool takes what the source held."""
            pc = pending.pop(cid)
            copied = Copied(0, "target_lost" if not alive[pc.dst] else "source_lost" if not alive[pc.src] else "")
            if not copied.why:
                try:
                    copied = instances.copy_prefix(pc.src, pc.dst, pc.content, pc.migrate)
                except InstanceLost as e:
                    copied = Copied(0, "target_lost" if e.instance == pc.dst else "source_lost")
                    lose(e.instance, at)
            if copied.why:
                skipped(copied.why)
            else:
                stats["copied_blocks"] += copied.blocks  # type: ignore[operator]
                index.add(pc.dst, pc.chain)
                if copied.dropped:
                    index.forget(pc.src, pc.chain)
            copies.append((pc.decided_s, at, pc.src, pc.dst, copied.blocks, int(pc.migrate), copied.why))
            if pc.waiting and alive[pc.dst]:
                ids = np.array([q for q, _ in pc.waiting], dtype=np.int64)
                mts = np.array([mt for _, mt in pc.waiting], dtype=np.int64)
                for i in instances.add({pc.dst: (ids, mts)}, at):
                    lose(i, at)

        def lose(i: int, at: float, names: list[int] | None = None) -> None:
            """Instance i left the fleet at `at`: route again what it held (`names`, or, for an
            instance that stopped answering, every request routed there and not settled)."""
            if not alive[i]:
                return
            alive[i] = False
            next_t[i] = math.inf
            index.drop(i)
            for pc in pending.values():  # requests waiting for a copy to i never reached it
                if pc.dst == i and pc.waiting:
                    if names is not None:
                        names = sorted(set(names) | {q for q, _ in pc.waiting})
                    pc.waiting = []
            if names is None:
                stats["lost"].append(i)  # type: ignore[union-attr]
            restart(names if names is not None else np.flatnonzero((instance_of == i) & ~settled).tolist(), at)

        def restart(back: list[int], at: float) -> None:
            """Route `back` again at `at`: they restart elsewhere, without what their lost instance recorded."""
            for r in back:
                reqs.first_scheduled_s[r] = reqs.first_token_s[r] = reqs.last_token_s[r] = math.nan
                reqs.tokens_out[r] = 0
                reqs.prefix_hit_tokens[r] = -1
                if r in handoff:  # P/D: its prefill instance went; routing it again decides anew
                    j, _ = handoff.pop(r)
                    handing[instance_of[r]] -= 1
                    expecting[j] -= 1
            stats["rerouted"] += len(back)  # type: ignore[operator]
            if back:
                route(back, at)

        def settle(i: int, a: Advanced) -> None:
            nonlocal done
            finished = a.finished
            if handoff and finished:
                kept = []
                for r in finished:
                    if r in handoff:  # prefilled: not finished, its KV goes to the decode instance
                        j, seconds = handoff.pop(r)
                        handing[i] -= 1
                        t_done = float(reqs.finish_s[r])
                        reqs.finish_s[r] = math.nan
                        heapq.heappush(arriving, (t_done + seconds, r, j))
                        moved.append((t_done, t_done + seconds, r, i, j))
                    else:
                        kept.append(r)
                finished = kept
            if finished:
                finish_count[finished] += 1
                settled[finished] = True
            if a.rejected:
                settled[a.rejected] = True
                for r in a.rejected:
                    reject_why[r] = reqs.rejected[r]
                    if r in handoff:  # rejected by its prefill instance: no transfer will come
                        expecting[handoff.pop(r)[0]] -= 1
                        handing[i] -= 1
            done += len(a.rejected) + len(finished)

        def advance(which: np.ndarray, until: float, max_steps: int = -1) -> None:
            ran, lost = instances.advance(which.tolist(), until, max_steps)
            for i, a in ran.items():
                settle(i, a)
            for i in lost:
                lose(i, now)

        def advance_to(until: float) -> None:
            """Run every instance's steps that start before `until` (the next fleet event). With
            P/D handoffs pending, the prefill side runs first: the transfers its steps start may
            land on a decode instance before `until`, which then runs only up to the first of them."""
            ready = np.flatnonzero(next_t < until)
            if ready.size == 0:
                return
            if not handoff:
                advance(ready, until)
                return
            sources = ready[handing[ready] > 0]
            if (expecting[sources] > 0).any():  # an instance both hands off and receives: one step at a time
                i = int(np.argmin(next_t))
                advance(np.array([i]), until, 1)
                return
            advance(sources, until)
            until = min(until, arriving[0][0]) if arriving else until
            rest = ready[(handing[ready] == 0) & (next_t[ready] < until)]
            if rest.size:
                advance(rest, until)

        while True:
            t_arr = arrival_at[nxt] if nxt < n else math.inf
            t_rm = removals[ri].at_s if ri < len(removals) else math.inf
            t_kv = arriving[0][0] if arriving else math.inf
            t_cp = landing[0][0] if landing else math.inf
            t = min(t_arr, t_rm, t_kv, t_cp)
            if (next_t < t).any():
                advance_to(t)
                if progress is not None and done // progress_every > reported:
                    reported = done // progress_every
                    progress(done, n, float(now))
                continue  # the steps may have started transfers that land first
            if t == math.inf:
                break
            if t_kv == t:  # P/D: a request's KV reached its decode instance, which takes it from here
                _, r, j = heapq.heappop(arriving)
                expecting[j] -= 1
                if not alive[j]:  # its decode instance failed while the KV was on the way: start over
                    restart([r], t_kv)
                    continue
                instance_of[r] = j
                try:
                    instances.receive(j, r, max_tokens[r] - 1, t_kv)
                except InstanceLost:  # found dead now: it and everything it held (r too) go elsewhere
                    lose(j, t_kv)
                continue
            if t_cp == t:
                land(heapq.heappop(landing)[1], t_cp)
                continue
            if t_rm == t:
                removal = removals[ri]
                ri += 1
                now = max(now, t_rm)
                if removal.kill:
                    try:
                        instances.kill(removal.instance)
                    except InstanceLost:  # the backend saw it go (a Ray actor answers no more)
                        pass
                    lose(removal.instance, now)
                else:
                    lose(removal.instance, now, instances.abort(removal.instance))
                continue
            now = t_arr
            batch = []
            while nxt < n and arrival_at[nxt] <= now:
                batch.append(nxt)
                nxt += 1
            route(batch, now)
        unfinished = [i for i in range(m) if alive[i] and instances.busy[i]]
        if unfinished:
            stalled = (f"instance {unfinished[0]}: pipeline '{cfg.pipeline}' scheduled nothing with "
                       f"{instances.stalled(unfinished[0])}")
        wall = time.perf_counter() - wall_start
        if progress is not None:
            progress(done, n, now)
        steps = _merge(logs)
        metrics: dict[str, float] = {}
        result = SimResult(
            config_name=fc.name, config=cfg.recorded(),
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
        route_steps = int(stats["route_steps"])  # type: ignore[arg-type]
        routed = max(int(stats["routed"]), 1)  # type: ignore[arg-type]
        load = _load_series(logs)
        rejected = sorted(reqs.rejected)
        routed_at = np.where(finish_count > 0, instance_of, -1)
        fleet_info = {"router": fc.router, "pipeline": manager.spec, "instances": m,
                      "route_steps": route_steps, "routed": stats["routed"],
                      # the whole router (fleet state, IR, pipeline, queueing on the instances) and
                      # the routing step alone (IR built and run), per routed request
                      "route_us_per_request": float(stats["route_wall_s"]) * 1e6 / routed,  # type: ignore[arg-type]
                      "pipeline_us_per_request": float(stats["pipeline_wall_s"]) * 1e6 / routed,  # type: ignore[arg-type]
                      "replicas": stats["replicas"], "migrations": stats["migrations"],
                      "replica_bytes": stats["replica_bytes"], "transfers": stats["transfers"],
                      "copied_blocks": stats["copied_blocks"], "copy_skipped": stats["copy_skipped"],
                      "rerouted": stats["rerouted"], "lost": stats["lost"], "why": stats["why"],
                      "per_instance": per_instance,
                      "series": {**load,
                                 "rejected": [[round(float(arrivals[r]), 3), r, reqs.rejected[r]] for r in rejected],
                                 "transfers": [[round(a, 4), round(b, 4), r, i, j] for a, b, r, i, j in moved],
                                 "copies": [[round(a, 4), round(b, 4), s_, d, k, mig, why]
                                            for a, b, s_, d, k, mig, why in copies],
                                 "arrival_s": [round(float(x), 3) for x in arrivals.tolist()],
                                 "instance": routed_at.tolist()}}
        return FleetResult(result=result, fleet=fleet_info, instance_of=instance_of, finish_count=finish_count,
                           reject_why=reject_why)


LOAD_SERIES = (("load_running", "num_reqs", 2), ("load_queued", "num_waiting", 2), ("load_kv", "kv_usage", 4))


def _load_series(logs: Sequence[StepLog], bins: int = 200) -> dict[str, list[list[float]]]:
    """Each instance's load over time on one grid of at most `bins` bins over the run: the mean
    per bin of its batch size (`load_running`), waiting queue (`load_queued`) and KV use
    (`load_kv`, 0-1) over its steps starting in the bin; bins without a step are left out."""
    out: dict[str, list[list[float]]] = {"load_t_s": [], **{key: [] for key, _, _ in LOAD_SERIES}}
    starts = [log.column("start_s") for log in logs if log.size]
    lo = min((float(t[0]) for t in starts), default=0.0)
    hi = max((float(t[-1]) for t in starts), default=0.0)
    edges = np.linspace(lo, hi + 1e-9, bins + 1)
    mid = (edges[:-1] + edges[1:]) / 2
    for log in logs:
        if not log.size:
            for key in out:
                out[key].append([])
            continue
        t = log.column("start_s")
        which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
        count = np.bincount(which, minlength=bins)
        keep = count > 0
        out["load_t_s"].append(np.round(mid[keep], 3).tolist())
        for key, column, digits in LOAD_SERIES:
            mean = np.bincount(which, weights=log.column(column), minlength=bins)[keep] / count[keep]
            out[key].append(np.round(mean, digits).tolist())
    return out


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

