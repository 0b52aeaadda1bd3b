"""Numba kernels of the runtime's UPDATE: append sampled tokens, hash full blocks, check stops."""

from __future__ import annotations

import numba as nb
import numpy as np

from schedir.lowering.batch_plan import batch_plan_packed
from schedir.lowering.hashing import ROOT, block_hash
from schedir.lowering.kv_pool import allocate, cache_full_blocks, register_full_blocks
from schedir.lowering.radix_pool import _decode_rows
from schedir.lowering import kv_pool as _kv_pool
from schedir.runtime import output as _output
from schedir.runtime import table as _table

# Numba's on-disk cache (cache=True) does not notice a change of constants imported from
# another module, so the column indices are spelled out here and checked against the table.
PROMPT, COMPUTED, TOTAL, MAX_TOKENS, STATUS, BLOCKS, IN_FLIGHT, QUEUED = 1, 2, 3, 4, 7, 8, 9, 10
PLACEHOLDERS, STALE_OUTPUTS = 12, 13
EOS, IGNORE_EOS, PREEMPTIONS, OUTPUTS, HAS_STOP, SERIAL = 14, 15, 16, 17, 18, 19
QUEUE_COLUMN_COUNT = 14
WAITING, RUNNING, PREEMPTED, SWAPPED, FINISHED = 0, 1, 2, 3, 9
assert (PROMPT, COMPUTED, TOTAL, MAX_TOKENS, STATUS, BLOCKS, IN_FLIGHT, QUEUED, PLACEHOLDERS, STALE_OUTPUTS, EOS, IGNORE_EOS,
        PREEMPTIONS, OUTPUTS, HAS_STOP, SERIAL, QUEUE_COLUMN_COUNT, WAITING, RUNNING, PREEMPTED, SWAPPED, FINISHED) == (
    _table.PROMPT, _table.COMPUTED, _table.TOTAL, _table.MAX_TOKENS, _table.STATUS, _table.BLOCKS, _table.IN_FLIGHT,
    _table.QUEUED, _table.PLACEHOLDERS, _table.STALE_OUTPUTS, _table.EOS, _table.IGNORE_EOS, _table.PREEMPTIONS, _table.OUTPUTS, _table.HAS_STOP,
    _table.SERIAL, _table.QUEUE_COLUMN_COUNT, _table.WAITING, _table.RUNNING, _table.PREEMPTED, _table.SWAPPED,
    _table.FINISHED), \
    "runtime/kernels.py column indices are stale: update them"

# the KV pool's meta slots `steady_decode` reads (spelled out for the same reason)
_POOL_NUM_FREE, _POOL_CACHING, _POOL_BLOCK_SIZE = 0, 1, 2
assert (_POOL_NUM_FREE, _POOL_CACHING, _POOL_BLOCK_SIZE) == (_kv_pool.NUM_FREE, _kv_pool.CACHING, _kv_pool.BLOCK_SIZE), \
    "runtime/kernels.py pool meta indices are stale: update them"

NOT_DONE, STOPPED, LENGTH = 0, 1, 2
STALE = -1  # update(): the row was recycled since the output (not this output's request)
DROPPED = -2  # update(): a stale output in drop mode (preempted and resumed meanwhile): not applied


@nb.njit(cache=True)
def queue_columns_with_state(data, rows, nblk, refresh_blocks: bool, state, state_rows):
    """The step IR's columns of a queue (the table's first QUEUE_COLUMN_COUNT rows at `rows`),
    then the rows' declared request state (`state[state_rows]`), as one C-ordered matrix; with
    `refresh_blocks`, each row's held-block count is first copied from the pool (running
    requests: the count moves every few steps). One pass instead of a fancy get, a fancy set,
    a gather and a `vstack`."""
    n = rows.size
    if refresh_blocks:
        for i in range(n):
            data[BLOCKS, rows[i]] = nblk[rows[i]]
    k = state_rows.size
    out = np.empty((QUEUE_COLUMN_COUNT + k, n), dtype=np.int64)
    for c in range(QUEUE_COLUMN_COUNT):
        for i in range(n):
            out[c, i] = data[c, rows[i]]
    for c in range(k):
        for i in range(n):
            out[QUEUE_COLUMN_COUNT + c, i] = state[state_rows[c], rows[i]]
    return out


_NO_STATE = np.zeros((0, 0), dtype=np.int64)
_NO_STATE_ROWS = np.zeros(0, dtype=np.int64)


def queue_columns(data, rows, nblk, refresh_blocks: bool):  # noqa: ANN001, ANN201
    """`queue_columns_with_state` for a pipeline that declares no request state."""
    return queue_columns_with_state(data, rows, nblk, refresh_blocks, _NO_STATE, _NO_STATE_ROWS)


@nb.njit(cache=True)
def steady_rows(running, data, budget: int, max_model_len: int) -> bool:
    """Whether the running requests make a steady decode step, KV aside: every one decoding (its
    prompt computed, nothing in flight, no placeholder) and asking for exactly one token below
    `max_model_len`, all of them within the token budget `budget`."""
    n = running.size
    if n == 0 or n > budget:
        return False
    for i in range(n):
        r = running[i]
        total = data[TOTAL, r]
        computed = data[COMPUTED, r]
        if (total - computed != 1 or computed < data[PROMPT, r] or total >= max_model_len
                or data[IN_FLIGHT, r] != 0 or data[PLACEHOLDERS, r] != 0):
            return False
    return True


@nb.njit(cache=True)
def steady_decode(running, data, budget: int, max_model_len: int, ref, bhash, dup_next, nxt, prv, meta, cache,
                  table, nblk, ncached, rhash, nhash, commit: bool) -> bool:
    """Decide and commit a steady decode step (see `StepPass.decodes_steadily`), or change
    nothing and return False when the step is not one.

    Steady: every running request is decoding (its prompt computed, nothing in flight, no
    placeholder), asks for exactly one token below `max_model_len`, the running requests fit
    in the token budget, and the free blocks cover every block their tokens need. Then, in
    running order, each row's held-block count is recorded (`blocks`, as the step IR's queue
    columns record it), its new blocks are allocated from the front of the free queue and its
    newly full blocks registered in the prefix cache: what vllm-schedule-running's kernel does
    for such a step, row by row, with no preemption possible (and the lowering's `commit`, for
    a count-level pipeline). `commit` false: the test alone."""
    if not steady_rows(running, data, budget, max_model_len):
        return False
    n = running.size
    bs = meta[_POOL_BLOCK_SIZE]
    need = 0
    for i in range(n):
        r = running[i]
        total = data[TOTAL, r]
        if total > nblk[r] * bs:
            need += -(-total // bs) - nblk[r]
    if need > meta[_POOL_NUM_FREE]:
        return False
    if not commit:  # the test alone
        return True
    caching = meta[_POOL_CACHING] != 0
    for i in range(n):
        r = running[i]
        data[BLOCKS, r] = nblk[r]
        total = data[TOTAL, r]
        if total > nblk[r] * bs:
            allocate(r, -(-total // bs) - nblk[r], ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk)
        if caching and total >= (ncached[r] + 1) * bs:
            register_full_blocks(r, total, ref, bhash, dup_next, nxt, prv, meta, cache, table, ncached, rhash, nhash)
    return True


@nb.njit(cache=True)
def steady_settle(rows, running, data, budget: int, max_model_len: int, ref, bhash, dup_next, nxt, prv, meta, cache,
                  table, nblk, ncached, rhash, nhash, tokens, front: int, waiting, block_size: int, async_mode: bool,
                  plan: bool):
    """`steady_decode` (committing) then `settle_step` for the running requests' one token each, in
    one call, the batch in the order of `rows` (the running queue, or a pass's `steady_order` of
    it): (True, per_request, sampled, tokens scheduled, query_start_loc, per_token, seq_lens,
    block_table), or (False, None, ...) with nothing changed when the step is not steady. The
    queues stay as they are (every running request keeps running, nobody waiting moves), so they
    are not handed back: a light step pays for each array boxed (~1 µs each)."""
    if not steady_decode(rows, data, budget, max_model_len, ref, bhash, dup_next, nxt, prv, meta, cache, table,
                         nblk, ncached, rhash, nhash, True):
        return False, None, None, 0, None, None, None, None
    nobody = np.zeros(0, dtype=np.int64)
    _, _, per_request, sampled, scheduled, qsl, per_token, seq_lens, block_table = settle_step(
        rows, tokens, nobody, nobody, front, data, running, waiting, table, nblk, block_size, async_mode, False,
        False, plan)
    return True, per_request, sampled, scheduled, qsl, per_token, seq_lens, block_table


NOT_FREE = -3  # radix_steady_settle: not a steady step, or the free pages alone do not cover it


@nb.njit(cache=True)
def radix_steady_settle(rows, data, budget: int, max_model_len: int, kv_len, table, nblk, free, head: int,
                        nfree: int, page: int, tokens, front: int, running, waiting, async_mode: bool, plan: bool):
    """The radix pool's steady decode step (`Scheduler._steady_radix`) in one call: when `rows`
    are steady (`steady_rows`) and the free pages cover a page per row
    (`RadixKVPool.decode_if_free`'s test), record each row's held
    pages (`blocks`, as the step IR's running queue does), give each of `rows` one more token
    of KV (`_decode_rows`) and settle the step (`settle_step`, queues unchanged). Returns (pages
    taken, per_request, sampled, tokens scheduled, query_start_loc, per_token, seq_lens,
    block_table); pages taken is NOT_FREE (nothing changed) or `_decode_rows`' error code."""
    if nfree < rows.size or not steady_rows(rows, data, budget, max_model_len):
        return NOT_FREE, None, None, 0, None, None, None, None
    for i in range(rows.size):
        data[BLOCKS, rows[i]] = nblk[rows[i]]
    taken = _decode_rows(kv_len, table, nblk, rows, free, head, nfree, page)
    if taken < 0:
        return taken, None, None, 0, None, None, None, None
    nobody = np.zeros(0, dtype=np.int64)
    _, _, per_request, sampled, scheduled, qsl, per_token, seq_lens, block_table = settle_step(
        rows, tokens, nobody, nobody, front, data, running, waiting, table, nblk, page, async_mode, False, False,
        plan)
    return taken, per_request, sampled, scheduled, qsl, per_token, seq_lens, block_table


# rows of `read_scheduled`'s result
SCHED_COMPUTED, SCHED_TOTAL = range(2)


@nb.njit(cache=True)
def read_scheduled(rows, data):
    """Computed and total tokens of the scheduled rows, as the step was decided (before the
    lowering applies it): the lowering of a pipeline without a pool-level pass commits
    blocks from them before `settle_step` (which reads the rest itself)."""
    n = rows.size
    out = np.empty((2, n), dtype=np.int64)
    for i in range(n):
        out[SCHED_COMPUTED, i] = data[COMPUTED, rows[i]]
        out[SCHED_TOTAL, i] = data[TOTAL, rows[i]]
    return out



# rows of `settle_step`'s per-request matrix (spelled out, as above; SchedulerOutput reads them)
STEP_COMPUTED, STEP_BLOCKS_BEFORE, STEP_KIND, STEP_BLOCKS_AFTER, STEP_GENERATION = range(5)
assert (STEP_COMPUTED, STEP_BLOCKS_BEFORE, STEP_KIND, STEP_BLOCKS_AFTER, STEP_GENERATION) == (
    _output.STEP_COMPUTED, _output.STEP_BLOCKS_BEFORE, _output.STEP_KIND, _output.STEP_BLOCKS_AFTER,
    _output.STEP_GENERATION), "runtime/kernels.py per-request rows are stale: update them"

@nb.njit(cache=True)
def settle_step(rows, tokens, new_rows, gone, front, data, running, waiting, table, nblk, block_size: int,
                async_mode: bool, preempted_first: bool, waiting_changed: bool, plan: bool):
    """Apply a lowered step to the request table and queues, and build its batch plan.

    Reads each scheduled row as the step was decided (status, computed, total, held blocks)
    before changing anything. Preempted rows go back to waiting at the front (`queued`
    counts down from `front`), admitted rows join running, every scheduled row advances by
    its tokens and is in flight; the queues keep the rows whose status still belongs there,
    in order, then the newcomers (with `preempted_first`, preempted rows go to the front of
    waiting, last preempted first, so an FCFS waiting queue stays in `queued` order). Returns (running, waiting, per_request, sampled,
    query_start_loc, per_token, seq_lens, block_table): `per_request` is int64[5, n] with
    rows STEP_COMPUTED, STEP_BLOCKS_BEFORE, STEP_KIND (0 running, 1 new, 2 resumed: after a
    preemption by recompute, or swapped back in),
    STEP_BLOCKS_AFTER and STEP_GENERATION; `per_token` is int64[2, T] (positions, slots).
    `waiting_changed` false (nobody admitted, rejected or preempted this step) hands `waiting`
    back as it is: an overloaded queue of thousands is not walked twice a step for nothing.
    `plan` false leaves the batch plan out (its four results are None). Returns (running,
    waiting, per_request, sampled, tokens scheduled in all, query_start_loc, per_token,
    seq_lens, block_table).
    A chunk samples when it reaches the end of the known tokens and the placeholders; with
    `async_mode` each sampling chunk adds a placeholder (vLLM's AsyncScheduler). A preempted
    row's outputs in flight become stale: delivered when they return (`stale` > 0), or still
    dropped if an earlier drop-mode share has not drained (`stale` < 0); its placeholders go.
    One kernel with few results: each call and each array boxed back costs ~0.3-1 µs."""
    n = rows.size
    per_request = np.empty((5, n), dtype=np.int64)
    sampled = np.empty(n, dtype=np.bool_)
    for i in range(n):
        r = rows[i]
        st = data[STATUS, r]
        per_request[STEP_COMPUTED, i] = data[COMPUTED, r]
        per_request[STEP_BLOCKS_BEFORE, i] = data[BLOCKS, r] if st == RUNNING else 0
        per_request[STEP_KIND, i] = 1 if st == WAITING else (2 if st == PREEMPTED or st == SWAPPED else 0)
        sampled[i] = data[COMPUTED, r] + tokens[i] >= data[TOTAL, r] + data[PLACEHOLDERS, r]
    for k in range(gone.size):
        r = gone[k]
        data[STALE_OUTPUTS, r] = -data[IN_FLIGHT, r] if data[STALE_OUTPUTS, r] < 0 else data[IN_FLIGHT, r]
        data[PLACEHOLDERS, r] = 0
        data[STATUS, r] = PREEMPTED
        data[COMPUTED, r] = 0
        data[BLOCKS, r] = 0  # freed (the column is refreshed for running rows only)
        data[PREEMPTIONS, r] += 1
        data[QUEUED, r] = front - 1 - k
    for k in range(new_rows.size):
        data[STATUS, new_rows[k]] = RUNNING
    for i in range(n):
        r = rows[i]
        data[COMPUTED, r] += tokens[i]
        data[IN_FLIGHT, r] += 1
        if async_mode and sampled[i]:
            data[PLACEHOLDERS, r] += 1
        per_request[STEP_BLOCKS_AFTER, i] = nblk[r]
        per_request[STEP_GENERATION, i] = data[SERIAL, r]
    kept = 0
    for k in range(running.size):
        if data[STATUS, running[k]] == RUNNING:
            kept += 1
    new_running = np.empty(kept + new_rows.size, dtype=np.int64)
    at = 0
    for k in range(running.size):
        if data[STATUS, running[k]] == RUNNING:
            new_running[at] = running[k]
            at += 1
    new_running[at:] = new_rows
    if not waiting_changed and gone.size == 0:
        new_waiting = waiting
    else:
        new_waiting = _settle_waiting(data, waiting, gone, preempted_first)
    if plan:
        qsl, per_token, seq_lens, block_table = batch_plan_packed(rows, tokens, per_request[STEP_COMPUTED], table,
                                                                  nblk, block_size)
        return new_running, new_waiting, per_request, sampled, qsl[n], qsl, per_token, seq_lens, block_table
    scheduled = 0
    for i in range(n):
        scheduled += tokens[i]
    return new_running, new_waiting, per_request, sampled, scheduled, None, None, None, None


@nb.njit(cache=True)
def _settle_waiting(data, waiting, gone, preempted_first: bool):
    """The waiting queue after a step: the rows still waiting (or preempted), in order, and the
    rows preempted this step (in front, last preempted first, with `preempted_first`)."""
    kept = 0
    for k in range(waiting.size):
        st = data[STATUS, waiting[k]]
        if st == WAITING or st == PREEMPTED:
            kept += 1
    new_waiting = np.empty(kept + gone.size, dtype=np.int64)
    at = 0
    if preempted_first:
        for k in range(gone.size):
            new_waiting[k] = gone[gone.size - 1 - k]
        at = gone.size
    for k in range(waiting.size):
        st = data[STATUS, waiting[k]]
        if st == WAITING or st == PREEMPTED:
            new_waiting[at] = waiting[k]
            at += 1
    if not preempted_first:
        new_waiting[at:] = gone
    return new_waiting


@nb.njit(cache=True)
def apply_samples(rows, generation, offsets, toks, one_each: bool, data, tail, rhash, nhash, block_size: int,
                  max_model_len: int, stop_rows, stop_ids, register: bool, bhash, dup_next, cache, meta, table,
                  ncached):
    """Apply one output's sampled tokens. Returns (done, attention): per request NOT_DONE,
    STOPPED (EOS or a stop id), LENGTH (max_tokens or max_model_len) or STALE (its row was
    recycled since the output: not this output's request, left alone); `attention` counts
    rows the caller must look at: finished now, or finished before with no output left in
    flight (their row can be released). Tokens after a stop are dropped. DROPPED: the output
    was stale in drop mode (its request was preempted and resumed while it was in flight): its
    tokens are not applied.

    Async scheduling: an output that is not stale turns its placeholders into tokens; with
    `register` (async with prefix caching) a running request's blocks filled with computed, known
    tokens are registered in the prefix cache now, as vLLM's AsyncScheduler does at update.

    Tokens: with `one_each`, `toks[i]` is request i's token (-1: none); else request i's
    tokens are `toks[offsets[i]:offsets[i + 1]]`. Every live row leaves flight.
    `tail[r]` holds row r's unfinished last block; when a token completes it, the block's
    chained hash is appended to `rhash[r]` (the tokens themselves are not kept).
    (One loop body, no helper: a non-inlined Numba call with a dozen arrays costs more
    than the work it does here.)"""
    n = rows.size
    done = np.zeros(n, dtype=np.int8)
    attention = 0
    for i in range(n):
        r = rows[i]
        if data[SERIAL, r] != generation[i]:
            done[i] = STALE
            continue
        data[IN_FLIGHT, r] -= 1
        stale = data[STALE_OUTPUTS, r]  # outputs in flight from before the last preemption come back first
        if stale > 0:
            data[STALE_OUTPUTS, r] = stale - 1
        elif stale < 0:
            data[STALE_OUTPUTS, r] = stale + 1
        # A request preempted while this step was in flight still gets its token (vLLM appends it;
        # the recompute then covers it); finished or never-run rows get nothing.
        status = data[STATUS, r]
        if status != RUNNING and status != PREEMPTED:
            if status == FINISHED and data[IN_FLIGHT, r] == 0:
                attention += 1
            continue
        if stale < 0:
            done[i] = DROPPED
            continue
        if one_each:
            first = i
            last = i + 1 if toks[i] >= 0 else i
        else:
            first = offsets[i]
            last = offsets[i + 1]
        before = data[TOTAL, r]
        for k in range(first, last):
            t = toks[k]
            at = data[TOTAL, r]
            tail[r, at % block_size] = t
            data[TOTAL, r] = at + 1
            data[OUTPUTS, r] += 1
            if (at + 1) % block_size == 0 and (at + 1) // block_size == nhash[r] + 1:
                parent = rhash[r, nhash[r] - 1] if nhash[r] > 0 else ROOT
                rhash[r, nhash[r]] = block_hash(parent, tail[r], 0, block_size)
                nhash[r] += 1
            if data[IGNORE_EOS, r] == 0 and data[EOS, r] >= 0 and t == data[EOS, r]:
                done[i] = STOPPED
                break
            if data[HAS_STOP, r] != 0:
                hit = False
                for j in range(stop_rows.size):
                    if stop_rows[j] == r and stop_ids[j] == t:
                        hit = True
                        break
                if hit:
                    done[i] = STOPPED
                    break
            if at + 1 >= max_model_len or data[OUTPUTS, r] >= data[MAX_TOKENS, r]:
                done[i] = LENGTH
                break
        if stale == 0 and data[PLACEHOLDERS, r] > 0:
            data[PLACEHOLDERS, r] = max(data[PLACEHOLDERS, r] - (data[TOTAL, r] - before), 0)
        if register and status == RUNNING and stale == 0:
            filled = data[COMPUTED, r] - data[PLACEHOLDERS, r]
            if filled >= (ncached[r] + 1) * block_size:
                cache_full_blocks(r, filled, bhash, dup_next, cache, meta, table, ncached, rhash, nhash)
        if done[i] != NOT_DONE:
            attention += 1
    return done, attention


@nb.njit(cache=True, nogil=True)
def write_state_row(state, r: int, rows, values) -> None:
    """`state[r, rows] = values` (a steady step's answer for the batch's rows, `Scheduler._declared_steady_step`):
    a loop, where numpy's fancy assignment costs ~1.6 µs a row of 256."""
    row = state[r]
    for k in range(rows.size):
        row[rows[k]] = values[k]
