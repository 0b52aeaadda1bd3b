"""Request state an array step writes (`ArrayStep.set_state`) goes into the table at once and is
put back where the step is not lowered: a pass that fails leaves the table as it found it."""

from __future__ import annotations

import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.ir.array_step import ArrayStep
from schedir.ir.errors import PassFailure
from schedir.passes.verify_step import VerifyStep


def _fastserve() -> Scheduler:
    cfg = SchedulerConfig(num_blocks=200, block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
                          max_model_len=200, pipeline="fastserve")
    s = Scheduler(cfg, clock=lambda: 0.0)
    for i in range(12):
        s.add_request(Request(f"r{i}", np.arange(1, 6 + 3 * i), max_tokens=4 + i % 5))
    return s


def test_a_failed_array_step_leaves_request_state_as_it_found_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step is first tried with verify-step failing: an array step fails after FastServe's
    passes wrote request state (levels, service), and the table's request state is then the one
    before it; the step taken again, without the failure, decides as a scheduler's that never
    failed (but for the step number the failed one took), step after step."""
    s, twin = _fastserve(), _fastserve()
    writes: list[int] = []
    real_set_state = ArrayStep.set_state

    def counted(self: ArrayStep, rows: np.ndarray, **columns: np.ndarray) -> None:
        writes.append(rows.size)
        real_set_state(self, rows, **columns)

    def fails(self: VerifyStep, step: ArrayStep) -> None:
        raise PassFailure(self.name, "injected")

    monkeypatch.setattr(ArrayStep, "set_state", counted)
    failed_after_writes = 0
    for _ in range(40):
        before = s.table.state.copy()
        writes.clear()
        out = None
        with monkeypatch.context() as m:
            m.setattr(VerifyStep, "run_arrays", fails)
            try:
                out = s.schedule()
            except PassFailure as e:
                assert "injected" in str(e)
                assert np.array_equal(s.table.state, before)
                failed_after_writes += bool(writes)
        if out is None:
            out = s.schedule()  # the same step again, verify-step as it is
            twin._step += 1  # (the failed one kept its number, as every step does: the next is the next)
        want = twin.schedule()
        assert out.req_ids == want.req_ids and out.num_scheduled_tokens == want.num_scheduled_tokens
        assert np.array_equal(s.table.state, twin.table.state)
        tokens = np.full(len(out.req_ids), 7, dtype=np.int64)
        s.update(out, tokens)
        twin.update(want, tokens)
    assert failed_after_writes > 0  # array steps wrote state before failing: the path is exercised
