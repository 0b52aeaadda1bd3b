"""order-slo and the `slo-aware` presets: deadline-aware order from the step's clock (`now_us`)."""

from __future__ import annotations

import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.ir.errors import PassFailure
from schedir.ir.pipeline import PassManager
from schedir.ir.textio import parse_step_text
from schedir.sim.config import SimConfig
from schedir.sim.metrics import summarize
from schedir.sim.simulator import Simulator
from schedir.sim.workloads import builtin_workload


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_runtime_records_its_clock_in_every_step() -> None:
    clock = Clock()
    s = Scheduler(SchedulerConfig(num_blocks=64, pipeline="slo-aware"), clock=clock)
    s.keep_ir = True
    clock.now = 12.5
    s.add_request(Request("a", [1, 2, 3], max_tokens=2))
    s.schedule()
    assert s.last_module.body.block.first_op.read_facts().now_us == 12_500_000  # type: ignore[attr-defined]


def test_hopeless_requests_go_last_or_are_rejected_with_a_reason() -> None:
    def run(pipeline: str) -> tuple[list[str], dict[str, str]]:
        clock = Clock()
        s = Scheduler(SchedulerConfig(num_blocks=4000, max_num_batched_tokens=4096, pipeline=pipeline), clock=clock)
        s.add_request(Request("old", [1] * 3000, max_tokens=2, arrival_time=0.0))  # waited 5 s already
        s.add_request(Request("new", [2] * 3000, max_tokens=2, arrival_time=4.9))
        s.add_request(Request("strict", [3] * 100, max_tokens=2, arrival_time=4.95, state={"ttft_slo_ms": 1}))
        clock.now = 5.0
        out = s.schedule()
        return out.req_ids, out.rejected

    assert run("slo-aware")[0][0] == "new"  # the old one would miss 2 s anyway: it goes behind
    ran, rejected = run("slo-aware-reject")
    assert rejected == {"old": "slo", "strict": "slo"} and ran == ["new"]
    assert run("vllm")[0][0] == "old"


def test_a_step_without_a_clock_is_refused_by_name() -> None:
    module = parse_step_text(
        'sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 0, '
        'total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = ["admissible"]} {\n'
        '  %w = req.queue waiting {id = [3], prompt = [40], computed = [0], total = [40], max_tokens = [8], '
        'priority = [0], arrival = [7], status = [waiting], blocks = [0]}\n}')
    with pytest.raises(PassFailure, match="order-slo.*the step has no clock"):
        PassManager.parse("order-slo").run(module)


def test_deadline_aware_order_raises_goodput_under_overload() -> None:
    workload = builtin_workload("chat-short", num_requests=600, rate=34.0, seed=0)  # ~2x what one H100 serves
    goodput = {p: summarize(Simulator(SimConfig(pipeline=p)).run(workload))["goodput_req_s"]
               for p in ("vllm", "slo-aware", "slo-aware-reject")}
    assert goodput["slo-aware"] > 1.5 * goodput["vllm"]
    assert goodput["slo-aware-reject"] > 1.5 * goodput["vllm"]


def test_the_last_feasible_clock_is_where_all_feasible_flips() -> None:
    """`last_feasible_us` (what a steady step holds while the queue stays as it is) is exactly the
    latest clock at which `all_feasible` holds: true at it and every earlier clock tried, false
    one µs later and beyond; random queues, targets, rates and arrival times."""
    import numpy as np

    from schedir.passes.order_slo import all_feasible, last_feasible_us

    rng = np.random.default_rng(7)
    for _ in range(400):
        n = int(rng.integers(1, 12))
        rows = rng.permutation(20)[:n]
        arrival = rng.integers(0, 5_000_000, 20)
        total = rng.integers(1, 5000, 20)
        computed = np.minimum(rng.integers(0, 3000, 20), total - 1)
        slo_ms = rng.choice([0, 50, 300, 2000], 20)
        default_ms = int(rng.choice([100, 1000]))
        rate = float(rng.choice([0.02, 0.5, 3.7, 20.0]))  # tokens per µs
        last = last_feasible_us(arrival, computed, total, slo_ms, rows, default_ms, rate)
        assert all_feasible(arrival, computed, total, slo_ms, rows, default_ms, last, rate)
        assert not all_feasible(arrival, computed, total, slo_ms, rows, default_ms, last + 1, rate)
        for now in rng.integers(last - 10_000_000, last + 10_000_000, 5).tolist():
            assert all_feasible(arrival, computed, total, slo_ms, rows, default_ms, now, rate) == (now <= last)
