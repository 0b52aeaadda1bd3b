"""The seed API over the step IR (schedir.compat.sagellm)."""

import pytest

from schedir.compat.sagellm import (BaseSchedulerIR, OptimizationPass, RequestPhase, ScheduleRequest,
                                    ScheduleResult)


def test_issue_example_runs_unchanged() -> None:
    scheduler = BaseSchedulerIR()
    requests = [ScheduleRequest(request_id="1", token_ids=[1, 2, 3], max_tokens=10),
                ScheduleRequest(request_id="2", token_ids=[4, 5, 6], max_tokens=20)]
    result = scheduler.schedule(pending_requests=requests, running_requests=[], available_memory=1000)
    assert len(result.scheduled_requests) > 0
    assert isinstance(result, ScheduleResult)
    assert result.batch_tokens == 6 and result.batch_size == 2
    assert "req.queue waiting" in scheduler.last_ir
    m = scheduler.get_metrics()
    assert m.total_requests == 2 and m.avg_latency > 0 and m.p99_latency >= m.avg_latency * 0.5


def test_memory_limits_admission_with_reason() -> None:
    s = BaseSchedulerIR(block_size=4)
    running = [ScheduleRequest("r", token_ids=[1] * 8, max_tokens=8)]
    pending = [ScheduleRequest("a", token_ids=[2] * 8, max_tokens=4), ScheduleRequest("b", token_ids=[3] * 20, max_tokens=4)]
    result = s.schedule(pending, running, available_memory=3)
    names = [r.request_id for r in result.scheduled_requests]
    assert "r" in names and "a" in names and "b" not in names
    assert result.deferred_requests["b"] == "memory"
    assert running[0].phase is RequestPhase.DECODE and result.num_scheduled_tokens["r"] == 1


@pytest.mark.parametrize("pending,running,mem,needle", [
    ([ScheduleRequest("x", [1])], [ScheduleRequest("x", [2])], 10, "'x' appears twice"),
    ([ScheduleRequest("e", [])], [], 10, "'e' has empty token_ids"),
    ([ScheduleRequest("a", [1])], [], -1, "available_memory"),
])
def test_bad_input(pending, running, mem, needle) -> None:
    with pytest.raises(ValueError, match=needle):
        BaseSchedulerIR().schedule(pending, running, mem)


class Reverse(OptimizationPass):
    """Serve the latest request first, leave out odd prompt lengths."""

    name = "reverse"

    def optimize(self, requests, facts):
        return [r for r in reversed(requests) if r.prompt_len % 2 == 0]


def test_seed_pass_through_add_optimization_pass() -> None:
    s = BaseSchedulerIR()
    s.add_optimization_pass(Reverse())
    reqs = [ScheduleRequest(str(i), [1] * (2 + (i == 1)), max_tokens=4, arrival_time=float(i)) for i in range(3)]
    result = s.schedule(reqs, [], 100)
    assert [r.request_id for r in result.scheduled_requests] == ["2", "0"]
    assert result.deferred_requests == {"1": "policy"}
    assert "seed:seed-reverse" in s.last_ir
    from schedir.passes import PASSES

    assert "seed-reverse" not in PASSES  # in the pass table only while the call ran
    assert s.remove_optimization_pass("reverse") and not s.remove_optimization_pass("reverse")
    assert len(s.schedule([ScheduleRequest("1", [1, 2, 3])], [], 100).scheduled_requests) == 1


def test_dump_dir_writes_the_step_after_every_pass(tmp_path) -> None:
    s = BaseSchedulerIR(dump_dir=tmp_path)
    s.schedule([ScheduleRequest("a", [1, 2, 3])], [], 10)
    texts = [p.read_text() for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".mlir", ".txt")]
    assert texts and any("req.schedule" in t for t in texts)
