"""A lowered pipeline's steady decode step in one kernel call: its steady answers, then the step.

With a steady program (`schedir.lowering.steady_program`) the runtime asked the lowered answers
in one call and, when they let the step be steady, settled it in another (`steady_settle`),
with Python between them: a second dispatch of ~20 arrays, the answers' arrays boxed and read
back, the batch order applied. Here one call asks the answers into the program's buffers and,
when they answered, settles the batch in the order they gave. The request state the answers
write for the batch's rows is left in the program's buffers (`work`) and written by the
kernel once the step was taken, as the IR's `req.set_state` is applied after the step; the
scheduler state they write is left in `SS` for the runtime (`SteadyProgram.write_scalars`).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from schedir.lowering.kv_pool import NUM_FREE
from schedir.lowering.steady_layout import (
    SC_ASYNC,
    SC_BLOCK_SIZE,
    SC_FREE_BLOCKS,
    SC_FRONT,
    SC_MAX_MODEL_LEN,
    SC_PLAN,
    SC_STEADY_BUDGET,
)
from schedir.lowering.steady_program import run_steady
from schedir.runtime.kernels import steady_settle, write_state_row

ASKED_IR, NOT_STEADY, TAKEN = 0, -1, 1  # program_steady_settle's first result


@nb.njit(cache=True)
def program_steady_settle(plan, options, ST, swapped, sc, SS, memo, marks, work, running, data, ref, bhash, dup_next,
                          nxt, prv, meta, cache, table, nblk, ncached, rhash, nhash, tokens, waiting):
    """`run_steady` over the program's opcodes and buffers, then, when every answer let the step be
    steady, `steady_settle` for the batch in the order the answers gave (running order when none
    did; the caller finds it in `flags[1]` and `order`, as `SteadyProgram.ordered`): (TAKEN,
    per_request, sampled, tokens scheduled, query_start_loc, per_token, seq_lens, block_table);
    (ASKED_IR, ...) when an answer leaves the step to the IR, (NOT_STEADY, ...) when the running
    requests do not make a steady step (nothing changed either way but the answers' memo of the
    queued requests, which holds). The step's scalars are facts of `sc` (`SC_STEADY_BUDGET`,
    `SC_FRONT`, ...), not arguments, and the batch is not handed back: a call's cost grows ~0.12
    µs an argument and ~0.5 µs an array boxed."""
    sc[SC_FREE_BLOCKS] = meta[NUM_FREE]  # the pool's own count (the runtime fills the other facts)
    n = options.shape[0]  # the program's packed arrays and buffers (`SteadyProgram.buffers_for`)
    flags = marks[:2 + n]
    order = work[0]
    if not run_steady(plan[:n], options, plan[n:2 * n], plan[2 * n:], data, ST, nblk, running, waiting, swapped, sc,
                      SS, memo, flags, order, work[1], work[2:], marks[2 + n:]):
        return ASKED_IR, None, None, 0, None, None, None, None
    batch = running
    if flags[1]:
        batch = np.empty(running.size, dtype=np.int64)
        for k in range(running.size):
            batch[k] = running[order[k]]
    taken, per_request, sampled, scheduled, qsl, per_token, seq_lens, block_table = steady_settle(
        batch, running, data, sc[SC_STEADY_BUDGET], sc[SC_MAX_MODEL_LEN], ref, bhash, dup_next, nxt, prv, meta, cache,
        table, nblk, ncached, rhash, nhash, tokens, sc[SC_FRONT], waiting, sc[SC_BLOCK_SIZE], sc[SC_ASYNC] != 0,
        sc[SC_PLAN] != 0)
    if not taken:
        return NOT_STEADY, None, None, 0, None, None, None, None
    # the step is taken: the request state the answers wrote for the batch's rows goes into the
    # table now (flags[0] = 2 says some did), as the IR's `req.set_state` is applied after the step
    rows = work[2:]
    for i in range(n):
        if flags[2 + i]:
            end = plan[n + i + 1] if i + 1 < n else rows.shape[0]
            for j in range(plan[n + i], end):
                r = plan[2 * n + j]
                if r >= 0:  # (the ST row of each write: `SteadyProgram.write_rows`)
                    write_state_row(ST, r, running, rows[j])
            flags[0] = 2
    return TAKEN, per_request, sampled, scheduled, qsl, per_token, seq_lens, block_table
