"""What a lowered steady answer reads, laid out for one kernel call (`schedir.lowering.steady_program`).

A pass's `steady_state` reads the runtime's state through a `WindowContext`: the queues, a few
facts, whole-table views of queue columns and declared request state. Its lowered form reads
the same things as arrays: `D`, the request table's data (a row per queue column, a column
per request row), `ST`, its declared request state (a row per name), `NB`, each request's KV
blocks, the three queues, `sc`, the step's facts (`SC_*` below), and `SS`, the pipeline's
scheduler state that is a number (float64, a slot per name: vLLM v0's delay clock, its running
queue's next place). Which row of `D` or `ST`, which slot of `SS`, holds what the pass reads is
fixed when the program is built (`SteadyLayout`) and handed to the pass as numbers, with its
options.

A lowered answer has one signature, `f(D, ST, NB, running, waiting, swapped, sc, SS, o, order,
rows, w, m, over) -> int`: -1 when `steady_state` would answer None (the IR decides the step),
0 when it answers with no batch order and writes nothing, 1 when it wrote the batch order
(positions in `running`) into `order`, 2 when it wrote request state for the batch's rows into
`rows[w]`, `rows[w + 1]`, ... in the order of its `steady_lowered_writes` (a pass that writes
sometimes returns 0 the other times). What a pass wrote is what the passes after it read of
the batch's rows, as the IR shows a state write to the passes after it: `over[r]` is the row
of `rows` holding `ST[r]`'s values for the running requests (aligned with `running`), -1 where
no pass wrote it (`running_state` reads either). A pass writes scheduler state into its slot
of `SS`, where the passes after it read it, as they read a `sched.set_state` before them in the
IR; the runtime loads `SS` from its scheduler state before the call and writes every slot back
once the step was taken (an answer that leaves the step to the IR changes nothing).

`m` is the pass's memo (int64[MEMO_WIDTH]) over the requests that do not run: what its answer
reads of the waiting and swapped queues, summarised once (`m[MEMO_SET]` 0: not yet; the pass
sets it to 1 when it writes its summary). Nothing a steady step does changes those requests
(it writes the batch's rows only), so the memo is kept with the runtime's other answers over the
queued requests (`Scheduler._queued_answers`, as `WindowContext.queued`), while the waiting and
swapped queues are the same arrays and no other request's state was written (an IR step, an
arrival), and made again otherwise. A summary that depends on the step
(a starvation deadline) is kept as the step it changes at. With it a steady step's cost does not
grow with the queue (FastServe with 5,000 waiting: `python benchmarks/preset_step.py --waiting 5000`).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import numba
import numpy as np

# the step's facts in `sc`
SC_STEP, SC_MAX_SEQS, SC_FREE_BLOCKS, SC_BLOCK_SIZE, SC_HOST_FREE, SC_NOW_US, SC_TOKEN_BUDGET, SC_MAX_MODEL_LEN, \
    SC_OVERSIZED, SC_TOTAL_BLOCKS = range(10)  # SC_OVERSIZED: how many waiting requests reject-oversized's rule
#                                                refuses; SC_TOTAL_BLOCKS: the pool's usable blocks
# ... and what the runtime's steady step reads (`schedir.runtime.steady_kernel`): the steady token
# budget, the FCFS key of the next request put back in front, async scheduling, batch plans (0/1)
SC_STEADY_BUDGET, SC_FRONT, SC_ASYNC, SC_PLAN = range(10, 14)
SC_SIZE = 14
ASK_IR, ANSWERED, ORDERED, WROTE = -1, 0, 1, 2  # what a lowered answer returns
MEMO_WIDTH = 4  # a pass's memo: m[MEMO_SET] (0: empty), then its summary in m[1:]
MEMO_SET = 0


@attrs.frozen
class SteadyLayout:
    """Where the runtime keeps what a lowered answer reads: a queue column's row of `D`, a declared
    request state's row of `ST`, a scheduler state's slot of `SS` (numbers only: a pass whose
    options name another state does not lower)."""

    columns: Mapping[str, int]
    states: Mapping[str, int]
    scalars: Mapping[str, int] = attrs.field(factory=dict)
    policy: str = "fcfs"  # the configuration's queue policy (a pass whose answer depends on it)

    def scalar(self, name: str) -> int:
        return self.scalars[name]

    def column(self, name: str) -> int:
        return self.columns[name]

    def state(self, name: str) -> int:
        return self.states[name]


@numba.njit(cache=True, nogil=True)
def running_state(ST: np.ndarray, rows: np.ndarray, over: np.ndarray, r: int, running: np.ndarray) -> np.ndarray:
    """Declared request state `ST[r]` of the running requests (aligned with `running`) as this
    step's answers so far leave it: the row an earlier pass wrote (`rows[over[r]]`), else the
    table's values."""
    at = over[r]
    if at >= 0:
        return rows[at]
    row = ST[r]
    out = np.empty(running.size, dtype=np.int64)
    for k in range(running.size):
        out[k] = row[running[k]]
    return out


# a default answer's window rule (`window_steady_lowered`'s o[0]): the pass's waiting window in a
# steady step is nobody; the requests flagged oversized (reject-oversized); nobody while every
# sequence slot is taken (`WindowContext.nobody_while_seats_stay_taken`: admit-greedy); the whole
# queue (options pointing elsewhere: the IR decides whenever anybody waits)
WINDOW_NOBODY, WINDOW_OVERSIZED, WINDOW_SEATS, WINDOW_QUEUE = range(4)


@numba.njit(cache=True, nogil=True)
def window_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, order, rows, w, m, over) -> int:  # noqa: ANN001
    """The default steady answer (`StepPass.steady_state`: nothing written while nobody waits or the
    pass's waiting window is empty, else the IR) for a pass whose window follows rule `o[0]`, as the
    WindowContext's helpers answer in a steady step (the running requests' blocks fit then, by the
    step's own test, so seats stay taken exactly when every one is)."""
    rule = int(o[0])
    if waiting.size == 0 or rule == WINDOW_NOBODY:
        return ANSWERED
    if rule == WINDOW_OVERSIZED:
        return ANSWERED if sc[SC_OVERSIZED] == 0 else ASK_IR
    if rule == WINDOW_SEATS:
        return ANSWERED if running.size >= sc[SC_MAX_SEQS] else ASK_IR
    return ASK_IR


def windows_empty(rules: frozenset[int], running: int, max_seqs: int, oversized: int) -> bool:
    """`window_steady_lowered` over a pipeline whose every pass keeps the default answer, with
    requests waiting, in Python: whether each window `rules` names is empty in a steady step
    (the runtime then takes the plain steady step, `Scheduler._steady_step`, which checks the
    step is steady: the running requests' blocks fit, so seats stay taken exactly when every
    one is). One test against the kernel keeps the two the same rule."""
    if WINDOW_QUEUE in rules or (WINDOW_OVERSIZED in rules and oversized):
        return False
    return WINDOW_SEATS not in rules or running >= max_seqs
