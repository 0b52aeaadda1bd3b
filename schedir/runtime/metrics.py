"""Counters the runtime keeps about itself: requests, steps, batch fill, KV use, latency, throughput.

Latency and throughput are measured on the scheduler's clock (`Scheduler(clock=...)`):
wall time in an engine, simulated time in the simulator.
"""

from __future__ import annotations

import attrs
import numpy as np

STEP_WINDOW = 8192  # steps whose scheduling time the median and p99 cover (the most recent ones)


@attrs.define
class RuntimeMetrics:
    """Running totals, so a long-lived engine keeps constant memory: batch fill and KV use
    are summed, and step times are kept for the last `STEP_WINDOW` steps only."""

    added: int = 0
    finished: int = 0
    aborted: int = 0
    rejected: int = 0
    preemptions: int = 0
    steps: int = 0
    steady_steps: int = 0  # steps lowered without their IR (steady decode steps, see StepPass.decodes_steadily,
    # and running steps, see StepPass.decides_running_steps)
    running_steps: int = 0  # of them, running steps
    ranked_steps: int = 0  # IR steps built over a ranked window (the head of the order: Scheduler._waiting_window)
    ranked_rebuilt: int = 0  # ... that did not hold and were built again over the whole queue
    array_steps: int = 0  # IR steps decided over arrays, no ops built (`schedir.ir.array_step`)
    scheduled_tokens: int = 0
    prefix_hit_tokens: int = 0
    step_seconds: np.ndarray = attrs.field(factory=lambda: np.zeros(STEP_WINDOW))  # a ring: step k at k % size
    batch_fill_sum: float = 0.0
    kv_usage_sum: float = 0.0
    latencies: np.ndarray = attrs.field(factory=lambda: np.zeros(64))  # arrival -> finish, per finished request
    output_tokens: int = 0
    first_arrival: float = float("inf")
    last_finish: float = float("-inf")
    token_budget: int = 1  # the scheduler's max_num_batched_tokens (batch fill's denominator)
    usable_blocks: int = 1  # the KV pool's blocks (KV use's denominator)

    def record_arrival(self, arrival: float) -> None:
        self.added += 1
        self.first_arrival = min(self.first_arrival, arrival)

    def record_finish(self, arrival: float, now: float, outputs: int) -> None:
        """A request that finished by a stop condition (not an abort or a rejection)."""
        if self.finished == self.latencies.size:
            self.latencies = np.concatenate([self.latencies, np.zeros(self.latencies.size)])
        self.latencies[self.finished] = now - arrival
        self.finished += 1
        self.output_tokens += outputs
        self.last_finish = max(self.last_finish, now)

    def record_step(self, seconds: float, tokens: int, hit_tokens: int, free_blocks: int, steady: bool = False) -> None:
        """One step: how long it took, tokens scheduled (of them `hit_tokens` prefix-cache hits
        of admitted or resumed requests) against `token_budget`, the KV pool's free blocks after
        it (of `usable_blocks`), and whether it was lowered without its IR."""
        self.step_seconds[self.steps % STEP_WINDOW] = seconds
        self.steps += 1
        self.steady_steps += steady
        self.scheduled_tokens += tokens
        self.prefix_hit_tokens += hit_tokens
        self.batch_fill_sum += tokens / self.token_budget
        self.kv_usage_sum += 1.0 - free_blocks / self.usable_blocks

    def summary(self) -> dict[str, float]:
        us = self.step_seconds[: min(self.steps, self.step_seconds.size)] * 1e6
        lat = self.latencies[: self.finished]
        span = self.last_finish - self.first_arrival if self.finished else 0.0
        steps = self.steps
        return {
            "total_requests": self.added,
            "finished_requests": self.finished + self.aborted,  # ended: stopped by itself or aborted
            "rejected_requests": self.rejected,
            "aborted_requests": self.aborted,
            "preemptions": self.preemptions,
            "steps": steps,
            "steady_steps": self.steady_steps,
            "scheduled_tokens": self.scheduled_tokens,
            "prefix_hit_tokens": self.prefix_hit_tokens,
            "batch_efficiency": self.batch_fill_sum / steps if steps else 0.0,
            "memory_utilization": self.kv_usage_sum / steps if steps else 0.0,
            "schedule_us_median": float(np.median(us)) if us.size else 0.0,  # over the last STEP_WINDOW steps
            "schedule_us_p99": float(np.percentile(us, 99)) if us.size else 0.0,
            "avg_latency_s": float(lat.mean()) if lat.size else 0.0,
            "p99_latency_s": float(np.percentile(lat, 99)) if lat.size else 0.0,
            "throughput_req_s": self.finished / span if span > 0 else 0.0,
            "throughput_tok_s": self.output_tokens / span if span > 0 else 0.0,
        }
