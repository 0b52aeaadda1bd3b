"""The `cluster` dialect: one routing step over a fleet of engine instances.

A router decides, per arriving request, which instance serves it (Mooncake's Conductor, the
SGLang router, llm-d's scorers). A routing step holds the fleet's facts as columns, one entry
per instance, and the arrivals as columns, one entry per request; prefix-cache facts are
pairs (an instance's advertised block hashes, a request's prefix block hashes, in order). The
decision ops record what was decided and why, like the step dialects:

    cluster.route_step 7 {now_us = 1000, facts = []} {
      %fleet = cluster.fleet {id = [0, 1, 2], role = [both, prefill, decode], queued = [3, 0, 1],
                              running = [10, 0, 4], free_blocks = [100, 900, 50],
                              total_blocks = [1000, 1000, 1000], position = [0, 0, 1]}
      %req = cluster.arrivals {id = [17, 18], prompt = [2048, 512], output = [128, 64],
                               ttft_slo_ms = [2000, 2000], tbt_slo_ms = [100, 100]}
      cluster.digest %fleet {id = [0, 0], hash = [11, 12]}
      cluster.prefix %req {id = [17, 17], hash = [11, 12]}
      %r = cluster.route %req {id = [17], instance = [1], decode = [2], hit_blocks = [2], why = [cache]}
      cluster.reject %req {id = [18], why = [slo]}
      cluster.transfer %r {id = [17], src = [1], dst = [2], bytes = [4194304], latency_us = [300]}
      cluster.migrate %fleet {hash = [11], src = [0], dst = [2], bytes = [65536], benefit_us = [900]}
      cluster.yield %r
    }

`cluster.replicate` has `cluster.migrate`'s columns (a copy instead of a move). The column
checks of the step dialects apply (`id` unique in an op over a set, lengths equal, ids from
the operand); pair ops (`digest`, `prefix`) repeat an id once per hash; instance columns of the
decisions must name instances of the step's `cluster.fleet`.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from xdsl.dialects.builtin import I64, ArrayAttr, IntegerAttr, StringAttr, i64
from xdsl.ir import Block, Dialect, Operation, ParametrizedAttribute, TypeAttribute
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import IsTerminator, Pure, SingleBlockImplicitTerminator
from xdsl.utils.exceptions import VerifyException

from schedir.dialects.base import (
    ColumnOpMixin,
    parse_attr_dict,
    parse_columns,
    parse_string,
    parse_yield_operands,
    print_attr_dict,
    print_columns,
    print_yield,
    set_ids,
    string_literal,
)
from schedir.dialects.codes import Role, Why
from schedir.dialects.columns import ColumnsAttr


@irdl_attr_definition
class IdSetType(ParametrizedAttribute, TypeAttribute):
    """`!cluster.ids`: an ordered set of instances or requests of a routing step."""

    name = "cluster.ids"


IDS = IdSetType()


def _fleet_of(op: Operation) -> FleetOp | None:
    block = op.parent_block()
    if block is None:
        return None
    for other in block.ops:
        if isinstance(other, FleetOp):
            return other
    return None


def _check_instances(op: ColumnOpMixin, columns: tuple[str, ...]) -> None:
    """Every instance column names an instance of the step's fleet."""
    fleet = _fleet_of(op)  # type: ignore[arg-type]
    if fleet is None:
        raise VerifyException(f"{op.name}: the routing step has no cluster.fleet")  # type: ignore[attr-defined]
    known = fleet.ids
    cols = op.columns  # type: ignore[attr-defined]
    for col in columns:
        if not cols.has(col):
            continue
        values = cols.get(col)
        bad = values[~np.isin(values, known)]
        if bad.size:
            raise VerifyException(f"{op.name}: column '{col}' names instance(s) {sorted(set(bad.tolist()))} "  # type: ignore[attr-defined]
                                  "that are not in the fleet")


def _check_codes(op: ColumnOpMixin, col: str, allowed: frozenset[Why]) -> None:
    codes = {int(w) for w in allowed}
    for rid, code in zip(op.ids.tolist(), op.col(col).tolist(), strict=True):
        if code not in codes:
            shown = Why(code).name.lower() if code in Why._value2member_map_ else str(code)
            names = ", ".join(sorted(w.name.lower() for w in allowed))
            raise VerifyException(f"{op.name}: request {rid} has why '{shown}', expected one of {names}")  # type: ignore[attr-defined]


class _TableOp(ColumnOpMixin, IRDLOperation):
    """`cluster.fleet` / `cluster.arrivals`: a table of facts, no operand."""

    def print(self, printer: Printer) -> None:
        print_columns(printer, self.columns)
        print_attr_dict(printer, self)

    @classmethod
    def parse(cls, parser: Parser):
        cols = parse_columns(parser)
        return cls.create(properties={"columns": cols}, attributes=parse_attr_dict(parser), result_types=[IDS])


@irdl_op_definition
class FleetOp(_TableOp):
    """The fleet this step: per instance its role (`both`, `prefill`, `decode`), requests queued
    and running, free and total KV blocks, and its position in the topology (instances at one
    position share a fast link).

        %fleet = cluster.fleet {id = [0, 1], role = [both, both], queued = [3, 0], running = [10, 2],
                                free_blocks = [100, 900], total_blocks = [1000, 1000], position = [0, 1]}
    """

    name = "cluster.fleet"
    columns = prop_def(ColumnsAttr)
    result = result_def(IdSetType)
    traits = traits_def(Pure())

    REQUIRED_COLUMNS: ClassVar[tuple[str, ...]] = (
        "id", "role", "queued", "running", "free_blocks", "total_blocks", "position")
    NON_NEGATIVE_COLUMNS: ClassVar[tuple[str, ...]] = (
        "id", "queued", "running", "free_blocks", "total_blocks", "position")

    def verify_(self) -> None:
        self.verify_columns()
        if len(self) == 0:
            return
        role = self.col("role")
        bad = self.ids[(role < 0) | (role > max(Role))]
        if bad.size:
            raise VerifyException(f"cluster.fleet: unknown role for instance(s) {bad.tolist()}")
        bad = self.ids[self.col("free_blocks") > self.col("total_blocks")]
        if bad.size:
            raise VerifyException(f"cluster.fleet: free_blocks exceeds total_blocks for instance(s) {bad.tolist()}")


@irdl_op_definition
class ArrivalsOp(_TableOp):
    """The requests to route: prompt and expected output tokens, TTFT and TBT targets (0: none).

        %req = cluster.arrivals {id = [17], prompt = [2048], output = [128], ttft_slo_ms = [2000],
                                 tbt_slo_ms = [100]}
    """

    name = "cluster.arrivals"
    columns = prop_def(ColumnsAttr)
    result = result_def(IdSetType)
    traits = traits_def(Pure())

    REQUIRED_COLUMNS: ClassVar[tuple[str, ...]] = ("id", "prompt", "output", "ttft_slo_ms", "tbt_slo_ms")
    NON_NEGATIVE_COLUMNS: ClassVar[tuple[str, ...]] = ("id", "output", "ttft_slo_ms", "tbt_slo_ms")
    POSITIVE_COLUMNS: ClassVar[tuple[str, ...]] = ("prompt",)

    def verify_(self) -> None:
        self.verify_columns()


class _OverIdsOp(ColumnOpMixin, IRDLOperation):
    """`cluster.op %set {columns}`: one operand, the set the op is about."""

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.operands[0])
        print_columns(printer, self.columns)
        print_attr_dict(printer, self)

    @classmethod
    def parse(cls, parser: Parser):
        operand = parser.parse_operand(IDS)
        cols = parse_columns(parser)
        return cls.create(operands=[operand], properties={"columns": cols}, attributes=parse_attr_dict(parser),
                          result_types=[IDS] * len(cls.get_irdl_definition().results))

    def _verify_ids_from_operand(self, ids: np.ndarray) -> None:
        source = set_ids(self.operands[0])
        outside = ids[~np.isin(ids, source)]
        if outside.size:
            raise VerifyException(f"{self.name}: id(s) {sorted(set(outside.tolist()))} are not in the operand set")


class _PairsOp(_OverIdsOp):
    """Pairs (id, hash): the id repeats once per hash, hashes in order."""

    REQUIRED_COLUMNS: ClassVar[tuple[str, ...]] = ("id", "hash")

    def verify_(self) -> None:
        cols = self.columns
        missing = [c for c in self.REQUIRED_COLUMNS if not cols.has(c)]
        if missing:
            raise VerifyException(f"{self.name}: missing column(s) {', '.join(missing)}")
        n = len(cols.get("id"))
        for col, raw in cols.data:
            if len(raw) // 8 != n:
                raise VerifyException(f"{self.name}: column '{col}' has {len(raw) // 8} entries, but 'id' has {n}")
        ids, hashes = cols.get("id"), cols.get("hash")
        self._verify_ids_from_operand(ids)
        if n:
            pairs = np.unique(np.stack([ids, hashes]), axis=1)
            if pairs.shape[1] != n:
                raise VerifyException(f"{self.name}: an (id, hash) pair appears more than once")


@irdl_op_definition
class DigestOp(_PairsOp):
    """The prefix-cache block hashes each instance advertises.

        cluster.digest %fleet {id = [0, 0, 1], hash = [11, 12, 11]}
    """

    name = "cluster.digest"
    input = operand_def(IdSetType)
    columns = prop_def(ColumnsAttr)
    traits = traits_def(Pure())


@irdl_op_definition
class PrefixOp(_PairsOp):
    """Each arriving request's prefix block hashes, in prompt order (chained hashes).

        cluster.prefix %req {id = [17, 17], hash = [11, 12]}
    """

    name = "cluster.prefix"
    input = operand_def(IdSetType)
    columns = prop_def(ColumnsAttr)
    traits = traits_def(Pure())


@irdl_op_definition
class RouteOp(_OverIdsOp):
    """Sends requests to an instance (`instance`; `decode`: the decode instance, the same one
    unless prefill and decode are disaggregated) with the prefix blocks it hits there and why.

        %r = cluster.route %req {id = [17], instance = [1], decode = [1], hit_blocks = [2], why = [cache]}
    """

    name = "cluster.route"
    input = operand_def(IdSetType)
    columns = prop_def(ColumnsAttr)
    result = result_def(IdSetType)
    traits = traits_def(Pure())

    REQUIRED_COLUMNS: ClassVar[tuple[str, ...]] = ("id", "instance", "decode", "hit_blocks", "why")
    NON_NEGATIVE_COLUMNS: ClassVar[tuple[str, ...]] = ("hit_blocks",)
    WHY: ClassVar[frozenset[Why]] = frozenset({Why.ROUND_ROBIN, Why.LEAST_LOAD, Why.CACHE, Why.DISAGGREGATED})

    def verify_(self) -> None:
        self.verify_columns()
        self._verify_ids_from_operand(self.ids)
        _check_codes(self, "why", self.WHY)
        _check_instances(self, ("instance", "decode"))


@irdl_op_definition
class RejectOp(_OverIdsOp):
    """Refuses requests now, with the reason (`slo`: predicted to miss its SLO; `overloaded`:
    no instance has room; `no_instance`: no instance can serve it).

        cluster.reject %req {id = [18], why = [slo]}
    """

    name = "cluster.reject"
    input = operand_def(IdSetType)
    columns = prop_def(ColumnsAttr)

    REQUIRED_COLUMNS: ClassVar[tuple[str, ...]] = ("id", "why")
    WHY: ClassVar[frozenset[Why]] = frozenset({Why.SLO, Why.OVERLOADED, Why.NO_INSTANCE})

    def verify_(self) -> None:
        self.verify_columns()
        self._verify_ids_from_operand(self.ids)
        _check_codes(self, "why", self.WHY)


@irdl_op_definition
class TransferOp(_OverIdsOp):
    """KV moved from a request's prefill instance to its decode instance (P/D disaggregation).

        cluster.transfer %r {id = [17], src = [1], dst = [2], bytes = [4194304], latency_us = [300]}
    """

    name = "cluster.transfer"
    input = operand_def(IdSetType)
    columns = prop_def(ColumnsAttr)

    REQUIRED_COLUMNS: ClassVar[tuple[str, ...]] = ("id", "src", "dst", "bytes", "latency_us")
    NON_NEGATIVE_COLUMNS: ClassVar[tuple[str, ...]] = ("bytes", "latency_us")

    def verify_(self) -> None:
        self.verify_columns()
        self._verify_ids_from_operand(self.ids)
        _check_instances(self, ("src", "dst"))


class _PrefixMoveOp(_OverIdsOp):
    """A prefix's KV copied or moved between instances, with its cost and expected benefit.
    Rows are moves (no `id` column); the operand is the fleet."""

    REQUIRED_COLUMNS: ClassVar[tuple[str, ...]] = ("hash", "src", "dst", "bytes", "benefit_us")

    def verify_(self) -> None:
        cols = self.columns
        missing = [c for c in self.REQUIRED_COLUMNS if not cols.has(c)]
        if missing:
            raise VerifyException(f"{self.name}: missing column(s) {', '.join(missing)}")
        n = len(cols.get("hash"))
        for col, raw in cols.data:
            if len(raw) // 8 != n:
                raise VerifyException(f"{self.name}: column '{col}' has {len(raw) // 8} entries, but 'hash' has {n}")
        if n and cols.get("bytes").min() < 0:
            raise VerifyException(f"{self.name}: column 'bytes' is negative")
        same = cols.get("src") == cols.get("dst")
        if same.any():
            raise VerifyException(f"{self.name}: a prefix cannot move to the instance it is on "
                                  f"(instance {int(cols.get('src')[same][0])})")
        _check_instances(self, ("src", "dst"))


@irdl_op_definition
class MigrateOp(_PrefixMoveOp):
    """A hot prefix moved to another instance (the source drops it).

        cluster.migrate %fleet {hash = [11], src = [0], dst = [2], bytes = [65536], benefit_us = [900]}
    """

    name = "cluster.migrate"
    input = operand_def(IdSetType)
    columns = prop_def(ColumnsAttr)


@irdl_op_definition
class ReplicateOp(_PrefixMoveOp):
    """A hot prefix copied to another instance (both keep it).

        cluster.replicate %fleet {hash = [11], src = [0], dst = [1], bytes = [65536], benefit_us = [400]}
    """

    name = "cluster.replicate"
    input = operand_def(IdSetType)
    columns = prop_def(ColumnsAttr)


@irdl_op_definition
class YieldOp(IRDLOperation):
    """Ends a routing step: the routed sets, in decision order."""

    name = "cluster.yield"
    sets = var_operand_def(IdSetType)
    traits = traits_def(IsTerminator())

    def verify_(self) -> None:
        if not isinstance(self.parent_op(), RouteStepOp):
            raise VerifyException("cluster.yield must end a cluster.route_step")
        for value in self.sets:
            if not isinstance(value.owner, RouteOp):
                raise VerifyException("cluster.yield: every operand must be a cluster.route result")

    def print(self, printer: Printer) -> None:
        print_yield(printer, self)

    @classmethod
    def parse(cls, parser: Parser) -> YieldOp:
        return cls.create(operands=parse_yield_operands(parser, IDS), attributes=parse_attr_dict(parser))


@irdl_op_definition
class RouteStepOp(IRDLOperation):
    """One routing step: its time (µs), the analysis facts established, and a block of decisions."""

    name = "cluster.route_step"
    step = prop_def(IntegerAttr[I64])
    now_us = prop_def(IntegerAttr[I64])
    facts = prop_def(ArrayAttr[StringAttr])
    body = region_def("single_block")
    traits = traits_def(SingleBlockImplicitTerminator(YieldOp))

    def verify_(self) -> None:
        if self.step.value.data < 0 or self.now_us.value.data < 0:
            raise VerifyException("cluster.route_step: step and now_us must be >= 0")
        fleets = [op for op in self.body.block.ops if isinstance(op, FleetOp)]
        if len(fleets) != 1:
            raise VerifyException(f"cluster.route_step: needs exactly one cluster.fleet, found {len(fleets)}")
        decided: list[np.ndarray] = []
        for op in self.body.block.ops:
            if isinstance(op, (RouteOp, RejectOp)):
                decided.append(op.ids)
        if decided:
            ids, counts = np.unique(np.concatenate(decided), return_counts=True)
            if (counts > 1).any():
                raise VerifyException(f"cluster.route_step: request(s) {ids[counts > 1].tolist()} are decided "
                                      "more than once (routed or rejected)")

    def print(self, printer: Printer) -> None:
        facts = ", ".join(string_literal(f.data) for f in self.facts.data)
        printer.print_string(f" {self.step.value.data} {{now_us = {self.now_us.value.data}, facts = [{facts}]}}")
        print_attr_dict(printer, self)
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False, print_empty_block=False)

    @classmethod
    def parse(cls, parser: Parser) -> RouteStepOp:
        step = parser.parse_integer(allow_boolean=False, allow_negative=False, context_msg=" (the step index)")
        values: dict[str, object] = {}

        def parse_item() -> None:
            at = parser._current_token.span
            key = parser.parse_identifier(" (a routing step fact)")
            if key not in ("now_us", "facts"):
                parser.raise_error(f"unknown routing step fact '{key}' (expected: now_us, facts)", at)
            if key in values:
                parser.raise_error(f"routing step fact '{key}' given twice", at)
            parser.parse_punctuation("=")
            if key == "now_us":
                values[key] = parser.parse_integer(allow_boolean=False, context_msg=" for now_us")
            else:
                values[key] = parser.parse_comma_separated_list(
                    parser.Delimiter.SQUARE, lambda: parse_string(parser, "a fact"), " (facts)")

        opening = parser._current_token.span
        parser.parse_comma_separated_list(parser.Delimiter.BRACES, parse_item, " (the routing step facts)")
        if "now_us" not in values:
            parser.raise_error("cluster.route_step is missing now_us", opening)
        attributes = parse_attr_dict(parser)
        region = parser.parse_region()
        if not region.blocks:
            region.add_block(Block())
        if not isinstance(region.block.last_op, YieldOp):
            region.block.add_op(YieldOp.create())
        facts = values.get("facts", [])
        return cls.create(
            properties={"step": IntegerAttr(step, i64), "now_us": IntegerAttr(values["now_us"], i64),  # type: ignore[arg-type]
                        "facts": ArrayAttr([StringAttr(f) for f in facts])},  # type: ignore[union-attr]
            attributes=attributes, regions=[region])


Cluster = Dialect(
    "cluster",
    [RouteStepOp, YieldOp, FleetOp, ArrivalsOp, DigestOp, PrefixOp, RouteOp, RejectOp, TransferOp, MigrateOp,
     ReplicateOp],
    [IdSetType],
)
