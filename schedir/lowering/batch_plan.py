"""Batch-plan lowering: the flat arrays a model runner consumes, from the step's decisions."""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(cache=True)
def batch_plan(rows: np.ndarray, tokens: np.ndarray, computed: np.ndarray, table: np.ndarray,
               nblk: np.ndarray, block_size: int):
    """(query_start_loc, positions, slot_mapping, seq_lens, block_table) for requests `rows`
    scheduling `tokens` each after `computed` tokens, with KV blocks from `table`."""
    n = rows.size
    qsl = np.zeros(n + 1, dtype=np.int32)
    width = 0
    for i in range(n):
        qsl[i + 1] = qsl[i] + tokens[i]
        width = max(width, nblk[rows[i]])
    total = qsl[n]
    positions = np.empty(total, dtype=np.int64)
    slots = np.empty(total, dtype=np.int64)
    seq_lens = np.empty(n, dtype=np.int32)
    block_table = np.zeros((n, width), dtype=np.int32)
    for i in range(n):
        r = rows[i]
        start = computed[i]
        seq_lens[i] = start + tokens[i]
        for k in range(nblk[r]):
            block_table[i, k] = table[r, k]
        at = qsl[i]
        for t in range(tokens[i]):
            p = start + t
            positions[at + t] = p
            slots[at + t] = np.int64(table[r, p // block_size]) * block_size + p % block_size
    return qsl, positions, slots, seq_lens, block_table
