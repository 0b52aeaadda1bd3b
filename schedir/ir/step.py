"""`Step`: the pass author's view of one `sched.step` op: read columns, append decisions.

A step holds a handful of ops, so every lookup here is a plain loop over them;
per-request work is numpy over columns. Decisions are appended in program
order (before `sched.yield`), so the IR reads top to bottom as the order in
which the pipeline decided.

The *pending* set of a queue is the last `req.queue` / `req.sort` / `req.select`
result rooted in that queue: a pass that decides on part of a set and leaves the
rest for later passes emits a `req.select` of the rest (`Step.keep`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import attrs
import numpy as np
from xdsl.dialects.builtin import ArrayAttr, StringAttr
from xdsl.ir import Block, Operation, SSAValue

from schedir.dialects.base import SET, ColumnOpMixin
from schedir.dialects.columns import ColumnsAttr
from schedir.dialects.mem import AllocOp, EvictOp, FreeOp, MatchOp, ShareOp, SwapInOp, SwapOutOp
from schedir.dialects.req import (
    DeferOp,
    PreemptOp,
    QueueOp,
    RejectOp,
    ScheduleOp,
    SelectOp,
    SortOp,
)
from schedir.dialects.sched import StepFacts, StepOp, YieldOp, facts_attr, i64_attr

EMPTY = np.zeros(0, dtype=np.int64)
_PHASES = {p: StringAttr(p) for p in ("prefill", "decode", "mixed")}
_MODES = {m: StringAttr(m) for m in ("recompute", "swap")}
_KEYS: dict[tuple[str, ...], ArrayAttr[StringAttr]] = {}


def positions(source: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Index of each `query` id in `source` (-1 where absent), in O(n) for dense ids."""
    if source.size == 0 or query.size == 0:
        return np.full(query.size, -1, dtype=np.int64)
    top = int(source.max())
    if int(source.min()) >= 0 and top < 8 * source.size + 4096:
        table = np.full(top + 1, -1, dtype=np.int64)
        table[source] = np.arange(source.size, dtype=np.int64)
        inside = (query >= 0) & (query <= top)
        out = np.full(query.size, -1, dtype=np.int64)
        out[inside] = table[query[inside]]
        return out
    order = np.argsort(source, kind="stable")
    sorted_ids = source[order]
    at = np.minimum(np.searchsorted(sorted_ids, query), sorted_ids.size - 1)
    return np.where(sorted_ids[at] == query, order[at], -1)


@attrs.frozen
class Usage:
    """What the decisions so far consume of the step's budgets."""

    tokens: int  # tokens scheduled
    seqs: int  # requests scheduled
    blocks_taken: int  # blocks leaving the free pool (alloc, revived shares, swap-in)
    blocks_given: int  # blocks returning to it (free, swap-out)
    evicted: int  # cached-free blocks whose content was dropped
    scheduled_ids: np.ndarray  # every request scheduled so far, in batch order

    def free_left(self, facts: StepFacts) -> int:
        return facts.free_blocks + self.blocks_given - self.blocks_taken


class Step:
    """Read and extend one `sched.step` op."""

    def __init__(self, op: StepOp) -> None:
        self.op = op
        self.block: Block = op.body.block
        self._facts: StepFacts | None = None
        self._roots: dict[SSAValue, QueueOp] = {}

    # ------------------------------------------------------------ facts
    @property
    def facts(self) -> StepFacts:
        if self._facts is None:
            self._facts = self.op.read_facts()
        return self._facts

    def has_fact(self, fact: str) -> bool:
        return fact in self.op.fact_set()

    def set_facts(self, facts: frozenset[str]) -> None:
        self.op.facts = facts_attr(facts)
        self._facts = None

    # ------------------------------------------------------------ finding ops
    def ops(self) -> Iterator[Operation]:
        return iter(self.block.ops)

    def ops_of(self, *kinds: type[Operation]) -> list[Operation]:
        return [op for op in self.block.ops if isinstance(op, kinds)]

    @property
    def terminator(self) -> YieldOp:
        last = self.block.last_op
        assert isinstance(last, YieldOp), "a sched.step block ends with sched.yield"
        return last

    def queue(self, name: str) -> QueueOp | None:
        for op in self.block.ops:
            if isinstance(op, QueueOp) and op.queue.data == name:
                return op
        return None

    def queues(self) -> list[QueueOp]:
        return [op for op in self.block.ops if isinstance(op, QueueOp)]

    def root(self, value: SSAValue) -> QueueOp:
        """The `req.queue` a set value was derived from."""
        found = self._roots.get(value)
        if found is not None:
            return found
        op = value.owner
        while not isinstance(op, QueueOp):
            if not isinstance(op, Operation) or not op.operands:
                raise ValueError("a request set must derive from a req.queue")
            op = op.operands[0].owner
        self._roots[value] = op
        return op

    def pending(self, queue: str) -> SSAValue | None:
        """The set of `queue` requests not yet decided on (None if the step has no such queue)."""
        current: SSAValue | None = None
        for op in self.block.ops:
            if isinstance(op, QueueOp):
                if op.queue.data == queue:
                    current = op.result
            elif isinstance(op, (SortOp, SelectOp)) and current is not None and op.input is current:
                current = op.result
        return current

    # ------------------------------------------------------------ columns
    @staticmethod
    def ids(value: SSAValue) -> np.ndarray:
        owner = value.owner
        assert isinstance(owner, ColumnOpMixin)
        return owner.ids

    def column(self, value: SSAValue, name: str) -> np.ndarray:
        """A queue column for the requests of `value`, in `value`'s order."""
        root = self.root(value)
        source = root.columns.get(name)
        if value is root.result:
            return source
        return source[positions(root.ids, self.ids(value))]

    def columns(self, value: SSAValue, names: Sequence[str]) -> list[np.ndarray]:
        root = self.root(value)
        if value is root.result:
            return [root.columns.get(n) for n in names]
        rows = positions(root.ids, self.ids(value))
        return [root.columns.get(n)[rows] for n in names]

    def decision_column(self, kind: type[ColumnOpMixin], name: str, ids: np.ndarray) -> np.ndarray:
        """`name` from every `kind` op (e.g. MatchOp 'hit'), aligned with `ids`; 0 where none."""
        out = np.zeros(ids.size, dtype=np.int64)
        for op in self.block.ops:
            if isinstance(op, kind) and len(op):
                at = positions(op.ids, ids)
                found = at >= 0
                out[found] = op.col(name)[at[found]]
        return out

    def prefix_hits(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cached prefix tokens per request and how many of those blocks sit in the free queue."""
        hit = np.zeros(ids.size, dtype=np.int64)
        cached_free = np.zeros(ids.size, dtype=np.int64)
        for op in self.block.ops:
            if isinstance(op, MatchOp) and len(op):
                at = positions(op.ids, ids)
                found = at >= 0
                hit[found] = op.col("hit")[at[found]]
                if op.columns.has("cached_free"):
                    cached_free[found] = op.col("cached_free")[at[found]]
        return hit, cached_free

    # ------------------------------------------------------------ budgets
    def usage(self) -> Usage:
        tokens = seqs = taken = given = evicted = 0
        scheduled: list[np.ndarray] = []
        for op in self.block.ops:
            if isinstance(op, ScheduleOp):
                t = op.col("tokens")
                tokens += int(t.sum())
                seqs += t.size
                scheduled.append(op.ids)
            elif isinstance(op, (AllocOp, SwapInOp)):
                taken += int(op.col("blocks").sum())
            elif isinstance(op, ShareOp):
                if op.columns.has("revived"):
                    taken += int(op.col("revived").sum())
            elif isinstance(op, (FreeOp, SwapOutOp)):
                given += int(op.col("blocks").sum())
            elif isinstance(op, EvictOp):
                evicted += op.count
        ids = np.concatenate(scheduled) if scheduled else EMPTY
        return Usage(tokens, seqs, taken, given, evicted, ids)

    # ------------------------------------------------------------ appending decisions
    def append(self, op: Operation) -> Operation:
        self.block.insert_op_before(op, self.terminator)
        return op

    def _over(self, kind: type[Operation], value: SSAValue, cols: dict[str, np.ndarray], **props) -> Operation:
        props["columns"] = ColumnsAttr.of(cols)
        results = [SET] * len(kind.get_irdl_definition().results)  # type: ignore[attr-defined]
        return self.append(kind.create(operands=[value], properties=props, result_types=results))

    def sort(self, value: SSAValue, keys: Sequence[str], order: np.ndarray) -> SSAValue:
        """Reorder `value`; `order` is the new id order (a permutation of its ids)."""
        key = tuple(keys)
        by = _KEYS.get(key)
        if by is None:
            by = _KEYS[key] = ArrayAttr([StringAttr(k) for k in key])
        return self._over(SortOp, value, {"id": order}, by=by).results[0]

    def keep(self, value: SSAValue, ids: np.ndarray) -> SSAValue:
        """The part of `value` still pending after a decision (a `req.select`)."""
        return self._over(SelectOp, value, {"id": ids}).results[0]

    def schedule(self, value: SSAValue, phase: str, ids: np.ndarray, tokens: np.ndarray) -> SSAValue:
        """Run `ids` with `tokens` each; the result joins the batch (`sched.yield`) in order."""
        result = self._over(ScheduleOp, value, {"id": ids, "tokens": tokens}, phase=_PHASES[phase]).results[0]
        term = self.terminator
        term.operands = (*term.operands, result)
        return result

    def defer(self, value: SSAValue, ids: np.ndarray, reasons: np.ndarray) -> None:
        if ids.size:
            self._over(DeferOp, value, {"id": ids, "reason": reasons})

    def reject(self, value: SSAValue, ids: np.ndarray, reasons: np.ndarray) -> None:
        if ids.size:
            self._over(RejectOp, value, {"id": ids, "reason": reasons})

    def preempt(self, value: SSAValue, mode: str, ids: np.ndarray) -> SSAValue:
        return self._over(PreemptOp, value, {"id": ids}, mode=_MODES[mode]).results[0]

    def blocks(self, kind: type[Operation], value: SSAValue, ids: np.ndarray, blocks: np.ndarray, **extra: np.ndarray) -> None:
        """A block effect (`mem.alloc`, `mem.free`, `mem.share`, ...) for the requests that have one."""
        if ids.size:
            self._over(kind, value, {"id": ids, "blocks": blocks, **extra})

    def evict(self, count: int) -> None:
        if count:
            self.append(EvictOp.create(properties={"blocks": i64_attr(count)}))


def steps_of(module: Operation) -> list[StepOp]:
    """The `sched.step` ops at the top of a module."""
    return [op for op in module.regions[0].block.ops if isinstance(op, StepOp)]
