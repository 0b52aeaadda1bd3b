"""mlfq-account: record the service each request got this step (FastServe's attained service)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np

from schedir.ir.array_step import ArrayStep
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import SC_STEP, WROTE
from schedir.passes.mlfq_state import LAST_RUN, MLFQ_STATE, SERVED_DECODE, SERVED_PREFILL


@numba.njit(cache=True, nogil=True)
def _served_one(rows: np.ndarray, decode: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """(decode tokens served + 1, `step`) for `rows`, from the whole-table view of the served tokens."""
    served = np.empty(rows.size, dtype=np.int64)
    for i in range(rows.size):
        served[i] = decode[rows[i]] + 1
    return served, np.full(rows.size, step, dtype=np.int64)


@numba.njit(cache=True, nogil=True)
def account_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, order, rows, w, m, over) -> int:  # noqa: ANN001
    """`MlfqAccount.steady_state` in the steady program: the batch's rows' decode service and
    last run, into `rows[w]` and `rows[w + 1]`."""
    decode = ST[int(o[0])]
    for i in range(running.size):
        rows[w, i] = decode[running[i]] + 1
        rows[w + 1, i] = sc[SC_STEP]
    return WROTE


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

    # steady decode steps: each running request is served one decode token (`steady_state`)
    steady_when: ClassVar[dict[str, str]] = {}
    steady_swapped: ClassVar[bool] = True  # it accounts what ran: swapped jobs did not

    steady_lowered = staticmethod(account_steady_lowered)

    def waiting_window(self, ctx: WindowContext) -> np.ndarray:
        """Nobody of its own: it accounts what the step scheduled."""
        return ctx.NONE

    swapped_window = waiting_window
    steady_lowered_writes = (SERVED_DECODE.name, LAST_RUN.name)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (layout.state(SERVED_DECODE.name),)

    def steady_state(self, ctx: WindowContext) -> dict[str, np.ndarray]:
        """The batch's rows: one more decode token served, last run this step."""
        decode, last = _served_one(ctx.running, ctx.state_of(SERVED_DECODE.name), ctx.step)
        return {SERVED_DECODE.name: decode, LAST_RUN.name: last}

    array_step_when: ClassVar[dict[str, str]] = {}  # `run_arrays`: any options

    def run_arrays(self, step: ArrayStep) -> None:
        """`run` over an array step (`schedir.ir.array_step`)."""
        now = step.facts.step
        for got in step.served():
            prefill = step.state(SERVED_PREFILL.name)[got.rows] + got.prefill
            decode = step.state(SERVED_DECODE.name)[got.rows] + got.decode
            step.set_state(got.rows, mlfq_prefill=prefill, mlfq_decode=decode,
                           mlfq_last_run=np.full(got.rows.size, now, dtype=np.int64))

    def run(self, step: Step) -> None:
        now = step.facts.step
        for got in step.served():
            prefill = step.state_column(got.queue, SERVED_PREFILL.name, 0)[got.at] + got.prefill
            decode = step.state_column(got.queue, SERVED_DECODE.name, 0)[got.at] + got.decode
            step.set_request_state(got.queue, got.ids, mlfq_prefill=prefill, mlfq_decode=decode,
                                   mlfq_last_run=np.full(got.ids.size, now, dtype=np.int64))
