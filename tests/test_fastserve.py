"""The `fastserve` preset: skip-join MLFQ whose levels and service persist across steps as
declared request state (mlfq-levels, mlfq-order, mlfq-account)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedir import Request, Scheduler, SchedulerConfig
from schedir.ir.errors import PipelineError
from schedir.ir.pipeline import PassManager


def _step(s: Scheduler) -> tuple[list[str], frozenset[str], list[str]]:
    out = s.schedule()
    finished = s.update(out, {n: [7] for n in out.req_ids})
    return out.req_ids, out.preempted_req_ids, finished


def _levels(s: Scheduler, names) -> list[int]:
    return [s.request_state(n)["mlfq_level"] for n in names]


def test_skip_join_places_a_request_by_its_first_iteration() -> None:
    s = Scheduler(SchedulerConfig(num_blocks=4000, max_num_batched_tokens=16384, max_model_len=16384,
                                  pipeline="fastserve"))
    for name, n in (("short", 100), ("mid", 5000), ("long", 9000)):
        s.add_request(Request(name, [1 + len(name)] * n, max_tokens=4))
    _step(s)
    # quanta 8, 16, 32 units; prefills of 1, 10 and 18 units (512 prompt tokens a unit)
    assert _levels(s, ("short", "mid", "long")) == [0, 1, 2]


def test_a_long_decode_is_demoted_level_by_level() -> None:
    s = Scheduler(SchedulerConfig(num_blocks=400, pipeline="fastserve"))
    s.add_request(Request("a", [1, 2, 3], max_tokens=60))
    seen = []
    for _ in range(59):
        _step(s)
        seen.append(_levels(s, ["a"])[0])
    # levels are decided at the start of a step from the service before it: k units after k
    # steps (the 3-token prefill is one unit); level i is left after 8 * 2**i units
    assert [seen.index(level) for level in (1, 2, 3)] == [8, 8 + 16, 8 + 16 + 32]


def test_a_new_short_job_takes_the_seat_of_a_lower_level_one() -> None:
    s = Scheduler(SchedulerConfig(num_blocks=400, block_size=4, max_num_seqs=2, pipeline="fastserve"))
    s.add_request(Request("old1", [1] * 8, max_tokens=50, arrival_time=0.0))
    s.add_request(Request("old2", [2] * 8, max_tokens=50, arrival_time=1.0))
    for _ in range(12):
        _step(s)
    assert _levels(s, ("old1", "old2")) == [1, 1]
    s.add_request(Request("new", [3] * 4, max_tokens=2, arrival_time=2.0))
    ran, preempted, _ = _step(s)
    assert preempted == {"old2"} and "new" in ran  # the later of the two lower-level jobs gives way
    done = []
    for _ in range(3):
        done += _step(s)[2]
    assert "new" in done
    while s.has_requests():
        _step(s)
    assert s.pool.num_free == s.pool.usable_blocks


def test_starvation_promotes_a_waiting_job_to_the_top_level() -> None:
    spec = "reject-oversized,mlfq-levels{starve-steps=5},mlfq-order,schedule-running,admit-greedy,mlfq-account"
    s = Scheduler(SchedulerConfig(num_blocks=400, block_size=4, max_num_seqs=1, pipeline=spec))
    s.add_request(Request("runner", [1] * 4, max_tokens=40, arrival_time=0.0))
    for _ in range(10):
        _step(s)
    s.add_request(Request("waiter", [2] * 4, max_tokens=40, arrival_time=1.0))
    for _ in range(14):  # waiter joins level 0, preempts runner (level 1), then is demoted itself
        _step(s)
    levels = {n: s.request_state(n)["mlfq_level"] for n in ("runner", "waiter")}
    waiting = [s.table.names[r] for r in s.waiting]
    assert waiting and levels[waiting[0]] == 0  # promoted after 5 steps without service


def test_short_jobs_finish_sooner_than_under_fcfs() -> None:
    def finish_steps(pipeline: str) -> dict[str, int]:
        s = Scheduler(SchedulerConfig(num_blocks=200, block_size=16, max_num_seqs=4, pipeline=pipeline))
        for i in range(4):
            s.add_request(Request(f"long{i}", [10 + i] * 64, max_tokens=200, arrival_time=float(i)))
        when: dict[str, int] = {}
        for step in range(2000):
            if step == 5:
                for i in range(4):
                    s.add_request(Request(f"short{i}", [50 + i] * 16, max_tokens=4, arrival_time=10.0 + i))
            for name in _step(s)[2]:
                when[name] = step
            if not s.has_requests():
                break
        return when

    mlfq, fcfs = finish_steps("fastserve"), finish_steps("base")
    assert max(mlfq[f"short{i}"] for i in range(4)) < 20 < min(fcfs[f"short{i}"] for i in range(4))
    assert set(mlfq) == set(fcfs)  # everyone finishes under both


def test_bad_options_are_refused() -> None:
    with pytest.raises(PipelineError, match="pass 'mlfq-levels': bad option: quantum must be >= 1, got 0"):
        PassManager.parse("reject-oversized,mlfq-levels{quantum=0},mlfq-order")
    with pytest.raises(PipelineError, match="requires 'mlfq-levels'"):
        PassManager.parse("reject-oversized,mlfq-order,schedule-running,admit-greedy").check()


def test_a_new_job_behind_served_ones_does_not_displace_forever() -> None:
    """Invariant-fuzz seed 845 (small size): one seat, a 1-token budget, and a new job queued
    behind jobs promoted by the starvation rule. When a new job displaced running jobs for a
    seat that then went to those older jobs, it displaced again and again: a livelock."""
    from schedir.tools.parity.fuzz import SMALL_SIZE, draw_case
    from schedir.tools.parity.invariants import check_case

    assert check_case(draw_case(845, SMALL_SIZE), "fastserve").steps < 5000


# ------------------------------------------------------------ swap (mlfq-order{preemption=swap}, mlfq-swap-in)
def _displacement(num_cpu_blocks: int, **config) -> tuple[Scheduler, list]:
    """Two long jobs at level 1 fill both seats; a new short job arrives and displaces one."""
    s = Scheduler(SchedulerConfig(num_blocks=400, block_size=4, max_num_seqs=2, pipeline="fastserve",
                                  num_cpu_blocks=num_cpu_blocks, **config))
    s.add_request(Request("old1", [1] * 8, max_tokens=50, arrival_time=0.0))
    s.add_request(Request("old2", [2] * 8, max_tokens=50, arrival_time=1.0))
    for _ in range(12):
        _step(s)
    s.add_request(Request("new", [3] * 4, max_tokens=2, arrival_time=2.0))
    outs = []
    while s.has_requests():
        out = s.schedule()
        s.update(out, {n: [7] for n in out.req_ids})
        outs.append(out)
    return s, outs


def test_a_displaced_job_is_swapped_out_and_comes_back_with_its_progress() -> None:
    s, outs = _displacement(num_cpu_blocks=100)
    first = outs[0]
    assert first.swapped_out_req_ids == {"old2"} and not first.preempted_req_ids and "new" in first.req_ids
    assert len(first.blocks_to_swap_out) == 5  # 8 prompt + 12 generated tokens in 4-token blocks
    back = next(o for o in outs if len(o.blocks_to_swap_in))
    at = back.req_ids.index("old2")
    assert back.num_tokens[at] == 1  # it decodes on: nothing is recomputed
    assert sorted(back.blocks_to_swap_in[:, 0].tolist()) == sorted(first.blocks_to_swap_out[:, 1].tolist())
    assert sum(o.num_tokens[o.req_ids.index("old2")] for o in outs if "old2" in o.req_ids) == 50 - 12
    assert s.pool.num_free == s.pool.usable_blocks and s.pool.host.num_free == 100
    s.pool.check()


@pytest.mark.parametrize("host", [0, 2])
def test_without_room_on_the_host_the_displaced_job_is_recomputed(host: int) -> None:
    _, outs = _displacement(num_cpu_blocks=host)  # none, or fewer host blocks than old2's 5
    assert outs[0].preempted_req_ids == {"old2"} and not outs[0].swapped_out_req_ids
    assert not any(len(o.blocks_to_swap_out) for o in outs)


def test_a_starving_job_displaces_by_swap_and_nobody_loses_progress() -> None:
    """With swap a job that was served before may displace a lower level's (a recompute would
    cost the victim its progress; a swap costs a copy): the starvation rule's promoted jobs."""
    spec = ("reject-oversized,mlfq-levels{starve-steps=5},mlfq-order{preemption=swap},schedule-running,"
            "mlfq-swap-in,admit-greedy,mlfq-account,verify-step")
    s = Scheduler(SchedulerConfig(num_blocks=400, block_size=4, max_num_seqs=1, pipeline=spec, num_cpu_blocks=50))
    s.add_request(Request("runner", [1] * 4, max_tokens=40, arrival_time=0.0))
    for _ in range(10):
        _step(s)
    s.add_request(Request("waiter", [2] * 4, max_tokens=40, arrival_time=1.0))
    swaps = served = 0
    while s.has_requests():
        out = s.schedule()
        assert not out.preempted_req_ids
        swaps += len(out.swapped_out_req_ids)
        served += int(out.num_tokens.sum())
        s.update(out, {n: [7] for n in out.req_ids})
    assert swaps >= 2  # the waiter displaced the runner, then the promoted runner displaced the waiter
    assert served == 2 * (4 + 40 - 1) - (4 + 9)  # every token once (the runner's first 10 steps: 13)
    assert s.pool.num_free == s.pool.usable_blocks and s.pool.host.num_free == 50


def test_swap_needs_a_pass_that_brings_jobs_back() -> None:
    spec = "reject-oversized,mlfq-levels,mlfq-order{preemption=swap},schedule-running,admit-greedy,mlfq-account"
    with pytest.raises(PipelineError, match="pass 'mlfq-order' preempts by swap, but no pass of pipeline"):
        Scheduler(SchedulerConfig(pipeline=spec, num_cpu_blocks=10))
    with pytest.raises(PipelineError, match="preemption must be recompute or swap, got 'park'"):
        PassManager.parse("reject-oversized,mlfq-levels,mlfq-order{preemption=park}")


def test_dumped_fastserve_swap_steps_replay(tmp_path, capsys) -> None:  # noqa: ANN001
    from schedir.tools.cli import main as schedir_main

    s, outs = _displacement(num_cpu_blocks=100, dump_dir=tmp_path, dump_steps="all")
    swaps = [o.step for o in outs if o.swapped_out_req_ids or len(o.blocks_to_swap_in)]
    assert len(swaps) == 2
    for step in swaps:
        stem = f"step-{step:05d}-"
        capsys.readouterr()
        assert schedir_main(["opt", str(tmp_path / f"{stem}00-input.mlir"), "-p", s.spec]) == 0
        replayed = capsys.readouterr().out
        live = (tmp_path / f"{stem}08-verify-step.mlir").read_text()
        assert replayed == live
        assert "host_free_blocks = " in live and ("req.preempt" in live or "mem.swap_in" in live)


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_the_batch_order_kernel_is_the_stable_level_then_arrival_sort(data) -> None:  # noqa: ANN001
    """`level_arrival_order` (a steady step's batch order: the queue in arrival order skips a sort,
    the levels counted) is `_sorted`'s stable (level, arrival) order: ties in queue order, levels
    spread past counting (a mergesort then), unplaced -1 levels, arrivals out of order."""
    import numpy as np

    from schedir.passes.mlfq_order import level_arrival_order

    n = data.draw(st.integers(1, 40))
    running = np.array(data.draw(st.permutations(range(64)))[:n], dtype=np.int64)
    arrival = np.array(data.draw(st.lists(st.integers(0, data.draw(st.sampled_from([0, 3, 10**6]))), min_size=64,
                                          max_size=64)), dtype=np.int64)
    if data.draw(st.booleans()):  # the queue in arrival order (admission order): no sort of arrivals
        arrival[running] = np.sort(arrival[running])
    top = data.draw(st.sampled_from([1, 6, 10**9]))
    lv = np.array(data.draw(st.lists(st.integers(-1, top), min_size=n, max_size=n)), dtype=np.int64)
    by_arrival = np.argsort(arrival[running], kind="mergesort")
    expected = by_arrival[np.argsort(lv[by_arrival], kind="mergesort")]
    assert level_arrival_order(running, lv, arrival).tolist() == expected.tolist()
