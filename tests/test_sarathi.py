"""The `sarathi` preset: stall-free batching under a token budget derived from a TBT target."""

from __future__ import annotations

import numpy as np

from schedir.passes.sarathi_budget import SarathiBudget
from schedir.sim.config import SimConfig
from schedir.sim.metrics import summarize
from schedir.sim.simulator import Simulator
from schedir.sim.workloads import builtin_workload


def test_the_budget_follows_the_tbt_target() -> None:
    assert SarathiBudget().budget() == (100_000 - 8000) // 29
    assert SarathiBudget(tbt_ms=50).budget() == (50_000 - 8000) // 29


def test_tail_tbt_stays_under_the_target_where_vllm_s_does_not() -> None:
    workload = builtin_workload("chat-short", num_requests=500, rate=18.0, seed=0)
    p99 = {}
    for preset in ("vllm", "sarathi"):
        metrics = summarize(Simulator(SimConfig(pipeline=preset)).run(workload))
        p99[preset] = metrics["tbt_s"]["p99"]
    assert p99["sarathi"] <= 0.100 < p99["vllm"]
    assert np.isfinite(p99["sarathi"])
