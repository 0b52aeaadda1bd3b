"""The runtime's recycled step IR (`RecycledStep`) is the IR a fresh `build_step` gives.

A scheduler reuses one step skeleton from step to step (its hot path); one with
`keep_ir` builds every step afresh. Driven through the same trace, both must print
the same IR after the pipeline at every step and decide the same.
"""

from __future__ import annotations

import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.dialects.columns import ColumnsAttr
from schedir.dialects.sched import StepFacts
from schedir.ir.builder import RecycledStep
from schedir.ir.fastop import new_op
from schedir.ir.textio import print_ir

CONFIGS: dict[str, dict[str, object]] = {
    "vllm-fcfs-preempting": {"pipeline": "vllm", "num_blocks": 24, "block_size": 4, "max_num_batched_tokens": 48,
                             "max_num_seqs": 6, "max_model_len": 96},
    "vllm-priority-caching": {"pipeline": "vllm", "policy": "priority", "num_blocks": 40, "block_size": 4,
                              "max_num_batched_tokens": 32, "max_num_seqs": 5, "max_model_len": 96,
                              "long_prefill_token_threshold": 8},
    "base-no-caching": {"pipeline": "base", "enable_prefix_caching": False, "num_blocks": 30, "block_size": 4,
                        "max_num_batched_tokens": 40, "max_num_seqs": 6, "max_model_len": 96},
    "base-caching": {"pipeline": "base", "num_blocks": 30, "block_size": 4, "max_num_batched_tokens": 40,
                     "max_num_seqs": 6, "max_model_len": 96},
}


def _module_text(sched: Scheduler) -> str:
    module = sched.last_module if sched.keep_ir else sched._recycled.module  # type: ignore[union-attr]
    assert module is not None
    return print_ir(module)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_recycled_steps_print_and_decide_like_fresh_ones(name: str) -> None:
    rng = np.random.default_rng(7)
    shared = rng.integers(0, 500, 12).tolist()
    clock = lambda: 1.5  # noqa: E731  (one clock: the steps' now_us facts agree)
    recycled = Scheduler(SchedulerConfig(**CONFIGS[name]), clock=clock)
    fresh = Scheduler(SchedulerConfig(**CONFIGS[name]), clock=clock)
    fresh.keep_ir = True
    for s in (recycled, fresh):  # every step through the skeleton (steady steps skip it: test_runtime_steady;
        s._steady_pipeline = False  # array steps build no IR: tests/test_runtime_steady.py compares those)
        s._arrays_allowed = False
    steps = compared = hits_steps = 0
    for step in range(120):
        if step < 60 and rng.random() < 0.5:
            prompt = (shared if rng.random() < 0.5 else []) + rng.integers(0, 500, int(rng.integers(1, 30))).tolist()
            max_tokens, priority = int(rng.integers(1, 24)), int(rng.integers(0, 3))
            for s in (recycled, fresh):
                s.add_request(Request(f"r{step}", prompt, max_tokens=max_tokens, priority=priority,
                                      arrival_time=float(step)))
        if not recycled.has_requests():
            continue
        a, b = recycled.schedule(), fresh.schedule()
        steps += 1
        if recycled._recycled is not None and recycled._recycled.module is not None:
            text = _module_text(recycled)
            assert text == _module_text(fresh), f"step {a.step}"
            compared += 1
            hits_steps += "mem.match" in text
        assert a.req_ids == b.req_ids and a.num_tokens.tolist() == b.num_tokens.tolist()
        assert a.preempted_req_ids == b.preempted_req_ids and a.finished_req_ids == b.finished_req_ids
        tokens = rng.integers(0, 500, len(a.rows))
        recycled.update(a, tokens)
        fresh.update(b, tokens)
    assert steps > 50 and recycled.metrics.preemptions == fresh.metrics.preemptions > 0
    assert compared == steps  # every step went through the recycled skeleton, mem.match included
    if name == "base-caching":
        assert hits_steps > 0  # steps that carried the cache's answer (mem.match, the prefix-hits fact)


def _facts(step: int) -> StepFacts:
    return StepFacts(step=step, token_budget=64, max_seqs=4, block_size=4, free_blocks=10, cached_free_blocks=0,
                     total_blocks=20, max_model_len=128)


def test_a_rewritten_skeleton_is_not_reused() -> None:
    cols = ColumnsAttr.of_matrix(("id", "total"), np.array([[1, 2], [5, 6]]))
    queues = {"running": cols, "waiting": cols}
    skeleton = RecycledStep(_facts(1), queues, None)
    assert skeleton.refill(_facts(2), queues, None) is skeleton.module
    first = skeleton.block.first_op
    stray = new_op(type(first), (), dict(first.properties), (first.results[0].type,))
    skeleton.block.insert_op_before(stray, first)  # a pass put an op before the queues
    assert skeleton.refill(_facts(3), queues, None) is None
    assert RecycledStep(_facts(1), queues, None).refill(_facts(2), {"running": cols}, None) is None
