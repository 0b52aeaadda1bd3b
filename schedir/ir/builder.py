"""Build a step IR from column arrays: the fast path an engine's runtime uses every step.

Measured levers (DESIGN.md): `Op.create` with cached attribute objects, columns
from `ndarray.tobytes()`, no verification here (the pass manager verifies in
debug mode).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import numpy as np
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import OpResult

from schedir.dialects.base import SET
from schedir.dialects.columns import ColumnsAttr
from schedir.dialects.mem import MatchOp
from schedir.dialects.pool import PoolOp
from schedir.dialects.req import QueueOp
from schedir.dialects.sched import StateOp, StepFacts, StepOp, YieldOp, state_values_attr
from schedir.ir.fastop import clear_decisions, new_op, region_of
from schedir.lowering.kv_pool import KVPool

Columns = Mapping[str, np.ndarray]
_QUEUE_NAMES: dict[str, StringAttr] = {}
_ONE_SET = (SET,)
_SSA_NAMES: dict[str, str | None] = {}


def queue_op(name: str, columns: Columns | ColumnsAttr) -> QueueOp:
    attr = _QUEUE_NAMES.get(name)
    if attr is None:
        attr = _QUEUE_NAMES[name] = StringAttr(name)
    cols = columns if type(columns) is ColumnsAttr else ColumnsAttr.of(columns)  # type: ignore[arg-type]
    op = new_op(QueueOp, (), {"queue": attr, "columns": cols}, _ONE_SET)
    hint = _SSA_NAMES.get(name, False)
    if hint is False:  # xDSL's name_hint setter runs a regex: do it once per queue name
        hint = _SSA_NAMES[name] = OpResult.extract_valid_name(name) if name.isascii() and name.isidentifier() else None
    op.results[0]._name = hint
    return op


def build_step(
    facts: StepFacts,
    queues: Mapping[str, Columns | ColumnsAttr],
    hits: Mapping[str, Columns] | None = None,
    pool: KVPool | None = None,
    state: Mapping[str, float] | None = None,
) -> ModuleOp:
    """A module with one `sched.step`: a `req.queue` per entry of `queues` (in order; a
    queue's columns are arrays by name, or a ready `ColumnsAttr`),
    and a `mem.match` per entry of `hits` (queue name -> `id`, `hit` and optionally
    `cached_free` columns). With hits, the step records the `prefix-hits` fact.
    With `pool`, the step carries it (`mem.pool`, first op) and records `kv-pool`. With `state`
    (scheduler-level state its pipeline declares), a `sched.state` op lists it."""
    ops: list = [PoolOp.of(pool)] if pool is not None else []
    if state:
        ops.append(new_op(StateOp, (), {"values": state_values_attr(state)}))
    by_name: dict[str, QueueOp] = {}
    for name, columns in queues.items():
        op = queue_op(name, columns)
        by_name[name] = op
        ops.append(op)
    for name, columns in (hits or {}).items():
        source = by_name.get(name)
        if source is None:
            raise KeyError(f"prefix hits given for queue '{name}', which the step does not have")
        ops.append(new_op(MatchOp, (source.result,), {"columns": ColumnsAttr.of(columns)}))
    ops.append(new_op(YieldOp, (), {}))
    if hits and "prefix-hits" not in facts.facts:  # the step now carries the cache's answer
        facts = attrs.evolve(facts, facts=(*facts.facts, "prefix-hits"))
    pool_fact = getattr(pool, "fact", "kv-pool")
    if pool is not None and pool_fact not in facts.facts:
        facts = attrs.evolve(facts, facts=(*facts.facts, pool_fact))
    step = StepOp.build(facts, ops)
    return new_op(ModuleOp, (), {}, (), (region_of((step,)),))


class RecycledStep:
    """A step IR whose skeleton ops are reused from one step to the next (the runtime's hot path).

    `build_step` creates a module, a step, the pool and queue ops and the terminator every
    step, and each step's IR is then freed: ~20 µs of object churn per step at any load.
    This keeps one such skeleton and, for each step, writes the new facts and queue
    columns into it and unlinks the ops the previous step's passes appended. The IR a
    pipeline sees is the same as a fresh `build_step` would give (tested). The previous
    step's IR is gone after `refill`, so anyone keeping a step's IR (dumps, `keep_ir`)
    builds fresh instead. If a pass rewrote the skeleton itself (replaced a queue op, say),
    `refill` says so and the caller starts a new skeleton.
    """

    def __init__(self, facts: StepFacts, queues: Mapping[str, ColumnsAttr], pool: KVPool | None,
                 state: Mapping[str, float] | None = None, hits: Mapping[str, Columns] | None = None) -> None:
        self.module = build_step(facts, queues, hits, pool=pool, state=state)
        self.step_op: StepOp = self.module.regions[0].block.first_op  # type: ignore[assignment]
        self.block = self.step_op.regions[0].block
        ops = []
        op = self.block.first_op
        while op is not None:
            ops.append(op)
            op = op._next_op
        self.base: tuple = tuple(ops[:-1])
        self.terminator: YieldOp = ops[-1]
        self.queue_ops = {op.queue.data: op for op in self.base if type(op) is QueueOp}
        self.names = tuple(queues)
        self.facts_in = facts.facts
        self.pool_op: PoolOp | None = self.base[0] if pool is not None else None  # type: ignore[assignment]
        self.state_op: StateOp | None = next((op for op in self.base if type(op) is StateOp), None)  # type: ignore[assignment]
        # mem.match per queue with prefix hits (count-level pipelines with prefix caching), in order
        self.hit_names = tuple(hits or ())
        self.match_ops = tuple(op for op in self.base if type(op) is MatchOp)
        # the facts build_step records for a step with hits (refill requires facts.facts == facts_in)
        self.hit_facts = (*facts.facts, "prefix-hits") if hits and "prefix-hits" not in facts.facts else None

    def refill(self, facts: StepFacts, queues: Mapping[str, ColumnsAttr], pool: KVPool | None,
               state: Mapping[str, float] | None = None, hits: Mapping[str, Columns] | None = None) -> ModuleOp | None:
        """This step's IR with `facts`, `queues`, `pool`, `state` and `hits` (the same queue
        names, in order, pool or none, state or none, prefix hits for the same queues, as at
        creation); None when the skeleton was rewritten or the inputs differ."""
        if (tuple(queues) != self.names or facts.facts != self.facts_in or (pool is None) != (self.pool_op is None)
                or (not state) != (self.state_op is None) or (tuple(hits) if hits else ()) != self.hit_names):
            return None
        if self.step_op.parent is not self.module.regions[0].block or not clear_decisions(self.block, self.base,
                                                                                         self.terminator):
            return None
        for name, op in self.queue_ops.items():
            op.properties = {"queue": op.properties["queue"], "columns": queues[name]}
        if hits:
            for name, op in zip(self.hit_names, self.match_ops, strict=True):
                op.properties = {"columns": ColumnsAttr.of(hits[name])}
            if self.hit_facts is not None:
                facts = attrs.evolve(facts, facts=self.hit_facts)
        if self.pool_op is not None:
            self.pool_op.properties = {"state": self.pool_op.properties["state"]}
            self.pool_op._live = pool
        if self.state_op is not None:
            self.state_op.properties = {"values": state_values_attr(state)}  # type: ignore[arg-type]
        self.step_op.attributes = {}
        self.step_op.set_facts(facts)
        return self.module
