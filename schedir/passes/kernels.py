"""Numba kernels shared by admission passes: sequential fits under running budgets.

Admission is inherently sequential (each request spends budget the next one
cannot use), so it is a loop; Numba keeps that loop at a few ns per request.
"""

from __future__ import annotations

import numba
import numpy as np

from schedir.dialects.codes import Reason

_BUDGET = int(Reason.BUDGET)
_MAX_SEQS = int(Reason.MAX_SEQS)
_MEMORY = int(Reason.MEMORY)
_BLOCKED = int(Reason.BLOCKED)


@numba.njit(cache=True, nogil=True)
def greedy_fit(
    need: np.ndarray,  # tokens each request still has to compute
    computed: np.ndarray,  # tokens already computed (prefix hits included)
    held: np.ndarray,  # blocks each request already holds (shared hit blocks included)
    extra_blocks: np.ndarray,  # blocks charged on top (cached-free hit blocks leaving the free queue)
    token_budget: int,
    seq_room: int,
    free_blocks: int,
    block_size: int,
    chunk: bool,
    stop_at_first: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int, int]:
    """Walk requests in order, fitting each under the token, sequence and block budgets.

    Returns (tokens, new_blocks, reason, tokens_left, seqs_left, blocks_left):
    tokens > 0 for a scheduled request, reason > 0 (a `Reason`) for one that is not.
    With `chunk`, a request larger than the remaining budget gets a partial chunk.
    With `stop_at_first`, everything after the first misfit is BLOCKED.
    """
    n = need.size
    tokens = np.zeros(n, dtype=np.int64)
    new_blocks = np.zeros(n, dtype=np.int64)
    reason = np.zeros(n, dtype=np.int64)
    stopped = False
    for i in range(n):
        if stopped:
            reason[i] = _BLOCKED
            continue
        if seq_room <= 0:
            reason[i] = _MAX_SEQS
        elif token_budget <= 0:
            reason[i] = _BUDGET
        else:
            t = need[i]
            if t > token_budget:
                if chunk:
                    t = token_budget
                else:
                    reason[i] = _BUDGET
            if reason[i] == 0:
                nb = (computed[i] + t + block_size - 1) // block_size - held[i]
                if nb < 0:
                    nb = 0
                if nb + extra_blocks[i] > free_blocks:
                    reason[i] = _MEMORY
                else:
                    tokens[i] = t
                    new_blocks[i] = nb
                    token_budget -= t
                    seq_room -= 1
                    free_blocks -= nb + extra_blocks[i]
        if reason[i] != 0 and stop_at_first:
            stopped = True
    return tokens, new_blocks, reason, token_budget, seq_room, free_blocks


_IN_FLIGHT = int(Reason.IN_FLIGHT)


@numba.njit(cache=True, nogil=True)
def fit_batch(
    ids: np.ndarray,
    computed: np.ndarray,
    total: np.ndarray,
    held: np.ndarray,
    hit: np.ndarray,  # prefix-hit tokens per request (empty: no hits)
    cached_free: np.ndarray,  # hit blocks sitting in the free queue (empty: none)
    token_budget: int,
    seq_room: int,
    free_blocks: int,
    block_size: int,
    chunk: bool,
    stop_at_first: bool,
):
    """`greedy_fit` plus the bookkeeping around it, in one call (numpy per op costs ~1 µs here).

    Per request: prefix hits usable = full blocks of at most total - 1 tokens (a
    full hit still recomputes the last token); start = max(computed, usable);
    shared = hit blocks not yet held; revived = shared blocks that leave the free
    queue. Returns compacted arrays, in request order:
    (run_ids, run_tokens, alloc_ids, alloc_blocks, share_ids, share_blocks,
     share_revived, defer_ids, defer_reasons, all_decode).
    A request with nothing left to compute is deferred as IN_FLIGHT.
    """
    n = ids.size
    has_hits = hit.size == n and n > 0
    has_free = cached_free.size == n and n > 0
    run_ids = np.empty(n, np.int64)
    run_tokens = np.empty(n, np.int64)
    alloc_ids = np.empty(n, np.int64)
    alloc_blocks = np.empty(n, np.int64)
    share_ids = np.empty(n, np.int64)
    share_blocks = np.empty(n, np.int64)
    share_revived = np.empty(n, np.int64)
    defer_ids = np.empty(n, np.int64)
    defer_reasons = np.empty(n, np.int64)
    nr = na = ns = nd = 0
    all_decode = True
    stopped = False
    for i in range(n):
        start = computed[i]
        shared = 0
        revived = 0
        if has_hits:
            limit = total[i] - 1
            if limit < 0:
                limit = 0
            usable = min(hit[i], limit) // block_size * block_size
            if usable > start:
                start = usable
            shared = usable // block_size - held[i]
            if shared < 0:
                shared = 0
            if has_free:
                revived = min(cached_free[i], shared)
        need = total[i] - start
        reason = 0
        t = 0
        nb = 0
        if need <= 0:
            reason = _IN_FLIGHT
        elif stopped:
            reason = _BLOCKED
        elif seq_room <= 0:
            reason = _MAX_SEQS
        elif token_budget <= 0:
            reason = _BUDGET
        else:
            t = need
            if t > token_budget:
                if chunk:
                    t = token_budget
                else:
                    reason = _BUDGET
            if reason == 0:
                nb = (start + t + block_size - 1) // block_size - held[i] - shared
                if nb < 0:
                    nb = 0
                if nb + revived > free_blocks:
                    reason = _MEMORY
        if reason == 0:
            token_budget -= t
            seq_room -= 1
            free_blocks -= nb + revived
            run_ids[nr] = ids[i]
            run_tokens[nr] = t
            nr += 1
            if need != 1:
                all_decode = False
            if nb > 0:
                alloc_ids[na] = ids[i]
                alloc_blocks[na] = nb
                na += 1
            if shared > 0:
                share_ids[ns] = ids[i]
                share_blocks[ns] = shared
                share_revived[ns] = revived
                ns += 1
        else:
            defer_ids[nd] = ids[i]
            defer_reasons[nd] = reason
            nd += 1
            if stop_at_first and reason != _IN_FLIGHT:
                stopped = True
    return (
        run_ids[:nr], run_tokens[:nr], alloc_ids[:na], alloc_blocks[:na],
        share_ids[:ns], share_blocks[:ns], share_revived[:ns],
        defer_ids[:nd], defer_reasons[:nd], all_decode,
    )
