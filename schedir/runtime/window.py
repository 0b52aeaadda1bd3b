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
    """At most how many waiting requests this step can admit: the free sequence slots and,
    with `vllm_rules` (the vllm preset's passes: vllm-schedule-running, then vllm-admit with
    its full-sequence reservation, no long-prefill cap), what the token budget and the free
    blocks allow. `waiting` is in FCFS order for the block rule (else pass it empty).

    Budget: a running request that is not in flight (and holds no async placeholder) asks for
    min(total, max_model_len - 1) - computed tokens and gets min(ask, budget left) unless the
    step preempts; a step that preempts admits nobody, and each admitted request takes at
    least one token. So the asks, summed, are a floor on the budget the running requests
    spend (in-flight rows are left out: they may ask for nothing).

    Blocks: admission stops at the first request (stale and oversized ones are skipped or
    rejected first) whose whole sequence does not fit in the free blocks, counting as free
    the prefix hits other requests hold. Before admission the running requests can only take
    free blocks (or preempt, and then nobody is admitted) and register blocks under hashes
    they already carry, so that request's hits are at most its leading hashes that are cached
    now or carried unregistered by a running request at the same position (chained hashes);
    if its blocks minus those exceed the free blocks now, the step admits nobody."""
    seats = max_seqs - running.size
    if not vllm_rules or seats <= 0:
        return max(seats, 0)
    floor = 0
    for k in range(running.size):
        r = running[k]
        if data[IN_FLIGHT, r] == 0 and data[PLACEHOLDERS, r] == 0:
            ask = min(data[TOTAL, r], max_model_len - 1) - data[COMPUTED, r]
            if ask > 0:
                floor += ask
    seats = min(seats, budget - floor)
    if seats <= 0 or waiting.size == 0:
        return max(seats, 0)
    head = -1
    for k in range(waiting.size):
        r = waiting[k]
        if data[STALE_OUTPUTS, r] <= 0 and not oversized[r]:
            head = r
            break
    if head < 0:
        return 0  # nobody admission could take
    if data[COMPUTED, head] != 0:
        return seats
    total = data[TOTAL, head]
    hits = 0
    if caching:
        limit = min(nhash[head], (total - 1) // block_size)
        while hits < limit:
            h = rhash[head, hits]
            if cache_slot(cache, h) < 0:
                carried = False
                for k in range(running.size):
                    x = running[k]
                    if ncached[x] <= hits < nhash[x] and rhash[x, hits] == h:
                        carried = True
                        break
                if not carried:
                    break
            hits += 1
    need = (min(total, max_model_len) + block_size - 1) // block_size - hits - nblk[head]
    return 0 if need > num_free else seats


@nb.njit(cache=True)
def fcfs_head(data: np.ndarray, waiting: np.ndarray, count: int) -> int:
    """The length of `waiting`'s shortest prefix that holds `count` requests admission may
    take (or all of it): preempted requests whose stale outputs are still in flight are
    skipped, not stopped at, so the head reaches past them."""
    k = 0
    taken = 0
    while k < waiting.size and taken < count:
        if data[STALE_OUTPUTS, waiting[k]] <= 0:
            taken += 1
        k += 1
    return k


@cache
def vllm_passes() -> tuple:
    """The vllm preset's passes, as parsed (frozen dataclasses: compared by value)."""
    from schedir.ir.pipeline import parse_passes

    return tuple(parse_passes("vllm"))
