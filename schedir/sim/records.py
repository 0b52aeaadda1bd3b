"""What a simulation records: per-request times, per-step batch facts, token gaps.

Everything is a numpy column (grown by doubling for the per-step log), so a
run of 100k steps costs a few array writes per step and the metrics are
vectorised reductions at the end.
"""

from __future__ import annotations

import attrs
import numpy as np

STEP_FIELDS = ("start_s", "gpu_s", "prefill_tokens", "decode_tokens", "num_reqs", "num_waiting", "kv_usage",
               "sched_us", "flops")


class StepLog:
    """Per-step columns, appended one row per simulated step."""

    def __init__(self, capacity: int = 4096) -> None:
        self.size = 0
        self.cols = {name: np.zeros(capacity, dtype=np.float64) for name in STEP_FIELDS}

    def append(self, start_s: float, gpu_s: float, prefill_tokens: int, decode_tokens: int, num_reqs: int,
               num_waiting: int, kv_usage: float, sched_us: float, flops: float) -> None:
        i = self.size
        cols = self.cols
        if i == cols["start_s"].size:
            for name, col in cols.items():
                grown = np.zeros(col.size * 2, dtype=np.float64)
                grown[:i] = col
                cols[name] = grown
        cols["start_s"][i] = start_s
        cols["gpu_s"][i] = gpu_s
        cols["prefill_tokens"][i] = prefill_tokens
        cols["decode_tokens"][i] = decode_tokens
        cols["num_reqs"][i] = num_reqs
        cols["num_waiting"][i] = num_waiting
        cols["kv_usage"][i] = kv_usage
        cols["sched_us"][i] = sched_us
        cols["flops"][i] = flops
        self.size = i + 1

    def column(self, name: str) -> np.ndarray:
        return self.cols[name][: self.size]

    def as_dict(self) -> dict[str, np.ndarray]:
        return {name: self.column(name) for name in STEP_FIELDS}


class RequestLog:
    """Per-request times in simulated seconds (NaN: never happened) and counters."""

    def __init__(self, arrival_s: np.ndarray, input_len: np.ndarray, output_len: np.ndarray) -> None:
        n = arrival_s.size
        self.arrival_s = arrival_s.astype(np.float64)
        self.input_len = input_len.astype(np.int64)
        self.output_len = output_len.astype(np.int64)
        self.first_scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.last_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.tokens_out = np.zeros(n, dtype=np.int64)
        self.prefix_hit_tokens = np.full(n, -1, dtype=np.int64)  # at first admission; -1: never admitted
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.rejected: dict[int, str] = {}
        self._gaps: list[np.ndarray] = []

    def add_gaps(self, gaps: np.ndarray) -> None:
        if gaps.size:
            self._gaps.append(gaps)

    def gaps(self) -> np.ndarray:
        """Every time-between-tokens sample of the run (seconds)."""
        return np.concatenate(self._gaps) if self._gaps else np.zeros(0)


@attrs.frozen
class SimResult:
    """One finished simulation: the logs, the runtime's own metrics and the wall time."""

    config_name: str
    config: dict[str, object]
    workload: dict[str, object]
    num_blocks: int
    max_model_len: int
    peak_flops: float
    requests: RequestLog
    steps: StepLog
    runtime_metrics: dict[str, float]
    sim_wall_s: float
    stalled: str | None = None  # why the run stopped early (a pipeline that cannot make progress)
