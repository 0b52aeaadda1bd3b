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
still writes the step's IR for dumps.

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


class NotLowered(ValueError):
    """A pipeline with a pass that has no lowered form (the message names it)."""


def _int64(v: object) -> np.ndarray:
    return np.ascontiguousarray(v, dtype=np.int64)


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
        try:  # the columns as the kernel takes them: int64, contiguous (copied only where not)
            F = tuple([v if type(v) is _ND and v.dtype is _I64 and v.flags.c_contiguous else _int64(v)
                       for v in map(fleet.__getitem__, rs.FLEET_LAYOUT)])
            A = tuple([v if type(v) is _ND and v.dtype is _I64 and v.flags.c_contiguous else _int64(v)
                       for v in map(arrivals.__getitem__, rs.ARRIVAL_LAYOUT)])
        except KeyError as e:
            missing = e.args[0]
            where = "fleet" if missing in rs.FLEET_LAYOUT and missing not in fleet else "arrival"
            raise ValueError(f"the lowered router needs the {where} column '{missing}' (columns: "
                             f"{', '.join(fleet if where == 'fleet' else arrivals)})") from None
        d_ids, d_hash = (_EMPTY, _EMPTY) if digest is None else (np.asarray(digest[0], np.int64),
                                                                 np.asarray(digest[1], np.int64))
        p_ids, p_hash = (_EMPTY, _EMPTY) if prefix is None else (np.asarray(prefix[0], np.int64),
                                                                 np.asarray(prefix[1], np.int64))
        log = self.kernel(F, A, p_ids, p_hash, d_ids, d_hash, prefix is not None, self.options)
        out = []
        r = int(log[0, 0])
        at = 1 + r
        for kind, start, end, operand in log[:4, 1:at].T.tolist():
            names = _NAMES[kind]
            out.append((_KINDS[kind], _OPERANDS.get(kind, operand),
                        dict(zip(names, log[:len(names), at + start:at + end], strict=True))))
        return RouteArrays.decided(step, now_us, fleet, arrivals, (d_ids, d_hash) if digest is not None else None,
                                   (p_ids, p_hash) if prefix is not None else None, out, self.facts)


    def warm(self) -> None:
        """Compile (or load from Numba's cache) the pipeline's driver now, over an empty step of the
        column types every step has: a caller timing its routing then times routing, not the
        first call's compile (28 s for mooncake's passes after a kernel edit)."""
        fleet = dict.fromkeys(rs.FLEET_LAYOUT, _EMPTY)
        arrivals = dict.fromkeys(rs.ARRIVAL_LAYOUT, _EMPTY)
        self.run(0, 0, fleet, arrivals, (_EMPTY, _EMPTY), (_EMPTY, _EMPTY))


def lower_router(manager: object) -> RouteProgram | None:
    """The pipeline lowered, or None when a pass has no lowered form."""
    try:
        return RouteProgram.lower(manager)
    except NotLowered:
        return None
