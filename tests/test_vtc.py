"""The `vtc` preset: per-tenant Virtual Token Counters as vector scheduler state."""

from __future__ import annotations

import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.ir.textio import print_ir


def _finish_steps(pipeline: str) -> tuple[dict[str, int], Scheduler]:
    s = Scheduler(SchedulerConfig(num_blocks=2000, max_num_batched_tokens=256, max_num_seqs=4, pipeline=pipeline))
    for i in range(20):  # tenant 1 floods the queue first
        s.add_request(Request(f"heavy{i}", [i + 1] * 200, max_tokens=20, arrival_time=i * 0.01,
                              state={"tenant": 1}))
    for i in range(3):
        s.add_request(Request(f"light{i}", [100 + i] * 200, max_tokens=20, arrival_time=1.0 + i * 0.01,
                              state={"tenant": 2}))
    done: dict[str, int] = {}
    for k in range(2000):
        out = s.schedule()
        for name in s.update(out, {n: [5] for n in out.req_ids}):
            done[name] = k
        if not s.has_requests():
            break
    return done, s


def test_a_light_tenant_is_not_starved_by_a_flooding_one() -> None:
    fcfs, _ = _finish_steps("vllm")
    vtc, s = _finish_steps("vtc")
    assert max(vtc[f"light{i}"] for i in range(3)) * 2 < min(fcfs[f"light{i}"] for i in range(3))
    assert set(vtc) == set(fcfs)  # everyone finishes
    counters = s.scheduler_state["vtc_counter"]
    # 20 heavy requests: 200 prompt tokens at weight 1 and 19 decode tokens at weight 2 each, plus
    # each one's first sampled token on its last prefill chunk
    assert counters[1] == 20 * (200 + 2 * 19) and counters[2] == 3 * (200 + 2 * 19) and counters[0] == 0


def test_the_counters_show_in_the_step_and_a_returning_tenant_is_lifted() -> None:
    s = Scheduler(SchedulerConfig(num_blocks=2000, max_num_batched_tokens=64, pipeline="vtc"))
    s.keep_ir = True
    s.add_request(Request("a", [1] * 60, max_tokens=30, state={"tenant": 1}))
    for _ in range(5):
        out = s.schedule()
        s.update(out, {n: [5] for n in out.req_ids})
    s.add_request(Request("b", [2] * 8, max_tokens=2, state={"tenant": 3}))
    s.schedule()
    text = print_ir(s.last_module)
    assert "sched.state {vtc_counter = [0.0, 68.0, 0.0, 0.0" in text  # 60 prompt + 4 decodes at weight 2
    lifted = np.array(s.scheduler_state["vtc_counter"])
    assert lifted[3] >= 68.0  # tenant 3 came back below the served tenant's counter: lifted to it


def test_a_tenant_out_of_range_is_refused_by_request() -> None:
    s = Scheduler(SchedulerConfig(num_blocks=200, pipeline="vtc"))
    with pytest.raises(ValueError, match=r"request 'x': state 'tenant' must be in 0..63, got 99"):
        s.add_request(Request("x", [1, 2], state={"tenant": 99}))
    assert not s.has_unfinished_requests()
