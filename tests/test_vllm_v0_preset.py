"""The `vllm-v0` preset: three queues, preemption by recompute or by swap to the host tier.

Step-by-step parity with vLLM 0.8.5's real v0 scheduler runs when its environment is present
(docs/vllm-v0-reference.md); the runtime's swap mechanics, dumps and errors are checked here
without it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.ir.errors import PipelineError
from schedir.tools.cli import main as schedir_main
from schedir.tools.parity import v0_reference, v0_schedir, v0_trace

V0_ENV = v0_reference.unavailable_reason()


def swap_config(**kw: object) -> SchedulerConfig:
    base = dict(num_blocks=21, block_size=4, max_num_batched_tokens=64, max_model_len=64,
                enable_prefix_caching=False, pipeline="vllm-v0-swap", num_cpu_blocks=40)
    base.update(kw)
    return SchedulerConfig(**base)  # type: ignore[arg-type]


def drive(s: Scheduler, n: int = 5, max_tokens: int = 30, steps: int = 400) -> list:
    for k in range(n):
        s.add_request(Request(f"r{k}", (np.arange(10) + 3 + k).tolist(), max_tokens=max_tokens, ignore_eos=True,
                              arrival_time=0.0))
    outs = []
    for _ in range(steps):
        if not s.has_unfinished_requests():
            break
        out = s.schedule()
        s.pool.check()  # device and host blocks conserved, every step
        outs.append(out)
        s.update(out, np.where(out.sampled, 7, -1))
    return outs


def test_swap_moves_blocks_to_the_host_and_back() -> None:
    s = Scheduler(swap_config(), clock=lambda: 0.0)
    outs = drive(s)
    assert not s.has_unfinished_requests()
    outs_swapping = [o for o in outs if o.swapped_out_req_ids]
    assert outs_swapping, "the pool is small enough to swap"
    for o in outs_swapping:
        assert not o.preempted_req_ids & o.swapped_out_req_ids
        assert len(o.blocks_to_swap_out) > 0
        assert (o.blocks_to_swap_out[:, 1] < 40).all()  # destinations are host blocks
    back = [o for o in outs if len(o.blocks_to_swap_in)]
    assert back
    for o in back:
        resumed = o.kind == 2
        assert resumed.any() and (o.num_tokens[resumed] == 1).all()  # back as a decode, KV kept
        assert (o.computed[resumed] > 0).all()
        for i in np.flatnonzero(resumed):
            table = o.block_table[i, : o.nblk_after[i]]
            assert np.isin(o.blocks_to_swap_in[:, 1], table).any()
    assert s.pool.num_free == s.pool.usable_blocks and s.pool.host.num_free == 40
    assert s.get_metrics()["finished_requests"] == 5
    # a step is all-prefill or all-decode (v0's default path)
    for o in outs:
        came_new = o.kind == 1
        assert came_new.all() or not came_new.any()


def test_recompute_by_default_and_without_swap_space() -> None:
    for cfg in (swap_config(pipeline="vllm-v0"), swap_config(num_cpu_blocks=0)):
        s = Scheduler(cfg, clock=lambda: 0.0)
        outs = drive(s)
        assert any(o.preempted_req_ids for o in outs)
        assert not any(o.swapped_out_req_ids for o in outs) and not s.swapped.size
        assert not s.has_unfinished_requests()


def swapped_scheduler() -> Scheduler:
    """Five requests on the small pool, run until one is swapped out."""
    s = Scheduler(swap_config(), clock=lambda: 0.0)
    for k in range(5):
        s.add_request(Request(f"r{k}", list(range(3, 13)), max_tokens=30, ignore_eos=True, arrival_time=0.0))
    while not s.swapped.size:
        out = s.schedule()
        s.update(out, np.where(out.sampled, 7, -1))
    return s


def test_abort_of_a_swapped_request_frees_its_host_blocks() -> None:
    s = swapped_scheduler()
    victim = s.table.names[s.swapped[0]]
    held = s.pool.host.num_free
    assert s.finish_requests([victim]) == [victim]
    assert not s.swapped.size and s.pool.host.num_free > held
    s.pool.check()
    assert s.get_num_unfinished_requests() == 4


def test_switching_away_while_requests_are_swapped_is_refused() -> None:
    s = swapped_scheduler()
    with pytest.raises(PipelineError, match="swapped out"):
        s.set_pipeline("vllm")
    assert s.config.pipeline == "vllm-v0-swap"


def test_ignored_requests_are_rejected_with_a_reason() -> None:
    s = Scheduler(swap_config(max_num_batched_tokens=64, max_model_len=64), clock=lambda: 0.0)
    s.add_request(Request("long", list(range(3, 80)), max_tokens=4, arrival_time=0.0))  # 77 > prompt limit 64
    s.add_request(Request("ok", list(range(3, 13)), max_tokens=4, arrival_time=0.0))
    out = s.schedule()
    assert out.rejected == {"long": "too-long"} and out.req_ids == ["ok"]


def test_configuration_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="num_cpu_blocks"):
        SchedulerConfig(num_cpu_blocks=-1)
    with pytest.raises(PipelineError, match="preemption"):
        Scheduler(swap_config(pipeline="order-vllm,v0-prefills,v0-running{preemption=sometimes},v0-swapped"))
    with pytest.raises(PipelineError, match="prefix caching"):
        Scheduler(swap_config(enable_prefix_caching=True))
    with pytest.raises(PipelineError, match="priority"):
        Scheduler(swap_config(policy="priority"))


def test_dumped_swap_steps_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = Scheduler(swap_config(dump_dir=tmp_path, dump_steps="all"), clock=lambda: 0.0)
    outs = drive(s)
    swaps = [o.step for o in outs if o.swapped_out_req_ids or len(o.blocks_to_swap_in)]
    assert swaps
    for step in swaps[:4]:
        stem = f"step-{step:05d}-"
        capsys.readouterr()
        code = schedir_main(["opt", str(tmp_path / f"{stem}00-input.mlir"), "-p", s.spec])
        replayed = capsys.readouterr().out
        assert code == 0
        live = (tmp_path / f"{stem}04-v0-swapped.mlir").read_text()
        assert replayed == live
        assert "host_blocks" in live and ("mem.swap_out" in live or "mem.swap_in" in live)


def test_dumping_does_not_change_decisions(tmp_path: Path) -> None:
    plain = drive(Scheduler(swap_config(), clock=lambda: 0.0))
    dumped = drive(Scheduler(swap_config(dump_dir=tmp_path, dump_steps="all"), clock=lambda: 0.0))
    assert [(o.req_ids, o.num_tokens.tolist(), sorted(o.swapped_out_req_ids), o.blocks_to_swap_in.tolist())
            for o in plain] == [(o.req_ids, o.num_tokens.tolist(), sorted(o.swapped_out_req_ids),
                                 o.blocks_to_swap_in.tolist()) for o in dumped]


@pytest.mark.skipif(V0_ENV is not None, reason=f"vLLM 0.8.5's v0 scheduler is not available: {V0_ENV}")
def test_every_in_scope_scenario_matches_v0_step_by_step() -> None:
    scenarios = v0_schedir.scenarios_in_scope()
    assert {"swap", "recompute", "ignored", "delay", "aborts", "swap-cpu-exhausted", "swap-chunked", "chunked",
            "ignored-chunked", "priority", "prefix"} <= set(scenarios)
    refs = v0_reference.run_reference(scenarios)
    for name, (trace, cfg) in scenarios.items():
        ours = v0_schedir.run_schedir(trace, cfg)
        assert ours["steps"], name
        diffs = v0_schedir.compare(refs[name], ours)
        assert diffs == [], f"{name}: {diffs[:5]}"


@pytest.mark.skipif(V0_ENV is not None, reason=f"vLLM 0.8.5's v0 scheduler is not available: {V0_ENV}")
def test_the_comparison_sees_a_wrong_preemption_mode() -> None:
    trace, cfg = v0_trace.scenarios()["swap"]
    ref = v0_reference.run_reference({"swap": (trace, cfg)})["swap"]
    wrong = v0_schedir.run_schedir(trace, {**cfg, "preemption_mode": "recompute"})
    assert any("swapped_out" in d for d in v0_schedir.compare(ref, wrong))


@pytest.mark.skipif(V0_ENV is not None, reason=f"vLLM 0.8.5's v0 scheduler is not available: {V0_ENV}")
def test_random_scenarios_match_v0_step_by_step() -> None:
    """Random configs and traces (chunked or not, swap, recompute or v0's choice, delay, partial
    prefills, aborts): 24 of the long run's (`python -m schedir.tools.parity.v0_schedir --random N`)."""
    scenarios = {f"random-{k}": v0_schedir.random_scenario(k) for k in range(1000, 1024)}
    assert {c["enable_chunked_prefill"] for _, c in scenarios.values()} == {True, False}
    refs = v0_reference.run_reference(scenarios)
    steps = 0
    for name, (trace, cfg) in scenarios.items():
        ours = v0_schedir.run_schedir(trace, cfg)
        steps += len(ours["steps"])
        diffs = v0_schedir.compare(refs[name], ours)
        assert diffs == [], f"{name} {cfg}: {diffs[:5]}"
    assert steps > 1000


def test_chunked_prefill_mixes_decodes_and_prompt_chunks() -> None:
    s = Scheduler(swap_config(pipeline="vllm-v0-chunked", max_num_batched_tokens=16, num_cpu_blocks=0),
                  clock=lambda: 0.0)
    s.add_request(Request("a", list(range(3, 9)), max_tokens=20, ignore_eos=True, arrival_time=0.0))
    out = s.schedule()
    s.update(out, np.where(out.sampled, 7, -1))
    s.add_request(Request("b", list(range(3, 43)), max_tokens=4, ignore_eos=True, arrival_time=0.0))
    out = s.schedule()
    assert out.req_ids == ["a", "b"] and out.num_tokens.tolist() == [1, 15]  # a decode, then b's first chunk
    assert s.pool.nblk[s.table.row_of["b"]] == 10  # v0 allocates the whole prompt's blocks at admission
    s.update(out, np.where(out.sampled, 7, -1))
    out = s.schedule()
    assert out.num_tokens.tolist() == [1, 15] and not out.sampled[1]


@pytest.mark.skipif(V0_ENV is not None, reason=f"vLLM 0.8.5's v0 scheduler is not available: {V0_ENV}")
def test_v0_livelock_is_the_one_recognised_difference() -> None:
    """random-898: v0 preempts its only running request for a block it does not need, re-admits it
    and does so forever (its step limit ends the run); schedir keeps it running. The comparison
    names that case and nothing else."""
    trace, cfg = v0_schedir.random_scenario(898)
    ref = v0_reference.run_reference({"r": (trace, cfg)})["r"]
    ours = v0_schedir.run_schedir(trace, cfg)
    assert v0_schedir.compare(ref, ours) and v0_schedir.v0_livelock(ref, ours) == 48
    wrong = v0_schedir.run_schedir(trace, {**cfg, "max_num_batched_tokens": 32})  # differs early, otherwise
    assert v0_schedir.v0_livelock(ref, wrong) is None
