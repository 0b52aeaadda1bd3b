"""`RouteStep`: a routing pass's view of one `cluster.route_step`: read the fleet and the
arrivals, append decisions.

The counterpart of `Step` for the `cluster` dialect. A routing step holds a fixed handful
of ops (fleet, arrivals, digest, prefix, then decisions), so every lookup is a loop over
them and per-request work is numpy over columns. The *pending* arrivals are those no
`cluster.route` or `cluster.reject` has decided yet: passes run in order, each deciding
some of what is left (an early-reject pass before a routing pass, say).

`build_route_step` is the builder the fleet simulator (and the tests) use: the fleet's
columns, the arrivals' columns and the (id, hash) pairs in, a module out.
"""

from __future__ import annotations

from collections.abc import Mapping

import numba as nb
import numpy as np
from xdsl.dialects.builtin import ArrayAttr, ModuleOp, StringAttr
from xdsl.ir import Block, Operation, Region, SSAValue

from schedir.dialects.cluster import (
    IDS,
    ArrivalsOp,
    DigestOp,
    FleetOp,
    MigrateOp,
    PrefixOp,
    RejectOp,
    ReplicateOp,
    RouteOp,
    RouteStepOp,
    TransferOp,
    YieldOp,
)
from schedir.dialects.codes import Role, Why
from schedir.dialects.columns import ColumnsAttr
from schedir.dialects.sched import i64_attr
from schedir.ir.fastop import append_operand, clear_decisions, insert_before, new_op, region_of
from schedir.ir.step import LiveFacts

EMPTY = np.zeros(0, dtype=np.int64)


@nb.njit(cache=True)
def lower_bound(ordered: np.ndarray, value: int) -> int:
    """The first index of `ordered` (ascending) not below `value`: `np.searchsorted`'s answer,
    without its per-call cost inside a kernel (~30 ns a call there, a routing step makes dozens)."""
    lo, hi = 0, ordered.size
    while lo < hi:
        mid = (lo + hi) >> 1
        if ordered[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


@nb.njit(cache=True)
def stable_order(values: np.ndarray) -> np.ndarray:
    """`np.argsort(values, kind="mergesort")`; by insertion for the few values of a routing step
    (Numba's sorts cost ~350 ns on 20 values, insertion ~40)."""
    n = values.size
    if n > 32:
        return np.argsort(values, kind="mergesort")
    order = np.arange(n)
    for i in range(1, n):
        j = i
        at = order[i]
        v = values[at]
        while j > 0 and values[order[j - 1]] > v:
            order[j] = order[j - 1]
            j -= 1
        order[j] = at
    return order


@nb.njit(cache=True)
def _rows_of(source: np.ndarray, query: np.ndarray) -> np.ndarray:
    out = np.full(query.size, -1, dtype=np.int64)
    if source.size == 0:
        return out
    order = stable_order(source)
    ordered = source[order]
    for i in range(query.size):
        j = lower_bound(ordered, query[i])
        if j < ordered.size and ordered[j] == query[i]:
            out[i] = order[j]
    return out


def positions(source: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Index of each `query` id in `source` (unique ids; -1 where absent): `schedir.ir.step.positions`
    for a routing step's few ids, in one Numba call (~1 µs where the numpy version costs ~7)."""
    return _rows_of(np.asarray(source, dtype=np.int64), np.asarray(query, dtype=np.int64))
_FACTS: dict[frozenset[str], ArrayAttr[StringAttr]] = {}


def _facts_attr(facts: frozenset[str]) -> ArrayAttr[StringAttr]:
    attr = _FACTS.get(facts)
    if attr is None:
        attr = _FACTS[facts] = ArrayAttr([StringAttr(f) for f in sorted(facts)])
    return attr


class _RouteFacts:
    """What `PassManager._check_queues` asks of a step's facts (its index only)."""

    __slots__ = ("step",)

    def __init__(self, step: int) -> None:
        self.step = step


class RouteView:
    """What a routing pass reads of a routing step and the decisions it appends: the fleet's and
    the arrivals' columns, the digest and prefix pairs, the decisions so far. Two backings share
    it: `RouteStep` over a `cluster.route_step` op (the IR: dumps, `schedir opt`, verification),
    and `schedir.ir.route_arrays.RouteArrays` over plain arrays (the fleet simulator's routing,
    materialized as the same IR on demand). Subclasses give the backing's accessors; the rules
    (load, pending, prefix hits, the decisions' columns) live here once."""

    _hits: np.ndarray | None
    _hits_key: int
    _chains: tuple[np.ndarray, np.ndarray] | None

    # ------------------------------------------------------------ the backing (subclasses)
    @property
    def num_instances(self) -> int:
        raise NotImplementedError

    def fleet_col(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def has_fleet_col(self, name: str) -> bool:
        raise NotImplementedError

    def arrival_col(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def num_arrivals(self) -> int:
        raise NotImplementedError

    def prefix_pairs(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(request id, hash) pairs of the arrivals' chains, in chain order; None: no prefix given."""
        raise NotImplementedError

    def digest_pairs(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(instance id, hash) pairs the instances advertise; None: no digest given."""
        raise NotImplementedError

    def _decided_ids(self) -> list[np.ndarray]:
        """The ids of every `cluster.route` and `cluster.reject` so far."""
        raise NotImplementedError

    def _route_columns(self) -> list[Mapping[str, np.ndarray]]:
        """The columns of every `cluster.route` so far, in order."""
        raise NotImplementedError

    def _moves(self) -> list[tuple[type, Mapping[str, np.ndarray]]]:
        """Every `cluster.replicate` / `cluster.migrate` so far: (kind, columns)."""
        raise NotImplementedError

    def _record(self, kind: type[Operation], operand: object, cols: Mapping[str, np.ndarray],
                results: int = 0) -> object:
        """Append a decision over `operand` (the fleet, the arrivals or a route's result); returns
        its result when it has one."""
        raise NotImplementedError

    def _fleet_set(self) -> object:
        raise NotImplementedError

    def _arrival_set(self) -> object:
        raise NotImplementedError

    # ------------------------------------------------------------ the fleet
    def fleet_col_or(self, name: str, default: int) -> np.ndarray:
        return self.fleet_col(name) if self.has_fleet_col(name) else np.full(self.num_instances, default,
                                                                               dtype=np.int64)

    def load(self) -> np.ndarray:
        """Requests queued and running per instance, plus those routed to it so far this step."""
        load = self.fleet_col("queued") + self.fleet_col("running")
        ids, inst, _ = self.routed()
        if ids.size:
            at = positions(self.fleet_col("id"), inst)
            load = load + np.bincount(at, minlength=load.size)
        return load

    def serves_whole(self) -> np.ndarray:
        """Instances that serve prefill and decode (role `both`)."""
        return self.fleet_col("role") == int(Role.BOTH)

    def digest_ids(self) -> np.ndarray:
        """The instance of every digest pair (empty when no digest is given)."""
        pairs = self.digest_pairs()
        return EMPTY if pairs is None else pairs[0]

    # ------------------------------------------------------------ the arrivals
    def pending(self) -> np.ndarray:
        """Rows (into the arrivals' columns) of requests no decision covers yet, in arrival order."""
        n = self.num_arrivals()
        if n == 0:
            return EMPTY
        decided = self._decided_ids()
        if not decided:
            return np.arange(n, dtype=np.int64)
        done = np.isin(self.arrival_col("id"), decided[0] if len(decided) == 1 else np.concatenate(decided))
        return np.flatnonzero(~done)

    def routed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, instance, decode) over every `cluster.route` so far."""
        routes = self._route_columns()
        if not routes:
            return EMPTY, EMPTY, EMPTY
        if len(routes) == 1:
            cols = routes[0]
            return cols["id"], cols["instance"], cols["decode"]
        return tuple(np.concatenate([c[name] for c in routes]) for name in ("id", "instance", "decode"))  # type: ignore

    def routed_whys(self) -> np.ndarray:
        """The `why` of every routed request, in `routed()` order."""
        routes = self._route_columns()
        if not routes:
            return EMPTY
        return routes[0]["why"] if len(routes) == 1 else np.concatenate([c["why"] for c in routes])

    def has_prefix(self) -> bool:
        """Whether the step carries the arrivals' prefix chains (`cluster.prefix`)."""
        return self.prefix_pairs() is not None

    def prefix_blocks(self) -> np.ndarray:
        """Prefix block hashes per arrival (how many `cluster.prefix` pairs each has)."""
        n = self.num_arrivals()
        pairs = self.prefix_pairs()
        if pairs is None or n == 0 or len(pairs[0]) == 0:
            return np.zeros(n, dtype=np.int64)
        rows = positions(self.arrival_col("id"), pairs[0])
        return np.bincount(rows, minlength=n).astype(np.int64)

    def chains(self) -> tuple[np.ndarray, np.ndarray]:
        """(hashes in chain order grouped by arrival row, start of each row's chain in it)."""
        if self._chains is None:
            n = self.num_arrivals()
            pairs = self.prefix_pairs()
            if pairs is None or n == 0:
                self._chains = (EMPTY, np.zeros(n, dtype=np.int64))
            else:
                self._chains = _chains_by_id(n, self.arrival_col("id"), pairs[0], pairs[1])
        return self._chains

    def prefix_hits(self) -> np.ndarray:
        """Leading prefix blocks each instance holds, per arrival: int64[arrivals, instances].

        An instance holds block k of a request's chain if the digest lists its hash (chained
        hashes: block k's hash names the whole prefix up to k, so "leading" is the first miss),
        or if a `cluster.replicate` / `cluster.migrate` earlier in this step moved the chain
        up to that hash there (its source keeps it on a replicate, loses it on a migrate)."""
        moves = self._moves()
        key = len(moves)
        if self._hits is not None and self._hits_key == key:
            return self._hits
        n = self.num_arrivals()
        m = self.num_instances
        pairs = self.prefix_pairs()
        if not (n and m and pairs is not None and len(pairs[0])):
            hits = np.zeros((n, m), dtype=np.int64)
        elif not moves:  # the usual step: one kernel call, the id lookups inside
            digest = self.digest_pairs()
            d_ids, d_hash = (EMPTY, EMPTY) if digest is None else digest
            hits = _prefix_hits_by_id(n, m, self.arrival_col("id"), pairs[0], pairs[1], self.fleet_col("id"),
                                      d_ids, d_hash)
        else:
            fleet_ids = self.fleet_col("id")
            p_rows = positions(self.arrival_col("id"), pairs[0])
            p_hash = pairs[1]
            digest = self.digest_pairs()
            if digest is not None and len(digest[0]):
                d_col = positions(fleet_ids, digest[0])
                d_hash = digest[1]
            else:
                d_col, d_hash = EMPTY, EMPTY
            if moves:  # chains moved this step: their target holds every block up to the hash
                extra_col, extra_hash = [d_col], [d_hash]
                for _, cols in moves:
                    for h, dst in zip(cols["hash"].tolist(), cols["dst"].tolist(), strict=True):
                        chain = _chain_to(p_rows, p_hash, h)
                        extra_col.append(np.full(chain.size, positions(fleet_ids, np.array([dst]))[0], np.int64))
                        extra_hash.append(chain)
                d_col, d_hash = np.concatenate(extra_col), np.concatenate(extra_hash)
                migrated = [(h, s) for kind, cols in moves if kind is MigrateOp
                            for h, s in zip(cols["hash"].tolist(), cols["src"].tolist(), strict=True)]
                if migrated:  # a migrated chain leaves its source
                    src_row = positions(fleet_ids, np.array([s for _, s in migrated], np.int64))
                    drop = np.zeros(d_col.size, dtype=np.bool_)
                    for (h, _), row in zip(migrated, src_row.tolist(), strict=True):
                        drop |= (d_col == row) & np.isin(d_hash, _chain_to(p_rows, p_hash, h))
                    d_col, d_hash = d_col[~drop], d_hash[~drop]
            hits = prefix_hit_kernel(n, m, p_rows, p_hash, d_col, d_hash)
        self._hits, self._hits_key = hits, key
        return hits

    # ------------------------------------------------------------ appending decisions
    def route(self, rows: np.ndarray, instance: np.ndarray, why: np.ndarray | int,
              decode: np.ndarray | None = None, hit_blocks: np.ndarray | None = None) -> object:
        """Route arrivals `rows` to fleet rows `instance` (decode on `decode`, default the same)."""
        if rows.size == 0:
            return None
        fleet_ids = self.fleet_col("id")
        inst = fleet_ids[instance]
        dec = inst if decode is None else fleet_ids[decode]
        if hit_blocks is None:
            hit_blocks = (self.prefix_hits()[rows, instance] if self.has_prefix()
                          else np.zeros(rows.size, np.int64))
        whys = (np.full(rows.size, int(why), dtype=np.int64) if isinstance(why, (int, np.integer))
                else np.asarray(why, np.int64))
        return self._record(RouteOp, self._arrival_set(),
                            {"id": self.arrival_col("id")[rows], "instance": inst, "decode": dec,
                             "hit_blocks": np.asarray(hit_blocks, np.int64), "why": whys}, results=1)

    def reject(self, rows: np.ndarray, why: Why) -> None:
        if rows.size:
            self._record(RejectOp, self._arrival_set(),
                         {"id": self.arrival_col("id")[rows], "why": np.full(rows.size, int(why), np.int64)})

    def transfer(self, routed: object, ids: np.ndarray, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray,
                 latency_us: np.ndarray) -> None:
        """KV from prefill to decode instance (instance ids, not rows)."""
        if ids.size:
            self._record(TransferOp, routed, {"id": ids, "src": src, "dst": dst, "bytes": nbytes,
                                              "latency_us": latency_us})

    def move_prefix(self, kind: type[ReplicateOp] | type[MigrateOp], hashes: np.ndarray, src: np.ndarray,
                    dst: np.ndarray, nbytes: np.ndarray, benefit_us: np.ndarray) -> None:
        """A `cluster.replicate` / `cluster.migrate` of chains ending at `hashes` (instance ids)."""
        if hashes.size:
            self._record(kind, self._fleet_set(),
                         {"hash": hashes, "src": src, "dst": dst, "bytes": nbytes, "benefit_us": benefit_us})


class RouteStep(RouteView, LiveFacts):
    """Read and extend one `cluster.route_step` op."""

    def __init__(self, op: RouteStepOp) -> None:
        self.op = op
        self.block: Block = op.body.block
        self.fleet: FleetOp | None = None
        self.arrivals: ArrivalsOp | None = None
        self.digest: DigestOp | None = None
        self.prefix: PrefixOp | None = None
        for child in self._ops():
            kind = type(child)
            if kind is FleetOp:
                self.fleet = child  # type: ignore[assignment]
            elif kind is ArrivalsOp:
                self.arrivals = child  # type: ignore[assignment]
            elif kind is DigestOp:
                self.digest = child  # type: ignore[assignment]
            elif kind is PrefixOp:
                self.prefix = child  # type: ignore[assignment]
        if self.fleet is None:
            raise ValueError("a cluster.route_step needs a cluster.fleet")
        self._fact_set: frozenset[str] | None = None
        self._hits = None
        self._hits_key = -1
        self._chains = None

    def _ops(self) -> list[Operation]:
        """The step's ops in order (a linked-list walk: xDSL's `block.ops` iterator costs more)."""
        out = []
        op = self.block.first_op
        while op is not None:
            out.append(op)
            op = op._next_op
        return out

    def _decisions(self, *kinds: type[Operation]) -> list[Operation]:
        return [op for op in self._ops() if type(op) in kinds]

    # ------------------------------------------------------------ facts (the pass manager's protocol)
    @property
    def facts(self) -> _RouteFacts:
        return _RouteFacts(self.op.step.value.data)

    @property
    def fact_set(self) -> frozenset[str]:
        if self._fact_set is None:
            self._fact_set = frozenset(f.data for f in self.op.facts.data)
        return self._fact_set

    def write_facts(self) -> None:
        if self._fact_set is not None:
            self.op.properties["facts"] = _facts_attr(self._fact_set)

    def queues(self) -> list[Operation]:
        return []  # a routing step has no request queues (no queue options apply)

    @property
    def now_us(self) -> int:
        return self.op.now_us.value.data

    # ------------------------------------------------------------ the backing: the step's ops
    @property
    def num_instances(self) -> int:
        return len(self.fleet)  # type: ignore[arg-type]

    def fleet_col(self, name: str) -> np.ndarray:
        return self.fleet.col(name)  # type: ignore[union-attr]

    def has_fleet_col(self, name: str) -> bool:
        return self.fleet.columns.has(name)  # type: ignore[union-attr]

    def arrival_col(self, name: str) -> np.ndarray:
        if self.arrivals is None:
            return EMPTY
        return self.arrivals.col(name)

    def num_arrivals(self) -> int:
        return len(self.arrivals) if self.arrivals is not None else 0

    def prefix_pairs(self) -> tuple[np.ndarray, np.ndarray] | None:
        if self.prefix is None:
            return None
        cols = self.prefix.columns
        return cols.get("id"), cols.get("hash")

    def digest_pairs(self) -> tuple[np.ndarray, np.ndarray] | None:
        if self.digest is None:
            return None
        cols = self.digest.columns
        return cols.get("id"), cols.get("hash")

    def _decided_ids(self) -> list[np.ndarray]:
        return [op.ids for op in self._decisions(RouteOp, RejectOp)]  # type: ignore[attr-defined]

    def _route_columns(self) -> list[Mapping[str, np.ndarray]]:
        return [_OpColumns(op) for op in self._decisions(RouteOp)]

    def _moves(self) -> list[tuple[type, Mapping[str, np.ndarray]]]:
        return [(type(op), _OpColumns(op)) for op in self._decisions(ReplicateOp, MigrateOp)]

    def _fleet_set(self) -> SSAValue:
        return self.fleet.results[0]  # type: ignore[union-attr]

    def _arrival_set(self) -> SSAValue:
        return self.arrivals.results[0]  # type: ignore[union-attr]

    @property
    def terminator(self) -> YieldOp:
        last = self.block.last_op
        if type(last) is not YieldOp:
            raise ValueError("a cluster.route_step block must end with cluster.yield")
        return last  # type: ignore[return-value]

    def _record(self, kind: type[Operation], operand: object, cols: Mapping[str, np.ndarray],
                results: int = 0) -> SSAValue | None:
        op = new_op(kind, (operand,), {"columns": ColumnsAttr.of(cols)}, (IDS,) * results)
        insert_before(self.block, op, self.terminator)
        if kind is RouteOp:
            append_operand(self.terminator, op.results[0])
        return op.results[0] if results else None

    def decisions(self) -> list[tuple[type, Mapping[str, np.ndarray]]]:
        """Every decision of the step in order: (op kind, its columns)."""
        return [(type(op), _OpColumns(op)) for op in self._decisions(RouteOp, RejectOp, ReplicateOp, MigrateOp,
                                                                      TransferOp)]


class _OpColumns(Mapping):
    """A decision op's columns as a read-only mapping (name -> int64 array)."""

    __slots__ = ("op",)

    def __init__(self, op: Operation) -> None:
        self.op = op

    def __getitem__(self, name: str) -> np.ndarray:
        return self.op.col(name)  # type: ignore[attr-defined]

    def __iter__(self):  # noqa: ANN204
        return iter(self.op.columns.names)  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self.op.columns.names)  # type: ignore[attr-defined]


def _chain_to(p_rows: np.ndarray, p_hash: np.ndarray, h: int) -> np.ndarray:
    """The hashes of the chain ending at `h`, from the first request whose prefix holds it."""
    at = np.flatnonzero(p_hash == h)
    if at.size == 0:
        return np.array([h], dtype=np.int64)
    i = int(at[0])
    mine = np.flatnonzero(p_rows == p_rows[i])
    return p_hash[mine[mine <= i]]


@nb.njit(cache=True)
def prefix_hit_kernel(n: int, m: int, p_rows: np.ndarray, p_hash: np.ndarray, d_col: np.ndarray,
                      d_hash: np.ndarray) -> np.ndarray:
    """Leading blocks of each request's chain (pairs `p_rows`, `p_hash`, in chain order per
    request) that each instance column holds (pairs `d_col`, `d_hash`): int64[n, m]."""
    hits = np.zeros((n, m), dtype=np.int64)
    order = stable_order(d_hash)
    sorted_hash = d_hash[order]
    seen = np.zeros(n, dtype=np.int64)  # blocks of each request walked so far
    dead = np.zeros(n, dtype=np.bool_)  # a request whose every instance missed already
    # an instance still holds every block of request r so far where hits[r, c] == seen[r]: only
    # the block's holders are visited (O(chain x holders), not chain x instances)
    for i in range(p_rows.size):
        r = p_rows[i]
        if r < 0 or dead[r]:
            continue
        k = seen[r]
        seen[r] = k + 1
        h = p_hash[i]
        any_alive = False
        j = lower_bound(sorted_hash, h)
        while j < sorted_hash.size and sorted_hash[j] == h:
            c = d_col[order[j]]
            if c >= 0 and hits[r, c] == k:
                hits[r, c] = k + 1
                any_alive = True
            j += 1
        if not any_alive:
            dead[r] = True
    return hits


@nb.njit(cache=True)
def _prefix_hits_by_id(n: int, m: int, arrival_ids: np.ndarray, p_ids: np.ndarray, p_hash: np.ndarray,
                       fleet_ids: np.ndarray, d_ids: np.ndarray, d_hash: np.ndarray) -> np.ndarray:
    """`prefix_hit_kernel` over the pairs' ids (rows looked up here: one call, not three)."""
    return prefix_hit_kernel(n, m, _rows_of(arrival_ids, p_ids), p_hash, _rows_of(fleet_ids, d_ids), d_hash)


@nb.njit(cache=True)
def chains_by_row(n: int, rows: np.ndarray, p_hash: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs' hashes grouped by arrival row (`rows`; stable: chain order kept) and the start
    of each row's chain."""
    ordered = True
    for i in range(1, rows.size):
        if rows[i] < rows[i - 1]:
            ordered = False
            break
    if ordered:
        return p_hash, _chain_starts(n, rows)
    order = stable_order(rows)
    return p_hash[order], _chain_starts(n, rows[order])


@nb.njit(cache=True)
def _chain_starts(n: int, rows: np.ndarray) -> np.ndarray:
    """Where each row's chain starts among pairs grouped by row (`rows` ascending)."""
    starts = np.zeros(n, dtype=np.int64)
    for i in range(rows.size):
        if rows[i] + 1 < n:
            starts[rows[i] + 1] += 1
    for r in range(1, n):
        starts[r] += starts[r - 1]
    return starts


@nb.njit(cache=True)
def _chains_by_id(n: int, arrival_ids: np.ndarray, p_ids: np.ndarray,
                  p_hash: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`RouteView.chains` in one call (the rows looked up here)."""
    return chains_by_row(n, _rows_of(arrival_ids, p_ids), p_hash)


def route_steps_of(module: Operation) -> list[RouteStepOp]:
    """The `cluster.route_step` ops at the top of a module."""
    return [op for op in module.regions[0].block.ops if isinstance(op, RouteStepOp)]


FLEET_COLUMNS = FleetOp.REQUIRED_COLUMNS
ARRIVAL_COLUMNS = ArrivalsOp.REQUIRED_COLUMNS


def build_route_step(step: int, now_us: int, fleet: Mapping[str, np.ndarray], arrivals: Mapping[str, np.ndarray],
                     digest: tuple[np.ndarray, np.ndarray] | None = None,
                     prefix: tuple[np.ndarray, np.ndarray] | None = None) -> ModuleOp:
    """A module holding one routing step (no decisions yet): the fleet's and the arrivals'
    columns, and the (instance, hash) / (request, hash) pairs when given."""
    fleet_op = new_op(FleetOp, (), {"columns": ColumnsAttr.of(fleet)}, (IDS,))
    arrivals_op = new_op(ArrivalsOp, (), {"columns": ColumnsAttr.of(arrivals)}, (IDS,))
    ops: list[Operation] = [fleet_op, arrivals_op]
    if digest is not None:
        ops.append(new_op(DigestOp, (fleet_op.results[0],), {"columns": ColumnsAttr.of(
            {"id": digest[0], "hash": digest[1]})}))
    if prefix is not None:
        ops.append(new_op(PrefixOp, (arrivals_op.results[0],), {"columns": ColumnsAttr.of(
            {"id": prefix[0], "hash": prefix[1]})}))
    ops.append(new_op(YieldOp, (), {}))
    region: Region = region_of(ops)
    step_op = new_op(RouteStepOp, (), {"step": i64_attr(step), "now_us": i64_attr(now_us),
                                       "facts": _facts_attr(frozenset())}, (), (region,))
    return new_op(ModuleOp, (), {}, (), (region_of((step_op,)),))


class RecycledRouteStep:
    """Routing steps that reuse one IR skeleton: the fleet simulator's hot path.

    `build_route_step` creates a module, a step, four column ops and a terminator per
    routing step, and the fleet then frees them: ~25 µs build and ~10 µs teardown, most of a
    single-arrival step. This keeps the skeleton of the last step and, for the next one,
    unlinks the decisions its passes appended and writes the new step number, time and
    columns into it. The IR a pipeline sees is the one `build_route_step` gives (tested:
    same text after the pipeline); the previous step's decisions are gone after `build`,
    so read them first. A skeleton a pass rewrote (or another op layout) is rebuilt.
    """

    def __init__(self) -> None:
        self.module: ModuleOp | None = None
        self.base: tuple[Operation, ...] = ()

    def build(self, step: int, now_us: int, fleet: Mapping[str, np.ndarray], arrivals: Mapping[str, np.ndarray],
              digest: tuple[np.ndarray, np.ndarray] | None = None,
              prefix: tuple[np.ndarray, np.ndarray] | None = None) -> ModuleOp:
        """`build_route_step(...)`'s module, refilled in place when the skeleton allows."""
        if self.module is not None and self._clear((digest is not None, prefix is not None)):
            fleet_op, arrivals_op = self.base[0], self.base[1]
            fleet_op.properties = {"columns": ColumnsAttr.of(fleet)}
            arrivals_op.properties = {"columns": ColumnsAttr.of(arrivals)}
            k = 2
            if digest is not None:
                self.base[k].properties = {"columns": ColumnsAttr.of({"id": digest[0], "hash": digest[1]})}
                k += 1
            if prefix is not None:
                self.base[k].properties = {"columns": ColumnsAttr.of({"id": prefix[0], "hash": prefix[1]})}
            self.step_op.properties = {"step": i64_attr(step), "now_us": i64_attr(now_us),
                                       "facts": _facts_attr(frozenset())}
            self.step_op.attributes = {}
            return self.module
        module = self.module = build_route_step(step, now_us, fleet, arrivals, digest, prefix)
        self.step_op: RouteStepOp = module.regions[0].block.first_op  # type: ignore[assignment]
        self.block = self.step_op.regions[0].block
        ops = []
        op = self.block.first_op
        while op is not None:
            ops.append(op)
            op = op._next_op
        self.base = tuple(ops[:-1])
        self.terminator: YieldOp = ops[-1]  # type: ignore[assignment]
        self.shape = (digest is not None, prefix is not None)
        return module

    def _clear(self, shape: tuple[bool, bool]) -> bool:
        """Unlink the last step's decisions; False when the skeleton is not the one built."""
        if shape != self.shape or self.module is None or self.step_op.parent is not self.module.regions[0].block:
            return False
        if not clear_decisions(self.block, self.base, self.terminator):
            return False
        for base in self.base:
            for use in base._operand_uses:
                use._prev_use = use._next_use = None
                base._operands[use.index].add_use(use)
        return True
