"""`RouteArrays`: a routing step as plain arrays, for the fleet simulator's routing.

A routing step's IR is a handful of ops, but building, running and reading them costs
~200 µs a step on a 2-core machine (xDSL op creation, column attributes, the pass manager's
walk), most of a single arrival's routing. The routing passes read and append only through
the `RouteView` interface, so they run unchanged over this view: the fleet's and the
arrivals' columns, the digest and prefix pairs as the arrays given, and the decisions as a
list of (op kind, columns). `to_module()` writes the very IR a `cluster.route_step` run
through the same pipeline holds (tested: the same text), for dumps and for tests.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation

from schedir.dialects.cluster import IDS, MigrateOp, RejectOp, ReplicateOp, RouteOp, RouteStepOp, TransferOp
from schedir.dialects.columns import ColumnsAttr
from schedir.ir.fastop import append_operand, insert_before, new_op
from schedir.ir.route_step import RouteView, _facts_attr, _RouteFacts, build_route_step

_I64 = np.dtype(np.int64)
FLEET_SET, ARRIVAL_SET = "fleet", "arrivals"  # the sets a decision is over (its operand in the IR)
_FLEET, _ARRIVALS = FLEET_SET, ARRIVAL_SET


def _int64(columns: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The columns as int64 arrays, as the IR holds them (copied only where another dtype)."""
    return {name: (v if type(v) is np.ndarray and v.dtype is _I64 else np.asarray(v, dtype=np.int64))
            for name, v in columns.items()}


class RouteArrays(RouteView):
    """One routing step over arrays: what `build_route_step` would hold, without the IR.

    The columns are the caller's arrays (int64; passes only read them); decisions are kept in
    the order the passes append them, each a (kind, columns) with the set it is over: the
    fleet, the arrivals, or the route decision whose result a `cluster.transfer` names."""

    def __init__(self, step: int, now_us: int, fleet: Mapping[str, np.ndarray], arrivals: Mapping[str, np.ndarray],
                 digest: tuple[np.ndarray, np.ndarray] | None = None,
                 prefix: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        self.step = step
        self._now_us = now_us
        self.fleet = _int64(fleet)
        self.arrivals = _int64(arrivals)
        self.digest = None if digest is None else (np.asarray(digest[0], np.int64), np.asarray(digest[1], np.int64))
        self.prefix = None if prefix is None else (np.asarray(prefix[0], np.int64), np.asarray(prefix[1], np.int64))
        self.records: list[tuple[type, object, dict[str, np.ndarray]]] = []  # (kind, operand, columns)
        self._fact_set: frozenset[str] = frozenset()
        self._hits = None
        self._hits_key = -1
        self._chains = None

    @classmethod
    def decided(cls, step: int, now_us: int, fleet: Mapping[str, np.ndarray], arrivals: Mapping[str, np.ndarray],
                digest: tuple[np.ndarray, np.ndarray] | None, prefix: tuple[np.ndarray, np.ndarray] | None,
                records: list[tuple[type, object, dict[str, np.ndarray]]], facts: frozenset[str]) -> RouteArrays:
        """A step some other run decided (`schedir.lowering.route_program`): its inputs as given (int64
        columns; `to_module` converts any other) and its decisions, the facts after the pipeline."""
        view = cls.__new__(cls)
        view.step, view._now_us, view.fleet, view.arrivals = step, now_us, fleet, arrivals
        view.digest, view.prefix, view.records, view._fact_set = digest, prefix, records, facts
        view._hits, view._hits_key, view._chains = None, -1, None
        return view

    # ------------------------------------------------------------ facts (the pass manager's protocol)
    @property
    def facts(self) -> _RouteFacts:
        return _RouteFacts(self.step)

    @property
    def fact_set(self) -> frozenset[str]:
        return self._fact_set

    def set_facts(self, facts: frozenset[str], *, write: bool = True) -> None:
        self._fact_set = facts

    def write_facts(self) -> None:
        pass  # held as the attribute: `to_module` writes them

    def queues(self) -> list[Operation]:
        return []

    @property
    def now_us(self) -> int:
        return self._now_us

    # ------------------------------------------------------------ the backing: arrays
    @property
    def num_instances(self) -> int:
        return len(self.fleet["id"])

    def fleet_col(self, name: str) -> np.ndarray:
        try:
            return self.fleet[name]
        except KeyError:
            raise KeyError(f"no column '{name}' (columns: {', '.join(self.fleet)})") from None

    def has_fleet_col(self, name: str) -> bool:
        return name in self.fleet

    def arrival_col(self, name: str) -> np.ndarray:
        try:
            return self.arrivals[name]
        except KeyError:
            raise KeyError(f"no column '{name}' (columns: {', '.join(self.arrivals)})") from None

    def num_arrivals(self) -> int:
        return len(self.arrivals["id"])

    def prefix_pairs(self) -> tuple[np.ndarray, np.ndarray] | None:
        return self.prefix

    def digest_pairs(self) -> tuple[np.ndarray, np.ndarray] | None:
        return self.digest

    def _decided_ids(self) -> list[np.ndarray]:
        return [cols["id"] for kind, _, cols in self.records if kind is RouteOp or kind is RejectOp]

    def _route_columns(self) -> list[Mapping[str, np.ndarray]]:
        return [cols for kind, _, cols in self.records if kind is RouteOp]

    def _moves(self) -> list[tuple[type, Mapping[str, np.ndarray]]]:
        return [(kind, cols) for kind, _, cols in self.records if kind is ReplicateOp or kind is MigrateOp]

    def _fleet_set(self) -> object:
        return _FLEET

    def _arrival_set(self) -> object:
        return _ARRIVALS

    def _record(self, kind: type[Operation], operand: object, cols: Mapping[str, np.ndarray],
                results: int = 0) -> object:
        self.records.append((kind, operand, dict(cols)))  # int64 already: the view's own arithmetic
        return len(self.records) - 1 if results else None  # a route decision's handle: its place

    def decisions(self) -> list[tuple[type, Mapping[str, np.ndarray]]]:
        """Every decision of the step in order: (op kind, its columns)."""
        return [(kind, cols) for kind, _, cols in self.records]

    # ------------------------------------------------------------ the IR
    def to_module(self) -> ModuleOp:
        """The step as IR: `build_route_step`'s module with these decisions appended, as the same
        pipeline run over it appends them (results of route ops yielded), and the facts."""
        module = build_route_step(self.step, self._now_us, _int64(self.fleet), _int64(self.arrivals), self.digest,
                                  self.prefix)
        step_op: RouteStepOp = module.regions[0].block.first_op  # type: ignore[assignment]
        block = step_op.regions[0].block
        base = {}
        op = block.first_op
        while op is not None:
            base[op.name] = op
            op = op._next_op
        terminator = block.last_op
        results: dict[int, object] = {}
        for at, (kind, operand, cols) in enumerate(self.records):
            if operand == _FLEET:
                value = base["cluster.fleet"].results[0]
            elif operand == _ARRIVALS:
                value = base["cluster.arrivals"].results[0]
            else:
                value = results[operand]  # type: ignore[index]
            op = new_op(kind, (value,), {"columns": ColumnsAttr.of(cols)}, (IDS,) if kind is RouteOp else ())
            insert_before(block, op, terminator)
            if kind is RouteOp:
                results[at] = op.results[0]
                append_operand(terminator, op.results[0])
            elif kind is TransferOp and operand not in results:
                raise ValueError(f"a cluster.transfer names route decision {operand}, which it does not follow")
        step_op.properties["facts"] = _facts_attr(self._fact_set)
        return module


class ArrayRouteSteps:
    """The fleet simulator's routing steps as `RouteArrays` (its `route_steps`; the IR builders,
    `RecycledRouteStep` and `build_route_step`, give modules instead)."""

    def build(self, step: int, now_us: int, fleet: Mapping[str, np.ndarray], arrivals: Mapping[str, np.ndarray],
              digest: tuple[np.ndarray, np.ndarray] | None = None,
              prefix: tuple[np.ndarray, np.ndarray] | None = None) -> RouteArrays:
        return RouteArrays(step, now_us, fleet, arrivals, digest, prefix)
