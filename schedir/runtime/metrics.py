"""Counters the runtime keeps about itself (the simulator adds latency metrics on top)."""

from __future__ import annotations

import attrs
import numpy as np


@attrs.define
class RuntimeMetrics:
    added: int = 0
    finished: int = 0
    rejected: int = 0
    preemptions: int = 0
    steps: int = 0
    scheduled_tokens: int = 0
    prefix_hit_tokens: int = 0
    step_seconds: list[float] = attrs.field(factory=list)
    batch_fill: list[float] = attrs.field(factory=list)
    kv_usage: list[float] = attrs.field(factory=list)

    def record_step(self, out, seconds: float, budget: int, kv_usage: float) -> None:
        self.steps += 1
        tokens = out.total_num_scheduled_tokens
        self.scheduled_tokens += tokens
        if out.kind.size:
            self.prefix_hit_tokens += int(out.computed[out.kind != 0].sum())
        self.step_seconds.append(seconds)
        self.batch_fill.append(tokens / budget)
        self.kv_usage.append(kv_usage)

    def summary(self) -> dict[str, float]:
        us = np.asarray(self.step_seconds) * 1e6
        return {
            "total_requests": self.added,
            "finished_requests": self.finished,
            "rejected_requests": self.rejected,
            "preemptions": self.preemptions,
            "steps": self.steps,
            "scheduled_tokens": self.scheduled_tokens,
            "prefix_hit_tokens": self.prefix_hit_tokens,
            "batch_efficiency": float(np.mean(self.batch_fill)) if self.batch_fill else 0.0,
            "memory_utilization": float(np.mean(self.kv_usage)) if self.kv_usage else 0.0,
            "schedule_us_median": float(np.median(us)) if us.size else 0.0,
            "schedule_us_p99": float(np.percentile(us, 99)) if us.size else 0.0,
        }
