"""mlfq-account: record the service each request got this step (FastServe's attained service)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.req import ScheduleOp
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step, positions
from schedir.passes.mlfq_state import LAST_RUN, MLFQ_STATE, SERVED_DECODE, SERVED_PREFILL


@dataclass(frozen=True)
class MlfqAccount(StepPass):
    """Add this step's tokens to each scheduled request's served prefill or decode tokens and
    restart its starvation clock; `mlfq-levels` turns service into demotions next step.

    A chunk that reaches past the prompt counts its prompt part as prefill, the rest as decode
    (a preempted request recomputing its generated tokens is served again: FastServe counts the
    time a job held the GPU). Runs after every scheduling pass.
    """

    name: ClassVar[str] = "mlfq-account"
    requires: ClassVar[frozenset[str]] = frozenset({"running-scheduled", "waiting-scheduled"})
    request_state = MLFQ_STATE

    def run(self, step: Step) -> None:
        for op in step.ops_of(ScheduleOp):
            ids = op.ids  # type: ignore[attr-defined]
            if not ids.size:
                continue
            tokens = op.col("tokens")  # type: ignore[attr-defined]
            root = step.root(op.operands[0]).results[0]
            at = positions(step.ids(root), ids)
            prompt = step.column(root, "prompt")[at]
            computed = step.column(root, "computed")[at]
            # the chunk's tokens below the prompt's end are prefill, the rest decode
            prefill_part = np.clip(np.minimum(computed + tokens, prompt) - computed, 0, None)
            prefill = step.state_column(root, SERVED_PREFILL.name, 0)[at] + prefill_part
            decode = step.state_column(root, SERVED_DECODE.name, 0)[at] + tokens - prefill_part
            step.set_request_state(root, ids, mlfq_prefill=prefill, mlfq_decode=decode,
                                   mlfq_last_run=np.full(ids.size, step.facts.step, dtype=np.int64))
