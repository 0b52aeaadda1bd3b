"""The `vllm-v0-priority` preset: vLLM v0's scheduler under its priority policy.

Step-by-step parity with vLLM 0.8.5's real v0 scheduler (`_schedule_priority_preemption`) runs
when its environment is present (docs/vllm-v0-reference.md); the rules that set v0's priority
policy apart, and the configuration errors, are checked here without it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.ir.errors import PipelineError
from schedir.passes.order_v0_priority import deque_first, deque_head, deque_order
from schedir.tools.cli import main as schedir_main
from schedir.tools.parity import v0_reference, v0_schedir, v0_trace

V0_ENV = v0_reference.unavailable_reason()


def priority_config(**kw: object) -> SchedulerConfig:
    base = dict(num_blocks=41, block_size=4, max_num_batched_tokens=64, max_model_len=64, max_num_seqs=4,
                enable_prefix_caching=False, pipeline="vllm-v0-priority", policy="priority")
    base.update(kw)
    return SchedulerConfig(**base)  # type: ignore[arg-type]


def add(s: Scheduler, name: str, priority: int, prompt: int = 10, max_tokens: int = 30, at: float = 0.0) -> None:
    s.add_request(Request(name, list(range(3, 3 + prompt)), max_tokens=max_tokens, ignore_eos=True,
                          priority=priority, arrival_time=at))


def step(s: Scheduler):  # noqa: ANN201
    out = s.schedule()
    s.pool.check()
    s.update(out, np.where(out.sampled, 7, -1))
    return out


def test_the_deque_head_kernels_agree_with_the_deque_order() -> None:
    """`deque_first` (the window's head, no sort) and `deque_head` are `deque_order`'s first k and
    first, on queues with every run, ties in (priority, arrival) and marked victims."""
    rng = np.random.default_rng(7)
    for trial in range(300):
        n = int(rng.integers(0, 40))
        queued = rng.permutation(np.arange(-20, 40))[:n].astype(np.int64)
        priority, arrival = rng.integers(0, 3, n), rng.integers(0, 4, n)
        sorted_at = np.where(rng.random(n) < 0.2, 9, -1)
        record = (9.0, float(rng.integers(-10, 5)), float(rng.integers(0, 30))) if trial % 4 else (-1.0, 0.0, -1.0)
        full = deque_order(queued, priority, arrival, sorted_at, *record)
        for k in (1, 3, 17, 64):
            assert deque_first(queued, priority, arrival, sorted_at, *record, k).tolist() == full[:k].tolist()
        assert deque_head(queued, priority, arrival, sorted_at, *record) == (full[0] if n else -1)


def test_the_policy_needs_its_preset() -> None:
    with pytest.raises(PipelineError, match="order-v0-priority: the vllm-v0-priority preset"):
        Scheduler(priority_config(pipeline="vllm-v0"))
    with pytest.raises(PipelineError, match="v0-chunked-running' reproduces policy fcfs only"):
        Scheduler(priority_config(pipeline="vllm-v0-chunked"))
    with pytest.raises(PipelineError, match="queues it as waiting"):
        Scheduler(priority_config(pipeline="order-v0-priority,v0-prefills,v0-priority-preemption{preemption=swap},"
                                           "v0-running,v0-swapped"))
    with pytest.raises(PipelineError, match="v0-running' reproduces policy 'priority' only after .*"
                                            "v0-priority-preemption"):
        Scheduler(priority_config(pipeline="order-v0-priority,v0-prefills,v0-running,v0-swapped"))


def test_a_lower_priority_decode_gives_way_by_recompute() -> None:
    """Two low-priority requests hold 6 of 8 blocks free... until a high-priority prompt that needs
    more than what is free arrives: the latest low-priority one is recomputed for it in a decode
    step, and the high-priority one is admitted in the next."""
    s = Scheduler(priority_config(num_blocks=13), clock=lambda: 0.0)  # 12 usable blocks
    add(s, "lo-a", 5, prompt=16, at=0.0)
    add(s, "lo-b", 5, prompt=16, at=1.0)
    assert step(s).req_ids == ["lo-a", "lo-b"]  # 8 blocks held, 4 free
    add(s, "hi", 0, prompt=24, max_tokens=4, at=2.0)  # needs 6 blocks: can_allocate says LATER
    out = step(s)
    assert out.req_ids == ["lo-a"] and out.preempted_req_ids == {"lo-b"}  # a decode step: lo-b gives way
    assert s.request_state("lo-b")["v0_sorted_at"] == out.step  # put in the sorted deque, behind hi
    out = step(s)
    assert out.req_ids == ["hi"] and out.num_tokens.tolist() == [24]  # admitted whole, prefill-first
    assert [s.table.names[r] for r in s.waiting.tolist()] == ["lo-b"]


def test_a_dumped_priority_step_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The step whose priority rule preempted replays alone from its dump (the deque's record and
    the victims' mark are in the IR), and dumping changes no decision."""
    def run(dump: bool) -> tuple[Scheduler, list]:
        s = Scheduler(priority_config(num_blocks=13, **({"dump_dir": tmp_path, "dump_steps": "all"} if dump else {})),
                      clock=lambda: 0.0)
        add(s, "lo-a", 5, prompt=16, at=0.0)
        add(s, "lo-b", 5, prompt=16, at=1.0)
        outs = [step(s)]
        add(s, "hi", 0, prompt=24, max_tokens=4, at=2.0)
        while s.has_unfinished_requests():
            outs.append(step(s))
        return s, outs

    s, dumped = run(True)
    _, plain = run(False)
    assert [(o.req_ids, sorted(o.preempted_req_ids)) for o in dumped] == [
        (o.req_ids, sorted(o.preempted_req_ids)) for o in plain]
    stem = f"step-{dumped[1].step:05d}-"
    assert dumped[1].preempted_req_ids == {"lo-b"}
    code = schedir_main(["opt", str(tmp_path / f"{stem}00-input.mlir"), "-p", s.spec])
    replayed = capsys.readouterr().out
    live = (tmp_path / f"{stem}05-v0-swapped.mlir").read_text()
    assert code == 0 and replayed == live
    assert "v0_sorted_at = [" in live and "v0_sort_step = " in live and "req.preempt" in live
    # the same step under the FCFS preset's pipeline is refused as the runtime refuses the config,
    # naming the pass, the policy the step carries and the preset that reproduces it
    code = schedir_main(["opt", str(tmp_path / f"{stem}00-input.mlir"), "-p", "vllm-v0"])
    said = capsys.readouterr()
    assert code == 2 and not said.out
    assert "pass 'v0-prefills' reproduces policy 'priority' only after" in said.err
    assert "the vllm-v0-priority preset); the step's policy is 'priority'" in said.err
    assert "Traceback" not in said.err


def test_an_arrival_after_a_sort_waits_behind_the_sorted_block() -> None:
    """v0 sorts its waiting deque only in steps that schedule no prefill: a request that arrives
    after such a step joins the back, whatever its priority, until the next one (the v1 heap of
    the `vllm` preset would put it first)."""
    s = Scheduler(priority_config(max_num_seqs=2), clock=lambda: 0.0)
    add(s, "r1", 0, max_tokens=3, at=0.0)
    add(s, "r2", 0, at=0.0)
    assert step(s).req_ids == ["r1", "r2"]
    add(s, "a", 3, at=1.0)
    add(s, "c", 1, at=1.0)
    step(s)  # every seat taken: a decode step, which sorts the deque: c, a
    step(s)  # r1's third token: it finishes
    add(s, "b", 0, at=2.0)  # the best priority of all, but after the sort
    out = step(s)
    assert out.req_ids == ["c"]  # one seat: the sorted block's head (FCFS would take a, a heap b)
    assert v0_schedir.queues(s)["waiting"] == ["a", "b"]  # v0's deque: the sorted block, then b


def test_fcfs_under_the_preset_is_vllm_v0() -> None:
    """Under FCFS the preset's two passes add nothing: the same outputs as `vllm-v0`, step by step."""
    trace, cfg = v0_schedir.random_scenario(1003)
    cfg = {**cfg, "enable_chunked_prefill": False, "max_num_batched_tokens": 2 * cfg["max_model_len"],
           "preemption_mode": None, "policy": "fcfs"}
    ours = v0_schedir.run_schedir(trace, cfg)
    spec = v0_schedir.pipeline_for(v0_trace.check_config(cfg))
    assert spec.startswith("order-vllm")
    other = v0_schedir.run_schedir(trace, {**cfg, "policy": "fcfs"}, pipeline=spec.replace(
        "order-vllm,", "order-v0-priority,").replace("v0-running", "v0-priority-preemption,v0-running", 1))
    assert len(ours["steps"]) > 20 and ours["steps"] == other["steps"]


@pytest.mark.skipif(V0_ENV is not None, reason=f"vLLM 0.8.5's v0 scheduler is not available: {V0_ENV}")
def test_random_priority_scenarios_match_v0_step_by_step() -> None:
    """Random configs and traces under the priority policy (`python -m schedir.tools.parity.v0_schedir
    --random-priority N` runs more): every step's batch, preemptions and queues as v0's."""
    scenarios = {f"random-priority-{k}": v0_schedir.random_priority_scenario(k) for k in range(2000, 2016)}
    refs = v0_reference.run_reference(scenarios)
    steps = by_priority = 0
    for name, (trace, cfg) in scenarios.items():
        ours = v0_schedir.run_schedir(trace, cfg)
        steps += len(ours["steps"])
        by_priority += sum(p["by"] == "priority" for s in refs[name]["steps"] for p in s.get("preemptions", []))
        diffs = v0_schedir.compare(refs[name], ours)
        assert diffs == [], f"{name} {cfg}: {diffs[:5]}"
    assert steps > 1000 and by_priority >= 5  # the priority rule itself was exercised


@pytest.mark.skipif(V0_ENV is not None, reason=f"vLLM 0.8.5's v0 scheduler is not available: {V0_ENV}")
def test_the_comparison_sees_fcfs_where_v0_sorts() -> None:
    trace, cfg = v0_trace.scenarios()["priority"]
    ref = v0_reference.run_reference({"priority": (trace, cfg)})["priority"]
    assert v0_schedir.compare(ref, v0_schedir.run_schedir(trace, cfg)) == []
    fcfs = v0_schedir.run_schedir(trace, {**cfg, "policy": "fcfs"})
    assert any("recomputed" in d for d in v0_schedir.compare(ref, fcfs))
