"""The Step view answers pending(), states(), usage() and analysis() once per edit of the step:
every answer must change as soon as a pass appends a decision, and never leak between callers."""

from __future__ import annotations

import numpy as np
from conftest import make_step

from schedir.dialects.sched import StateOp, state_values_attr
from schedir.ir.fastop import new_op
from schedir.ir.step import Step, steps_of


def _view(n_running: int = 2, n_waiting: int = 3) -> Step:
    return Step(steps_of(make_step(n_running, n_waiting))[0])


def test_pending_follows_decisions() -> None:
    step = _view()
    waiting = step.pending("waiting")
    assert step.pending("waiting") is waiting  # asked again: the same answer
    ids = step.ids(waiting)
    kept = step.keep(waiting, ids[1:], picked=np.arange(1, ids.size))
    assert step.pending("waiting") is kept  # the keep is an edit
    step.schedule(kept, "prefill", step.ids(kept), np.ones(ids.size - 1, dtype=np.int64))
    step.defer(waiting, ids[:0], np.zeros(0, dtype=np.int64))  # nothing deferred: no op, no edit
    assert step.pending("waiting") is None  # all of the kept set is decided


def test_usage_counts_each_new_schedule() -> None:
    step = _view()
    running = step.pending("running")
    assert step.usage().tokens == 0
    step.schedule(running, "decode", step.ids(running), np.ones(2, dtype=np.int64))
    assert (step.usage().tokens, step.usage().seqs) == (2, 2)


def test_states_see_later_writes_and_vectors_are_private() -> None:
    step = _view()
    step.block.insert_op_before(new_op(StateOp, (), {"values": state_values_attr(
        {"ratio": 0.5, "counters": np.array([1.0, 2.0])})}), step.block.first_op)
    step.forget()  # an op added by hand, not through append: the view is told
    first = step.states()
    assert first["ratio"] == 0.5
    first["counters"][0] = 99.0  # a pass updating its copy in place
    assert step.states()["counters"].tolist() == [1.0, 2.0]
    step.set_state(ratio=0.25)
    assert step.states()["ratio"] == 0.25


def test_analysis_is_recomputed_after_an_edit() -> None:
    step = _view()
    calls = []

    def count() -> int:
        calls.append(1)
        return len(calls)

    assert step.analysis("k", count) == 1
    assert step.analysis("k", count) == 1  # cached
    step.set_state(x=1.0)
    assert step.analysis("k", count) == 2
