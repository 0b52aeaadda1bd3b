"""Deterministic prompt tokens from content block ids.

Traces carry no text, only block ids (equal id = equal content). A simulator with a
real prefix cache needs token ids whose equality follows the block ids exactly, in
every process and on every run, so the tokens of a block are a splitmix64 hash of
(block id, position in the block), scaled to the vocabulary -- never Python's salted `hash()`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S32 = np.uint64(32)


@njit(cache=True)
def splitmix64(x: np.uint64) -> np.uint64:
    """splitmix64's finaliser: a bijection on 64 bits with good avalanche."""
    z = x + _GOLDEN
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


@njit(cache=True)
def fill_block_tokens(block_ids: np.ndarray, length: int, block_tokens: int, vocab_size: int,
                      out: np.ndarray) -> None:
    """Write the first `length` tokens of the blocks `block_ids` into `out` (int32)."""
    vocab = np.uint64(vocab_size)
    for b in range(block_ids.shape[0]):
        seed = splitmix64(np.uint64(block_ids[b]))
        start = b * block_tokens
        stop = min(start + block_tokens, length)
        for t in range(start, stop):
            # the high 32 bits scaled to [0, vocab) (Lemire's multiply-shift): a 64-bit modulo
            # cost more than the mix itself
            out[t] = np.int32(((splitmix64(seed + np.uint64(t - start)) >> _S32) * vocab) >> _S32)


def block_tokens_of(block_ids: np.ndarray, length: int, block_tokens: int = 512,
                    vocab_size: int = 32000) -> np.ndarray:
    """The `length` prompt tokens (int32, in [0, vocab_size)) of a chain of content blocks."""
    if vocab_size < 2 or vocab_size > 2**31 - 1:
        raise ValueError(f"vocab_size must be in [2, 2**31 - 1], got {vocab_size}")
    if length > len(block_ids) * block_tokens:
        raise ValueError(f"{len(block_ids)} blocks of {block_tokens} tokens cannot hold {length} tokens")
    out = np.empty(length, dtype=np.int32)
    fill_block_tokens(np.ascontiguousarray(block_ids, dtype=np.int64), length, block_tokens, vocab_size, out)
    return out
