"""Batch-plan lowering: the flat arrays a model runner consumes, from the step's decisions."""

from __future__ import annotations

import numba as nb
import numpy as np

POSITIONS, SLOTS = 0, 1  # rows of `batch_plan_packed`'s per-token matrix


@nb.njit(cache=True)
def batch_plan_packed(rows: np.ndarray, tokens: np.ndarray, computed: np.ndarray, table: np.ndarray,
                      nblk: np.ndarray, block_size: int):
    """(query_start_loc, per_token, seq_lens, block_table) for requests `rows` scheduling
    `tokens` each after `computed` tokens, with KV blocks from `table`. `per_token` is one
    int64[2, T] matrix (row POSITIONS, row SLOTS): every array handed back to Python costs
    a boxing, so the runtime's step kernel returns as few as it can."""
    n = rows.size
    qsl = np.zeros(n + 1, dtype=np.int32)
    width = 0
    for i in range(n):
        qsl[i + 1] = qsl[i] + tokens[i]
        width = max(width, nblk[rows[i]])
    total = qsl[n]
    per_token = np.empty((2, total), dtype=np.int64)
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
            per_token[POSITIONS, at + t] = p
            per_token[SLOTS, at + t] = np.int64(table[r, p // block_size]) * block_size + p % block_size
    return qsl, per_token, seq_lens, block_table


@nb.njit(cache=True)
def batch_plan(rows: np.ndarray, tokens: np.ndarray, computed: np.ndarray, table: np.ndarray,
               nblk: np.ndarray, block_size: int):
    """(query_start_loc, positions, slot_mapping, seq_lens, block_table): `batch_plan_packed`
    with positions and slots as separate arrays."""
    qsl, per_token, seq_lens, block_table = batch_plan_packed(rows, tokens, computed, table, nblk, block_size)
    return qsl, per_token[POSITIONS], per_token[SLOTS], seq_lens, block_table
