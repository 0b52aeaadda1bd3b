"""Async scheduling (vLLM's AsyncScheduler) on schedir: output placeholders, stale outputs.

With async scheduling the engine schedules step N+1 before step N's sampled tokens are back:
each sampling request holds a placeholder, so a decode runs in consecutive steps; a request
whose steps in flight already reach max_tokens sits out; outputs of a request preempted while
they were in flight are stale (delivered, or dropped after a prefix-cache reset that resumes it
at once). The runtime tests need no vLLM; the rest run vLLM 0.32's own AsyncScheduler beside
schedir's runtime and plug-in on the same traces, with two steps in flight, and compare every
step and every delivered token.
"""

from __future__ import annotations

from collections import deque
from types import ModuleType

import attrs
import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.ir.errors import PipelineError
from schedir.runtime.kernels import DROPPED
from schedir.tools.parity.harness import (
    ParityConfig,
    RunStats,
    SchedirEngine,
    StepRecord,
    TraceRequest,
    compare,
    fake_model_runner,
    loop_depth,
    make_trace,
    run_engine,
    standard_matrix,
)

ASYNC_MATRIX = [attrs.evolve(c, async_scheduling=True) for c in standard_matrix(num_requests=40)]


def _async_runtime(**kw: object) -> Scheduler:
    cfg = dict(num_blocks=200, block_size=16, max_num_batched_tokens=2048, enable_prefix_caching=False,
               async_scheduling=True)
    cfg.update(kw)
    return Scheduler(SchedulerConfig(**cfg))  # type: ignore[arg-type]


def _run_two_in_flight(s: Scheduler, max_steps: int = 200) -> list[dict[str, int]]:
    """Schedule with two steps in flight (the oldest returns after each new one); every sampling
    chunk samples token 7. Returns each step's scheduled tokens per request."""
    steps: list[dict[str, int]] = []
    flying: deque = deque()
    for _ in range(max_steps):
        if not s.has_requests() and not flying:
            break
        if s.has_requests():
            out = s.schedule()
            steps.append(dict(zip(out.req_ids, out.num_tokens.tolist(), strict=True)))
            flying.append(out)
            if len(flying) < 2 and (len(out) or s.has_requests()):
                continue
        old = flying.popleft()
        s.update(old, np.where(old.sampled, 7, -1).astype(np.int64))
    return steps


# ---------------------------------------------------------------- runtime alone


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_decodes_run_in_consecutive_steps_and_stop_at_max_tokens(max_tokens: int) -> None:
    """vLLM's test_stop_by_max_tokens on the runtime: no step is scheduled past max_tokens."""
    s = _async_runtime()
    s.add_request(Request("a", list(range(3, 13)), max_tokens=max_tokens, ignore_eos=True))
    steps = _run_two_in_flight(s)
    scheduled = [st.get("a", 0) for st in steps]
    assert sum(scheduled) == 10 + max_tokens - 1
    # the prefill, then one token a step with no step left out while its token is in flight
    assert scheduled[: max_tokens] == [10] + [1] * (max_tokens - 1)
    assert "a" not in s.table.row_of  # finished


def test_sync_runtime_leaves_a_decode_out_while_its_token_is_in_flight() -> None:
    """The same loop without async scheduling: a decode sits out every other step."""
    s = Scheduler(SchedulerConfig(num_blocks=200, block_size=16, enable_prefix_caching=False))
    s.add_request(Request("a", list(range(3, 13)), max_tokens=4, ignore_eos=True))
    scheduled = [st.get("a", 0) for st in _run_two_in_flight(s)]
    assert scheduled[:7] == [10, 0, 1, 0, 1, 0, 1] and sum(scheduled) == 13


def test_async_scheduling_needs_a_pipeline_that_overlaps_decodes() -> None:
    with pytest.raises(PipelineError, match=r"async_scheduling: pipeline 'base' has no pass that schedules a "
                                            r"decode ahead of its sampled token .*'decode-overlap'"):
        Scheduler(SchedulerConfig(pipeline="base", async_scheduling=True))


def test_prefix_cache_reset_drops_outputs_in_flight() -> None:
    """Requests preempted by a reset resume at once; their outputs in flight are dropped."""
    s = _async_runtime()
    s.add_request(Request("a", list(range(3, 13)), max_tokens=8, ignore_eos=True))
    first = s.schedule()
    s.preempt_running()
    assert s.request_state("a")["stale"] == -1 and s.request_state("a")["placeholders"] == 0
    again = s.schedule()  # resumed at once: the dropped share does not hold it back
    assert again.req_ids == ["a"] and int(again.num_tokens[0]) == 10
    s.update(first, np.array([7], dtype=np.int64))
    assert s.last_update_codes.tolist() == [DROPPED]
    state = s.request_state("a")
    assert (state["total"], state["outputs"], state["stale"], state["placeholders"]) == (10, 0, 0, 1)
    s.update(again, np.array([7], dtype=np.int64))
    assert s.request_state("a")["outputs"] == 1


def test_preempted_request_waits_for_its_stale_output() -> None:
    """A request preempted with a step in flight resumes only once that step's token is back
    (and keeps the token): vLLM's deliver-stale path."""
    s = _async_runtime(num_blocks=4, block_size=4, max_num_batched_tokens=64)  # 3 usable blocks of 4 tokens
    s.add_request(Request("a", list(range(3, 7)), max_tokens=8, ignore_eos=True))
    s.add_request(Request("b", list(range(20, 24)), max_tokens=8, ignore_eos=True))
    steps = _run_two_in_flight(s, max_steps=400)
    assert s.metrics.preemptions > 0
    assert not s.has_requests()
    assert sum(st.get("a", 0) for st in steps) >= 4 + 8 - 1


# ---------------------------------------------------------------- against vLLM's AsyncScheduler



@pytest.mark.parametrize("cfg", ASYNC_MATRIX, ids=lambda c: c.label)
def test_async_matches_vllm_async_scheduler(vllm: ModuleType, cfg: ParityConfig) -> None:
    """The parity matrix with two steps in flight: vLLM's AsyncScheduler, schedir's runtime and
    schedir's plug-in decide every step the same."""
    from schedir.engines.vllm import AsyncScheduler as Plugin
    from schedir.tools.parity.harness import drive_schedir
    from schedir.tools.parity.vllm_driver import VllmEngine, drive_vllm

    trace = make_trace(cfg)
    reference = drive_vllm(cfg, trace)
    for name, records in (("runtime", drive_schedir(cfg, trace)),
                          ("plug-in", run_engine(VllmEngine(cfg, Plugin), trace, depth=loop_depth(cfg)))):
        report = compare(reference, records, names=("vllm", name))
        assert report.decisions_identical, f"{cfg.label} ({name}): {report.first_divergence}"
    stats = RunStats.of(reference)
    assert stats.finished == cfg.num_requests
    if "preempt" in cfg.label:
        assert stats.preemptions > 0


def test_async_mode_overlaps_decodes(vllm: ModuleType) -> None:
    """Async scheduling takes fewer steps than sync on the same trace (decodes no longer sit out)."""
    from schedir.tools.parity.harness import drive_schedir

    cfg = ASYNC_MATRIX[0]
    trace = make_trace(cfg)
    sync_two_in_flight = run_engine(SchedirEngine(attrs.evolve(cfg, async_scheduling=False)), trace, depth=2)
    assert len(drive_schedir(cfg, trace)) < len(sync_two_in_flight)


def _drive_with_resets(cls: type | None, cfg: ParityConfig, trace: list[TraceRequest],
                       resets: set[int]) -> tuple[list[StepRecord], dict[str, list[int]]]:
    """The async engine loop with `reset_prefix_cache(reset_running_requests=True)` before the
    steps in `resets` (as vLLM's test_reset_prefix_cache_with_inflight_output_under_kv_pressure)."""
    from schedir.tools.parity.vllm_driver import VllmEngine

    engine = VllmEngine(cfg, cls)
    pending = deque(trace)
    flying: deque = deque()
    records: list[StepRecord] = []
    step = 0
    while pending or engine.has_requests() or flying:
        assert step < 20_000, "the loop does not converge"
        while pending and pending[0].arrival_step <= step:
            engine.add(pending.popleft())
        if step in resets and (flying or engine._sched.running):
            engine._sched.reset_prefix_cache(reset_running_requests=True)
        if engine.has_requests():
            record, chunks = engine.schedule(step)
            records.append(record)
            flying.appendleft(chunks)
            if len(flying) < 2 and (chunks or engine.has_requests()):
                step += 1
                continue
        if flying:
            engine.update(fake_model_runner(flying.pop()))
        step += 1
    return records, engine.delivered


@pytest.mark.parametrize("blocks", [40, 2000], ids=["tight-cache", "roomy-cache"])
def test_prefix_cache_resets_with_outputs_in_flight_match_vllm(vllm: ModuleType, blocks: int) -> None:
    from schedir.engines.vllm import AsyncScheduler as Plugin

    cfg = ParityConfig(num_requests=12, num_blocks=blocks, max_num_batched_tokens=256, prompt_max=200,
                       output_min=8, output_max=40, arrival_rate=2.0, async_scheduling=True, seed=3)
    trace = make_trace(cfg)
    resets = {5, 6, 17, 40, 41}
    ref, ref_tokens = _drive_with_resets(None, cfg, trace, resets)
    got, got_tokens = _drive_with_resets(Plugin, cfg, trace, resets)
    report = compare(ref, got, names=("vllm", "plug-in"))
    assert report.decisions_identical, report.first_divergence
    assert got_tokens == ref_tokens
    assert all(len(got_tokens[r.req_id]) == r.max_tokens for r in trace)


def test_plugin_builds_its_async_class_when_async_scheduling_is_on(vllm: ModuleType) -> None:
    """vLLM builds its AsyncScheduler when async scheduling is on; schedir's Scheduler does too."""
    from schedir.engines.vllm import AsyncScheduler, Scheduler as Plugin
    from schedir.tools.parity.vllm_driver import build_vllm_scheduler

    off = build_vllm_scheduler(ParityConfig(), Plugin)
    assert type(off) is Plugin and not off.runtime.config.async_scheduling
    config = off.vllm_config
    config.scheduler_config.async_scheduling = True  # vLLM's CPU platform turns it off in VllmConfig
    on = Plugin(vllm_config=config, kv_cache_config=off.kv_cache_config, block_size=off.block_size,
                structured_output_manager=off.structured_output_manager)
    assert type(on) is AsyncScheduler and on.runtime.config.async_scheduling
