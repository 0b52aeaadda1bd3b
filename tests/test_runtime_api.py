"""The runtime's public contract (DESIGN.md section 4): what an engine may rely on.

Why: engines and benchmarks call `Scheduler`, `SchedulerConfig` and `Request` by these
names; a bad request or config must fail at once with a message naming what is wrong,
requests must stop exactly where vLLM stops them, aborts must free memory, and the two
forms of `update()` must be interchangeable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig, SchedulerOutput
from schedir.ir.errors import PipelineError, SchedirError
from schedir.runtime import table as T

EOS = 2


def small(**overrides: object) -> Scheduler:
    cfg = {"num_blocks": 64, "block_size": 4, "max_num_batched_tokens": 64, "max_model_len": 64, **overrides}
    return Scheduler(SchedulerConfig(**cfg))  # type: ignore[arg-type]


def prompt(n: int, start: int = 10) -> list[int]:
    return list(range(start, start + n))


def drive(sched: Scheduler, token: Callable[[str, int], int] = lambda rid, pos: 5, max_steps: int = 500,
          ) -> tuple[list[SchedulerOutput], dict[str, int]]:
    """Run to the end (one sampled token per finished chunk); returns the outputs and the step
    at which `update` reported each request finished. One extra schedule() flushes the last
    finishes into `finished_req_ids`, as vLLM's engine does."""
    outs: list[SchedulerOutput] = []
    finished_at: dict[str, int] = {}
    while sched.has_unfinished_requests():
        assert len(outs) < max_steps, "stalled"
        out = sched.schedule()
        outs.append(out)
        toks = np.array([token(r, int(c + n)) if s else -1 for r, c, n, s in
                         zip(out.req_ids, out.computed, out.num_tokens, out.sampled, strict=True)], dtype=np.int64)
        for rid in sched.update(out, toks):
            finished_at[rid] = out.step
    outs.append(sched.schedule())
    return outs, finished_at


def generated(outs: Sequence[SchedulerOutput], rid: str) -> int:
    """How many tokens the engine sampled for `rid` (chunks that reached the end of the known tokens)."""
    return sum(int(o.sampled[i]) for o in outs for i, r in enumerate(o.req_ids) if r == rid)


# ---------------------------------------------------------------- add_request
@pytest.mark.parametrize(("request_", "message"), [
    (Request("bad-empty", []), "bad-empty"),
    (Request("bad-zero", [1, 2], max_tokens=0), "max_tokens must be >= 1"),
    (Request("bad-neg-max", [1, 2], max_tokens=-3), "bad-neg-max"),
    (Request("bad-token", [1, -1, 2]), "token ids must lie in"),
    (Request("bad-big-token", [1, 2**31]), "bad-big-token"),
    (Request("bad-arrival", [1], arrival_time=-1.0), "arrival_time must be >= 0"),
    (Request("bad-2d", np.ones((2, 2), dtype=np.int64)), "bad-2d"),
])
def test_add_request_refuses_bad_fields_naming_the_request(request_: Request, message: str) -> None:
    sched = small()
    with pytest.raises(ValueError, match=message) as err:
        sched.add_request(request_)
    assert request_.request_id in str(err.value)
    assert not sched.has_unfinished_requests()
    assert len(sched.table) == 0  # nothing half-added


@pytest.mark.parametrize("name", ["", None, 7])
def test_add_request_refuses_a_bad_id(name: object) -> None:
    with pytest.raises(ValueError, match="request_id must be a non-empty string"):
        small().add_request(Request(name, [1, 2]))  # type: ignore[arg-type]


def test_duplicate_live_id_is_refused_and_the_first_request_is_untouched() -> None:
    sched = small()
    sched.add_request(Request("a", prompt(5), max_tokens=2))
    with pytest.raises(ValueError, match="'a' is already queued or running"):
        sched.add_request(Request("a", prompt(9), max_tokens=7))
    assert sched.request_state("a")["prompt"] == 5
    assert sched.get_num_unfinished_requests() == 1


def test_an_id_can_be_reused_once_its_request_is_gone() -> None:
    sched = small()
    sched.add_request(Request("a", prompt(5), max_tokens=1))
    drive(sched)
    sched.add_request(Request("a", prompt(6), max_tokens=1))
    assert sched.request_state("a")["prompt"] == 6


def test_request_state_names_every_column() -> None:
    sched = small()
    sched.add_request(Request("a", prompt(5), max_tokens=3, priority=2, arrival_time=1.5))
    state = sched.request_state("a")
    assert tuple(state) == T.COLUMNS
    assert (state["prompt"], state["total"], state["max_tokens"], state["priority"]) == (5, 5, 3, 2)
    assert state["arrival"] == 1_500_000 and state["status"] == T.WAITING


# ---------------------------------------------------------------- SchedulerConfig
@pytest.mark.parametrize(("field", "value", "message"), [
    ("policy", "lifo", "policy must be one of fcfs, priority"),
    ("num_blocks", 1, "num_blocks must be at least 2"),
    ("num_blocks", 0, "num_blocks must be positive"),
    ("block_size", 0, "block_size must be positive"),
    ("max_num_batched_tokens", 0, "max_num_batched_tokens must be positive"),
    ("max_num_seqs", 0, "max_num_seqs must be positive"),
    ("max_model_len", -5, "max_model_len must be positive"),
    ("long_prefill_token_threshold", -1, "long_prefill_token_threshold must be >= 0"),
    ("dump_steps", "some", "dump_steps must be step numbers or 'all'"),
])
def test_config_validation_names_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**{field: value})  # type: ignore[arg-type]


def test_unknown_pipeline_is_refused_when_the_scheduler_is_built() -> None:
    with pytest.raises(PipelineError, match="unknown pass 'vlm'.*did you mean 'vllm'"):
        Scheduler(SchedulerConfig(pipeline="vlm"))
    assert issubclass(PipelineError, SchedirError)


def test_defaults_follow_the_documented_contract() -> None:
    cfg = SchedulerConfig()
    assert (cfg.num_blocks, cfg.block_size, cfg.max_num_batched_tokens, cfg.max_num_seqs) == (2000, 16, 8192, 256)
    assert cfg.pipeline == "vllm" and cfg.policy == "fcfs" and cfg.enable_prefix_caching
    sched = Scheduler(cfg)
    assert sched.pool.usable_blocks == 1999 and sched.pool.num_free == 1999


# ---------------------------------------------------------------- stopping
def test_stops_at_max_tokens() -> None:
    sched = small()
    sched.add_request(Request("a", prompt(6), max_tokens=4, ignore_eos=True))
    outs, finished_at = drive(sched)
    assert generated(outs, "a") == 4
    assert finished_at == {"a": 4}


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_stops_at_eos_unless_ignored(ignore_eos: bool) -> None:
    sched = small()
    sched.add_request(Request("a", prompt(6), max_tokens=10, eos_token_id=EOS, ignore_eos=ignore_eos))
    outs, _ = drive(sched, token=lambda rid, pos: EOS if pos >= 8 else 5)  # EOS is the 3rd token
    assert generated(outs, "a") == (10 if ignore_eos else 3)


def test_without_an_eos_id_no_token_stops() -> None:
    sched = small()
    sched.add_request(Request("a", prompt(6), max_tokens=5))
    outs, _ = drive(sched, token=lambda rid, pos: EOS)
    assert generated(outs, "a") == 5


def test_stops_at_a_stop_token_id_even_with_ignore_eos() -> None:
    sched = small()
    sched.add_request(Request("a", prompt(6), max_tokens=10, stop_token_ids=[42, 43], ignore_eos=True))
    sched.add_request(Request("b", prompt(6, 100), max_tokens=10))
    outs, _ = drive(sched, token=lambda rid, pos: 43 if pos == 7 else 5)  # both see 43 as their 2nd token
    assert generated(outs, "a") == 2
    assert generated(outs, "b") == 10  # stop ids are per request


def test_stops_at_max_model_len() -> None:
    sched = small(max_model_len=16)
    sched.add_request(Request("a", prompt(10), max_tokens=100, ignore_eos=True))
    outs, _ = drive(sched)
    assert generated(outs, "a") == 6  # 10 + 6 = max_model_len
    assert max(int(o.batch.seq_lens.max(initial=0)) for o in outs) == 15  # no position reaches max_model_len


def test_tokens_after_a_stop_in_one_update_are_dropped() -> None:
    sched = small()
    sched.add_request(Request("a", prompt(4), max_tokens=10, eos_token_id=EOS))
    out = sched.schedule()
    assert sched.update(out, {"a": [5, EOS, 6, 7]}) == ["a"]
    assert sched.table.data[T.TOTAL, out.rows[0]] == 6  # prompt + 5 + EOS


def test_finished_ids_are_reported_once_in_the_next_output() -> None:
    sched = small()
    sched.add_request(Request("a", prompt(4), max_tokens=1))
    sched.add_request(Request("b", prompt(4, 50), max_tokens=2))
    first = sched.schedule()
    assert sched.update(first, np.array([5, 5])) == ["a"]
    second = sched.schedule()
    assert second.finished_req_ids == {"a"}
    assert second.req_ids == ["b"]
    assert sched.update(second, np.array([5])) == ["b"]
    third = sched.schedule()
    assert third.finished_req_ids == {"b"} and not third.req_ids
    assert not sched.schedule().finished_req_ids
    assert not sched.has_unfinished_requests()


# ---------------------------------------------------------------- finish_requests (abort)
def test_abort_waiting_and_running_frees_their_blocks() -> None:
    sched = small(num_blocks=20, max_num_seqs=1)
    sched.add_request(Request("run", prompt(9), max_tokens=50))
    sched.add_request(Request("wait", prompt(9, 40), max_tokens=50))
    out = sched.schedule()
    assert out.req_ids == ["run"]
    sched.update(out, {"run": [5]})
    assert sched.pool.num_free < sched.pool.usable_blocks
    assert sched.finish_requests(["run", "wait", "unknown"]) == ["run", "wait"]
    assert sched.pool.num_free == sched.pool.usable_blocks
    sched.pool.check()
    assert not sched.has_unfinished_requests() and sched.get_num_unfinished_requests() == 0
    nxt = sched.schedule()
    assert nxt.finished_req_ids == {"run", "wait"} and not nxt.req_ids
    assert sched.finish_requests("run") == []  # already gone
    assert sched.get_metrics()["finished_requests"] == 2


def test_abort_of_a_request_in_flight_ignores_its_late_tokens() -> None:
    sched = small()
    sched.add_request(Request("a", prompt(5), max_tokens=5))
    sched.add_request(Request("b", prompt(5, 50), max_tokens=2))
    out = sched.schedule()
    assert sched.finish_requests("a") == ["a"]
    assert sched.update(out, {"a": [5], "b": [5]}) == []
    assert "a" not in sched.table.row_of  # its row is released once the output naming it is back
    nxt = sched.schedule()
    assert nxt.req_ids == ["b"] and nxt.finished_req_ids == {"a"}
    assert sched.update(nxt, {"b": [5]}) == ["b"]


def test_abort_accepts_a_single_id_string() -> None:
    sched = small()
    sched.add_request(Request("abc", prompt(3)))
    assert sched.finish_requests("abc") == ["abc"]


# ---------------------------------------------------------------- update(): array and dict paths
def _trace(sched: Scheduler, seed: int) -> None:
    rng = np.random.default_rng(seed)
    stem = rng.integers(3, 40, 40).tolist()
    for i in range(12):
        p = stem[: int(rng.integers(0, 30))] + rng.integers(3, 40, int(rng.integers(1, 20))).tolist()
        sched.add_request(Request(f"r{i:02d}", p, max_tokens=int(rng.integers(1, 20)), priority=int(rng.integers(3)),
                                  arrival_time=0.0, eos_token_id=EOS, stop_token_ids=[7] if i % 3 == 0 else ()))


def _summary(out: SchedulerOutput) -> tuple[object, ...]:
    return (out.req_ids, out.num_tokens.tolist(), out.computed.tolist(), out.batch.slot_mapping.tolist(),
            sorted(out.preempted_req_ids), sorted(out.finished_req_ids), out.kind.tolist())


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_update_with_an_int_array_equals_the_dict_path(policy: str) -> None:
    a = small(num_blocks=24, max_num_batched_tokens=32, policy=policy)
    b = small(num_blocks=24, max_num_batched_tokens=32, policy=policy)
    _trace(a, 1)
    _trace(b, 1)
    preempted = 0
    for _ in range(400):
        if not a.has_unfinished_requests():
            break
        oa, ob = a.schedule(), b.schedule()
        assert _summary(oa) == _summary(ob)
        preempted += len(oa.preempted_req_ids)
        toks = np.where(oa.sampled, (oa.computed + oa.num_tokens) % 9 + 2, -1)  # EOS (2) and stop id 7 now and then
        as_dict: Mapping[str, Sequence[int]] = {r: [int(t)] for r, t in zip(oa.req_ids, toks, strict=True) if t >= 0}
        assert a.update(oa, toks) == b.update(ob, as_dict)
    assert not a.has_unfinished_requests() and not b.has_unfinished_requests()
    assert preempted  # the trace exercised preemption too


def test_update_ignores_requests_not_in_the_output_and_empty_outputs() -> None:
    sched = small()
    sched.add_request(Request("a", prompt(4), max_tokens=3))
    out = sched.schedule()
    assert sched.update(out, {"a": [5], "ghost": [5]}) == []
    sched.finish_requests("a")
    nothing = sched.schedule()  # an empty step's output updates to nothing
    assert isinstance(nothing, SchedulerOutput) and len(nothing) == 0
    assert sched.update(nothing, {}) == []


def test_a_second_update_of_the_same_output_is_refused() -> None:
    sched = small()
    sched.add_request(Request("a", prompt(4), max_tokens=5))
    out = sched.schedule()
    sched.update(out, np.array([5]))
    try:
        sched.update(out, np.array([5]))
    except ValueError:
        pass
    else:
        raise AssertionError("a second update() of one output was accepted")
    assert sched.schedule().req_ids == ["a"]


def test_update_with_a_wrong_length_array_fails_cleanly() -> None:
    sched = small()
    sched.add_request(Request("a", prompt(4), max_tokens=5))
    out = sched.schedule()
    with pytest.raises(ValueError, match="length"):
        sched.update(out, np.array([5, 6]))
    sched.update(out, np.array([5]))
    assert sched.schedule().req_ids == ["a"]


# ---------------------------------------------------------------- state and metrics
METRIC_KEYS = {"total_requests", "finished_requests", "rejected_requests", "preemptions", "steps",
               "steady_steps", "scheduled_tokens", "prefix_hit_tokens", "batch_efficiency", "memory_utilization",
               "schedule_us_median", "schedule_us_p99", "aborted_requests", "avg_latency_s", "p99_latency_s",
               "throughput_req_s", "throughput_tok_s"}


def test_metrics_keys_and_counts() -> None:
    sched = small(num_blocks=24, max_num_batched_tokens=32)
    assert set(sched.get_metrics()) == METRIC_KEYS
    assert sched.get_metrics()["steps"] == 0
    _trace(sched, 2)
    sched.add_request(Request("huge", prompt(100), arrival_time=0.0))  # longer than max_model_len
    outs, finished_at = drive(sched)
    m = sched.get_metrics()
    assert set(m) == METRIC_KEYS
    assert m["total_requests"] == 13 and m["rejected_requests"] == 1
    assert m["finished_requests"] == len(finished_at) == 12
    assert m["steps"] == len(outs)
    assert m["scheduled_tokens"] == sum(o.total_num_scheduled_tokens for o in outs)
    assert m["preemptions"] == sum(len(o.preempted_req_ids) for o in outs)
    assert 0.0 < m["batch_efficiency"] <= 1.0 and 0.0 <= m["memory_utilization"] <= 1.0
    assert 0.0 < m["schedule_us_median"] <= m["schedule_us_p99"]


def test_output_views_agree() -> None:
    sched = small()
    sched.add_request(Request("a", prompt(7), max_tokens=2))
    sched.add_request(Request("b", prompt(3, 50), max_tokens=2))
    out = sched.schedule()
    assert len(out) == 2 and out.num_scheduled_tokens == {"a": 7, "b": 3}
    assert out.total_num_scheduled_tokens == 10
    assert [r.req_id for r in out.new_reqs] == ["a", "b"] and not out.cached_reqs
    assert out.new_reqs[0].prompt_token_ids.tolist() == prompt(7)


def test_many_requests_grow_the_table_and_all_finish() -> None:
    """More live requests than the table's first 64 rows, priority ranks by id, rows recycled."""
    sched = small(num_blocks=400, max_num_batched_tokens=256, max_num_seqs=32, policy="priority")
    rng = np.random.default_rng(0)
    names = [f"x{int(v)}" for v in rng.permutation(150)]
    for i, name in enumerate(names):
        sched.add_request(Request(name, prompt(int(rng.integers(1, 30))), max_tokens=int(rng.integers(1, 10)),
                                  priority=int(rng.integers(3)), arrival_time=float(i % 7)))
    assert sched.table.capacity >= 150 and sched.get_num_unfinished_requests() == 150
    _, finished_at = drive(sched)
    assert sorted(finished_at) == sorted(names)
    assert sched.pool.num_free == sched.pool.usable_blocks and len(sched.table) == 0
    for name in names[:10]:  # rows are reused
        sched.add_request(Request(name, prompt(3), max_tokens=1))
    drive(sched)
    assert len(sched.table) == 0


def test_a_pipeline_without_reject_oversized_is_refused() -> None:
    """Without a pass that rejects too-long requests, one would be admitted whole and scheduled past
    its blocks (the kernels do no bounds checks): the runtime refuses such a pipeline up front."""
    with pytest.raises(PipelineError, match="no pass that rejects requests longer than the model"):
        small(max_model_len=16, pipeline="order-vllm,vllm-schedule-running,vllm-admit")


def test_latency_and_throughput_on_the_schedulers_clock() -> None:
    """A fake clock: each step takes 0.5 s; latencies are finish - arrival on that clock."""
    now = [0.0]
    sched = Scheduler(SchedulerConfig(num_blocks=64, block_size=4, max_num_batched_tokens=64, max_model_len=64),
                      clock=lambda: now[0])
    sched.add_request(Request("a", prompt(5), max_tokens=2))  # arrives now (t = 0) by the clock
    now[0] = 1.0
    sched.add_request(Request("b", prompt(5, 50), max_tokens=3))
    sched.add_request(Request("c", prompt(5, 80), max_tokens=9))
    ends: dict[str, float] = {}
    while sched.has_unfinished_requests():
        out = sched.schedule()
        now[0] += 0.5
        for name in sched.update(out, {rid: [5] for rid in out.req_ids}):
            ends[name] = now[0]
        if "c" in out.req_ids and out.num_tokens[out.req_ids.index("c")] and "a" in ends:
            sched.finish_requests("c")  # aborted: not a completed request
    m = sched.get_metrics()
    assert set(ends) == {"a", "b"}
    assert m["avg_latency_s"] == (ends["a"] - 0.0 + ends["b"] - 1.0) / 2
    assert m["finished_requests"] == 3 and m["aborted_requests"] == 1
    span = max(ends.values()) - 0.0
    assert m["throughput_req_s"] == 2 / span
    assert m["throughput_tok_s"] == (2 + 3) / span
    assert m["p99_latency_s"] <= max(ends["a"], ends["b"] - 1.0)


def test_has_requests_covers_finishes_not_yet_reported() -> None:
    sched = small()
    assert not sched.has_requests() and not sched.has_finished_requests()
    sched.add_request(Request("a", prompt(5), max_tokens=1))
    assert sched.has_requests() and not sched.has_finished_requests()
    out = sched.schedule()
    assert sched.update(out, {"a": [5]}) == ["a"]
    assert not sched.has_unfinished_requests()
    assert sched.has_finished_requests() and sched.has_requests()  # "a" is not reported yet
    last = sched.schedule()
    assert last.finished_req_ids == {"a"} and not last.req_ids
    assert not sched.has_requests()
    sched.add_request(Request("huge", prompt(100), max_tokens=1))  # longer than max_model_len
    out = sched.schedule()
    assert out.rejected == {"huge": "too-long"} and out.finished_req_ids == {"huge"}
    assert not sched.has_requests()


def test_long_prefill_threshold_reaches_every_pass_that_takes_it() -> None:
    listed = Scheduler(SchedulerConfig(pipeline="reject-oversized,order-vllm,vllm-schedule-running,vllm-admit",
                                       long_prefill_token_threshold=8))
    assert [getattr(p, "long_prefill", None) for p in listed.manager.passes] == [None, None, 8, 8]
    preset = Scheduler(SchedulerConfig(long_prefill_token_threshold=8))
    assert preset.manager.spec == listed.manager.spec
    with pytest.raises(ValueError, match="no pass of pipeline 'base' takes a long-prefill option"):
        Scheduler(SchedulerConfig(pipeline="base", long_prefill_token_threshold=8))


def test_no_batch_plan_decides_the_same() -> None:
    """SchedulerConfig.batch_plan=False (the simulator's): the same decisions, no batch plan or
    block table, and a clear error from the fields that list block ids."""
    outs = {}
    for plan in (True, False):
        sched = small(num_blocks=24, max_num_batched_tokens=32, batch_plan=plan)
        for i in range(5):
            sched.add_request(Request(f"r{i}", list(range(i, i + 9 + 3 * i)), max_tokens=6))
        steps = []
        while sched.has_unfinished_requests():
            out = sched.schedule()
            steps.append((out.req_ids, out.num_tokens.tolist(), out.computed.tolist(), out.kind.tolist(),
                          sorted(out.preempted_req_ids), out.total_num_scheduled_tokens))
            if not plan:
                assert out.batch is None and out.block_table is None
                if len(out):
                    with pytest.raises(ValueError, match=r"new_reqs lists block ids.*batch_plan=False"):
                        _ = out.new_reqs
            sched.update(out, np.where(out.sampled, 5, -1))
        outs[plan] = steps
    assert outs[True] == outs[False] and len(outs[True]) > 5
