"""Numba kernels of the runtime's UPDATE: append sampled tokens, hash full blocks, check stops."""

from __future__ import annotations

import numba as nb
import numpy as np

from schedir.lowering.hashing import ROOT, block_hash
from schedir.runtime import table as _table

# Numba's on-disk cache (cache=True) does not notice a change of constants imported from
# another module, so the column indices are spelled out here and checked against the table.
TOTAL, MAX_TOKENS, STATUS, EOS, IGNORE_EOS, OUTPUTS, HAS_STOP = 3, 4, 7, 12, 13, 15, 16
RUNNING = 1
assert (TOTAL, MAX_TOKENS, STATUS, EOS, IGNORE_EOS, OUTPUTS, HAS_STOP, RUNNING) == (
    _table.TOTAL, _table.MAX_TOKENS, _table.STATUS, _table.EOS, _table.IGNORE_EOS, _table.OUTPUTS,
    _table.HAS_STOP, _table.RUNNING), "runtime/kernels.py column indices are stale: update them"

NOT_DONE, STOPPED, LENGTH = 0, 1, 2


@nb.njit(cache=True)
def apply_samples(rows, offsets, toks, data, tail, rhash, nhash, block_size: int, max_model_len: int,
                  stop_rows, stop_ids):
    """Append each request's sampled tokens; returns per request NOT_DONE, STOPPED (EOS or a
    stop id) or LENGTH (max_tokens or max_model_len). Tokens after a stop are dropped.

    `tail[r]` holds row r's unfinished last block; when a token completes it, the block's
    chained hash is appended to `rhash[r]` (the tokens themselves are not kept)."""
    n = rows.size
    done = np.zeros(n, dtype=np.int8)
    for i in range(n):
        r = rows[i]
        if data[STATUS, r] != RUNNING:
            continue
        for k in range(offsets[i], offsets[i + 1]):
            t = toks[k]
            at = data[TOTAL, r]
            tail[r, at % block_size] = t
            data[TOTAL, r] = at + 1
            data[OUTPUTS, r] += 1
            if (at + 1) % block_size == 0 and (at + 1) // block_size == nhash[r] + 1:
                parent = rhash[r, nhash[r] - 1] if nhash[r] > 0 else ROOT
                rhash[r, nhash[r]] = block_hash(parent, tail[r], 0, block_size)
                nhash[r] += 1
            if data[IGNORE_EOS, r] == 0 and data[EOS, r] >= 0 and t == data[EOS, r]:
                done[i] = STOPPED
                break
            if data[HAS_STOP, r] != 0:
                hit = False
                for j in range(stop_rows.size):
                    if stop_rows[j] == r and stop_ids[j] == t:
                        hit = True
                        break
                if hit:
                    done[i] = STOPPED
                    break
            if at + 1 >= max_model_len or data[OUTPUTS, r] >= data[MAX_TOKENS, r]:
                done[i] = LENGTH
                break
    return done
