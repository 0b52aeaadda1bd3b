"""Growing per-request-row tables (block ids, block hashes) without copying what is unused.

A pool's block and hash tables have one row per request slot and one column per block a
request may hold (8k at a 128k context), while a request holds a few hundred: growing them
copies each row's used prefix only, into pages the OS maps when first written.
"""

from __future__ import annotations

import mmap

import numba as nb
import numpy as np


def grown_rows(wide: np.ndarray, used: np.ndarray, rows: int) -> np.ndarray:
    """`wide` (rows x max blocks per request) grown to `rows` rows, each row's first `used`
    entries kept (nothing reads past them). At 128k context a row is 8k entries while a
    request holds a few hundred: copying the tables whole moved ~1.6 GB per doubling of a
    16k-row table (8% of the Mooncake replay). The new table is an anonymous mapping, whose
    4 KiB pages the OS zeroes when first written: numpy asks for 2 MiB pages for a large
    array, and writing a short prefix of every row then zeroes all of them (~1-2 s for a
    16k x 8k hash table, against ~0.1 s)."""
    dtype = np.dtype(wide.dtype)
    out = np.frombuffer(mmap.mmap(-1, max(rows * wide.shape[1] * dtype.itemsize, 1)), dtype=dtype,
                        count=rows * wide.shape[1]).reshape(rows, wide.shape[1])
    _copy_prefixes(wide, used, out)
    return out


@nb.njit(cache=True)
def _copy_prefixes(src: np.ndarray, used: np.ndarray, dst: np.ndarray) -> None:
    for r in range(src.shape[0]):
        for k in range(used[r]):
            dst[r, k] = src[r, k]
