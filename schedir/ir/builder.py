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
from schedir.dialects.sched import StepFacts, StepOp, YieldOp
from schedir.ir.fastop import new_op, region_of
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
) -> ModuleOp:
    """A module with one `sched.step`: a `req.queue` per entry of `queues` (in order; a
    queue's columns are arrays by name, or a ready `ColumnsAttr`),
    and a `mem.match` per entry of `hits` (queue name -> `id`, `hit` and optionally
    `cached_free` columns). With hits, the step records the `prefix-hits` fact.
    With `pool`, the step carries it (`mem.pool`, first op) and records `kv-pool`."""
    ops: list = [PoolOp.of(pool)] if pool is not None else []
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
    if pool is not None and "kv-pool" not in facts.facts:
        facts = attrs.evolve(facts, facts=(*facts.facts, "kv-pool"))
    step = StepOp.build(facts, ops)
    return new_op(ModuleOp, (), {}, (), (region_of((step,)),))
