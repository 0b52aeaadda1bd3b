"""`Step`: the pass author's view of one `sched.step` op: read columns, append decisions.

A step holds a handful of ops, so every lookup here is a plain loop over them;
per-request work is numpy over columns. Decisions are appended in program
order (before `sched.yield`), so the IR reads top to bottom as the order in
which the pipeline decided.

The *pending* set of a queue is the last `req.queue` / `req.sort` / `req.select`
result rooted in that queue, until decisions cover it: a pass that decides on
part of a set and leaves the rest for later passes emits a `req.select` of the
rest (`Step.keep`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, TypeVar

import numba
import numpy as np
from xdsl.dialects.builtin import ArrayAttr, StringAttr
from xdsl.ir import Block, Operation, SSAValue

from schedir.dialects.base import SET, ColumnOpMixin, RequestSetType
from schedir.dialects.columns import ColumnsAttr
from schedir.dialects.mem import AllocOp, CopyOp, EvictOp, FreeOp, MatchOp, ShareOp, SwapInOp, SwapOutOp
from schedir.dialects.pool import PoolOp
from schedir.dialects.req import (
    DeferOp,
    PreemptOp,
    QueueOp,
    RejectOp,
    ScheduleOp,
    SelectOp,
    SortOp,
)
from schedir.dialects.req import SetStateOp as ReqSetStateOp
from schedir.dialects.sched import (
    SetStateOp,
    StateOp,
    StepFacts,
    StepOp,
    YieldOp,
    facts_attr,
    i64_attr,
    state_values_attr,
)
from schedir.dialects.sched import decoded_state_value, decoded_state_values
from schedir.ir.fastop import append_operand, insert_before, new_op
from schedir.lowering.kv_pool import KVPool

EMPTY = np.zeros(0, dtype=np.int64)
_PHASES = {p: StringAttr(p) for p in ("prefill", "decode", "mixed")}
_MODES = {m: StringAttr(m) for m in ("recompute", "swap")}
_KEYS: dict[tuple[str, ...], ArrayAttr[StringAttr]] = {}


_IDENTITY: dict[int, np.ndarray] = {}
_FACT_SETS: dict[int, tuple[object, frozenset[str]]] = {}


# Item access on xDSL's `SSAValues` (results, operands) without its Python-level `__getitem__`
# (an isinstance and a super() call, ~0.2 µs): the plain tuple slot, on the hot path.
_item = tuple.__getitem__


def root_queue(value: SSAValue) -> QueueOp:
    """The `req.queue` a set value derives from (each set op's first operand is its parent)."""
    op = value.owner
    while not isinstance(op, QueueOp):
        if not isinstance(op, Operation) or not op._operands:
            raise ValueError("a request set must derive from a req.queue")
        op = _item(op._operands, 0).owner
    return op


def identity_rows(n: int) -> np.ndarray:
    """A read-only `arange(n)`, cached: a whole queue's rows, asked for every step."""
    rows = _IDENTITY.get(n)
    if rows is None:
        rows = np.arange(n, dtype=np.int64)
        rows.flags.writeable = False
        if len(_IDENTITY) < 1024:
            _IDENTITY[n] = rows
    return rows


@numba.njit(cache=True, nogil=True)
def _dense_positions(source: np.ndarray, query: np.ndarray) -> tuple[bool, np.ndarray]:
    """`positions` through a table indexed by id, one pass each way (the ids a runtime gives are
    its table rows: dense); (False, ...) where the ids are not (negative, or spread wide)."""
    out = np.full(query.size, -1, dtype=np.int64)
    low, top = 0, -1
    for i in range(source.size):
        low = min(low, source[i])
        top = max(top, source[i])
    if low < 0 or top >= 8 * source.size + 4096:
        return False, out
    table = np.full(top + 1, -1, dtype=np.int64)
    for i in range(source.size):
        table[source[i]] = i  # (a repeated id: its last place)
    for j in range(query.size):
        q = query[j]
        if 0 <= q <= top:
            out[j] = table[q]
    return True, out


def positions(source: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Index of each `query` id in `source` (-1 where absent), in O(n) for dense ids."""
    if source.size == 0 or query.size == 0:
        return np.full(query.size, -1, dtype=np.int64)
    dense, out = _dense_positions(source, query)
    if dense:
        return out
    order = np.argsort(source, kind="stable")
    sorted_ids = source[order]
    at = np.minimum(np.searchsorted(sorted_ids, query), sorted_ids.size - 1)
    return np.where(sorted_ids[at] == query, order[at], -1)


class Served(NamedTuple):
    """One scheduled set's service (`Step.served`): its queue, rows in it, ids, and tokens."""

    queue: SSAValue  # the req.queue result the requests belong to
    at: np.ndarray  # their rows in that queue's columns
    ids: np.ndarray
    prefill: np.ndarray  # prompt tokens computed this step, per request
    decode: np.ndarray  # generated-token positions computed this step, per request


T = TypeVar("T")


class Usage:
    """What the decisions so far consume of the step's budgets (a plain class: built every pass)."""

    __slots__ = ("_scheduled", "blocks_given", "blocks_taken", "evicted", "seqs", "tokens")

    def __init__(self, tokens: int, seqs: int, blocks_taken: int, blocks_given: int, evicted: int,
                 scheduled: list[np.ndarray]) -> None:
        self.tokens = tokens  # tokens scheduled
        self.seqs = seqs  # requests scheduled
        self.blocks_taken = blocks_taken  # blocks leaving the free pool (alloc, revived shares, swap-in)
        self.blocks_given = blocks_given  # blocks returning to it (free, swap-out)
        self.evicted = evicted  # cached-free blocks whose content was dropped
        self._scheduled = scheduled

    @property
    def scheduled_ids(self) -> np.ndarray:
        """Every request scheduled so far, in batch order."""
        if not self._scheduled:
            return EMPTY
        return self._scheduled[0] if len(self._scheduled) == 1 else np.concatenate(self._scheduled)

    def free_left(self, facts: StepFacts) -> int:
        return facts.free_blocks + self.blocks_given - self.blocks_taken


class LiveFacts:
    """The facts a view's passes have established so far, and when they reach its IR: a view
    keeps them as `_fact_set` and writes them with `write_facts` (the pass manager's protocol;
    `Step`, `RouteStep`)."""

    _fact_set: frozenset[str] | None

    def set_facts(self, facts: frozenset[str], *, write: bool = True) -> None:
        """Record the live facts; with `write=False` the IR is updated later by `write_facts`."""
        self._fact_set = facts
        if write:
            self.write_facts()

    def write_facts(self) -> None:
        raise NotImplementedError


class Step(LiveFacts):
    """Read and extend one `sched.step` op."""

    def __init__(self, op: StepOp) -> None:
        self.op = op
        region = op.regions[0] if op.regions else None
        block = region._first_block if region is not None else None
        # `op.body.block` (an IRDL descriptor and a property, ~0.7 µs) checks the same
        self.block: Block = block if block is not None and block is region._last_block else op.body.block
        self._facts: StepFacts | None = None
        self._fact_set: frozenset[str] | None = None
        # Keyed by id(value): hashing an xDSL SSAValue costs microseconds (it is not an identity hash).
        self._roots: dict[int, QueueOp] = {}
        self._rows: dict[int, tuple[ColumnsAttr, np.ndarray]] = {}
        # Answers derived from the step (`analysis`: pending sets, state, usage, ...), valid while
        # `_edits` is unchanged: every op a pass adds goes through `append` (or `ensure_state`),
        # which counts; a pass that rewrites ops another way calls `forget`. Several passes of a
        # pipeline ask for the same queues and state.
        self._edits = 0
        self._analyses: dict[object, tuple[int, object]] = {}

    # ------------------------------------------------------------ facts
    @property
    def facts(self) -> StepFacts:
        if self._facts is None:
            self._facts = self.op.read_facts()
        return self._facts

    @property
    def fact_set(self) -> frozenset[str]:
        """Analysis facts established so far (`sched.step`'s `facts`)."""
        if self._fact_set is None:
            attr = self.op.properties.get("facts")
            known = _FACT_SETS.get(id(attr))
            if known is not None and known[0] is attr:  # the facts array repeats (cached attributes)
                self._fact_set = known[1]
            else:
                self._fact_set = self.op.fact_set()
                if attr is not None and len(_FACT_SETS) < 4096:
                    _FACT_SETS[id(attr)] = (attr, self._fact_set)  # holds attr: its id stays unique
        return self._fact_set

    def set_token_budget(self, tokens: int) -> None:
        """Lower (or set) the step's `token_budget` fact for the passes after this one."""
        self.op.properties["token_budget"] = i64_attr(int(tokens))
        self.op._built = None  # read_facts' cache keys on other properties
        self._facts = None

    def has_fact(self, fact: str) -> bool:
        return fact in self.fact_set

    def write_facts(self) -> None:
        if self._fact_set is not None:
            self.op.facts = facts_attr(self._fact_set)

    # ------------------------------------------------------------ finding ops
    def ensure_state(self, scheduler: dict[str, float | np.ndarray], requests: dict[str, int]) -> None:
        """Give the step every declared state it lacks, at its default: a `sched.state` listing
        the `scheduler` values, and the `requests` columns on each `req.queue` (a hand-written or
        older step run by a pipeline that declares state). A runtime-built step has them all."""
        if requests:
            for queue in self.queues():
                cols = queue.properties["columns"]
                missing = [k for k in requests if not cols.has(k)]  # type: ignore[attr-defined]
                if missing:
                    n = len(cols)
                    self._edits += 1
                    queue.properties["columns"] = ColumnsAttr.of(
                        {**cols.as_dict(), **{k: np.full(n, requests[k], dtype=np.int64) for k in missing}})  # type: ignore[attr-defined]
                    self.forget()
        if not scheduler:
            return
        present: dict[str, float | np.ndarray] = {}
        existing = None
        for op in self.ops_of(StateOp):
            existing = op
            present.update(op.as_dict())  # type: ignore[attr-defined]
        missing_values = {k: v for k, v in scheduler.items() if k not in present}
        if not missing_values:
            return
        self._edits += 1
        if existing is not None:
            existing.properties["values"] = state_values_attr({**present, **missing_values})
            return
        op = new_op(StateOp, (), {"values": state_values_attr(missing_values)})
        first = self.block.first_op
        if first is None:
            self.block.add_op(op)
        else:
            self.block.insert_op_before(op, first)

    def ops(self) -> Iterator[Operation]:
        return iter(self.block.ops)

    def ops_of(self, *kinds: type[Operation]) -> list[Operation]:
        """The step's ops of these exact kinds, in order (a linked-list walk: the hot path)."""
        found: list[Operation] = []
        op = self.block.first_op
        while op is not None:
            if type(op) in kinds:
                found.append(op)
            op = op._next_op
        return found

    @property
    def terminator(self) -> YieldOp:
        last = self.block._last_op
        if type(last) is not YieldOp:
            raise ValueError("a sched.step block must end with sched.yield")
        return last  # type: ignore[return-value]

    def queue(self, name: str) -> QueueOp | None:
        for op in self.ops_of(QueueOp):
            if op.queue.data == name:  # type: ignore[attr-defined]
                return op  # type: ignore[return-value]
        return None

    def queues(self) -> list[QueueOp]:
        return self.ops_of(QueueOp)  # type: ignore[return-value]

    def root(self, value: SSAValue) -> QueueOp:
        """The `req.queue` a set value was derived from."""
        found = self._roots.get(id(value))
        if found is None:
            found = self._roots[id(value)] = root_queue(value)
        return found

    def pending(self, queue: str) -> SSAValue | None:
        """The set of `queue` requests not yet decided on; None if the step has no such
        queue, or every request of it has been decided (an empty set included).

        It is the last `req.queue` / `req.sort` / `req.select` result rooted in the queue,
        unless decisions (schedule, defer, reject, preempt) took it over: a pass that decides
        on part of a set leaves the rest pending with `Step.keep` (a `req.select`).
        """
        return self.analysis(("pending", queue), lambda: self._find_pending(queue))

    def _find_pending(self, queue: str) -> SSAValue | None:
        current: SSAValue | None = None
        decided: list[Operation] = []
        op = self.block.first_op
        while op is not None:
            kind = type(op)
            if kind is QueueOp:
                if op.properties["queue"].data == queue:  # type: ignore[attr-defined]
                    current = _item(op.results, 0)
                    decided = []
            elif current is not None and op._operands and _item(op._operands, 0) is current:
                if kind is SortOp or kind is SelectOp:
                    current = _item(op.results, 0)
                    decided = []
                elif kind in _OUTCOME_KINDS:
                    decided.append(op)
            op = op._next_op
        if current is None:
            return None
        if not decided:
            # An empty set is decided already (vacuously): passes skip it without emitting ops.
            return current if len(current.owner.properties["columns"]) else None  # type: ignore[union-attr]
        ids = self.ids(current)
        rest = ids[~np.isin(ids, np.concatenate([d.ids for d in decided]))]  # type: ignore[attr-defined]
        if rest.size:
            raise ValueError(
                f"requests {rest[:10].tolist()} of queue '{queue}' were left undecided beside decisions "
                "on the same set; a pass that decides on part of a set must keep the rest (Step.keep)"
            )
        return None

    # ------------------------------------------------------------ columns
    @staticmethod
    def ids(value: SSAValue) -> np.ndarray:
        owner = value.owner
        assert isinstance(owner, ColumnOpMixin)
        return owner.ids

    def rows(self, value: SSAValue) -> np.ndarray | None:
        """Where each request of `value` sits in its queue's columns (None: it is the queue)."""
        root = self.root(value)
        if value is _item(root.results, 0):
            return None
        owner = value.owner
        cached = self._rows.get(id(value))
        if cached is not None and cached[0] is owner.properties["columns"]:  # type: ignore[union-attr]
            return cached[1]
        rows = positions(root.ids, self.ids(value))
        self._rows[id(value)] = (owner.properties["columns"], rows)  # type: ignore[union-attr]
        return rows

    def source(self, value: SSAValue) -> tuple[ColumnsAttr, np.ndarray]:
        """The queue columns `value` draws from, and its rows in them (for kernels that
        index themselves instead of paying one numpy gather per column)."""
        root = self.root(value)
        rows = self.rows(value)
        if rows is None:
            rows = identity_rows(len(root))
        return root.properties["columns"], rows

    def _derive_rows(self, parent: SSAValue, child: SSAValue, picked: np.ndarray | None) -> None:
        """Remember a derived set's rows from the parent's (`picked`: indices into the parent)."""
        if picked is None:
            return
        parent_rows = self.rows(parent)
        rows = picked if parent_rows is None else parent_rows[picked]
        self._rows[id(child)] = (child.owner.properties["columns"], rows)  # type: ignore[union-attr]

    def column(self, value: SSAValue, name: str) -> np.ndarray:
        """A queue column for the requests of `value`, in `value`'s order."""
        source = self.root(value).properties["columns"].get(name)
        rows = self.rows(value)
        return source if rows is None else source[rows]

    def columns(self, value: SSAValue, names: Sequence[str]) -> list[np.ndarray]:
        root = self.root(value)
        rows = self.rows(value)
        cols = root.properties["columns"]
        if rows is None:
            return [cols.get(n) for n in names]
        return [cols.get(n)[rows] for n in names]

    def decision_column(self, kind: type[ColumnOpMixin], name: str, ids: np.ndarray) -> np.ndarray:
        """`name` summed over every `kind` op (e.g. AllocOp 'blocks'), aligned with `ids`; 0 where none."""
        out = np.zeros(ids.size, dtype=np.int64)
        for op in self.ops_of(kind):
            if len(op):
                at = positions(op.ids, ids)  # type: ignore[attr-defined]
                found = at >= 0
                out[found] += op.col(name)[at[found]]  # type: ignore[attr-defined]
        return out

    def _pool(self):  # noqa: ANN202
        """The step's `mem.pool` pool (either kind), None when the step carries none."""
        op = self.block.first_op
        while op is not None:
            if type(op) is PoolOp:
                return op.pool()  # type: ignore[attr-defined]
            op = op._next_op
        return None

    def cached_tokens(self, value: SSAValue) -> np.ndarray:
        """How many tokens of each request of `value` the prefix cache holds, whichever cache it
        is: the step's `mem.match` answers (the runtime's, for count-level pipelines), else the
        step's KV pool (vLLM's block hashes or SGLang's radix tree), asked without side effects."""
        return self.prefix_hits(value)[0]

    def prefix_hits(self, value: SSAValue) -> tuple[np.ndarray, np.ndarray]:
        """Cached prefix tokens per request of `value` (`mem.match` `hit`, else the step's pool:
        see `cached_tokens`) and how many of those blocks sit in the free queue (`cached_free`,
        from `mem.match` only), aligned with `value`; zeros where none."""
        hit, cached_free, rows = self.prefix_hit_source(value)
        if hit.size == 0:
            n = len(self.ids(value))
            return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        return hit[rows], cached_free[rows]

    def prefix_hit_source(self, value: SSAValue) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(hit, cached_free, rows): request i of `value` has `hit[rows[i]]`. Three empty
        arrays when the step has no `mem.match` (no allocation on the common path)."""
        matches = self.ops_of(MatchOp)
        if not matches:
            pool = self._pool()
            if pool is None:
                return EMPTY, EMPTY, EMPTY
            # No match op, but the step carries its KV pool: ask it (either kind answers)
            ids = self.ids(value)
            hit = pool.cached_tokens(ids, self.column(value, "total"))
            return hit, np.zeros(ids.size, dtype=np.int64), np.arange(ids.size, dtype=np.int64)
        root = self.root(value)
        if len(matches) == 1 and matches[0]._operands[0] is root.results[0]:
            match = matches[0]
            if match.properties["columns"].raw("id") == root.properties["columns"].raw("id"):
                # The builder's layout: hits over the whole queue, in queue order.
                cols = match.properties["columns"]
                hit = cols.get("hit")
                _, rows = self.source(value)
                return hit, cols.get_or("cached_free", np.zeros(hit.size, dtype=np.int64)), rows
        ids = self.ids(value)
        hit = np.zeros(ids.size, dtype=np.int64)
        cached_free = np.zeros(ids.size, dtype=np.int64)
        for op in matches:
            if len(op):
                at = positions(op.ids, ids)  # type: ignore[attr-defined]
                found = at >= 0
                hit[found] = op.col("hit")[at[found]]  # type: ignore[attr-defined]
                if op.columns.has("cached_free"):  # type: ignore[attr-defined]
                    cached_free[found] = op.col("cached_free")[at[found]]  # type: ignore[attr-defined]
        return hit, cached_free, np.arange(ids.size, dtype=np.int64)

    # ------------------------------------------------------------ pass-declared state (schedir.ir.state)
    def state(self, name: str, default: float | np.ndarray | None = None) -> float | np.ndarray:
        """Scheduler-level state `name` as this step sees it: the last `sched.set_state` so far,
        else the step's `sched.state`; `default` when the step carries neither (a hand-written
        step), else an error."""
        found: float | np.ndarray | None = None
        op = self.block.first_op
        while op is not None:
            kind = type(op)
            if kind is StateOp or kind is SetStateOp:
                value = decoded_state_value(op.properties["values"], name)  # type: ignore[arg-type]
                if value is not None:
                    found = value
            op = op._next_op
        if found is not None:
            return found
        if default is None:
            raise ValueError(f"the step has no scheduler state '{name}' (the runtime lists the state its "
                             "pipeline declares in a sched.state op)")
        return default

    def analysis(self, key: object, compute: Callable[[], T]) -> T:
        """What `compute()` derives from the step as it stands, computed once per edit of the
        step (MLIR's analysis cache): passes that each ask the same question of an unchanged
        step (SGLang's admission gate, asked by the order and the admission pass) share the
        answer. `key` must name everything `compute` reads besides the step."""
        known = self._analyses.get(key)
        if known is not None and known[0] == self._edits:
            return known[1]  # type: ignore[return-value]
        value = compute()
        self._analyses[key] = (self._edits, value)
        return value

    def states(self) -> dict[str, float | np.ndarray]:
        """Every scheduler-level value as this step sees it now (one walk over the step: for a
        pass that reads several), later `sched.set_state` values over earlier ones."""
        values, vectors = self.analysis("states", self._find_states)
        if vectors:  # each caller gets its own copy (a pass may update one in place)
            return {k: v.copy() if type(v) is np.ndarray else v for k, v in values.items()}
        return dict(values)

    def _find_states(self) -> tuple[dict[str, float | np.ndarray], bool]:
        out: dict[str, float | np.ndarray] = {}
        op = self.block.first_op
        while op is not None:
            kind = type(op)
            if kind is StateOp or kind is SetStateOp:
                out.update(decoded_state_values(op.properties["values"]))  # type: ignore[arg-type]
            op = op._next_op
        return out, any(type(v) is np.ndarray for v in out.values())

    def set_state(self, **values: float | np.ndarray) -> None:
        """New scheduler-level values, kept from the next step on (a `sched.set_state`; the pass
        manager gives a step without `sched.state` one with the declared defaults)."""
        if values:
            self.append(new_op(SetStateOp, (), {"values": state_values_attr(values)}))

    def state_column(self, value: SSAValue, name: str, default: int) -> np.ndarray:
        """Declared request state `name` for the requests of `value`, as of this point in the
        step: the queue's column with every earlier `req.set_state` of it applied (a pass that
        updates state sees the new values in the passes after it); `default` where the queue
        does not carry the column (a hand-written step)."""
        root = self.root(value)
        if root.properties["columns"].has(name):  # type: ignore[union-attr]
            out = self.column(value, name)
        else:
            out = np.full(len(self.ids(value)), default, dtype=np.int64)
        ids = None
        op = self.block.first_op
        while op is not None:
            if type(op) is ReqSetStateOp:
                cols = op.properties["columns"]
                if cols.has(name) and self.root(_item(op._operands, 0)) is root:  # type: ignore[union-attr]
                    if ids is None:
                        ids = self.ids(value)
                        out = out.copy()
                    at = positions(ids, cols.get("id"))  # type: ignore[union-attr]
                    found = at >= 0
                    out[at[found]] = cols.get(name)[found]  # type: ignore[union-attr]
            op = op._next_op
        return out

    def set_request_state(self, value: SSAValue, ids: np.ndarray, **columns: np.ndarray) -> None:
        """New values of declared request state for `ids` (a `req.set_state`), kept from the next
        step on; the column must be in the queue `value` derives from."""
        if ids.size and columns:
            self._over(ReqSetStateOp, value, {"id": ids, **columns})

    # ------------------------------------------------------------ budgets
    def usage(self) -> Usage:
        """Budgets consumed by the decisions so far (a walk over the step's few ops, once per
        edit of the step: several passes ask)."""
        return self.analysis("usage", self._find_usage)

    def _find_usage(self) -> Usage:
        tokens = seqs = taken = given = evicted = 0
        scheduled: list[np.ndarray] = []
        op = self.block.first_op
        while op is not None:
            kind = type(op)
            if kind is ScheduleOp:
                t = op.col("tokens")  # type: ignore[attr-defined]
                tokens += int(t.sum())
                seqs += t.size
                scheduled.append(op.ids)  # type: ignore[attr-defined]
            elif kind is AllocOp or kind is SwapInOp or kind is CopyOp:
                taken += int(op.col("blocks").sum())  # type: ignore[attr-defined]
            elif kind is ShareOp:
                if op.columns.has("revived"):  # type: ignore[attr-defined]
                    taken += int(op.col("revived").sum())  # type: ignore[attr-defined]
            elif kind is FreeOp or kind is SwapOutOp:
                given += int(op.col("blocks").sum())  # type: ignore[attr-defined]
            elif kind is EvictOp:
                evicted += op.count  # type: ignore[attr-defined]
            op = op._next_op
        return Usage(tokens, seqs, taken, given, evicted, scheduled)

    def served(self) -> Iterator[Served]:
        """This step's service so far, one `Served` per non-empty `req.schedule`: the tokens of
        each scheduled chunk below its prompt's end count as prefill, the rest as decode (what
        passes that charge service, such as `mlfq-account` and `vtc-account`, account for)."""
        for op in self.ops_of(ScheduleOp):
            ids = op.ids  # type: ignore[attr-defined]
            if not ids.size:
                continue
            tokens = op.col("tokens")  # type: ignore[attr-defined]
            root = _item(self.root(_item(op._operands, 0)).results, 0)
            at = positions(self.ids(root), ids)
            computed = self.column(root, "computed")[at]
            prefill = np.maximum(np.minimum(computed + tokens, self.column(root, "prompt")[at]) - computed, 0)
            yield Served(root, at, ids, prefill, tokens - prefill)

    def forget(self) -> None:
        """Drop cached row maps (after rewriting ops this view already read)."""
        self._rows.clear()
        self._edits += 1
        self._roots.clear()

    # ------------------------------------------------------------ appending decisions
    def append(self, op: Operation) -> Operation:
        """Add an op before `sched.yield` (a fresh op from `new_op`: linked without checks)."""
        self._edits += 1
        if op.parent is not None or op.regions:
            self.block.insert_op_before(op, self.terminator)
        else:
            insert_before(self.block, op, self.terminator)
        return op

    def _over(self, kind: type[Operation], value: SSAValue, cols: dict[str, np.ndarray], **props) -> Operation:
        props["columns"] = ColumnsAttr.of(cols)
        return self.append(new_op(kind, (value,), props, _result_types(kind)))

    def sort(self, value: SSAValue, keys: Sequence[str], order: np.ndarray, *, picked: np.ndarray | None = None) -> SSAValue:
        """Reorder `value`; `order` is the new id order (a permutation of its ids).
        `picked` (optional) gives the same order as indices into `value`, which saves a lookup."""
        key = tuple(keys)
        by = _KEYS.get(key)
        if by is None:
            by = _KEYS[key] = ArrayAttr([StringAttr(k) for k in key])
        result = _item(self._over(SortOp, value, {"id": order}, by=by).results, 0)
        self._derive_rows(value, result, picked)
        return result

    def keep(self, value: SSAValue, ids: np.ndarray, *, picked: np.ndarray | None = None) -> SSAValue:
        """The part of `value` still pending after a decision (a `req.select`)."""
        result = _item(self._over(SelectOp, value, {"id": ids}).results, 0)
        self._derive_rows(value, result, picked)
        return result

    def schedule(self, value: SSAValue, phase: str, ids: np.ndarray, tokens: np.ndarray) -> SSAValue:
        """Run `ids` with `tokens` each; the result joins the batch (`sched.yield`) in order."""
        result = _item(self._over(ScheduleOp, value, {"id": ids, "tokens": tokens}, phase=_PHASES[phase]).results, 0)
        append_operand(self.terminator, result)
        return result

    def defer(self, value: SSAValue, ids: np.ndarray, reasons: np.ndarray) -> None:
        if ids.size:
            self._over(DeferOp, value, {"id": ids, "reason": reasons})

    def reject(self, value: SSAValue, ids: np.ndarray, reasons: np.ndarray) -> None:
        if ids.size:
            self._over(RejectOp, value, {"id": ids, "reason": reasons})

    def preempt(self, value: SSAValue, mode: str, ids: np.ndarray) -> SSAValue | None:
        """Preempt `ids` (None when there are none, like the other decisions)."""
        if not ids.size:
            return None
        return self._over(PreemptOp, value, {"id": ids}, mode=_MODES[mode]).results[0]

    def blocks(self, kind: type[Operation], value: SSAValue, ids: np.ndarray, blocks: np.ndarray, **extra: np.ndarray) -> None:
        """A block effect (`mem.alloc`, `mem.free`, `mem.share`, ...) for the requests that have one."""
        if ids.size:
            self._over(kind, value, {"id": ids, "blocks": blocks, **extra})

    def match(self, value: SSAValue, ids: np.ndarray, hit: np.ndarray) -> None:
        """Record the prefix-cache hit tokens a pass counted as computed (`mem.match`)."""
        if ids.size:
            self._over(MatchOp, value, {"id": ids, "hit": hit})

    def evict(self, count: int) -> None:
        if count:
            self.append(new_op(EvictOp, (), {"blocks": i64_attr(count)}))


_OUTCOME_KINDS = frozenset({ScheduleOp, DeferOp, RejectOp, PreemptOp})
_RESULT_TYPES: dict[type[Operation], tuple[RequestSetType, ...]] = {}


def _result_types(kind: type[Operation]) -> tuple[RequestSetType, ...]:
    types = _RESULT_TYPES.get(kind)
    if types is None:
        count = len(kind.get_irdl_definition().results)  # type: ignore[attr-defined]
        types = _RESULT_TYPES[kind] = (SET,) * count
    return types


def steps_of(module: Operation) -> list[StepOp]:
    """The `sched.step` ops at the top of a module (a linked-list walk: run every step)."""
    found: list[StepOp] = []
    op = module.regions[0].block.first_op
    while op is not None:
        if isinstance(op, StepOp):
            found.append(op)
        op = op._next_op
    return found


def pool_of(step: Step) -> KVPool:
    """The KV pool a pool-level pass decides against (the step's `mem.pool`)."""
    pool = step._pool()
    if pool is not None:
        return pool
    raise ValueError("this pass decides against the KV pool, but the step has no mem.pool op "
                     "(build the step with the runtime's pool, or load a dump that has one)")
