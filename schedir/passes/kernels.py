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
