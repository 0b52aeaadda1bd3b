"""Admission shared by schedule-running and admit-greedy: a Numba fit under running budgets.

Admission is inherently sequential (each request spends budget the next one
cannot use), so it is a loop; Numba keeps that loop at a few ns per request.
"""

from __future__ import annotations

import numba
import numpy as np
from xdsl.ir import SSAValue

from schedir.dialects.codes import Reason
from schedir.ir.array_step import ArrayQueue, ArrayStep
from schedir.ir.step import EMPTY, Step, Usage

_BUDGET = int(Reason.BUDGET)
_MAX_SEQS = int(Reason.MAX_SEQS)
_MEMORY = int(Reason.MEMORY)
_BLOCKED = int(Reason.BLOCKED)
_IN_FLIGHT = int(Reason.IN_FLIGHT)


@numba.njit(cache=True, nogil=True)
def count_members(values: np.ndarray, pool: np.ndarray) -> int:
    """How many of `values` occur in `pool` (`np.isin(values, pool).sum()` without numpy's
    generic setup, ~15 µs for a few hundred ids): sort a copy of the pool, binary-search each."""
    if values.size == 0 or pool.size == 0:
        return 0
    sorted_pool = np.sort(pool)
    found = 0
    for v in values:
        at = np.searchsorted(sorted_pool, v)
        if at < sorted_pool.size and sorted_pool[at] == v:
            found += 1
    return found


@numba.njit(cache=True, nogil=True)
def members_deferred_for(ids: np.ndarray, reasons: np.ndarray, pool: np.ndarray, allowed: np.ndarray) -> int:
    """How many of `ids` (a deferral's, with their `reasons`) occur in `pool`, or -1 when one of
    those was deferred for a reason not in `allowed`: the ranked window's check of the swapped
    requests behind the head (`np.isin` twice over the swapped queue cost ~100 µs a step)."""
    if ids.size == 0 or pool.size == 0:
        return 0
    sorted_pool = np.sort(pool)
    found = 0
    for i in range(ids.size):
        at = np.searchsorted(sorted_pool, ids[i])
        if at < sorted_pool.size and sorted_pool[at] == ids[i]:
            ok = False
            for code in allowed:
                if reasons[i] == code:
                    ok = True
            if not ok:
                return -1
            found += 1
    return found


@numba.njit(cache=True, nogil=True)
def decision_gaps(members: np.ndarray, decided: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids decided more than once, in ascending order; `members` decided never, in order):
    verify-step's completeness check without numpy's unique/isin setup (~10 µs each on a few
    ids). Ids may be negative or sparse: they are matched through one sorted copy."""
    order = np.sort(decided)
    twice = np.empty(order.size, dtype=np.int64)
    nt = 0
    for i in range(1, order.size):
        if order[i] == order[i - 1] and (nt == 0 or twice[nt - 1] != order[i]):
            twice[nt] = order[i]
            nt += 1
    missing = np.empty(members.size, dtype=np.int64)
    nm = 0
    for v in members:
        at = np.searchsorted(order, v)
        if at >= order.size or order[at] != v:
            missing[nm] = v
            nm += 1
    return twice[:nt], missing[:nm]


@numba.njit(cache=True, nogil=True)
def fit_batch(
    rows: np.ndarray,  # request i of the set is row rows[i] of the queue columns below
    ids: np.ndarray,
    computed: np.ndarray,
    total: np.ndarray,
    held: np.ndarray,
    in_flight: np.ndarray,  # steps scheduled and not yet updated (empty: none)
    hit_rows: np.ndarray,  # request i's prefix hit is hit[hit_rows[i]]
    hit: np.ndarray,  # prefix-hit tokens (empty: no hits)
    cached_free: np.ndarray,  # hit blocks sitting in the free queue
    hits_known: int,  # the first hits_known requests' hits are looked up (the rest: -1)
    token_budget: int,
    seq_room: int,
    free_blocks: int,
    block_size: int,
    chunk: bool,
    stop_at_first: bool,
    victim_rank: np.ndarray,  # per request: higher goes first as a victim (empty: never preempt)
):
    """Walk requests in order, fitting each under the token, sequence and block budgets.

    One call does the whole admission (numpy costs ~1 µs per small-array op here).

    Only the first `hits_known` requests' hits need be looked up: a request whose decision
    would read its hit past them ends the walk (the last value returned: its position, else -1),
    and the caller looks more up and walks again (`fit_arrays`). A request deferred for seats,
    tokens, an earlier stop or a step in flight reads none.

    Per request: prefix hits usable = full blocks of at most total - 1 tokens (a
    full hit still recomputes the last token); start = max(computed, usable);
    shared = hit blocks not yet held; revived = shared blocks that leave the free
    queue. Returns (out, n_run, n_alloc, n_share, n_defer, all_decode), rows of `out`:
    run ids, run tokens, alloc ids, alloc blocks, share ids, share blocks, share revived,
    defer ids, defer reasons (each valid up to its count); `Fit` names them.
    A request with nothing left to compute, or with a step in flight (a prefill chunk whose
    update has not come back), is deferred as IN_FLIGHT.

    With `victim_rank` (running requests), a request short of blocks preempts requests
    behind it that are neither decided nor in flight, highest rank first, until their held
    blocks cover the shortfall; with none to take, it preempts itself, unless a request behind
    it in flight will become a victim later or this step already preempted (their blocks come
    free next step). The victims' blocks are not counted free in this
    step (shared prefix blocks may stay held: only the pool knows), so the request waits one
    step (MEMORY) and finds them free in the next. Preempted ids: row 9 of `out`.
    """
    n = rows.size
    has_hits = hit.size > 0
    has_flight = in_flight.size > 0
    preempt = victim_rank.size > 0
    gone = np.zeros(n, np.bool_)
    # One array for every output (returning ten arrays costs more than computing them).
    out = np.empty((10, n), np.int64)
    run_ids = out[0]
    run_tokens = out[1]
    alloc_ids = out[2]
    alloc_blocks = out[3]
    share_ids = out[4]
    share_blocks = out[5]
    share_revived = out[6]
    defer_ids = out[7]
    defer_reasons = out[8]
    preempt_ids = out[9]
    nr = na = ns = nd = npre = 0
    all_decode = True
    stopped = False
    for i in range(n):
        if gone[i]:
            continue  # preempted by a request ahead of it: that is its decision
        r = rows[i]
        start = computed[r]
        if has_hits and i >= hits_known and not (stopped or seq_room <= 0 or token_budget <= 0
                                                  or start >= total[r] or (has_flight and in_flight[r] > 0)):
            return out, nr, na, ns, nd, npre, all_decode, i  # its hit decides: look it up first
        shared = 0
        revived = 0
        if has_hits:
            h = hit_rows[i]
            limit = total[r] - 1
            limit = max(limit, 0)
            usable = min(hit[h], limit) // block_size * block_size
            start = max(start, usable)
            shared = usable // block_size - held[r]
            shared = max(shared, 0)
            revived = min(cached_free[h], shared)
        need = total[r] - start
        reason = 0
        t = 0
        nb = 0
        if need <= 0 or (has_flight and in_flight[r] > 0):
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
                nb = (start + t + block_size - 1) // block_size - held[r] - shared
                nb = max(nb, 0)
                if nb + revived > free_blocks:
                    reason = _MEMORY
                    if preempt:
                        short = nb + revived - free_blocks
                        found = 0
                        waiting_on = False  # a request behind in flight: a victim once it comes back
                        while found < short:
                            v = -1
                            for j in range(i + 1, n):
                                rj = rows[j]
                                if gone[j] or held[rj] <= 0:
                                    continue
                                if total[rj] <= computed[rj] or (has_flight and in_flight[rj] > 0):
                                    waiting_on = True
                                    continue
                                if v < 0 or victim_rank[j] > victim_rank[v]:
                                    v = j
                            if v < 0:
                                break
                            gone[v] = True
                            preempt_ids[npre] = ids[rows[v]]
                            npre += 1
                            found += held[rows[v]]
                        if found == 0 and not waiting_on and npre == 0 and held[r] > 0:
                            gone[i] = True  # its own victim (those ahead of it hold the pool)
                            preempt_ids[npre] = ids[r]
                            npre += 1
                            continue
        if reason == 0:
            token_budget -= t
            seq_room -= 1
            free_blocks -= nb + revived
            run_ids[nr] = ids[r]
            run_tokens[nr] = t
            nr += 1
            if need != 1:
                all_decode = False
            if nb > 0:
                alloc_ids[na] = ids[r]
                alloc_blocks[na] = nb
                na += 1
            if shared > 0:
                share_ids[ns] = ids[r]
                share_blocks[ns] = shared
                share_revived[ns] = revived
                ns += 1
        else:
            defer_ids[nd] = ids[r]
            defer_reasons[nd] = reason
            nd += 1
            if stop_at_first and reason != _IN_FLIGHT:
                stopped = True
    return out, nr, na, ns, nd, npre, all_decode, -1


class Fit:
    """`fit_batch`'s result as named, compacted views (request order kept)."""

    __slots__ = (
        "all_decode",
        "alloc_blocks",
        "alloc_ids",
        "defer_ids",
        "defer_reasons",
        "preempt_ids",
        "run_ids",
        "run_tokens",
        "share_blocks",
        "share_ids",
        "share_revived",
    )

    def __init__(self, packed: tuple) -> None:
        out, nr, na, ns, nd, npre, self.all_decode, _ = packed
        self.run_ids, self.run_tokens = out[0, :nr], out[1, :nr]
        self.alloc_ids, self.alloc_blocks = out[2, :na], out[3, :na]
        self.share_ids, self.share_blocks, self.share_revived = out[4, :ns], out[5, :ns], out[6, :ns]
        self.defer_ids, self.defer_reasons = out[7, :nd], out[8, :nd]
        self.preempt_ids = out[9, :npre]  # in the order they were preempted


def victim_rank(policy: str, arrival: np.ndarray, priority: np.ndarray) -> np.ndarray:
    """Each request's rank as a victim, higher first: FCFS the last in order, priority the
    largest (priority, arrival)."""
    if policy != "priority":
        return np.arange(arrival.size, dtype=np.int64)
    order = np.lexsort((arrival, priority))
    rank = np.empty(arrival.size, dtype=np.int64)
    rank[order] = np.arange(arrival.size)
    return rank


def fit_pending(step: Step, pending: SSAValue, *, prefix_hits: bool, chunk: bool, stop_at_first: bool,
                seated: int = 0, preempt: bool = False, used: Usage | None = None) -> Fit | None:
    """Run `fit_batch` over a pending set against what the step has left of its budgets
    (None for an empty set). The shared core of schedule-running and admit-greedy.

    `seated`: requests that hold a sequence slot without being scheduled in this step
    (running ones left out, e.g. in flight): admission must not give their slots away.
    `preempt`: free blocks by preempting requests of the set (see `fit_batch`); victims are
    the lowest in the step's policy: FCFS the last in order, priority the largest
    (priority, arrival). `used`: the step's `usage()`, when the caller has it already."""
    cols, rows = step.source(pending)
    if rows.size == 0:
        return None
    facts = step.facts
    if used is None:
        used = step.usage()
    hit, cached_free, hit_rows = step.prefix_hit_source(pending) if prefix_hits else (EMPTY, EMPTY, EMPTY)
    rank = victim_rank(facts.policy, cols.get("arrival")[rows], cols.get("priority")[rows]) if preempt else EMPTY
    return Fit(fit_batch(
        rows, cols.get("id"), cols.get("computed"), cols.get("total"), cols.get("blocks"),
        cols.get_or("in_flight", EMPTY), hit_rows, hit, cached_free, rows.size,
        facts.token_budget - used.tokens, facts.max_seqs - used.seqs - seated, used.free_left(facts),
        facts.block_size, chunk, stop_at_first, rank,
    ))


def fit_arrays(step: ArrayStep, pending: ArrayQueue, *, prefix_hits: bool, chunk: bool, stop_at_first: bool,
               seated: int = 0, preempt: bool = False) -> Fit:
    """`fit_pending` over an array step's pending requests (`schedir.ir.array_step`): the same
    `fit_batch` call, the table's columns indexed by row. Prefix hits are looked up as the walk
    reaches them (`ArrayStep.prefix_hit_head`): first the free seats' worth and a few, more
    where the walk reads past them (requests deferred for memory take no seat)."""
    facts = step.facts
    rows = pending.pending
    seq_room = facts.max_seqs - step.seqs - seated
    known = min(rows.size, max(seq_room, 0) + 4)
    rank = victim_rank(facts.policy, step.column("arrival")[rows], step.column("priority")[rows]) if preempt else EMPTY
    while True:
        hit, cached_free, hit_rows = step.prefix_hit_head(pending, known) if prefix_hits else (EMPTY, EMPTY, EMPTY)
        packed = fit_batch(
            rows, step.column("id"), step.column("computed"), step.column("total"), step.column("blocks"),
            step.column("in_flight"), hit_rows, hit, cached_free, known if hit.size else rows.size,
            facts.token_budget - step.tokens, seq_room, step.free_left(), facts.block_size, chunk, stop_at_first,
            rank,
        )
        needs = packed[-1]
        if needs < 0:
            return Fit(packed)
        known = min(rows.size, max(2 * known, needs + 1))
