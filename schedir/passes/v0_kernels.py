"""Numba kernels of the `v0-*` passes: vLLM v0's `_schedule_default` loops over the pool's arrays.

Line numbers are vLLM 0.8.5's `vllm/core/scheduler.py` (the v0 scheduler, also in 0.6.3) and
`vllm/core/block_manager.py` (`SelfAttnBlockSpaceManager`, v0's block manager over a naive
allocator); docs/vllm-v0-reference.md lists the rules and how they were checked.

v0's block manager counts differently from v1's pool, and the kernels follow it:
- its GPU allocator has no null block: `total_gpu` is the pool's usable blocks;
- `can_allocate` (block_manager.py:109) keeps a watermark (1% of the GPU blocks): a prompt
  needing more than `total - watermark` blocks can NEVER run, one needing more than
  `free - watermark` waits (LATER);
- `can_append_slots` (block_manager.py:206) assumes each decode touches one new block (its
  worst case), so a decode needs one free block even when its last block has room;
- `_can_swap` (block_manager.py:470) counts a request's full blocks plus that one block.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from schedir.dialects.codes import Reason
from schedir.lowering.host_pool import swap_in_row, swap_out_row
from schedir.lowering.kv_pool import (
    CACHE_V0,
    CACHING,
    NUM_FREE,
    V0_TS,
    allocate,
    free_row,
    take_prefix,
    v0_cache_full_blocks,
    v0_computed_blocks,
)

R_BUDGET = int(Reason.BUDGET)
R_MAX_SEQS = int(Reason.MAX_SEQS)
R_MEMORY = int(Reason.MEMORY)
R_BLOCKED = int(Reason.BLOCKED)
R_POLICY = int(Reason.POLICY)
R_TOO_LONG = int(Reason.TOO_LONG)
R_EXCEEDS_CACHE = int(Reason.EXCEEDS_CACHE)

# rows of every kernel's per-request result
V0_TOKENS, V0_ALLOC, V0_REASON, V0_MOVED, V0_SEQ, V0_MODE, V0_PHASE = range(7)  # V0_PHASE: 1 = a prefill chunk
MODE_RECOMPUTE, MODE_SWAP = 0, 1


@nb.njit(cache=True, inline="always")
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@nb.njit(cache=True, inline="always")
def _alone(alive, i: int) -> bool:
    """Whether request i is the only running request left (every other one was preempted)."""
    for j in range(alive.size):
        if alive[j] and j != i:
            return False
    return True


@nb.njit(cache=True, inline="always")
def _defer_from(out, stop: int, reason: int) -> None:
    """The request a loop stopped at gets `reason`, those behind it `blocked` (nothing if none)."""
    if stop >= 0:
        out[V0_REASON, stop] = reason
        for j in range(stop + 1, out.shape[1]):
            out[V0_REASON, j] = R_BLOCKED


@nb.njit(cache=True, inline="always")
def _oldest_from(arrival_us):
    """oldest[i]: the earliest arrival among requests i.. of the queue (v0's `_passed_delay` takes the
    min over what is still waiting, and the requests before i have left it)."""
    n = arrival_us.size
    oldest = np.empty(n + 1, dtype=np.int64)
    oldest[n] = np.iinfo(np.int64).max
    for i in range(n - 1, -1, -1):
        oldest[i] = min(oldest[i + 1], arrival_us[i])
    return oldest


@nb.njit(cache=True)
def watermark_blocks(total_gpu: int) -> int:
    """v0's `watermark_blocks = int(0.01 * num_gpu_blocks)` (block_manager.py:92)."""
    return int(0.01 * total_gpu)


@nb.njit(cache=True, nogil=True)
def ignorable(waiting, total, computed, limit: int, total_gpu: int, block_size: int, first_only: bool):
    """Which of `waiting` v0 ignores when it reaches them: new tokens (total - computed;
    `computed` None: the whole sequence) over `limit`, or a sequence of more blocks than the
    pool above its watermark can ever hold (`can_allocate` NEVER). The columns are whole-table
    views indexed by row id. With `first_only` (a steady step's test) the walk stops at the first."""
    room = total_gpu - watermark_blocks(total_gpu)
    out = np.zeros(waiting.size, dtype=np.bool_)
    for i in range(waiting.size):
        r = waiting[i]
        t = total[r]
        new = t if computed is None else t - computed[r]
        if new > limit or -(-t // block_size) > room:
            out[i] = True
            if first_only:
                break
    return out


@nb.njit(cache=True, nogil=True)
def any_ignorable(waiting, total, computed, limit: int, total_gpu: int, block_size: int) -> bool:
    """Whether v0 could ignore one of `waiting` when it reaches it (`ignorable`'s rule)."""
    return ignorable(waiting, total, computed, limit, total_gpu, block_size, True).any()


@nb.njit(cache=True, nogil=True)
def steady_run_order(running, run_pos, computed, prefill_end) -> bool:
    """Whether `running` is in v0's running order already (`v0_run_pos` non-decreasing) with none
    in its prefill (computed below `v0_prefill_end`): v0-chunked-running's steady test, over
    whole-table views indexed by row id."""
    for i in range(running.size):
        r = running[i]
        if computed[r] < prefill_end[r] or (i and run_pos[r] < run_pos[running[i - 1]]):
            return False
    return True


@nb.njit(cache=True)
def v0_swapped(rows, computed, total, prefill_end, budget: int, seqs_used: int, max_seqs: int, total_gpu: int,
               ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, hfree, hmeta, htable, hnblk, log):
    """`_schedule_swapped` (scheduler.py:821), FCFS over the swapped queue: a request whose
    touched blocks exceed the whole pool can NEVER come back and is ignored; one that does not
    fit above the watermark stops the loop (LATER), as do the token and sequence budgets.
    A decode touches its full blocks plus one; a request swapped out mid-prefill (chunked
    prefill: computed < prefill_end) touches its whole allocation and asks for all its remaining
    tokens (v0 does not chunk here). A request swapped in gets its blocks back (V0_MOVED); a
    decode takes a new block when its last one is full (`_append_slots`). `budget` is the tokens
    left. Returns (out[7, n], swapped-in count)."""
    n = rows.size
    out = np.zeros((7, n), dtype=np.int64)
    bs = meta[2]
    water = watermark_blocks(total_gpu)
    used = 0
    count = 0
    stop = -1
    stop_reason = 0
    for i in range(n):
        prefill = computed[i] < prefill_end[i]
        touched = _cdiv(total[i], bs) if prefill else computed[i] // bs + 1
        want = total[i] - computed[i] if prefill else 1
        if total_gpu < touched:
            out[V0_REASON, i] = R_EXCEEDS_CACHE
            continue
        if meta[NUM_FREE] - touched < water:
            stop, stop_reason = i, R_MEMORY
            break
        if used + want > budget:
            stop, stop_reason = i, R_BUDGET
            break
        if seqs_used + 1 > max_seqs:
            stop, stop_reason = i, R_MAX_SEQS
            break
        r = rows[i]
        out[V0_MOVED, i] = swap_in_row(r, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk,
                                       hfree, hmeta, htable, hnblk, log)
        if not prefill:
            need = _cdiv(computed[i] + 1, bs) - nblk[r]
            if need > 0:
                allocate(r, need, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk)
                out[V0_ALLOC, i] = need
        out[V0_TOKENS, i] = want
        out[V0_PHASE, i] = 1 if prefill else 0
        used += want
        seqs_used += 1
        count += 1
    _defer_from(out, stop, stop_reason)
    return out, count


# ---------------------------------------------------------------- chunked prefill (_schedule_chunked_prefill)


@nb.njit(cache=True)
def partial_prefills(running_computed, running_end, running_total, waiting_new, max_partial: int,
                     long_threshold: int, max_long: int):
    """v0's `PartialPrefillMetadata.from_queues` (scheduler.py:392): prefills that may run this step
    (those running in prefill, then waiting ones, long ones beyond `max_long` skipped), capped by
    `max_partial`, and how many running prefills are long. Returns (schedulable, long_running)."""
    prefills = 0
    long_running = 0
    for i in range(running_computed.size):
        if running_computed[i] < running_end[i]:
            prefills += 1
            if running_total[i] - running_computed[i] > long_threshold:
                long_running += 1
    waiting_long = 0
    for i in range(waiting_new.size):
        if prefills >= max_partial:
            break
        if waiting_new[i] > long_threshold:
            if long_running + waiting_long >= max_long:
                continue
            waiting_long += 1
        prefills += 1
    return min(prefills, max_partial), long_running


@nb.njit(cache=True)
def v0_running(rows, computed, total, prefill_end, budget: int, slot_budget: int, swap: bool,
                       ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, ncached, access, rhash, nhash,
                       hfree, hmeta, htable, hnblk, log):
    """`_schedule_running` (scheduler.py:700), in running order; without chunking every running
    request is a decode and `budget` / `slot_budget` are unlimited.

    A request in its prefill (computed < prefill_end: the length it was admitted with; chunked
    prefill only) asks for its remaining tokens, a decode for one; either is cut to the token
    budget left and the prefill slot's budget, and a request that gets none ends the loop (the
    rest stay unscheduled). A prefill's blocks were all allocated at admission: it touches one
    block only when its last is partial; a decode touches one (`can_append_slots`: v0's worst
    case). While the touched blocks are not free, the last running request not yet reached is
    preempted (`running_queue.pop()`), or the request itself when it is the last: by swap when
    `swap` and the host has room for what it touches (`can_swap_out`), else by recompute. A
    request that preempts itself ends the loop. One change from v0: the only running request is
    not preempted for its own worst-case block when its last block has room (v0 does, and then
    re-admits it into the same full pool, forever). On a v0 pool (prefix caching) a victim's
    blocks take its last access (`access`, by row) and a decode's newly full block is registered
    as it is appended (`v0_cache_full_blocks`).
    Returns (out[7, n], preemption count): V0_SEQ is the preemption order (-1: none), V0_MODE
    its mode, V0_MOVED the blocks freed or moved to the host, V0_PHASE 1 for a prefill chunk."""
    n = rows.size
    out = np.zeros((7, n), dtype=np.int64)
    out[V0_SEQ, :] = -1
    bs = meta[2]
    alive = np.ones(n, dtype=np.bool_)
    preempted = 0
    used = 0
    i = 0
    while i < n:
        if not alive[i]:
            i += 1
            continue
        prefill = computed[i] < prefill_end[i]
        want = total[i] - computed[i] if prefill else 1
        chunk = min(want, budget - used, slot_budget)
        if chunk <= 0:
            for j in range(i, n):
                if alive[j]:
                    out[V0_REASON, j] = R_BUDGET
            break
        touched = (1 if total[i] % bs else 0) if prefill else 1
        needs_block = not prefill and _cdiv(computed[i] + 1, bs) > nblk[rows[i]]
        fits = True
        while meta[NUM_FREE] < touched:
            victim = i
            for j in range(n - 1, i, -1):
                if alive[j]:
                    victim = j
                    break
            if victim == i and not needs_block and _alone(alive, i):
                break  # schedir's one change from v0, which livelocks here (see the docstring)
            r = rows[victim]
            vprefill = computed[victim] < prefill_end[victim]
            need_host = _cdiv(total[victim], bs) if vprefill else computed[victim] // bs + 1
            moved = -1
            if swap and hmeta[0] - need_host >= 0:
                moved = swap_out_row(r, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, ncached,
                                     hfree, hmeta, htable, hnblk, log)
            if moved >= 0:
                out[V0_MODE, victim] = MODE_SWAP
            else:
                if meta[CACHING] == CACHE_V0:  # the victim's blocks take its last access (a v0 pool)
                    meta[V0_TS] = access[r]
                moved = free_row(r, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, ncached)
                out[V0_MODE, victim] = MODE_RECOMPUTE
            out[V0_MOVED, victim] = moved
            out[V0_SEQ, victim] = preempted
            preempted += 1
            alive[victim] = False
            if victim == i:
                fits = False
                break
        if not fits:
            break
        if not prefill:
            need = _cdiv(computed[i] + 1, bs) - nblk[rows[i]]
            if need > 0:
                allocate(rows[i], need, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk)
                out[V0_ALLOC, i] = need
            if meta[CACHING] == CACHE_V0:  # `_append_slots` promotes the block its token fills, at once
                v0_cache_full_blocks(rows[i], computed[i] + 1, ref, bhash, dup_next, nxt, prv, meta, cache, table,
                                     ncached, rhash, nhash)
        out[V0_TOKENS, i] = chunk
        out[V0_PHASE, i] = 1 if prefill else 0
        used += chunk
        i += 1
    return out, preempted


@nb.njit(cache=True)
def v0_prefills(rows, total, arrival_us, chunking: bool, used: int, seqs_used: int, budget: int, max_seqs: int,
                prompt_limit: int, slot_budget: int, max_partial: int, long_threshold: int, long_running: int,
                max_long: int, total_gpu: int, delay_threshold_us: float, delay_on: bool, any_running: bool,
                now_us: int, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, prefix_cache: bool, ncached,
                rhash, nhash, noted):
    """`_schedule_prefills` (scheduler.py:1035), in waiting order; `total` is each request's new
    tokens (its whole sequence: prompt plus outputs after a recompute).

    One over the prompt limit, or needing more blocks than the pool minus its watermark can ever
    give (can_allocate NEVER), is ignored and the loop goes on; the loop stops at the delay rule
    (`_passed_delay`: while requests run, the oldest waiting one must have waited longer than the
    threshold), at a request that must wait for blocks (LATER), and at the token or sequence
    budget. Without `chunking` a request prefills whole; with it, it gets a chunk (cut to the
    budget left and the prefill slot's budget) while its whole sequence's blocks are allocated,
    the prompt limit (max_model_len) is compared with the chunk, and with several partial
    prefills a long request (more new tokens than `long_threshold`) is passed over once
    `max_long` long ones run, keeping its place.

    With `prefix_cache` (a v0 pool, chunking off) each request the loop reaches first learns its
    prefix hit, v0's way (`_get_num_new_uncached_and_cached_tokens`, scheduler.py:1877): the
    computed cached blocks (`v0_computed_blocks`), noted by row in `noted` and kept while the
    request waits (`ComputedBlocksTracker`; its free forgets it: `KVPool.v0_forget`), a
    whole-prompt hit still computing its last token. Only the uncached tokens are charged to
    the budget; the prompt limit and `can_allocate` (which ignores hits) see the whole
    sequence; the request takes its cached blocks, is given the rest and registers them at once
    (a later request in the step shares them, uncomputed). Returns (out[7, n], scheduled count,
    hits[n]): the hit tokens charged as cached to each admitted request (-1: none admitted)."""
    n = rows.size
    out = np.zeros((7, n), dtype=np.int64)
    hits = np.full(n, -1, dtype=np.int64)
    scratch = np.empty(table.shape[1], dtype=np.int32)
    bs = meta[2]
    water = watermark_blocks(total_gpu)
    oldest = _oldest_from(arrival_us)
    scheduled = 0
    stop = -1
    stop_reason = 0
    long_prefills = long_running
    i = 0
    while i < n:
        if delay_on and any_running and not (now_us - oldest[i] > delay_threshold_us):
            stop, stop_reason = i, R_POLICY
            break
        new_tokens = total[i]
        uncached, hit = new_tokens, 0
        if prefix_cache:
            hit = noted[rows[i]]
            if hit < 0:
                hit = noted[rows[i]] = v0_computed_blocks(rows[i], ref, meta, cache, rhash, nhash) * bs
            uncached = new_tokens - hit
            if uncached == 0 and hit > 0:  # a whole-prompt hit computes its last token
                uncached, hit = 1, hit - 1
        if max_partial > 1 and new_tokens > long_threshold and long_prefills >= max_long:
            out[V0_REASON, i] = R_POLICY  # passed over, keeps its place
            i += 1
            continue
        chunk = min(new_tokens, budget - used, slot_budget) if chunking else new_tokens
        if chunk > prompt_limit:
            out[V0_REASON, i] = R_TOO_LONG
            i += 1
            continue
        need = _cdiv(total[i], bs)
        if total_gpu - need < water:
            out[V0_REASON, i] = R_EXCEEDS_CACHE
            i += 1
            continue
        if meta[NUM_FREE] - need < water:
            stop, stop_reason = i, R_MEMORY
            break
        charged = uncached if prefix_cache else chunk
        if used >= budget or charged <= 0 or used + charged > budget:
            stop, stop_reason = i, R_BUDGET
            break
        if seqs_used + 1 > max_seqs:
            stop, stop_reason = i, R_MAX_SEQS
            break
        if prefix_cache:
            taken = take_prefix(rows[i], nhash[rows[i]], ref, bhash, nxt, prv, meta, cache, table, nblk, ncached,
                                rhash, nhash, scratch)
            allocate(rows[i], need - taken, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk)
            v0_cache_full_blocks(rows[i], new_tokens, ref, bhash, dup_next, nxt, prv, meta, cache, table, ncached,
                                 rhash, nhash)
            hits[i] = hit
            chunk = uncached
        else:
            allocate(rows[i], need, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk)
        out[V0_TOKENS, i] = chunk
        out[V0_ALLOC, i] = need
        out[V0_PHASE, i] = 1
        if new_tokens > long_threshold:
            long_prefills += 1
        used += chunk
        seqs_used += 1
        scheduled += 1
        i += 1
    _defer_from(out, stop, stop_reason)
    return out, scheduled, hits


@nb.njit(cache=True, nogil=True)
def v0_priority_preemption(rows, run_priority, run_arrival, head_total: int, head_priority: int,
                           head_arrival: int, budget: int, max_seqs: int, total_gpu: int,
                           ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, ncached):
    """`_schedule_priority_preemption`'s loop (scheduler.py:967), over the running requests in
    (priority, arrival) order (`rows`) and the waiting queue's head (its whole sequence
    `head_total`, its priority and arrival): while the last running request ranks strictly
    below the head, the head is let in without a victim once `can_allocate` says OK (its blocks
    above the watermark, block_manager.py:109) and the budget takes it (its tokens, one more
    sequence: `SchedulingBudget.can_schedule`, nothing batched yet in a step without prefills);
    else that last request is preempted by recompute (its blocks freed) and leaves the budget's
    sequences. The head is not admitted here: the next step's prefill pass reaches it first.
    Returns (out[7, n], preemption count), rows as `v0_running`'s (V0_SEQ the preemption order)."""
    n = rows.size
    out = np.zeros((7, n), dtype=np.int64)
    out[V0_SEQ, :] = -1
    bs = meta[2]
    water = watermark_blocks(total_gpu)
    need = _cdiv(head_total, bs)
    seqs = n  # every running request counts in the budget's sequences (`_schedule_default`)
    preempted = 0
    k = n - 1
    while k >= 0 and (run_priority[k] > head_priority
                      or (run_priority[k] == head_priority and run_arrival[k] > head_arrival)):
        allocatable = total_gpu - need >= water and meta[NUM_FREE] - need >= water
        if head_total > 0 and allocatable and head_total <= budget and seqs + 1 <= max_seqs:
            break
        out[V0_MOVED, k] = free_row(rows[k], ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, ncached)
        out[V0_MODE, k] = MODE_RECOMPUTE
        out[V0_SEQ, k] = preempted
        preempted += 1
        seqs -= 1
        k -= 1
    return out, preempted
