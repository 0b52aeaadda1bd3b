"""Vidur's trace-replay CSV (`vidur/request_generator/trace_replay_request_generator.py`).

Vidur reads `arrived_at` (seconds), `num_prefill_tokens` and `num_decode_tokens` and
ignores any other column. Its scale factors and max_tokens clipping are options of
its generator, not of the file, so they are left to the caller (`Workload.with_rate`).
"""

from __future__ import annotations

from os import PathLike

from schedir.sim.workloads.csvrows import load_timed_lengths
from schedir.sim.workloads.fields import time_value
from schedir.sim.workloads.workload import Workload

VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


def load_vidur_trace(path: str | PathLike[str], on_bad_row: str = "error", limit: int | None = None,
                     block_tokens: int = 512) -> Workload:
    """Read a Vidur trace CSV; prompts get fresh block ids (no content in the file)."""
    return load_timed_lengths(path, VIDUR_COLUMNS, lambda text: time_value("arrived_at", text), on_bad_row, limit,
                              block_tokens)
