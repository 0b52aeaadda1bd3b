"""Vidur's trace-replay CSV (`vidur/request_generator/trace_replay_request_generator.py`).

Vidur reads `arrived_at` (seconds), `num_prefill_tokens` and `num_decode_tokens` and
ignores any other column. Its scale factors and max_tokens clipping are options of
its generator, not of the file, so they are left to the caller (`Workload.with_rate`).
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path

import numpy as np

from schedir.sim.workloads.csvrows import read_header, rows
from schedir.sim.workloads.errors import BadRowLog
from schedir.sim.workloads.fields import BadField, in_order, positive_int, time_value
from schedir.sim.workloads.workload import Workload

VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


def load_vidur_trace(path: str | PathLike[str], on_bad_row: str = "error", limit: int | None = None,
                     block_tokens: int = 512) -> Workload:
    """Read a Vidur trace CSV; prompts get fresh block ids (no content in the file)."""
    path = str(path)
    log = BadRowLog(path, on_bad_row)
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    previous: float | None = None
    with open(path, encoding="utf-8", newline="") as f:
        reader, col = read_header(f, log, VIDUR_COLUMNS)
        for line_no, row in rows(reader, log, max(col[c] for c in VIDUR_COLUMNS) + 1):
            if limit is not None and len(times) >= limit:
                break
            try:
                t = in_order("arrived_at", time_value("arrived_at", row[col["arrived_at"]]), previous)
                n_in = positive_int("num_prefill_tokens", row[col["num_prefill_tokens"]])
                n_out = positive_int("num_decode_tokens", row[col["num_decode_tokens"]])
            except BadField as e:
                log.report(line_no, str(e))
                continue
            previous = t
            times.append(t)
            inputs.append(n_in)
            outputs.append(n_out)
    if not times:
        raise log.refuse(2, "no usable requests after the header")
    arrival = np.asarray(times) - times[0]
    return Workload.without_content(Path(path).stem, path, arrival, np.asarray(inputs), np.asarray(outputs),
                                    block_tokens=block_tokens, skipped=tuple(log.rows))
