"""The `req` dialect: ordered request sets and what happens to them in a step.

Values are `!req.set`s. `req.queue` names a queue of the engine with all its
per-request columns; every other op decides on (part of) a set and records both
the rule and its concrete result, so a dump reads as a decision log:

    %w  = req.queue waiting {id = [11, 12], prompt = [512, 40], ...}
    %w1 = req.sort %w by ["priority", "arrival"] {id = [12, 11]}
    %a  = req.schedule %w1 prefill {id = [12], tokens = [40]}
    req.defer %w1 {id = [11], reason = [budget]}
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import ArrayAttr, StringAttr
from xdsl.ir import Dialect, Operation, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from schedir.dialects.base import (
    SET,
    ColumnOpMixin,
    OverSetOp,
    RequestSetType,
    check_keyword,
    parse_attr_dict,
    parse_columns,
    parse_string,
    parse_word,
    print_attr_dict,
    print_columns,
    print_word,
    string_literal,
)
from schedir.dialects.codes import DEFER_REASONS, REJECT_REASONS, PreemptMode, Reason, Status
from schedir.dialects.columns import ColumnsAttr

QUEUE_COLUMNS = ("id", "prompt", "computed", "total", "max_tokens", "priority", "arrival", "status", "blocks")
"""Columns every `req.queue` carries; passes may add their own (persistent state)."""

PHASES = ("prefill", "decode", "mixed")
PREEMPT_MODES = tuple(m.name.lower() for m in PreemptMode)


@irdl_op_definition
class QueueOp(ColumnOpMixin, IRDLOperation):
    """A queue of the engine at the start of the step, with every request's columns.

    Columns: `id`, `prompt` (prompt tokens), `computed` (tokens whose KV is
    computed), `total` (prompt + generated tokens), `max_tokens`, `priority`
    (lower runs first), `arrival` (µs), `status` (waiting / running / preempted /
    swapped) and `blocks` (KV blocks held). Extra columns are a pass's own state; the
    runtime adds `in_flight`, `queued`, `rank`, and for async scheduling `placeholders`
    (tokens being sampled by steps in flight: `computed` counts their positions, `total`
    does not) and `stale` (outputs in flight from before a preemption: > 0 delivered, the
    request waits for them; < 0 dropped).

        %run = req.queue running {id = [3], prompt = [12], computed = [14], total = [15],
                                  max_tokens = [64], priority = [0], arrival = [100],
                                  status = [running], blocks = [1]}
    """

    name = "req.queue"
    queue = prop_def(StringAttr)
    columns = prop_def(ColumnsAttr)
    result = result_def(RequestSetType)
    traits = traits_def(Pure())

    REQUIRED_COLUMNS: ClassVar[tuple[str, ...]] = QUEUE_COLUMNS
    NON_NEGATIVE_COLUMNS: ClassVar[tuple[str, ...]] = (
        "id", "computed", "max_tokens", "arrival", "status", "blocks"
    )
    POSITIVE_COLUMNS: ClassVar[tuple[str, ...]] = ("prompt",)

    def verify_(self) -> None:
        self.verify_columns()
        if len(self) == 0:
            return
        total, prompt, computed = self.col("total"), self.col("prompt"), self.col("computed")
        # async scheduling: positions of tokens still being sampled are computed, not yet known
        known = total + self.columns.get("placeholders") if self.columns.has("placeholders") else total
        bad = self.ids[(total < prompt) | (computed > known)]
        if bad.size:
            raise VerifyException(
                f"req.queue {self.queue.data}: need prompt <= total and computed <= total + placeholders; "
                f"request(s) {bad.tolist()}"
            )
        status = self.col("status")
        bad = self.ids[status > max(Status)]
        if bad.size:
            raise VerifyException(f"req.queue {self.queue.data}: unknown status for request(s) {bad.tolist()}")

    def print(self, printer: Printer) -> None:
        print_word(printer, self.queue.data)
        print_columns(printer, self.columns)
        print_attr_dict(printer, self)

    @classmethod
    def parse(cls, parser: Parser) -> QueueOp:
        queue = parse_word(parser, "a queue name")
        cols = parse_columns(parser)
        return cls.create(
            properties={"queue": StringAttr(queue), "columns": cols},
            attributes=parse_attr_dict(parser),
            result_types=[SET],
        )


@irdl_op_definition
class SortOp(OverSetOp):
    """Reorders a set; `by` is the key it sorted on (`"name"` or `"name desc"`, first key first).

        %w1 = req.sort %w by ["priority", "arrival"] {id = [12, 11]}
    """

    name = "req.sort"
    input = operand_def(RequestSetType)
    by = prop_def(ArrayAttr[StringAttr])
    columns = prop_def(ColumnsAttr)
    result = result_def(RequestSetType)
    traits = traits_def(Pure())

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k.data for k in self.by.data)

    def verify_(self) -> None:
        self.verify_columns()
        self.verify_subset_of(self.input, permutation=True)
        if not self.by.data:
            raise VerifyException("req.sort: 'by' must name at least one key")

    def _print_words(self, printer: Printer) -> None:
        printer.print_string(" by [" + ", ".join(string_literal(k) for k in self.keys) + "]")

    @classmethod
    def _parse_words(cls, parser: Parser) -> dict[str, object]:
        parser.parse_keyword("by", " (req.sort names its keys)")
        keys = parser.parse_comma_separated_list(
            parser.Delimiter.SQUARE, lambda: parse_string(parser, "a sort key"), " (sort keys)"
        )
        return {"by": ArrayAttr([StringAttr(k) for k in keys])}


@irdl_op_definition
class SelectOp(OverSetOp):
    """Keeps part of a set, in the given order: the requests still pending after a decision.

        %w2 = req.select %w1 {id = [11]}
    """

    name = "req.select"
    input = operand_def(RequestSetType)
    columns = prop_def(ColumnsAttr)
    result = result_def(RequestSetType)
    traits = traits_def(Pure())

    def verify_(self) -> None:
        self.verify_columns()
        self.verify_subset_of(self.input)


@irdl_op_definition
class ScheduleOp(OverSetOp):
    """Runs requests this step with `tokens` each (a prefill chunk, or 1 for a decode).

        %a = req.schedule %w1 prefill {id = [12], tokens = [40]}
    """

    name = "req.schedule"
    input = operand_def(RequestSetType)
    phase = prop_def(StringAttr)
    columns = prop_def(ColumnsAttr)
    result = result_def(RequestSetType)
    traits = traits_def(Pure())

    REQUIRED_COLUMNS: ClassVar[tuple[str, ...]] = ("id", "tokens")
    POSITIVE_COLUMNS: ClassVar[tuple[str, ...]] = ("tokens",)

    def verify_(self) -> None:
        check_keyword(self.name, "phase", self.phase.data, PHASES)
        self.verify_columns()
        self.verify_subset_of(self.input)

    def _print_words(self, printer: Printer) -> None:
        print_word(printer, self.phase.data)

    @classmethod
    def _parse_words(cls, parser: Parser) -> dict[str, object]:
        return {"phase": StringAttr(parser.parse_keyword_in(PHASES, " (prefill, decode or mixed)"))}


def _verify_reasons(op: ColumnOpMixin, allowed: frozenset[Reason], what: str) -> None:
    reasons = op.col("reason")
    codes = {int(r) for r in allowed}
    for rid, code in zip(op.ids.tolist(), reasons.tolist(), strict=True):
        if code not in codes:
            shown = Reason(code).name.lower() if code in Reason._value2member_map_ else str(code)
            names = ", ".join(sorted(r.name.lower() for r in allowed))
            raise VerifyException(f"{op.name}: request {rid} has reason '{shown}', not a {what} reason ({names})")  # type: ignore[attr-defined]


@irdl_op_definition
class DeferOp(OverSetOp):
    """Leaves requests for a later step, each with its reason.

        req.defer %w1 {id = [11, 13], reason = [budget, blocked]}
    """

    name = "req.defer"
    input = operand_def(RequestSetType)
    columns = prop_def(ColumnsAttr)

    REQUIRED_COLUMNS: ClassVar[tuple[str, ...]] = ("id", "reason")

    def verify_(self) -> None:
        self.verify_columns()
        _verify_reasons(self, DEFER_REASONS, "deferral")
        self.verify_subset_of(self.input)


@irdl_op_definition
class RejectOp(OverSetOp):
    """Refuses requests for good: they can never run on this engine.

        req.reject %w {id = [13], reason = [too_long]}
    """

    name = "req.reject"
    input = operand_def(RequestSetType)
    columns = prop_def(ColumnsAttr)

    REQUIRED_COLUMNS: ClassVar[tuple[str, ...]] = ("id", "reason")

    def verify_(self) -> None:
        self.verify_columns()
        _verify_reasons(self, REJECT_REASONS, "rejection")
        self.verify_subset_of(self.input)


@irdl_op_definition
class PreemptOp(OverSetOp):
    """Stops running requests to free their KV blocks, by recompute or swap.

        %p = req.preempt %run recompute {id = [9]}
    """

    name = "req.preempt"
    input = operand_def(RequestSetType)
    mode = prop_def(StringAttr)
    columns = prop_def(ColumnsAttr)
    result = result_def(RequestSetType)

    def verify_(self) -> None:
        check_keyword(self.name, "preemption mode", self.mode.data, PREEMPT_MODES)
        self.verify_columns()
        self.verify_subset_of(self.input)

    def _print_words(self, printer: Printer) -> None:
        print_word(printer, self.mode.data)

    @classmethod
    def _parse_words(cls, parser: Parser) -> dict[str, object]:
        return {"mode": StringAttr(parser.parse_keyword_in(PREEMPT_MODES, " (recompute or swap)"))}


@irdl_op_definition
class SetStateOp(OverSetOp):
    """Writes pass-declared request state (see `schedir.ir.state`): each column other than
    `id` names a state column of the operand's queue and gives the requests' new values,
    which the runtime keeps from the next step on. It decides nothing about this step.

        req.set_state %w {id = [12, 11], level = [1, 0], attained = [512, 40]}
    """

    name = "req.set_state"
    input = operand_def(RequestSetType)
    columns = prop_def(ColumnsAttr)

    def verify_(self) -> None:
        self.verify_columns()
        self.verify_subset_of(self.input)
        names = [n for n in self.columns.names if n != "id"]
        if not names:
            raise VerifyException("req.set_state: no state column to write (give at least one besides 'id')")
        queue = _root(self.input)
        if queue is not None:
            absent = [n for n in names if not queue.columns.has(n)]
            if absent:
                raise VerifyException(
                    f"req.set_state: column(s) {', '.join(absent)} are not state of queue '{queue.queue.data}' "
                    f"(its columns: {', '.join(queue.columns.names)})"
                )
        engine = [n for n in names if n in RUNTIME_COLUMNS]
        if engine:
            raise VerifyException(f"req.set_state: column(s) {', '.join(engine)} belong to the runtime, "
                                  "not to a pass (only declared request state is written this way)")


def _root(value: SSAValue) -> QueueOp | None:
    op = value.owner
    while isinstance(op, Operation) and not isinstance(op, QueueOp):
        if not op.operands:
            return None
        op = op.operands[0].owner
    return op if isinstance(op, QueueOp) else None


RUNTIME_COLUMNS = frozenset(QUEUE_COLUMNS) | {"in_flight", "queued", "rank", "placeholders", "stale"}
"""Queue columns the runtime owns; any other queue column is a pass's declared state."""

SET_PRODUCERS = (QueueOp, SortOp, SelectOp)
"""Ops whose result is still pending (not yet decided) in its queue."""

OUTCOMES = (ScheduleOp, DeferOp, RejectOp, PreemptOp)
"""Ops that decide a request's fate for this step."""

Req = Dialect(
    "req",
    [QueueOp, SortOp, SelectOp, ScheduleOp, DeferOp, RejectOp, PreemptOp, SetStateOp],
    [RequestSetType, ColumnsAttr],
)
