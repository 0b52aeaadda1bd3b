"""The vllm preset's admission window: a long waiting queue enters the step as its head only,
and the decisions are the same as with the whole queue in the step."""

from __future__ import annotations

import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.runtime import table as T


def run(window: bool, policy: str, seed: int, num_blocks: int) -> list[tuple]:
    cfg = SchedulerConfig(num_blocks=num_blocks, block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
                          max_model_len=256, policy=policy)
    sched = Scheduler(cfg)
    if not window:
        sched.window = 0
    else:
        assert sched.window == 4 + 16
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 1000, 32).tolist()
    n = 400  # far more than the window: most of the queue sits outside every step
    for i in range(n):
        length = int(rng.integers(1, 60))
        tokens = (shared[: int(rng.integers(0, 32))] + rng.integers(0, 1000, length).tolist())[:250]
        if i % 97 == 5:
            tokens = rng.integers(0, 1000, 300).tolist()  # longer than max_model_len: rejected
        sched.add_request(Request(f"r{i:04d}", tokens, max_tokens=int(rng.integers(1, 20)),
                                  priority=int(rng.integers(0, 3)), arrival_time=float(i // 50)))
    decisions = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        decisions.append((tuple(out.req_ids), tuple(out.num_tokens.tolist()), tuple(out.computed.tolist()),
                          tuple(sorted(out.preempted_req_ids)), tuple(sorted(out.rejected.items()))))
        sched.update(out, np.where(out.sampled, 7, -1))
        if window and policy == "fcfs":  # the window is the queue's head: it must stay in queued order
            queued = sched.table.data[T.QUEUED, sched.waiting]
            assert (np.diff(queued) > 0).all(), f"waiting out of queued order after step {len(decisions)}"
        assert len(decisions) < 20000
    assert sched.get_metrics()["finished_requests"] + sched.get_metrics()["rejected_requests"] == n
    return decisions


@pytest.mark.parametrize("num_blocks", [300, 40])  # 40: preemptions and exceeds-cache rejections
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_admission_window_keeps_every_decision(policy, num_blocks):
    windowed = run(True, policy, seed=3, num_blocks=num_blocks)
    whole = run(False, policy, seed=3, num_blocks=num_blocks)
    if num_blocks == 40:
        assert any(step[3] for step in whole) and any(step[4] for step in whole)
    assert len(windowed) == len(whole)
    for step, (a, b) in enumerate(zip(windowed, whole, strict=True)):
        assert a == b, f"step {step + 1} differs"


def test_pipelines_with_another_order_see_the_whole_queue():
    assert Scheduler(SchedulerConfig(pipeline="base")).window == 0
