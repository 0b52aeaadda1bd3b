"""What a simulation records: per-request times, per-step batch facts, token gaps.

Everything is a numpy column: the per-step log and the token-gap samples grow by
doubling, the per-request columns are sized once from the trace, and one Numba
kernel per step (`account_step`) writes a step's per-request facts into them, so
a run of 100k steps costs a handful of calls per step and the metrics are
vectorised reductions at the end.
"""

from __future__ import annotations

import attrs
import numba as nb
import numpy as np

STEP_FIELDS = ("start_s", "gpu_s", "prefill_tokens", "decode_tokens", "num_reqs", "num_waiting", "kv_usage",
               "sched_us", "flops")


class StepLog:
    """Per-step columns, appended one row per simulated step (one row of a 2-D array, doubled when full)."""

    def __init__(self, capacity: int = 4096) -> None:
        self.size = 0
        self._rows = np.zeros((max(capacity, 1), len(STEP_FIELDS)), dtype=np.float64)

    def append(self, start_s: float, gpu_s: float, prefill_tokens: int, decode_tokens: int, num_reqs: int,
               num_waiting: int, kv_usage: float, sched_us: float, flops: float) -> None:
        i = self.size
        rows = self._rows
        if i == rows.shape[0]:
            rows = np.concatenate([rows, np.zeros_like(rows)])
            self._rows = rows
        rows[i] = (start_s, gpu_s, prefill_tokens, decode_tokens, num_reqs, num_waiting, kv_usage, sched_us, flops)
        self.size = i + 1

    def extend(self, rows: np.ndarray) -> None:
        """Append whole rows (STEP_FIELDS order), as `append` would one by one."""
        i = self.size
        need = i + rows.shape[0]
        if need > self._rows.shape[0]:
            grown = np.zeros((max(need, 2 * self._rows.shape[0]), len(STEP_FIELDS)), dtype=np.float64)
            grown[:i] = self._rows[:i]
            self._rows = grown
        self._rows[i:need] = rows
        self.size = need

    def column(self, name: str) -> np.ndarray:
        """One field over the steps so far (a contiguous copy)."""
        return np.ascontiguousarray(self._rows[: self.size, STEP_FIELDS.index(name)])

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
        # every time-between-tokens sample, in the order they happen: [: gap_count] is filled
        self.gap_buf = np.zeros(max(int(self.output_len.sum()), 16), dtype=np.float64)
        self.gap_count = 0

    def reserve_gaps(self, extra: int) -> np.ndarray:
        """The gap buffer, grown (doubled) so that `extra` more samples fit."""
        need = self.gap_count + extra
        if need > self.gap_buf.size:
            grown = np.zeros(max(need, 2 * self.gap_buf.size), dtype=np.float64)
            grown[: self.gap_count] = self.gap_buf[: self.gap_count]
            self.gap_buf = grown
        return self.gap_buf

    def add_gaps(self, gaps: np.ndarray) -> None:
        gaps = np.asarray(gaps, dtype=np.float64).ravel()
        if gaps.size:
            buf = self.reserve_gaps(gaps.size)
            buf[self.gap_count: self.gap_count + gaps.size] = gaps
            self.gap_count += gaps.size

    def gaps(self) -> np.ndarray:
        """Every time-between-tokens sample of the run (seconds)."""
        return self.gap_buf[: self.gap_count].copy()


@nb.njit(cache=True)
def account_step(idx: np.ndarray, num_tokens: np.ndarray, computed: np.ndarray, sampled: np.ndarray,
                 kind: np.ndarray, input_len: np.ndarray, vocab: int, start: float, end: float,
                 first_scheduled_s: np.ndarray, prefix_hit_tokens: np.ndarray, first_token_s: np.ndarray,
                 last_token_s: np.ndarray, tokens_out: np.ndarray, gap_buf: np.ndarray, gap_count: int,
                 tokens: np.ndarray) -> tuple[int, int, int]:
    """One step's per-request bookkeeping, in batch order (request `idx[i]` ran `num_tokens[i]`
    tokens after `computed[i]`, in a step from `start` to `end` simulated seconds):

    - `tokens[i]`: the token request i samples (-1 if its chunk does not reach the end), a
      deterministic function of (request, position) -- the runtime's `update()` fast path;
    - a request admitted for the first time (`kind` 1) gets its queueing end and prefix hit;
    - a sampled token ends at `end`: the first one sets TTFT, the others add a TBT gap;
    - returns (prefill tokens, decode tokens, gap count after the step).

    The caller reserves room for `idx.size` more gaps (`RequestLog.reserve_gaps`).
    """
    prefill = 0
    decode = 0
    for i in range(idx.size):
        r = idx[i]
        q = num_tokens[i]
        c = computed[i]
        if q == 1 and c >= input_len[r]:
            decode += 1
        else:
            prefill += q
        if kind[i] == 1:
            if np.isnan(first_scheduled_s[r]):
                first_scheduled_s[r] = start
            if prefix_hit_tokens[r] < 0:
                prefix_hit_tokens[r] = c
        if sampled[i]:
            tokens[i] = (r * 7919 + c + q) % vocab
            if tokens_out[r] > 0:
                gap_buf[gap_count] = end - last_token_s[r]
                gap_count += 1
            else:
                first_token_s[r] = end
            last_token_s[r] = end
            tokens_out[r] += 1
        else:
            tokens[i] = -1
    return prefill, decode, gap_count


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
    # the wall time of the runtime's add_request() over the run (inside sim_wall_s; not part of the
    # scheduler's per-step time, which is schedule() + update())
    add_wall_s: float = 0.0
    # steps run in decode runs (schedir.sim.decode_run): their `sched_us` is their run's wall over its steps
    decode_run_steps: int = 0
