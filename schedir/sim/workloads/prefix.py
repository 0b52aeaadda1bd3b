"""Prefix-cache hits of a workload with an unbounded cache, as Mooncake counts them.

In arrival order, a request hits the leading run of its blocks whose whole prefix
chain (this block and every block before it) was already seen in an earlier
request. Keying on the chain, not the bare id, keeps the count honest for traces
whose ids are not already chain hashes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from schedir.sim.workloads.tokens import splitmix64


@njit(cache=True)
def chain_keys(block_ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """A 64-bit key per block that hashes the block id together with every id before it."""
    keys = np.empty(block_ids.shape[0], dtype=np.uint64)
    for r in range(offsets.shape[0] - 1):
        key = np.uint64(0x243F6A8885A308D3)
        for j in range(offsets[r], offsets[r + 1]):
            key = splitmix64(key ^ splitmix64(np.uint64(block_ids[j])))
            keys[j] = key
    return keys


def prefix_hit_tokens(block_ids: np.ndarray, offsets: np.ndarray, input_len: np.ndarray,
                      block_tokens: int) -> np.ndarray:
    """Tokens of each request's input that an unbounded prefix cache would already hold."""
    n = len(input_len)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    keys = chain_keys(block_ids, offsets)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    seen = first[inverse] < np.arange(len(keys))  # a chain can occur once per request
    counts = np.diff(offsets)
    pos = np.arange(len(keys)) - np.repeat(offsets[:-1], counts)
    miss_pos = np.where(seen, np.iinfo(np.int64).max, pos)
    run = np.minimum(np.minimum.reduceat(miss_pos, offsets[:-1]), counts)
    return np.minimum(run * block_tokens, input_len)
