"""Mooncake's trace format (FAST'25 release): one JSON object per line.

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}

`timestamp` is in ms; `hash_ids` has one id per 512-token block of the input, equal
ids = equal prefix content. Both released traces have exactly ceil(input_length / 512)
ids on every row, so a row that does not is bad (the ids could not cover its prompt,
or name content it does not have).
"""

from __future__ import annotations

import json
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from schedir.sim.workloads.errors import BadRowLog
from schedir.sim.workloads.fields import BadField, in_order, positive_int, time_value
from schedir.sim.workloads.workload import Workload

MOONCAKE_BLOCK_TOKENS = 512


def _hash_ids(value: Any, input_length: int) -> list[int]:
    if not isinstance(value, list):
        raise BadField(f"hash_ids must be a list of block ids, got {type(value).__name__}")
    expected = -(-input_length // MOONCAKE_BLOCK_TOKENS)
    if len(value) != expected:
        raise BadField(f"hash_ids has {len(value)} ids, but input_length {input_length} needs "
                       f"ceil({input_length}/{MOONCAKE_BLOCK_TOKENS}) = {expected}")
    for x in value:
        if isinstance(x, bool) or not isinstance(x, int) or x < 0 or x >= 2**63:
            raise BadField(f"hash_ids must hold integers in [0, 2**63), got {x!r}")
    return value


def load_mooncake(path: str | PathLike[str], on_bad_row: str = "error", limit: int | None = None) -> Workload:
    """Read a Mooncake jsonl trace; `limit` keeps the first `limit` good rows."""
    path = str(path)
    log = BadRowLog(path, on_bad_row)
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    counts: list[int] = []
    ids: list[int] = []
    previous: float | None = None
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if limit is not None and len(times) >= limit:
                break
            if not line.strip():
                continue
            try:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise BadField(f"not valid JSON: {e.msg} at column {e.colno}") from None
                if not isinstance(row, dict):
                    raise BadField(f"expected a JSON object, got {type(row).__name__}")
                missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in row]
                if missing:
                    raise BadField(f"missing field(s) {', '.join(missing)}")
                t = in_order("timestamp", time_value("timestamp", row["timestamp"]), previous)
                n_in = positive_int("input_length", row["input_length"])
                n_out = positive_int("output_length", row["output_length"])
                hashes = _hash_ids(row["hash_ids"], n_in)
            except BadField as e:
                log.report(line_no, str(e))
                continue
            previous = t
            times.append(t)
            inputs.append(n_in)
            outputs.append(n_out)
            counts.append(len(hashes))
            ids.extend(hashes)
    if not times:
        raise log.refuse(1, "no usable requests (empty file)" if not log.rows else "no usable requests")
    arrival = (np.asarray(times) - times[0]) / 1000.0
    return Workload(name=Path(path).stem, source=path, arrival_s=arrival, input_len=inputs, output_len=outputs,
                    priority=np.zeros(len(times), dtype=np.int64),
                    block_offsets=np.concatenate(([0], np.cumsum(counts))), block_ids=ids,
                    block_tokens=MOONCAKE_BLOCK_TOKENS, skipped=tuple(log.rows))
