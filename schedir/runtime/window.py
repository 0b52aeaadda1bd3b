"""How much of a long waiting queue a `vllm` step can act on (the runtime's admission window).

vLLM's waiting loop admits in order and stops at the first request that does not fit, at
max_num_seqs running requests and when the token budget is spent, so a step looks at a
bounded head of the queue however many wait. These kernels bound that head from the
request table before the step is built, in O(running + head) instead of O(waiting): an
overloaded replay keeps thousands waiting for hours.
"""

from __future__ import annotations

from functools import cache

import numba as nb
import numpy as np

from schedir.lowering.kv_pool import cache_slot
from schedir.runtime import table as _table

# Numba's on-disk cache does not notice a change of constants imported from another module,
# so the column indices are spelled out here and checked against the table.
COMPUTED, TOTAL, IN_FLIGHT, PLACEHOLDERS, STALE_OUTPUTS = 2, 3, 9, 12, 13
assert (COMPUTED, TOTAL, IN_FLIGHT, PLACEHOLDERS, STALE_OUTPUTS) == (
    _table.COMPUTED, _table.TOTAL, _table.IN_FLIGHT, _table.PLACEHOLDERS, _table.STALE_OUTPUTS), \
    "runtime/window.py column indices are stale: update them"


@nb.njit(cache=True)
def admissible_bound(data: np.ndarray, running: np.ndarray, waiting: np.ndarray, oversized: np.ndarray,
                     max_seqs: int, budget: int, max_model_len: int, vllm_rules: bool, num_free: int,
                     caching: bool, rhash: np.ndarray, nhash: np.ndarray, nblk: np.ndarray, ncached: np.ndarray,
                     cache: np.ndarray, block_size: int) -> int:
    """At most how many waiting requests this step can admit: max_seqs, or with `vllm_rules`
    (the vllm preset's passes: vllm-schedule-running, then vllm-admit with its full-sequence
    reservation, no long-prefill cap) the free sequence slots and what the token budget and
    the free blocks allow. `waiting` is in FCFS order for the queue walk (else pass it empty).

    Budget: a running request that is not in flight (and holds no async placeholder) asks for
    min(total, max_model_len - 1) - computed tokens and gets min(ask, budget left) unless the
    step preempts; a step that preempts admits nobody. So the asks, summed, are a floor on the
    budget the running requests spend (in-flight rows are left out: they may ask for nothing).
    Then each admitted request takes min(its tokens past its prefix hit, budget left), and
    admission stops when the budget is spent: walking the queue with each request's fewest
    possible tokens (its most possible hits) bounds how many it reaches.

    Hits: before a request's turn, the running requests and the requests admitted ahead of it
    can only register blocks under hashes they already carry, so its hits are at most its
    leading hashes that are cached now or carried (unregistered) by one of them at the same
    position (chained hashes). Blocks: admission stops at the first request (stale ones are
    skipped, oversized ones rejected first) whose whole sequence does not fit in the free
    blocks, the hits other requests hold counted as free; the running requests only take
    free blocks before it, so if the head's blocks minus its most hits exceed the free blocks
    now, the step admits nobody."""
    if not vllm_rules:  # another admission rule may re-use the seats of requests it preempts
        return max_seqs
    seats = max_seqs - running.size
    if seats <= 0:
        return 0
    floor = 0
    for k in range(running.size):
        r = running[k]
        if data[IN_FLIGHT, r] == 0 and data[PLACEHOLDERS, r] == 0:
            ask = min(data[TOTAL, r], max_model_len - 1) - data[COMPUTED, r]
            if ask > 0:
                floor += ask
    left = budget - floor
    seats = min(seats, left)
    if seats <= 0 or waiting.size == 0:
        return max(seats, 0)
    count = 0
    k = 0
    while k < waiting.size and count < seats and left > 0:
        r = waiting[k]
        k += 1
        if data[STALE_OUTPUTS, r] > 0 or oversized[r]:
            continue
        if data[COMPUTED, r] != 0:
            return seats
        total = data[TOTAL, r]
        hits = _most_hits(r, (total - 1) // block_size if caching else 0, running, waiting[: k - 1], data,
                          oversized, rhash, nhash, ncached, cache)
        if count == 0 and (min(total, max_model_len) + block_size - 1) // block_size - hits - nblk[r] > num_free:
            return 0
        count += 1
        left -= total - hits * block_size  # >= 1: hits stop short of the last token
    return count


@nb.njit(cache=True)
def _most_hits(row: int, limit: int, running: np.ndarray, ahead: np.ndarray, data: np.ndarray,
               oversized: np.ndarray, rhash: np.ndarray, nhash: np.ndarray, ncached: np.ndarray,
               cache: np.ndarray) -> int:
    """At most how many leading blocks of `row` (up to `limit`) hit when its turn comes (see
    `admissible_bound`): cached now, or carried by a running request or a request `ahead`."""
    hits = 0
    limit = min(limit, nhash[row])
    while hits < limit:
        h = rhash[row, hits]
        if cache_slot(cache, h) < 0:
            carried = False
            for k in range(running.size):
                x = running[k]
                if ncached[x] <= hits < nhash[x] and rhash[x, hits] == h:
                    carried = True
                    break
            if not carried:
                for k in range(ahead.size):
                    x = ahead[k]
                    if data[STALE_OUTPUTS, x] <= 0 and not oversized[x] and hits < nhash[x] and rhash[x, hits] == h:
                        carried = True
                        break
            if not carried:
                break
        hits += 1
    return hits


@nb.njit(cache=True)
def fcfs_head(data: np.ndarray, waiting: np.ndarray, oversized: np.ndarray, count: int) -> int:
    """The length of `waiting`'s shortest prefix that holds `count` requests admission may
    take (or all of it): preempted requests whose stale outputs are still in flight are
    skipped, not stopped at, so the head reaches past them; oversized ones are rejected
    (and enter the step anyway)."""
    k = 0
    taken = 0
    while k < waiting.size and taken < count:
        r = waiting[k]
        if data[STALE_OUTPUTS, r] <= 0 and not oversized[r]:
            taken += 1
        k += 1
    return k


@cache
def vllm_passes() -> tuple:
    """The vllm preset's passes, as parsed (frozen dataclasses: compared by value)."""
    from schedir.ir.pipeline import parse_passes

    return tuple(parse_passes("vllm"))

