"""Chained block hashes for prefix caching, deterministic across processes.

A block's hash covers its tokens and its parent block's hash, so equal hashes
mean equal whole prefixes (the property vLLM's prefix cache relies on). Python's
`hash()` is salted per process; this is a fixed 64-bit mix (splitmix64 steps
over the parent and every pair of tokens), so two runs and two processes agree.
"""

from __future__ import annotations

import numba as nb
import numpy as np

_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
ROOT = np.int64(0x2545F4914F6CDD1D)  # the parent of a request's first block


@nb.njit(cache=True, inline="always")
def _mix(x: np.uint64) -> np.uint64:
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


_LOW32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


@nb.njit(cache=True)
def block_hash(parent: np.int64, tokens: np.ndarray, start: int, block_size: int) -> np.int64:
    """Hash of `tokens[start:start + block_size]` chained on `parent` (never 0: 0 means none).
    Token ids are below 2**31 (the runtime checks), so two of them pack into one 64-bit word
    without loss and each word gets one mix: half the mixes of one per token (the chain of
    mixes is the whole cost: ~60 µs for a 13k-token prompt at one per token)."""
    h = _mix(np.uint64(parent) + _GOLDEN)
    i = start
    end = start + block_size
    while i + 1 < end:
        word = ((np.uint64(tokens[i]) & _LOW32) << _S32) | (np.uint64(tokens[i + 1]) & _LOW32)
        h = _mix(h ^ (word + _GOLDEN))
        i += 2
    if i < end:
        h = _mix(h ^ (np.uint64(tokens[i]) + _GOLDEN))
    out = np.int64(h)
    return out if out != 0 else np.int64(1)


@nb.njit(cache=True)
def extend_hashes(tokens: np.ndarray, num_tokens: int, hashes: np.ndarray, num_hashed: int, block_size: int) -> int:
    """Hash every full block of `tokens[:num_tokens]` past the first `num_hashed`; returns the new count."""
    n = num_hashed
    parent = hashes[n - 1] if n > 0 else ROOT
    while (n + 1) * block_size <= num_tokens:
        parent = block_hash(parent, tokens, n * block_size, block_size)
        hashes[n] = parent
        n += 1
    return n
