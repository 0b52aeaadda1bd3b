"""`Scheduler.set_pipeline`: switching the policy at run time keeps every request and block."""

from __future__ import annotations

import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.ir.errors import PipelineError
from schedir.runtime import table as T

PIPELINES = ("vllm", "base-priority", "orca", "base", "vllm")


def _trace(sched: Scheduler, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for i in range(n):
        sched.add_request(Request(f"r{i:03d}", rng.integers(3, 500, int(rng.integers(4, 120))).tolist(),
                                  max_tokens=int(rng.integers(1, 40)), priority=int(rng.integers(0, 3)),
                                  ignore_eos=True))


# pipelines whose steady steps run the steady program with scheduler state (v0's delay clock and
# running places, slo-aware's clock) or answer their windows by rule (base, orca), switched between
LOWERED_PIPELINES = ("vllm-v0", "vllm-v0-chunked", "base", "slo-aware", "vllm-v0-chunked", "orca", "vllm-v0")


@pytest.mark.parametrize("num_blocks,pipelines", [(60, PIPELINES), (400, PIPELINES), (60, LOWERED_PIPELINES),
                                                  (400, LOWERED_PIPELINES)])
def test_switching_pipelines_mid_run_loses_nothing(num_blocks: int, pipelines: tuple[str, ...]) -> None:
    """Every request finishes and every block comes back across switches every 7 steps (60
    blocks: preemptions), the lowered pipelines' scheduler state carried through the switches."""
    v0 = pipelines is LOWERED_PIPELINES  # (v0's prefix caching is not reproduced: off)
    sched = Scheduler(SchedulerConfig(num_blocks=num_blocks, block_size=8, max_num_batched_tokens=256,
                                      max_num_seqs=8, max_model_len=256, enable_prefix_caching=not v0,
                                      pipeline=pipelines[-1]))
    _trace(sched, 60, seed=num_blocks)
    finished: set[str] = set()
    steps = 0
    while sched.has_requests():
        if steps % 7 == 6:
            sched.set_pipeline(pipelines[(steps // 7) % len(pipelines)])
        out = sched.schedule()
        sched.pool.check()
        assert len(set(out.req_ids)) == len(out.req_ids)
        finished |= set(sched.update(out, np.where(out.sampled, 7, -1)))
        steps += 1
        assert steps < 5000, "the run does not drain"
    assert len(finished) == 60
    assert sched.pool.num_free == sched.pool.usable_blocks
    assert sched.metrics.steady_steps > 0
    assert steps > 7 * len(PIPELINES)  # every pipeline ran
    if num_blocks == 60:
        assert sched.metrics.preemptions > 0


def test_a_refused_pipeline_changes_nothing() -> None:
    sched = Scheduler(SchedulerConfig(pipeline="vllm"))
    _trace(sched, 5, seed=1)
    before = sched.spec
    with pytest.raises(PipelineError, match="reject-oversized"):
        sched.set_pipeline("order-fcfs,schedule-running,admit-greedy")
    with pytest.raises(PipelineError):
        sched.set_pipeline("no-such-pass")
    assert sched.spec == before and sched.config.pipeline == "vllm"
    assert len(sched.schedule().req_ids) == 5


def test_switching_to_the_vllm_preset_puts_waiting_in_queued_order() -> None:
    sched = Scheduler(SchedulerConfig(pipeline="base", num_blocks=40, block_size=8, max_num_seqs=2))
    _trace(sched, 30, seed=2)
    for _ in range(20):  # the base preset preempts and appends; its waiting order is its own
        out = sched.schedule()
        sched.update(out, np.where(out.sampled, 7, -1))
    sched.set_pipeline("vllm")
    queued = sched.table.data[T.QUEUED, sched.waiting]
    assert (np.diff(queued) > 0).all()
