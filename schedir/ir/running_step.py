"""A running step: a step whose waiting queue holds nobody a pass could admit, decided from arrays.

Most steps of a loaded engine admit nobody: the queue's head does not fit in the free blocks
(an overloaded replay keeps thousands waiting for hours) or the queue is empty, while the
running requests go on with their prefill chunks and decodes. Such a step's waiting queue,
after the runtime's admission window, is empty, and for a pipeline like vLLM's every pass but
the one that schedules the running queue then decides nothing. That pass may decide the step
itself, from the same arrays its IR run reads, without the IR being built (`StepPass.decide_running`);
the runtime settles the answer as it settles the IR's decisions. The IR's fixed cost (building,
running and reading ~10 ops, ~300 µs a step on an 8k-token prefill chunk) is what it saves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import numpy as np

if TYPE_CHECKING:
    from schedir.lowering.kv_pool import KVPool

_INDEX: dict[tuple[tuple[str, ...], tuple[str, ...]], np.ndarray] = {}


@attrs.define(eq=False)
class RunningStep:
    """What a pass reads to decide a running step alone: the running queue's columns as the
    step IR's `req.queue` would hold them, the step's facts that bound it, and the KV pool the
    step's `mem.pool` would name (the pass commits its block effects there, as its IR run does)."""

    columns: np.ndarray  # int64[len(names), n]: the running queue's step columns, in running order
    names: tuple[str, ...]  # the columns' names (`columns[k]` is `names[k]`)
    token_budget: int
    max_model_len: int
    policy: str  # the config's queue policy: "fcfs" or "priority"
    pool: KVPool

    def index(self, wanted: tuple[str, ...]) -> np.ndarray:
        """Rows of `columns` holding `wanted`, in that order (int64, cached per name tuple)."""
        key = (self.names, wanted)
        index = _INDEX.get(key)
        if index is None:
            index = _INDEX[key] = np.array([self.names.index(name) for name in wanted], dtype=np.int64)
        return index


@attrs.define(eq=False)
class RunningDecision:
    """A running step's decisions, as the IR's ops would hold them: `rows` scheduled for `tokens`
    (in batch order, `req.schedule`) and `preempted` by recompute (in preemption order, `req.preempt`).
    Ids are request-table rows, as in every queue column `id`."""

    rows: np.ndarray
    tokens: np.ndarray
    preempted: np.ndarray
