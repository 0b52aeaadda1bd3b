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


@pytest.mark.parametrize("seed", range(6))
def test_vtc_head_keys_place_the_head_as_the_whole_rank_does(seed: int) -> None:
    """`vtc_head_keys` over a queue in arrival order places its first k picks exactly where
    `vtc_rank_keys` places them (lifted counters, refused requests, tenants of uneven backlog),
    the rest after them; every one when k picks take every kept request."""
    from schedir.ir.window import UNRANKED
    from schedir.passes.vtc_order import vtc_head_keys, vtc_rank_keys

    rng = np.random.default_rng(seed)
    n, rows = 300, 400
    tenant_of = rng.choice([0, 1, 2, 5], size=rows, p=[0.6, 0.25, 0.1, 0.05]).astype(np.int64)
    arrival_of = rng.integers(0, 10**6, rows).astype(np.int64)
    total_of = rng.integers(10, 500, rows).astype(np.int64)
    computed_of = (total_of * rng.uniform(0, 0.9, rows)).astype(np.int64)
    waiting = rng.permutation(rows)[:n].astype(np.int64)
    waiting = waiting[np.argsort(arrival_of[waiting], kind="stable")]
    running = np.setdiff1d(np.arange(rows), waiting)[:12].astype(np.int64)
    refused = rng.random(n) < 0.05
    counters = np.zeros(64)
    counters[:6] = rng.uniform(0, 5000, 6)
    ok, full, _ = vtc_rank_keys(waiting, refused, running, tenant_of, arrival_of, total_of, computed_of, counters, 1.0)
    assert ok
    for k in (1, 7, 40, n - int(refused.sum()), n):
        outcome, keys, placed = vtc_head_keys(waiting, refused, running, tenant_of, arrival_of, total_of, computed_of,
                                              counters, 1.0, k)
        assert outcome == 1
        if k >= n - refused.sum():  # every kept request placed: the whole rank
            assert placed == n and np.array_equal(keys, full)
            continue
        assert placed == k
        head = keys < placed
        assert np.array_equal(head, full < k) and np.array_equal(keys[head], full[head])
        assert (keys[~head] >= UNRANKED).all()
    shuffled = waiting[::-1].copy()
    assert vtc_head_keys(shuffled, refused, running, tenant_of, arrival_of, total_of, computed_of, counters, 1.0,
                         5)[0] == 2  # out of arrival order: the caller ranks the whole queue
    tenant_of[waiting[~refused][0]] = 99
    assert vtc_head_keys(waiting, refused, running, tenant_of, arrival_of, total_of, computed_of, counters, 1.0,
                         5)[0] == 0


def test_a_partial_rank_answers_no_head_past_what_it_placed() -> None:
    """A head asked of a partial rank (`WindowContext.partial_rank`) within the placed requests is
    the rank's; one that would reach past them is None (the whole queue), skipped ones counted."""
    from schedir.ir.window import UNRANKED, WindowContext

    keys = np.array([UNRANKED + 0, 2, UNRANKED + 2, 0, 1, UNRANKED + 5], dtype=np.int64)
    ctx = WindowContext(np.zeros(0, np.int64), np.arange(6), 8, 0, 0, 0, 16, 0, np.zeros(0, np.int64), {},
                        lambda name, ids: ids, lambda name, ids: ids)
    ctx.partial_rank(keys, 3)
    assert ctx.first_by_rank(keys, 3).tolist() == [1, 3, 4]
    assert ctx.first_by_rank(keys, 4) is None
    ctx.rank = (keys, np.zeros(0, np.int64))
    skipped = np.zeros(6, dtype=np.bool_)
    assert ctx.reach(skipped, 3).tolist() == [1, 3, 4]
    skipped[3] = True  # a skipped one among the placed: the walk's third other may be unplaced
    assert ctx.reach(skipped, 3) is None
    assert ctx.reach(skipped, 2).tolist() == [1, 3, 4]
    whole = keys.copy()  # the same values, not declared partial: ranked as they are
    assert ctx.first_by_rank(whole, 4).tolist() == [0, 1, 3, 4]
