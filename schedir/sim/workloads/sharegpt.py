"""ShareGPT-style length CSVs (`num_prefill_tokens,num_decode_tokens[,num_total_tokens,pd_ratio]`).

The format Vidur's length-file generator reads: (prompt, output) pairs without
arrival times, so arrivals come from a Poisson process at the caller's rate.
Where `num_total_tokens` is present it must equal the sum of the two lengths:
a row that disagrees with itself is bad.
"""

from __future__ import annotations

import math
from os import PathLike
from pathlib import Path

import numpy as np

from schedir.sim.workloads.csvrows import read_header, rows
from schedir.sim.workloads.errors import BadRowLog
from schedir.sim.workloads.fields import BadField, positive_int
from schedir.sim.workloads.workload import Workload

SHAREGPT_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")


def poisson_arrivals(n: int, rate: float, seed: int) -> np.ndarray:
    """n arrival times (s) of a Poisson process at `rate`, the first at 0."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a positive finite number of requests per second, got {rate}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=max(n - 1, 0))
    return np.concatenate(([0.0], np.cumsum(gaps)))[:n]


def load_sharegpt(path: str | PathLike[str], rate: float, seed: int = 0, on_bad_row: str = "error",
                  limit: int | None = None, block_tokens: int = 512) -> Workload:
    """Read a length CSV; arrivals are Poisson at `rate` req/s (seeded), prompts get fresh block ids."""
    path = str(path)
    poisson_arrivals(1, rate, seed)  # refuse a bad rate before reading the file
    log = BadRowLog(path, on_bad_row)
    inputs: list[int] = []
    outputs: list[int] = []
    with open(path, encoding="utf-8", newline="") as f:
        reader, col = read_header(f, log, SHAREGPT_COLUMNS)
        header_total = col.get("num_total_tokens")
        width = max(col[c] for c in SHAREGPT_COLUMNS) + 1
        for line_no, row in rows(reader, log, width):
            if limit is not None and len(inputs) >= limit:
                break
            try:
                n_in = positive_int("num_prefill_tokens", row[col["num_prefill_tokens"]])
                n_out = positive_int("num_decode_tokens", row[col["num_decode_tokens"]])
                if header_total is not None and header_total < len(row) and row[header_total].strip():
                    total = positive_int("num_total_tokens", row[header_total])
                    if total != n_in + n_out:
                        raise BadField(f"num_total_tokens {total} != num_prefill_tokens {n_in} + "
                                       f"num_decode_tokens {n_out}")
            except BadField as e:
                log.report(line_no, str(e))
                continue
            inputs.append(n_in)
            outputs.append(n_out)
    if not inputs:
        raise log.refuse(2, "no usable requests after the header")
    arrival = poisson_arrivals(len(inputs), rate, seed)
    return Workload.without_content(Path(path).stem, f"{path} (Poisson arrivals at {rate:g} req/s, seed {seed})",
                                    arrival, np.asarray(inputs), np.asarray(outputs), block_tokens=block_tokens,
                                    skipped=tuple(log.rows))
