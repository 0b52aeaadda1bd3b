"""The seed's four passes inside the runtime: prefix sharing, priority, length groups, preemption."""

from __future__ import annotations

import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.passes.batching_efficiency import length_groups
from schedir.passes.memory_aware_preemption import victim_order


def _drain(s: Scheduler, out) -> None:
    s.update(out, {n: [7] for n in out.req_ids})


def test_prefix_cache_aware_serves_cached_prefix_first() -> None:
    cfg = SchedulerConfig(num_blocks=64, block_size=4, max_num_batched_tokens=64, max_num_seqs=1,
                          pipeline="with-prefix-aware")
    s = Scheduler(cfg, clock=lambda: 0.0)
    shared = list(range(100, 116))  # 4 blocks
    s.add_request(Request("warm", shared + [1], max_tokens=1, arrival_time=0.0))
    while s.has_unfinished_requests():
        _drain(s, s.schedule())
    s.add_request(Request("cold", list(range(200, 217)), max_tokens=1, arrival_time=1.0))
    s.add_request(Request("hot", shared + [2], max_tokens=1, arrival_time=2.0))
    out = s.schedule()
    assert out.req_ids == ["hot"]  # max_num_seqs=1: the later request with the cached prefix wins


def test_batching_efficiency_groups_lengths() -> None:
    groups = length_groups(np.array([100, 110, 1000, 1050, 140]), 0.5)
    assert groups[0] == groups[1] and groups[2] == groups[3] and groups[0] != groups[2]
    assert (np.array([100, 140]) / 100).max() <= 1.5


def test_batching_efficiency_in_runtime_and_age_bound() -> None:
    t = [10.0]
    cfg = SchedulerConfig(num_blocks=256, block_size=16, max_num_batched_tokens=4096, max_num_seqs=2,
                          pipeline="reject-oversized,batching-efficiency{max_age_ms=500},schedule-running,admit-greedy")
    s = Scheduler(cfg, clock=lambda: t[0])
    s.add_request(Request("short1", [1] * 50, max_tokens=1, arrival_time=9.9))
    s.add_request(Request("long", [2] * 900, max_tokens=1, arrival_time=9.95))
    s.add_request(Request("short2", [3] * 55, max_tokens=1, arrival_time=9.99))
    assert sorted(s.schedule().req_ids) == ["short1", "short2"]  # similar lengths batched, long waits
    s2 = Scheduler(cfg, clock=lambda: t[0])
    s2.add_request(Request("short1", [1] * 50, max_tokens=1, arrival_time=9.95))
    s2.add_request(Request("long", [2] * 900, max_tokens=1, arrival_time=9.0))  # older than 500 ms
    s2.add_request(Request("short2", [3] * 55, max_tokens=1, arrival_time=9.99))
    assert s2.schedule().req_ids[0] == "long"  # the aged one keeps FCFS precedence
    # aged requests go first, FCFS, ahead of the group their length would put them behind: at
    # 10.0 s, "short1" and "long" have waited over 500 ms ("short2" has not); the age bound
    # reads the runtime's clock (the pass declares `reads_clock`)
    s3 = Scheduler(cfg, clock=lambda: t[0])
    s3.add_request(Request("short1", [1] * 50, max_tokens=1, arrival_time=9.0))
    s3.add_request(Request("long", [2] * 900, max_tokens=1, arrival_time=9.1))
    s3.add_request(Request("short2", [3] * 55, max_tokens=1, arrival_time=9.95))
    assert s3.schedule().req_ids == ["short1", "long"]


def test_victim_orders() -> None:
    priority = np.array([5, 3, 5]); arrival = np.array([1, 2, 3])
    progress = np.array([9, 2, 4]); last = np.array([7, 5, 6])
    assert victim_order("lowest-priority", priority, arrival, progress, last).tolist() == [2, 0, 1]
    assert victim_order("least-progress", priority, arrival, progress, last).tolist() == [1, 2, 0]
    assert victim_order("lru", priority, arrival, progress, last).tolist() == [1, 2, 0]


@pytest.mark.parametrize("victim", ["lowest-priority", "least-progress", "lru"])
def test_urgent_prefill_preempts_low_priority_decode(victim: str) -> None:
    cfg = SchedulerConfig(num_blocks=11, block_size=4, max_num_batched_tokens=256, max_num_seqs=8, policy="priority",
                          pipeline=f"reject-oversized,priority-based,memory-aware-preemption{{victim={victim}}},"
                                   "schedule-running,admit-greedy")
    s = Scheduler(cfg, clock=lambda: 0.0)
    s.add_request(Request("keep", [1] * 12, max_tokens=6, priority=0, arrival_time=0.0, ignore_eos=True))
    s.add_request(Request("low", [2] * 12, max_tokens=6, priority=9, arrival_time=1.0, ignore_eos=True))
    for _ in range(3):
        _drain(s, s.schedule())
    s.add_request(Request("urgent", [3] * 16, max_tokens=2, priority=0, arrival_time=2.0, ignore_eos=True))
    out = s.schedule()
    assert out.preempted_req_ids == {"low"}
    _drain(s, out)
    out = s.schedule()
    assert "urgent" in out.req_ids and "low" not in out.req_ids


def test_no_preemption_without_a_less_urgent_decode() -> None:
    cfg = SchedulerConfig(num_blocks=11, block_size=4, max_num_batched_tokens=256, max_num_seqs=8, policy="priority",
                          pipeline="reject-oversized,priority-based,memory-aware-preemption,schedule-running{preempt=false},"
                                   "admit-greedy")
    s = Scheduler(cfg, clock=lambda: 0.0)
    s.add_request(Request("a", [1] * 12, max_tokens=6, priority=0, arrival_time=0.0, ignore_eos=True))
    s.add_request(Request("b", [2] * 12, max_tokens=6, priority=0, arrival_time=1.0, ignore_eos=True))
    for _ in range(3):
        _drain(s, s.schedule())
    s.add_request(Request("late", [3] * 16, max_tokens=2, priority=0, arrival_time=2.0, ignore_eos=True))
    assert not s.schedule().preempted_req_ids


def test_with_all_passes_drains() -> None:
    s = Scheduler(SchedulerConfig(num_blocks=32, block_size=4, max_num_batched_tokens=64, pipeline="with-all-passes"),
                  clock=lambda: 0.0)
    rng = np.random.default_rng(0)
    for i in range(12):
        s.add_request(Request(str(i), rng.integers(0, 50, rng.integers(1, 30)).tolist(), max_tokens=int(rng.integers(1, 8)),
                              priority=int(rng.integers(0, 3)), arrival_time=float(i), ignore_eos=True))
    done: set[str] = set()
    for _ in range(500):
        if not s.has_unfinished_requests():
            break
        out = s.schedule()
        done |= set(s.update(out, {n: [7] for n in out.req_ids}))
    assert done == {str(i) for i in range(12)}
