"""Numba kernels of the `vllm` preset: vLLM 0.32's `Scheduler.schedule()` loops over arrays.

These run against the step's KV pool (`mem.pool`) because vLLM's decisions
depend on it block by block: a prefix hit revives cached free blocks, an
allocation evicts the oldest cached free block, a later request in the same step
hits blocks an earlier one has just registered, a preempted request's blocks
return to the pool tail first. The kernels commit those effects as they decide,
exactly as vLLM's loops do, and report per request what they did.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from schedir.dialects.codes import Reason
from schedir.lowering.kv_pool import CACHING, NUM_FREE, allocate, cache_full_blocks, free_row, lookup_prefix, touch

R_BUDGET = int(Reason.BUDGET)
R_MAX_SEQS = int(Reason.MAX_SEQS)
R_MEMORY = int(Reason.MEMORY)
R_BLOCKED = int(Reason.BLOCKED)
R_IN_FLIGHT = int(Reason.IN_FLIGHT)
R_TOO_LONG = int(Reason.TOO_LONG)

# rows of the running kernel's per-request work array
RUN_TOKENS, RUN_PREEMPT_SEQ, RUN_ALLOC, RUN_FREED, RUN_REASON = range(5)
# rows of the running kernel's decisions (each row's first counts[...] entries are used):
# scheduled ids and tokens; allocations of scheduled requests; preempted ids (in preemption
# order) with the blocks they had allocated this step and the blocks freed; deferred ids and reasons
DEC_ID, DEC_TOKENS, DEC_ALLOC_ID, DEC_ALLOC, DEC_PRE_ID, DEC_PRE_ALLOC, DEC_PRE_FREED, DEC_DEFER_ID, DEC_REASON = range(9)
N_SCHEDULED, N_ALLOC, N_PREEMPTED, N_DEFERRED = range(4)
# the queue columns the running kernel reads (`ColumnsAttr.matrix` order); a step with a
# `placeholders` column (async scheduling) also gives it prompt and max_tokens for vLLM's
# rule that a request which will have reached max_tokens asks for no further step
RUNNING_COLUMNS = ("id", "computed", "total", "priority", "arrival", "in_flight")
RUNNING_COLUMNS_ASYNC = RUNNING_COLUMNS + ("placeholders", "prompt", "max_tokens")
# rows of the admission kernel's result
ADM_TOKENS, ADM_HIT, ADM_SHARED, ADM_REVIVED, ADM_ALLOC, ADM_REASON = range(6)


@nb.njit(cache=True, inline="always")
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@nb.njit(cache=True)
def schedule_running(mat, cix, at, budget: int, threshold: int, max_model_len: int, priority_policy: bool,
                     ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, ncached, rhash, nhash):
    """vLLM's RUNNING loop over the requests `at` of the queue columns `mat` (rows `cix`:
    RUNNING_COLUMNS). Returns (decisions[9, n], counts[4], budget left): see DEC_* / N_*.

    In running order: each request asks for its remaining tokens (none while its sampled
    token is in flight; a prefill's next chunk may go ahead of the previous one's return; with
    async scheduling the tokens in flight are placeholders and count as known, so a decode goes
    ahead too, unless the steps in flight already reach max_tokens), capped by the
    long-prefill threshold, the budget and the model length; its new blocks come
    from the free pool, and when they do not fit the victim (FCFS: the last
    running request; priority: the max (priority, arrival)) is preempted by
    recompute, its blocks freed, its tokens returned if it had been scheduled,
    until the request fits or is itself the victim, which ends the loop.
    """
    n = at.size
    rows = np.empty(n, dtype=np.int64)
    computed = np.empty(n, dtype=np.int64)
    total = np.empty(n, dtype=np.int64)
    priority = np.empty(n, dtype=np.int64)
    arrival = np.empty(n, dtype=np.int64)
    in_flight = np.empty(n, dtype=np.int64)
    overlap = cix.size > 6  # placeholders, prompt and max_tokens present
    placeholders = np.zeros(n, dtype=np.int64)
    last_token = np.zeros(n, dtype=np.int64)  # prompt + max_tokens: the last position a request samples
    for i in range(n):
        c = at[i]
        rows[i] = mat[cix[0], c]
        computed[i] = mat[cix[1], c]
        total[i] = mat[cix[2], c]
        priority[i] = mat[cix[3], c]
        arrival[i] = mat[cix[4], c]
        in_flight[i] = mat[cix[5], c]
        if overlap:
            placeholders[i] = mat[cix[6], c]
            last_token[i] = mat[cix[7], c] + mat[cix[8], c]
    bs = meta[2]
    out = np.zeros((5, n), dtype=np.int64)
    out[RUN_PREEMPT_SEQ, :] = -1
    alive = np.ones(n, dtype=np.bool_)
    preempted = 0
    left = budget
    stopped = False
    i = 0
    while i < n and left > 0:
        if not alive[i]:
            i += 1
            continue
        # A step in flight already advanced `computed`: a decode waiting for its sampled token
        # asks for nothing, a prefill's next chunk goes ahead (vLLM: num_new_tokens == 0 skips).
        ph = placeholders[i]
        # vLLM (async): (computed + 1) - (placeholders - 1) >= prompt + max_tokens: the steps in
        # flight already sample the last token, so this request sits the step out
        if ph > 0 and computed[i] + 2 - ph >= last_token[i]:
            out[RUN_REASON, i] = R_IN_FLIGHT
            i += 1
            continue
        want = total[i] + ph - computed[i]
        if 0 < threshold < want:
            want = threshold
        # vLLM's cap: room for the token it samples. No prompt reaches max_model_len
        # (reject-oversized refuses it, as vLLM's input processor does), so no prefill stalls here.
        want = min(want, left, max_model_len - 1 - computed[i])
        if want <= 0:
            if in_flight[i] and computed[i] >= total[i] + ph:
                out[RUN_REASON, i] = R_IN_FLIGHT
            else:
                out[RUN_REASON, i] = R_TOO_LONG if computed[i] + 1 >= max_model_len else R_BUDGET
            i += 1
            continue
        row = rows[i]
        fits = False
        end = min(computed[i] + want, max_model_len)
        filled = min(computed[i] + want, total[i])
        while True:
            # Most decode steps need no block and fill none: test with products (no division) and
            # skip the calls (a dozen array arguments each).
            need = _cdiv(end, bs) - nblk[row] if end > nblk[row] * bs else 0
            if need <= meta[NUM_FREE]:
                if need > 0:
                    allocate(row, need, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk)
                if meta[CACHING] != 0 and filled >= (ncached[row] + 1) * bs:
                    cache_full_blocks(row, filled, bhash, dup_next, cache, meta, table, ncached, rhash, nhash)
                out[RUN_ALLOC, i] += need
                fits = True
                break
            victim = -1
            if priority_policy:
                for j in range(n):
                    if alive[j] and (victim < 0 or priority[j] > priority[victim]
                                     or (priority[j] == priority[victim] and arrival[j] > arrival[victim])):
                        victim = j
            else:
                for j in range(n - 1, -1, -1):
                    if alive[j]:
                        victim = j
                        break
            # An in-flight victim is preempted too (vLLM's rule): the step in flight writes its
            # blocks before any later step runs, and its sampled token is still appended.
            if out[RUN_TOKENS, victim] > 0:
                left += out[RUN_TOKENS, victim]
                out[RUN_TOKENS, victim] = 0
            out[RUN_FREED, victim] = free_row(rows[victim], ref, bhash, dup_next, nxt, prv, meta, cache,
                                              table, nblk, ncached)
            alive[victim] = False
            out[RUN_PREEMPT_SEQ, victim] = preempted
            preempted += 1
            if victim == i:
                break
        if not fits:
            stopped = True
            break
        out[RUN_TOKENS, i] = want
        left -= want
        i += 1
    tail_reason = R_MEMORY if stopped else R_BUDGET
    for j in range(n):
        if alive[j] and out[RUN_TOKENS, j] == 0 and out[RUN_REASON, j] == 0:
            out[RUN_REASON, j] = tail_reason
    dec, counts = _running_decisions(rows, out, preempted)
    return dec, counts, left


@nb.njit(cache=True)
def _running_decisions(rows, out, preempted: int):
    """Compact the per-request work array into the decisions the pass emits, in its order."""
    n = rows.size
    dec = np.empty((9, n), dtype=np.int64)
    counts = np.zeros(4, dtype=np.int64)
    for j in range(n):
        seq = out[RUN_PREEMPT_SEQ, j]
        if out[RUN_TOKENS, j] > 0:
            k = counts[N_SCHEDULED]
            dec[DEC_ID, k] = rows[j]
            dec[DEC_TOKENS, k] = out[RUN_TOKENS, j]
            counts[N_SCHEDULED] = k + 1
            if out[RUN_ALLOC, j] > 0:
                k = counts[N_ALLOC]
                dec[DEC_ALLOC_ID, k] = rows[j]
                dec[DEC_ALLOC, k] = out[RUN_ALLOC, j]
                counts[N_ALLOC] = k + 1
        elif seq >= 0:
            dec[DEC_PRE_ID, seq] = rows[j]
            dec[DEC_PRE_ALLOC, seq] = out[RUN_ALLOC, j]
            dec[DEC_PRE_FREED, seq] = out[RUN_FREED, j]
        else:
            k = counts[N_DEFERRED]
            dec[DEC_DEFER_ID, k] = rows[j]
            dec[DEC_REASON, k] = out[RUN_REASON, j]
            counts[N_DEFERRED] = k + 1
    counts[N_PREEMPTED] = preempted
    return dec, counts


@nb.njit(cache=True)
def admit_waiting(rows, computed, total, stale, budget: int, seqs_left: int, threshold: int, max_model_len: int,
                  reserve_full: bool, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk, ncached,
                  rhash, nhash):
    """vLLM's WAITING loop. Returns (result[6, n], admitted count, budget left); admitted
    requests are those with ADM_TOKENS > 0 (the first ones, but for skipped requests).

    In queue order while budget and sequence slots last: prefix hits (full blocks,
    never the last prompt token) count as computed; the whole remaining sequence
    must fit in free blocks (vLLM's `scheduler_reserve_full_isl`) and so must the
    chunk; hit blocks sitting in the free queue count against free blocks. The
    first request that does not fit stops admission (no skipping ahead). A preempted request
    whose outputs from before its preemption are still in flight (`stale` > 0) is skipped:
    resuming it could recompute a position that output later delivers (vLLM skips it too).
    """
    n = rows.size
    bs = meta[2]
    caching = meta[1] != 0
    out = np.zeros((6, n), dtype=np.int64)
    hits = np.empty(table.shape[1], dtype=np.int32)
    left = budget
    admitted = 0
    stop_reason = 0
    stop_at = n
    for i in range(n):
        if left <= 0:
            stop_reason = R_BUDGET
            stop_at = i
            break
        if seqs_left <= 0:
            stop_reason = R_MAX_SEQS
            stop_at = i
            break
        if stale.size and stale[i] > 0:
            out[ADM_REASON, i] = R_IN_FLIGHT
            continue
        row = rows[i]
        n_hit = 0
        if computed[i] == 0 and caching:
            n_hit = lookup_prefix(row, (total[i] - 1) // bs, rhash, nhash, cache, hits)
            done = n_hit * bs
        else:
            done = computed[i]
        want = total[i] - done
        if 0 < threshold < want:
            want = threshold
        want = min(want, left)
        revived = 0
        for k in range(n_hit):
            if ref[hits[k]] == 0:
                revived += 1
        if reserve_full:
            need_all = max(_cdiv(min(total[i], max_model_len), bs) - n_hit - nblk[row], 0) + revived
            if need_all > meta[NUM_FREE]:
                stop_reason = R_MEMORY
                stop_at = i
                break
        need = max(_cdiv(min(done + want, max_model_len), bs) - n_hit - nblk[row], 0)
        if need + revived > meta[NUM_FREE]:
            stop_reason = R_MEMORY
            stop_at = i
            break
        if n_hit:
            touch(hits, n_hit, ref, bhash, nxt, prv, meta)
            for k in range(n_hit):
                table[row, nblk[row] + k] = hits[k]
            nblk[row] += n_hit
            ncached[row] = n_hit
        allocate(row, need, ref, bhash, dup_next, nxt, prv, meta, cache, table, nblk)
        cache_full_blocks(row, min(done + want, total[i]), bhash, dup_next, cache, meta, table, ncached, rhash, nhash)
        out[ADM_TOKENS, i] = want
        out[ADM_HIT, i] = done
        out[ADM_SHARED, i] = n_hit
        out[ADM_REVIVED, i] = revived
        out[ADM_ALLOC, i] = need
        left -= want
        seqs_left -= 1
        admitted += 1
    for j in range(stop_at, n):
        if out[ADM_REASON, j] == 0:
            out[ADM_REASON, j] = stop_reason if (j == stop_at or stop_reason != R_MEMORY) else R_BLOCKED
    return out, admitted, left
