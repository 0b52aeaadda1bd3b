"""A routing pipeline lowered to one Numba kernel call per routing step.

Running a routing pipeline pass by pass over arrays (`PassManager.run_view` over `RouteArrays`)
costs 50-200 µs for one arrival on a 2-core machine, nearly all of it Python: each pass asks the
view for the pending arrivals, the load, the prefix hits, then appends its decision, a few
numpy calls each. Issue 17 asks <= 20 µs a request at 64 instances, the step's cost independent
of the requests in flight. Here the pipeline is compiled the way a compiler lowers a program:
each routing pass that has a lowered form (`lowered`, a Numba function beside its `run`, in the
pass's own file, written rule for rule after it) becomes an opcode with its options as numbers,
and the pipeline's own driver kernel, generated as source (`schedir.lowering.route_driver`),
calls those passes' kernels in order over the step's arrays, sharing the step's state
(`schedir.lowering.route_state`: pending arrivals, load, hits, the decision log). A process
compiles only its pipeline's passes (round-robin 14 s cold, mooncake 28 s, where one kernel
dispatching over all eight took 43 s; cached after).
The decisions come back as the `RouteArrays` the pass-by-pass run gives, in the same order and
with the same columns (tested over random steps for every router preset), so `to_module()`
still writes the step's IR for dumps. The fleet simulator calls `decide` instead: its facts
already form a matrix (a row per fact), so it hands the kernel two int64 matrices (one Numba
argument each, where 14 column arrays in tuples cost ~2 µs to dispatch) and reads the
decisions back as lists (it walks them in Python anyway); at batch 1 that is ~10 µs a request
of the 25 that `run` with its `RouteArrays` cost on this machine at 64 instances (mooncake).

A pipeline with a pass that has no lowered form is not lowered (`lower_router` says which); the
fleet simulator then runs it pass by pass.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import numpy as np

from schedir.dialects.cluster import RejectOp, ReplicateOp, RouteOp, TransferOp
from schedir.ir.route_arrays import ARRIVAL_SET, FLEET_SET, RouteArrays
from schedir.lowering import route_state as rs
from schedir.lowering.own_kernel import own_kernel
from schedir.lowering.route_driver import driver_for
from schedir.passes.pd_disaggregate import pd_disaggregate_lowered
from schedir.passes.replicate_hot_prefix import replicate_hot_prefix_lowered
from schedir.passes.route_cache_aware import cache_aware_lowered
from schedir.passes.route_cache_balance import cache_balance_lowered
from schedir.passes.route_least_load import least_load_lowered
from schedir.passes.route_round_robin import round_robin_lowered
from schedir.passes.slo_early_reject import slo_early_reject_lowered
from schedir.passes.topology_distance import topology_distance_lowered

# the opcode of each lowered form is its place here (the kernels a driver calls, by opcode)
LOWERED = (round_robin_lowered, least_load_lowered, cache_aware_lowered, cache_balance_lowered,
           slo_early_reject_lowered, replicate_hot_prefix_lowered, topology_distance_lowered,
           pd_disaggregate_lowered)
_I64 = np.dtype(np.int64)
_ND = np.ndarray
_EMPTY = np.zeros(0, dtype=np.int64)
_KINDS = {rs.ROUTE: RouteOp, rs.REJECT: RejectOp, rs.REPLICATE: ReplicateOp, rs.TRANSFER: TransferOp}
_OPERANDS = {rs.ROUTE: ARRIVAL_SET, rs.REJECT: ARRIVAL_SET, rs.REPLICATE: FLEET_SET}  # a transfer: its route
_NAMES = {rs.ROUTE: ("id", "instance", "decode", "hit_blocks", "why"), rs.REJECT: ("id", "why"),
          rs.REPLICATE: ("hash", "src", "dst", "bytes", "benefit_us"),
          rs.TRANSFER: ("id", "src", "dst", "bytes", "latency_us")}


Decision = tuple[type, object, dict[str, list[int]]]
_FLEET_ROWS, _ARRIVAL_ROWS = len(rs.FLEET_LAYOUT), len(rs.ARRIVAL_LAYOUT)


class NotLowered(ValueError):
    """A pipeline with a pass that has no lowered form (the message names it)."""


def _int64(v: object) -> np.ndarray:
    return v if type(v) is _ND and v.dtype is _I64 and v.flags.c_contiguous else np.ascontiguousarray(v, np.int64)


def _is_matrix(v: object, rows: int) -> bool:
    return type(v) is _ND and v.dtype is _I64 and v.ndim == 2 and v.shape[0] == rows and v.flags.c_contiguous


def _matrix(what: str, v: object, rows: int) -> np.ndarray:
    """`v` as the kernel's int64 matrix, or a ValueError saying what is wrong with it."""
    a = np.asarray(v)
    if a.ndim != 2 or a.shape[0] != rows or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
        layout = rs.FLEET_LAYOUT if what == "fleet" else rs.ARRIVAL_LAYOUT
        raise ValueError(f"the lowered router takes the {what} columns as an integer matrix of {rows} rows "
                         f"({', '.join(layout)}), got shape {a.shape} of {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.int64)


def _columns(what: str, columns: Mapping[str, object], layout: tuple[str, ...]) -> np.ndarray:
    try:
        picked = [columns[name] for name in layout]
    except KeyError as e:
        raise ValueError(f"the lowered router needs the {what} column '{e.args[0]}' (columns: "
                         f"{', '.join(columns)})") from None
    size = len(picked[0])
    out = np.empty((len(layout), size), dtype=np.int64)
    for i, (name, col) in enumerate(zip(layout, picked, strict=True)):
        if len(col) != size:
            raise ValueError(f"the {what} column '{name}' has {len(col)} rows, '{layout[0]}' has {size}")
        out[i] = col
    return out


def fleet_matrix(fleet: Mapping[str, object]) -> np.ndarray:
    """The fleet's columns as `RouteProgram.decide` takes them (rows in `FLEET_LAYOUT` order)."""
    return _columns("fleet", fleet, rs.FLEET_LAYOUT)


def arrival_matrix(arrivals: Mapping[str, object]) -> np.ndarray:
    """The arrivals' columns as `RouteProgram.decide` takes them (rows in `ARRIVAL_LAYOUT` order)."""
    return _columns("arrival", arrivals, rs.ARRIVAL_LAYOUT)


@attrs.frozen
class RouteProgram:
    """A routing pipeline as opcodes and options, run in one kernel call per step."""

    passes: tuple[str, ...]  # the pipeline's pass names, in order
    codes: np.ndarray  # int64 opcode per pass
    options: np.ndarray  # float64[passes, width]: each pass's `lowered_options()`
    facts: frozenset[str]  # the step's facts after the pipeline (as `run_view` leaves them)
    # the kernel a step runs: the pipeline's generated driver (`schedir.lowering.route_driver`)
    kernel: object = attrs.field(default=None, eq=False, repr=False)

    @classmethod
    def lower(cls, manager: object) -> RouteProgram:
        """Lower a routing `PassManager`; `NotLowered` names the first pass without a lowered form."""
        passes = list(manager.passes)  # type: ignore[attr-defined]
        if not passes or any(getattr(p, "over", "") != "cluster.route_step" for p in passes):
            raise NotLowered("only a routing pipeline (passes over cluster.route_step) lowers")
        facts = manager.check(frozenset())  # type: ignore[attr-defined]
        codes, rows = [], []
        for p in passes:
            kernel = own_kernel(type(p), ("run",), "lowered", LOWERED)
            if kernel is None:
                raise NotLowered(f"pass '{p.name}' has no lowered form (it runs pass by pass)")
            codes.append(next(i for i, k in enumerate(LOWERED) if k is kernel))
            rows.append(tuple(float(v) for v in p.lowered_options()))
        width = max([len(r) for r in rows] + [1])
        options = np.zeros((len(rows), width), dtype=np.float64)
        for i, r in enumerate(rows):
            options[i, :len(r)] = r
        return cls(tuple(p.name for p in passes), np.asarray(codes, dtype=np.int64), options, facts,
                   driver_for([LOWERED[c] for c in codes]))

    def run(self, step: int, now_us: int, fleet: Mapping[str, np.ndarray], arrivals: Mapping[str, np.ndarray],
            digest: tuple[np.ndarray, np.ndarray] | None = None,
            prefix: tuple[np.ndarray, np.ndarray] | None = None) -> RouteArrays:
        """The step's decisions, as `PassManager.run_view` over `RouteArrays(...)` gives them."""
        out = self.decide(fleet_matrix(fleet), arrival_matrix(arrivals), digest, prefix)
        records = [(kind, operand, {n: np.asarray(v, dtype=np.int64) for n, v in cols.items()})
                   for kind, operand, cols in out]
        d = None if digest is None else (np.asarray(digest[0], np.int64), np.asarray(digest[1], np.int64))
        p = None if prefix is None else (np.asarray(prefix[0], np.int64), np.asarray(prefix[1], np.int64))
        return RouteArrays.decided(step, now_us, fleet, arrivals, d, p, records, self.facts)

    def decide(self, fleet: np.ndarray, arrivals: np.ndarray, digest: tuple[np.ndarray, np.ndarray] | None = None,
               prefix: tuple[np.ndarray, np.ndarray] | None = None) -> list[Decision]:
        """The step's decisions, in the order the passes made them: (op kind, operand, columns as
        lists), the operand as `RouteArrays.records` names it. The fleet's and the arrivals'
        columns come as int64 matrices, one row per name of `FLEET_LAYOUT` / `ARRIVAL_LAYOUT`
        (`fleet_matrix`, `arrival_matrix`): the fleet simulator keeps its facts that way, and the
        kernel takes two arrays where a tuple of 14 columns cost ~2 µs of Numba's dispatch."""
        F = fleet if _is_matrix(fleet, _FLEET_ROWS) else _matrix("fleet", fleet, _FLEET_ROWS)
        A = arrivals if _is_matrix(arrivals, _ARRIVAL_ROWS) else _matrix("arrival", arrivals, _ARRIVAL_ROWS)
        d_ids, d_hash = (_EMPTY, _EMPTY) if digest is None else (_int64(digest[0]), _int64(digest[1]))
        p_ids, p_hash = (_EMPTY, _EMPTY) if prefix is None else (_int64(prefix[0]), _int64(prefix[1]))
        log = self.kernel(F, A, p_ids, p_hash, d_ids, d_hash, prefix is not None, self.options).tolist()
        head = log[0]
        at = 1 + head[0]
        out = []
        for j in range(1, at):  # the records: (kind, first col, end col, operand)
            kind = head[j]
            start, end = at + log[1][j], at + log[2][j]
            names = _NAMES[kind]
            out.append((_KINDS[kind], _OPERANDS.get(kind, log[3][j]),
                        {name: log[i][start:end] for i, name in enumerate(names)}))
        return out

    def warm(self) -> None:
        """Compile (or load from Numba's cache) the pipeline's driver now, over an empty step of the
        column types every step has: a caller timing its routing then times routing, not the
        first call's compile (28 s for mooncake's passes after a kernel edit)."""
        self.decide(np.zeros((_FLEET_ROWS, 0), np.int64), np.zeros((_ARRIVAL_ROWS, 0), np.int64),
                    (_EMPTY, _EMPTY), (_EMPTY, _EMPTY))


def lower_router(manager: object) -> RouteProgram | None:
    """The pipeline lowered, or None when a pass has no lowered form."""
    try:
        return RouteProgram.lower(manager)
    except NotLowered:
        return None
