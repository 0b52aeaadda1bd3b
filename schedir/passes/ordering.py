"""Sorting a pending set by columns: the shared mechanism of the order-* passes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.ir import SSAValue

ARRIVAL_BITS = 47  # a rank key: a major key (from its lowest) << 47 | arrival (µs; ~4 years)


def then_arrival_keys(major: np.ndarray, arrival: np.ndarray) -> np.ndarray | None:
    """Rank keys `(major - lowest) << 47 | arrival` (a stable sort by (major, arrival) as one
    int64: `StepPass.waiting_rank`), or None when the majors span 2**15 or more or an arrival
    does not fit 47 bits."""
    if not major.size:
        return major.astype(np.int64)
    low = int(major.min())
    if int(major.max()) - low >= 1 << 15 or int(arrival.min()) < 0 or int(arrival.max()) >= 1 << ARRIVAL_BITS:
        return None
    return ((major.astype(np.int64) - low) << ARRIVAL_BITS) | arrival


from schedir.ir.array_step import ArrayQueue, ArrayStep
from schedir.ir.step import Step


def sort_by_columns(step: Step, value: SSAValue, keys: Sequence[str]) -> SSAValue:
    """Emit `req.sort` of `value` by `keys` ("col" ascending, "col desc"), stable on ties."""
    names = [k.split()[0] for k in keys]
    columns = step.columns(value, names)
    # np.lexsort sorts by the last key first, so feed the keys reversed.
    sort_keys = [(-c if key.endswith(" desc") else c) for c, key in zip(columns, keys, strict=True)]
    ids = step.ids(value)
    order = np.lexsort(sort_keys[::-1]) if ids.size else np.zeros(0, dtype=np.int64)
    return step.sort(value, keys, ids[order], picked=order)


def sort_arrays_by_columns(step: ArrayStep, q: ArrayQueue, keys: Sequence[str]) -> None:
    """`sort_by_columns` over an array step's pending requests (`schedir.ir.array_step`)."""
    rows = q.pending
    sort_keys = [(-step.column(key.split()[0])[rows] if key.endswith(" desc") else step.column(key.split()[0])[rows])
                 for key in keys]
    step.sort(q, np.lexsort(sort_keys[::-1]))
