"""Steady decode steps lowered without their IR (`StepPass.decodes_steadily`) decide exactly as
the IR does: every output field, the queues, the request table and the KV pool, step by step."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.ir.array_step import ArrayStep
from schedir.ir.errors import PassFailure
from schedir.ir.pass_base import StepPass
from schedir.ir.pipeline import parse_passes
from schedir.lowering.radix_pool import RadixKVPool
from schedir.passes.mlfq_account import MlfqAccount
from schedir.passes.mlfq_order import MlfqOrder
from schedir.passes.mlfq_state import LEVEL
from schedir.passes.presets import PRESETS
from schedir.passes.schedule_running import ScheduleRunning
from schedir.passes.vllm_schedule_running import VllmScheduleRunning
from schedir.runtime import table as T


def output_record(out) -> tuple:  # noqa: ANN001
    return (tuple(out.req_ids), out.num_tokens.tolist(), out.computed.tolist(), out.kind.tolist(),
            out.sampled.tolist(), out.nblk_before.tolist(), out.nblk_after.tolist(), out.generation.tolist(),
            out.batch.query_start_loc.tolist(), out.batch.positions.tolist(), out.batch.slot_mapping.tolist(),
            out.batch.seq_lens.tolist(), out.block_table.tolist(), sorted(out.preempted_req_ids),
            sorted(out.finished_req_ids), sorted(out.rejected.items()), [p.tolist() for p in out.new_prompts])


def plain(v):  # noqa: ANN001, ANN201
    """A pool's attribute as comparable values: arrays as lists, the radix tree by its own attributes."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (int, float, str, list, tuple)):
        return v
    return [(k, plain(x)) for k, x in sorted(vars(v).items())]


def state_record(sched: Scheduler) -> tuple:
    """The queues, every live request's columns and declared state, the scheduler state, the KV pool."""
    pool = sched.pool
    live = sched.table.data[T.STATUS] != T.FREE
    if isinstance(pool, RadixKVPool):  # every array and count it keeps (pages, tree, locks)
        kv = [(k, plain(v)) for k, v in sorted(vars(pool).items())]
    else:
        kv = [pool.ref.tolist(), pool.nxt.tolist(), pool.nblk.tolist(), pool.ncached.tolist(), pool.bhash.tolist(),
              pool.meta.tolist()]
    return (sched.running.tolist(), sched.waiting.tolist(), sched.table.data[:, live].tolist(),
            sched.table.state[:, live].tolist(), sorted((k, np.asarray(v, dtype=float).tolist()) for k, v in sched.scheduler_state.items()),
            kv, sched.metrics.preemptions)


def replay(steady: bool, *, pipeline: str = "vllm", seed: int, num_blocks: int, block_size: int = 4,
           caching: bool = True, policy: str = "fcfs", depth: int = 1, max_seqs: int = 6, n: int = 60,
           long_prefill: int = 0, async_mode: bool = False, budget: int = 48,
           tenants: int = 0, spread: int = 300, prompt_len: int = 30,
           memo: bool = True, cpu_blocks: int = 0, lowered: bool = True, arrays: bool = True,
           counts: dict[str, int] | None = None) -> tuple[list[tuple], int, int]:
    """Run one random trace (shared prefixes, aborts, arrivals over `spread` ticks); returns every
    step's output and state, how many steps were steady decode steps and how many running steps
    (both lowered without their IR). `arrays` false: every IR step builds its IR (no array
    steps, `schedir.ir.array_step`); `counts`, when given, gets the run's `array_steps`."""
    cfg = SchedulerConfig(pipeline=pipeline, num_blocks=num_blocks, block_size=block_size,
                          max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len=160,
                          enable_prefix_caching=caching, policy=policy, async_scheduling=depth > 1 or async_mode,
                          long_prefill_token_threshold=long_prefill, num_cpu_blocks=cpu_blocks)
    now = [0.0]
    sched = Scheduler(cfg, clock=lambda: now[0])  # the trace's clock: slo-aware's deadlines read it
    if not steady:
        sched._steady_pipeline = False
    sched._answers.reuse = memo
    sched._answers.lowered = lowered  # False: every steady answer asked in Python
    sched._arrays_allowed = arrays
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 50, 40).tolist() for _ in range(3)]
    arrivals = sorted(int(rng.integers(0, spread)) for _ in range(n))
    records: list[tuple] = []
    flight: list = []
    added = 0
    tick = 0
    while added < n or sched.has_unfinished_requests() or flight:
        while added < n and arrivals[added] <= tick:
            prompt = (prefixes[int(rng.integers(0, 3))][: int(rng.integers(0, 40))]
                      + rng.integers(0, 50, int(rng.integers(1, prompt_len))).tolist())
            sched.add_request(Request(f"r{added:03d}", prompt, max_tokens=int(rng.integers(1, 60)),
                                      priority=int(rng.integers(0, 3)), arrival_time=now[0],
                                      **({"state": {"tenant": (added * 7) % tenants}} if tenants else {})))
            added += 1
        tick += 1
        now[0] = tick * 0.01
        if tick % 37 == 0 and sched.running.size:  # an abort mid-decode or mid-prefill
            sched.finish_requests(str(sched.table.names[sched.running[-1]]))
        out = sched.schedule()
        records.append(output_record(out) + state_record(sched))
        flight.append(out)
        while flight and (len(flight) >= depth or not sched.has_unfinished_requests()):
            done = flight.pop(0)
            records.append(tuple(sched.update(done, np.where(done.sampled, 7, -1))))
        assert tick < 20000
    running = sched.metrics.running_steps
    if counts is not None:
        counts["array_steps"] = sched.metrics.array_steps
    return records, sched.get_metrics()["steady_steps"] - running, running


CASES = [
    dict(seed=1, num_blocks=400),                      # ample: long runs of steady decodes
    dict(seed=2, num_blocks=60),                       # tight: preemption by recompute
    dict(seed=3, num_blocks=40, block_size=8),         # waiting heads that cannot fit (admissible_bound)
    dict(seed=4, num_blocks=80, caching=False),
    dict(seed=5, num_blocks=70, policy="priority"),
    dict(seed=6, num_blocks=90, depth=2),              # async, two steps in flight: never steady
    dict(seed=10, num_blocks=90, depth=1, async_mode=True),  # async, each output back before the next step
    dict(seed=7, num_blocks=50, max_seqs=2),           # seats full while many wait
    dict(seed=8, num_blocks=120, long_prefill=8),
    dict(seed=9, num_blocks=60, pipeline="slo-aware"),
    dict(seed=19, num_blocks=60, pipeline="slo-aware-reject"),
    # count-level pipelines: the lowering's `commit` allocates; their admission's declared window
    # (nobody while every seat stays taken) empties the waiting queue of a steady step
    dict(seed=11, num_blocks=60, pipeline="base"),
    dict(seed=12, num_blocks=400, pipeline="base", max_seqs=3),
    dict(seed=13, num_blocks=70, pipeline="base-priority", policy="priority"),
    dict(seed=14, num_blocks=80, pipeline="orca", budget=160),
    dict(seed=15, num_blocks=60, pipeline="with-prefix-aware", max_seqs=4),
    dict(seed=16, num_blocks=50, pipeline="base", caching=False),
    dict(seed=17, num_blocks=80, pipeline="sarathi", max_seqs=8),
    dict(seed=18, num_blocks=200, pipeline="reject-oversized,sarathi-budget{tbt-ms=9 step-us=8000 token-us=200},"
                                        "order-vllm,order-decodes-first,vllm-schedule-running,vllm-admit", max_seqs=8),
    # SGLang on the radix pool: its passes write state in a steady step (the decaying new_token_ratio,
    # the batch's size and batch_is_full: `StepPass.steady_state`) and decode in join order
    # (`steady_order`); the gate skips admission with requests waiting (a full batch)
    dict(seed=21, num_blocks=400, pipeline="sglang", policy="lpm", budget=64),
    dict(seed=22, num_blocks=60, pipeline="sglang", policy="lpm", budget=64),  # retraction reorders the batch
    dict(seed=23, num_blocks=40, pipeline="sglang", policy="lpm", budget=64, max_seqs=3),
    dict(seed=24, num_blocks=200, pipeline="sglang", policy="dfs-weight", budget=64, max_seqs=2),
    dict(seed=25, num_blocks=60, pipeline="sglang-mixed", policy="lpm", budget=64),
    dict(seed=26, num_blocks=300, pipeline="sglang", budget=64, max_seqs=3),  # fcfs
]
CASES += [  # VTC: the counter lift over the waiting tenants and each step's charge are state (vtc-order,
    # vtc-account: `steady_state`); admission reaches nobody while every seat is taken
    dict(seed=31, num_blocks=400, pipeline="vtc", tenants=3, max_seqs=3),
    dict(seed=32, num_blocks=60, pipeline="vtc", tenants=4),
    dict(seed=33, num_blocks=200, pipeline="vtc", tenants=2, max_seqs=2),
]
CASES += [  # slo-aware-reject: steady with requests waiting only while none of them is hopeless now
    # (order-slo's `steady_state` judges the whole queue against the step's clock)
    dict(seed=41, num_blocks=400, pipeline="slo-aware-reject", max_seqs=3),
    dict(seed=42, num_blocks=200, pipeline="slo-aware-reject", max_seqs=2),
    dict(seed=43, num_blocks=200, pipeline="slo-aware", max_seqs=3),  # hopeless last: only ordering
]
CASES += [  # vLLM v0: steady while nothing is swapped out, no seat is free for a waiting request (or
    # nobody waits) and the free blocks cover v0's worst case, one per decode (v0-running's
    # `steady_state`); the delay rule's clock is written every step (v0-prefills')
    dict(seed=61, num_blocks=400, pipeline="vllm-v0", caching=False, budget=160, max_seqs=3),
    dict(seed=62, num_blocks=60, pipeline="vllm-v0", caching=False, budget=160),  # preemption by recompute
    dict(seed=63, num_blocks=60, pipeline="vllm-v0-swap", caching=False, budget=160, cpu_blocks=40),
    dict(seed=64, num_blocks=200, pipeline="order-vllm,v0-prefills{delay-factor=0.5},v0-running,v0-swapped",
         caching=False, budget=160, max_seqs=3),
    # chunked prefill: v0-chunked-running writes the step's places (v0's running order, request-state
    # rows) and is steady only while the running queue is in that order and none is in its prefill
    dict(seed=65, num_blocks=400, pipeline="vllm-v0-chunked", caching=False, budget=16, max_seqs=3),
    dict(seed=66, num_blocks=60, pipeline="vllm-v0-chunked", caching=False, budget=16),  # recompute
    dict(seed=67, num_blocks=60, pipeline="order-vllm,v0-chunked-running{preemption=swap partial=2},v0-swapped,"
                                        "v0-chunked-prefills{partial=2 delay-factor=0.5}", caching=False, budget=80,
         cpu_blocks=40),  # (a budget below a prompt: v0 never swaps a request back mid-prefill, it stalls)
    # the priority policy: steady while the deque's head does not outrank the last running request
    # (v0-priority-preemption's `steady_state`, which writes the step's sort); the batch decodes in
    # (priority, arrival) order (its `steady_order`)
    dict(seed=68, num_blocks=400, pipeline="vllm-v0-priority", policy="priority", caching=False, budget=160,
         max_seqs=3),
    dict(seed=69, num_blocks=60, pipeline="vllm-v0-priority", policy="priority", caching=False, budget=160),
]
CASES += [  # the seed's four passes: memory-aware-preemption writes when each running request last ran
    # (request state of the batch's rows) and is steady while it can preempt nobody
    dict(seed=71, num_blocks=60, pipeline="with-all-passes", max_seqs=4),
    dict(seed=72, num_blocks=400, pipeline="with-all-passes", max_seqs=3),
    dict(seed=73, num_blocks=45, pipeline="reject-oversized,prefix-cache-aware,batching-efficiency{max-age-ms=300},"
                                       "priority-based,memory-aware-preemption{victim=lru},schedule-running,"
                                       "admit-greedy,verify-step"),
]
CASES += [  # FastServe: mlfq-account writes the batch's service and last run (request-state rows);
    # steady while no level changes and no running job gives way to a waiting one (mlfq-order
    # asks its own rule, mlfq_pick)
    dict(seed=81, num_blocks=400, pipeline="fastserve", max_seqs=3, cpu_blocks=100),
    dict(seed=82, num_blocks=60, pipeline="fastserve", cpu_blocks=40),  # swaps, recomputes
    dict(seed=83, num_blocks=200, pipeline="reject-oversized,mlfq-levels{quantum=4 starve-steps=60},mlfq-order,"
                                        "schedule-running,admit-greedy,mlfq-account,verify-step", max_seqs=4),
    # a queue many deep behind two seats, starving within the run: the steady program's memo of
    # the queued jobs (their head, their next starvation step) is kept and refreshed many times
    dict(seed=84, num_blocks=300, pipeline="reject-oversized,mlfq-levels{quantum=4 starve-steps=25},"
                                        "mlfq-order{preemption=swap},schedule-running,mlfq-swap-in,admit-greedy,"
                                        "mlfq-account,verify-step", max_seqs=2, n=50, spread=60, cpu_blocks=60),
]
CASES += [  # default answers only (every pass's window by its rule, `steady_layout.windows_empty`):
    # steady with requests waiting behind the full seats, unless one is oversized
    dict(seed=91, num_blocks=400, pipeline="base", max_seqs=3),
    dict(seed=92, num_blocks=60, pipeline="orca", max_seqs=3, budget=160),
    dict(seed=93, num_blocks=200, pipeline="with-prefix-aware", max_seqs=4, prompt_len=150),  # oversized ones
    dict(seed=94, num_blocks=45, pipeline="base-priority", max_seqs=4),
]
# running steps (vllm: nobody in the admission window, the running requests mid-prefill or
# decoding; `StepPass.decide_running`): bursts that queue more than the window, prompts longer
# than the budget (chunks), pools tight enough that the queue's head does not fit, preemption
RUNNING = [
    dict(seed=51, num_blocks=60, max_seqs=4, n=90, spread=40, budget=16, prompt_len=60),
    dict(seed=52, num_blocks=45, max_seqs=5, n=90, spread=30, budget=12, prompt_len=50, policy="priority"),
    dict(seed=53, num_blocks=70, max_seqs=4, n=90, spread=40, budget=16, prompt_len=60, caching=False),
    dict(seed=54, num_blocks=60, max_seqs=4, n=90, spread=40, budget=16, prompt_len=60, depth=2),
    dict(seed=55, num_blocks=60, max_seqs=4, n=90, spread=40, budget=16, prompt_len=60, async_mode=True),
    dict(seed=56, num_blocks=35, max_seqs=3, n=90, spread=20, budget=20, prompt_len=60, block_size=8),
]
CASES += RUNNING
SGLANG = [c for c in CASES if c.get("pipeline", "").startswith("sglang")]
VTC = [c for c in CASES if c.get("pipeline") == "vtc"]


@pytest.mark.parametrize("case", CASES, ids=[f"seed{c['seed']}" for c in CASES])
def test_steady_steps_decide_as_the_ir(case):
    steady, taken, _ = replay(True, **case)
    full, none, none_running = replay(False, **case)
    assert none == none_running == 0
    if case.get("depth", 1) > 1:
        assert taken == 0  # a request waiting on its token is not steady
    else:
        assert taken > 10, f"only {taken} steady steps: the case does not exercise the path"
    assert len(steady) == len(full)
    for i, (a, b) in enumerate(zip(steady, full, strict=True)):
        assert a == b, f"record {i} differs"


LOWERED_CASES = [c for c in CASES if c["seed"] in (41, 42, 43, 61, 62, 63, 64, 65, 66, 67, 68, 69, 71, 72, 73, 81,
                                                    82, 83, 84, 91, 92, 93, 94)]


@pytest.mark.parametrize("case", LOWERED_CASES, ids=[f"seed{c['seed']}" for c in LOWERED_CASES])
def test_lowered_steady_answers_decide_as_asked(case):
    """vLLM v0's, FastServe's, with-all-passes' and slo-aware's steady answers lowered to one kernel
    call (`SteadyProgram`; v0's write the delay rule's clock and the running queue's next place into
    their scheduler-state slots), and the default-answer pipelines' windows answered by their
    rules (`windows_empty`): every step's output and state as when each pass is asked in Python."""
    lowered, taken, _ = replay(True, **case)
    asked, taken_asked, _ = replay(True, lowered=False, **case)
    assert taken == taken_asked and taken > 10
    assert lowered == asked


def test_which_steady_answers_lower():
    """The FastServe passes' answers lower, the default answers' window rules too, vLLM v0's with
    their scheduler state in slots; a pipeline with a stateful pass that has no lowered form does
    not, nor one whose lowered pass names scheduler state with no slot, or whose Python-asked pass
    declares scheduler state; nor does a subclass that writes an answer of its own without a
    kernel of its own (a default answer over a window of its own: asked in Python)."""
    from dataclasses import dataclass

    from schedir.lowering.steady_layout import SteadyLayout
    from schedir.lowering.steady_program import SteadyProgram
    from schedir.passes.admit_greedy import AdmitGreedy
    from schedir.passes.mlfq_order import MlfqOrder

    sched = Scheduler(SchedulerConfig(pipeline="fastserve", num_cpu_blocks=16))
    program = sched._answers.program
    assert program is not None and program.writes == ("mlfq_level", "mlfq_level_start", "mlfq_decode", "mlfq_last_run")
    assert program.writer == (1, 1, 6, 6)  # mlfq-levels (a demotion), mlfq-account (every step)
    assert program.asked == ()  # the default answers' window rules lower too (reject-oversized, admit-greedy, ...)
    assert program.codes.tolist() == [4, 0, 1, 4, 2, 4, 3, 4]  # in pipeline order (4: a window's rule)
    v0 = Scheduler(SchedulerConfig(pipeline="vllm-v0-chunked", enable_prefix_caching=False))._answers.program
    assert v0 is not None and v0.codes.tolist() == [4, 8, 4, 6]  # v0-chunked-running (8), -prefills (6: v0-prefills')
    assert v0.writes == ("v0_run_pos",)  # the decodes' places: request-state rows
    assert v0.scalars == ("v0_next_run_pos", "v0_prev_time_us", "v0_prev_prompt", "v0_last_prompt_latency_us")
    assert Scheduler(SchedulerConfig(pipeline="vtc"))._answers.program is None  # transitions: asked in Python
    assert Scheduler(SchedulerConfig(pipeline="vllm"))._answers.program is None  # no stateful pass
    from schedir.passes.v0_prefills import V0Prefills

    # scheduler state the layout has no slot for (not a number) keeps the pipeline in Python
    layout = SteadyLayout({"total": 2, "computed": 3}, {}, {"v0_prev_time_us": 0, "v0_prev_prompt": 1})
    assert SteadyProgram.lower([V0Prefills()], layout) is None

    @dataclass(frozen=True)
    class KeepsAClock(AdmitGreedy):  # a default answer asked in Python (a window of its own), keeping state
        scheduler_state = V0Prefills.scheduler_state

        def waiting_window(self, ctx):  # type: ignore[no-untyped-def]
            return None

    layout = SteadyLayout({"total": 2, "computed": 3}, {}, {"v0_prev_time_us": 0, "v0_prev_prompt": 1,
                                                             "v0_last_prompt_latency_us": 2})
    assert SteadyProgram.lower([V0Prefills(), AdmitGreedy()], layout) is not None
    assert SteadyProgram.lower([V0Prefills(), KeepsAClock()], layout) is None

    @dataclass(frozen=True)
    class NeverReorders(MlfqOrder):
        def steady_order(self, ctx):  # type: ignore[no-untyped-def]
            return None

    layout = SteadyLayout({"prompt": 0, "arrival": 1, "total": 2}, {})
    assert SteadyProgram.lower([NeverReorders()], layout) is None

    @dataclass(frozen=True)
    class AdmitsFromTheHead(AdmitGreedy):  # a window of its own, and no kernel of its rule: asked in Python
        def waiting_window(self, ctx):  # type: ignore[no-untyped-def]
            return None

    layout = SteadyLayout({"prompt": 0, "arrival": 1, "total": 2}, {"mlfq_level": 0, "mlfq_level_start": 1,
                                                                    "mlfq_last_run": 2, "mlfq_prefill": 3,
                                                                    "mlfq_decode": 4})
    program = SteadyProgram.lower([MlfqOrder(), AdmitsFromTheHead(), AdmitGreedy()], layout)
    assert program is not None and [type(p).__name__ for p in program.asked] == ["AdmitsFromTheHead"]


@pytest.mark.parametrize("case", RUNNING, ids=[f"seed{c['seed']}" for c in RUNNING])
def test_running_steps_decide_as_the_ir(case):
    """vllm-schedule-running decides a step with nobody admissible waiting alone (its kernel on the
    pool, `decide_running`), chunks and preemptions included: every output and state as the IR's."""
    steady, _, running = replay(True, **case)
    full, _, none = replay(False, **case)
    assert none == 0
    assert running > 10, f"only {running} running steps: the case does not exercise the path"
    assert steady == full


@pytest.mark.parametrize("mutation", ["budget", "victims unreported"])
def test_running_steps_need_the_pass_decision(mutation, monkeypatch):
    """The running-step equivalence fails when the decider's answer is not its IR run's: one token
    less of budget, or its preempted requests left out of the answer (their blocks freed all the same)."""
    real = VllmScheduleRunning.decide_running

    def mutated(self, step):  # type: ignore[no-untyped-def]
        if mutation == "budget":
            step.token_budget -= 1
        decision = real(self, step)
        if mutation == "victims unreported":
            decision.preempted = decision.preempted[:0]
        return decision

    monkeypatch.setattr(VllmScheduleRunning, "decide_running", mutated)
    assert any(replay(True, **case)[0] != replay(False, **case)[0] for case in RUNNING), mutation


def test_which_pipelines_take_running_steps():
    def decider(spec: str) -> str | None:
        sched = Scheduler(SchedulerConfig(pipeline=spec, num_blocks=64, block_size=4, max_model_len=128,
                                          enable_prefix_caching=spec not in ("vllm-v0", "fastserve")))
        return None if sched._running_decider is None else sched._running_decider.name

    assert decider("vllm") == "vllm-schedule-running"
    # a pass that acts on a step's running queue without deciding it alone (or lowers the budget) opts out
    for spec in ("sarathi", "slo-aware", "base", "sglang", "vllm-v0", "fastserve",
                 "reject-oversized,order-vllm,vllm-schedule-running{long-prefill=8},vllm-admit",
                 "reject-oversized,order-vllm{queue=running},vllm-schedule-running,vllm-admit"):
        assert decider(spec) is None, spec
    assert not parse_passes("vllm-schedule-running{long-prefill=8}")[0].decides_running_steps()


ARRAYS = [c for c in CASES if c["seed"] in (81, 82, 83, 84, 11, 12, 13, 14, 15, 16, 71, 72, 73)] + [
    dict(seed=85, num_blocks=40, pipeline="fastserve", max_seqs=4, n=80),  # no host tier: every victim recomputed
    dict(seed=86, num_blocks=50, pipeline="fastserve", max_seqs=3, n=80, cpu_blocks=100, policy="priority"),
    dict(seed=87, num_blocks=80, pipeline="fastserve", max_seqs=8, n=80, cpu_blocks=10, budget=24),  # chunks
    dict(seed=88, num_blocks=60, pipeline="fastserve", caching=False, cpu_blocks=40, prompt_len=120),  # oversized
]


@pytest.mark.parametrize("case", ARRAYS, ids=[f"seed{c['seed']}" for c in ARRAYS])
def test_array_steps_decide_as_the_ir(case):
    """IR steps decided over arrays (every pass's `run_arrays`, `schedir.ir.array_step`: FastServe,
    the seed's pipelines with their four passes, Orca) take the IR's decisions: every output
    and state of every step as with the IR built each step."""
    counts: dict[str, int] = {}
    arrays = replay(False, counts=counts, **case)[0]
    assert counts["array_steps"] > 50, f"only {counts['array_steps']} array steps: the case misses the path"
    assert arrays == replay(False, arrays=False, **case)[0]


@pytest.mark.parametrize("mutation", ["service not accounted", "queue left unsorted", "allocations not counted"])
def test_array_steps_need_each_rule(mutation, monkeypatch):
    """The array-step equivalence fails when one pass's `run_arrays` drops a rule of its `run` (or
    the step refuses to lower: blocks counted free that are not)."""
    if mutation == "service not accounted":
        monkeypatch.setattr(MlfqAccount, "run_arrays", lambda self, step: None)
    elif mutation == "queue left unsorted":
        monkeypatch.setattr(MlfqOrder, "_sorted_arrays", lambda self, step, q: (
            np.zeros(0, dtype=np.int64) if q is None else step.state(LEVEL.name)[q.pending]))
    else:
        real = ArrayStep.alloc

        def uncounted(self, rows, blocks):  # type: ignore[no-untyped-def]
            real(self, rows, blocks)
            self.blocks_taken -= int(blocks.sum())

        monkeypatch.setattr(ArrayStep, "alloc", uncounted)

    def diverges(case: dict) -> bool:
        try:
            return replay(False, **case)[0] != replay(False, arrays=False, **case)[0]
        except PassFailure:
            return True

    fastserve = [c for c in ARRAYS if c["seed"] in (81, 82, 83)]
    assert any(diverges(case) for case in fastserve), mutation


@pytest.mark.parametrize("illegal", ["scheduled twice", "left undecided"])
def test_verify_step_refuses_an_illegal_array_step(illegal, monkeypatch):
    """verify-step checks an array step as it checks the IR: a request scheduled twice, or one
    left without a decision, is refused with the IR's message."""
    if illegal == "scheduled twice":
        real = ScheduleRunning.run_arrays

        def broken(self, step):  # type: ignore[no-untyped-def]
            running = step.pending(self.queue)
            rows = None if running is None else running.pending.copy()
            real(self, step)
            if rows is not None and rows.size:
                step.schedule(step.queues["running"], rows[:1], np.ones(1, dtype=np.int64))

        monkeypatch.setattr(ScheduleRunning, "run_arrays", broken)
        message = r"verify-step.*scheduled more than once"
    else:
        from schedir.passes.admit_greedy import AdmitGreedy

        monkeypatch.setattr(AdmitGreedy, "run_arrays", lambda self, step: None)  # nobody admitted nor deferred
        message = r"verify-step.*of queue 'waiting' have no decision"
    with pytest.raises(PassFailure, match=message):
        replay(False, **next(c for c in ARRAYS if c["seed"] == 82))


def test_which_pipelines_take_array_steps():
    def arrays(spec: str, **options: object) -> bool:
        cfg = SchedulerConfig(pipeline=spec, num_blocks=64, block_size=4, max_model_len=128,
                              enable_prefix_caching=spec != "vllm-v0", num_cpu_blocks=16, **options)
        return Scheduler(cfg)._array_pipeline

    for spec in ("fastserve", "base", "base-priority", "orca", "with-prefix-aware", "with-all-passes",
                 "reject-oversized,mlfq-levels,mlfq-order,schedule-running,admit-greedy"):
        assert arrays(spec), spec
    assert not arrays("fastserve", verify_each=True)  # asked for the IR
    for spec in ("vllm", "sglang", "vllm-v0", "sarathi", "vtc"):  # a pass without `run_arrays`
        assert not arrays(spec), spec


@pytest.mark.parametrize("cfg", [dict(seed=3, num_blocks=40, block_size=8),  # vllm: admissible_bound
                                 dict(seed=12, num_blocks=400, pipeline="base", max_seqs=3)],  # declared windows
                         ids=["vllm-heads-do-not-fit", "base-seats-taken"])
def test_steady_steps_with_a_waiting_queue_admission_cannot_reach(cfg):
    """Heads that cannot fit (the few-b32 case), or every seat taken, keep the step steady:
    some steady steps have requests waiting."""
    seen = []
    real = Scheduler._steady_step

    def spy(self, step, waiting):  # type: ignore[no-untyped-def]
        out = real(self, step, waiting)
        if out is not None:
            seen.append(self.waiting.size)
        return out

    Scheduler._steady_step = spy  # type: ignore[method-assign]
    try:
        replay(False, **cfg)  # (the spy is on the class: this run's steady flag is off, so it never calls it)
        assert not seen
        replay(True, **cfg)
    finally:
        Scheduler._steady_step = real  # type: ignore[method-assign]
    assert any(w > 0 for w in seen)


@pytest.mark.parametrize("mutation", ["running order", "no decay", "admission ignores its gate", "no vtc charge",
                                      "no vtc lift", "nobody hopeless", "no last run", "nobody to preempt",
                                      "v0 preempts nobody", "no v0 places", "mlfq running order",
                                      "lowered order pass dropped", "lowered no last run", "lowered no map last run",
                                      "lowered memo kept", "lowered v0 running dropped", "lowered no v0 places",
                                      "lowered no v0 clock", "window rules ignored", "lowered slo dropped"])
def test_steady_steps_need_what_their_passes_declare(mutation, monkeypatch):
    """The sglang, vtc, seed and v0 cases fail when a declaration is wrong: the batch decoded in
    running order instead of join order, the ratio not decayed, admission declared steady when its
    gate is open, the tenants' counters not charged or not lifted, no waiting request judged
    hopeless, the batch's last run not written, memory-aware-preemption or v0-running declared
    steady when they would preempt, v0's running places not written, FastServe's batch decoded in
    running order instead of (level, arrival) order; and each lowered answer likewise (a pass's
    opcode dropped, its request-state rows or its scheduler-state slots not written back)."""
    from schedir.passes.memory_aware_preemption import LAST_RUN, MemoryAwarePreemption
    from schedir.passes.v0_running import V0Running
    from schedir.passes.sglang_admit import SglangAdmit
    from schedir.passes.sglang_decode import SglangDecode
    from schedir.passes.vtc_account import VtcAccount
    from schedir.passes.vtc_order import VtcOrder

    if mutation == "nobody hopeless":
        from schedir.passes.order_slo import OrderSlo

        monkeypatch.setattr(OrderSlo, "steady_state", lambda self, ctx: {})
        slo = [c for c in CASES if c.get("pipeline") == "slo-aware-reject" and "max_seqs" in c]  # its Python answer
        assert any(replay(True, lowered=False, **case)[0] != replay(False, **case)[0] for case in slo), mutation
        return
    if mutation in ("no last run", "nobody to preempt"):
        declared = MemoryAwarePreemption.steady_state

        def mutated(self, ctx):  # type: ignore[no-untyped-def]
            if mutation == "nobody to preempt":  # its writes, as if nobody waited
                waiting, ctx.waiting = ctx.waiting, ctx.NONE
                writes = declared(self, ctx)
                ctx.waiting = waiting
                return writes
            writes = declared(self, ctx)
            return writes and {k: v for k, v in writes.items() if k != LAST_RUN.name}

        monkeypatch.setattr(MemoryAwarePreemption, "steady_state", mutated)
        seed = [c for c in CASES if c["seed"] in (71, 72, 73)]  # its Python answer (the lowered one: below)
        assert any(replay(True, lowered=False, **case)[0] != replay(False, **case)[0] for case in seed), mutation
        return
    if mutation == "no v0 places":
        from schedir.passes.v0_chunked_running import V0ChunkedRunning
        from schedir.passes.v0_state import RUN_POS

        placed = V0ChunkedRunning.steady_state
        monkeypatch.setattr(V0ChunkedRunning, "steady_state", lambda self, ctx: (
            (lambda w: w and {k: v for k, v in w.items() if k != RUN_POS.name})(placed(self, ctx))))
        chunked = [c for c in CASES if c["seed"] in (65, 66, 67)]  # its Python answer (the lowered one: below)
        assert any(replay(True, lowered=False, **case)[0] != replay(False, **case)[0] for case in chunked), mutation
        return
    if mutation == "mlfq running order":  # the batch in running order, not (level, arrival)
        from schedir.passes.mlfq_order import MlfqOrder

        monkeypatch.setattr(MlfqOrder, "steady_order", lambda self, ctx: None)
        fastserve = [c for c in CASES if c["seed"] in (81, 82, 83)]
        assert any(replay(True, lowered=False, **case)[0] != replay(False, **case)[0] for case in fastserve), mutation
        return
    if mutation == "lowered memo kept":  # the queued jobs' memo never made again once made
        def stale(self, waiting):  # type: ignore[no-untyped-def]
            return self.__dict__.setdefault("_never_dropped", {})  # one per scheduler, never dropped

        monkeypatch.setattr(Scheduler, "_queued_answers", stale)
        fastserve = [c for c in CASES if c["seed"] in (81, 82, 83, 84)]
        assert any(replay(True, **case)[0] != replay(False, **case)[0] for case in fastserve), mutation
        return
    if mutation.startswith("lowered"):  # the steady program's answer (schedir.lowering.steady_program)
        from schedir.lowering.steady_program import SteadyProgram

        if mutation in ("lowered order pass dropped", "lowered v0 running dropped", "lowered slo dropped"):
            lowered = SteadyProgram.lower  # the program asks every lowered answer but mlfq-order's (v0-running's:
            # it would never preempt; order-slo's: it would never reject): the opcode (steady_program.LOWERED)
            dropped = {"lowered order pass dropped": 1, "lowered v0 running dropped": 7}.get(mutation, 9)

            def without_order(passes, layout):  # type: ignore[no-untyped-def]
                program = lowered(passes, layout)
                if program is None:
                    return None
                gone = int(np.flatnonzero(program.codes == dropped)[0])  # (neither writes request state)
                keep = np.arange(program.codes.size) != gone
                return attrs.evolve(program, codes=program.codes[keep], options=program.options[keep],
                                    first_write=program.first_write[keep],
                                    slots=tuple((flag - int(flag - 2 > gone), named) for flag, named in program.slots))

            monkeypatch.setattr(SteadyProgram, "lower", staticmethod(without_order))
        elif mutation == "lowered no v0 clock":  # the delay rule's clock and the next place never written back
            monkeypatch.setattr(SteadyProgram, "write_scalars", lambda self, state: None)
        else:  # one request state the kernel writes for the batch's rows left unwritten (its ST row: -1)
            lowered = SteadyProgram.lower
            dropped = {"lowered no map last run": "map_last_run", "lowered no v0 places": "v0_run_pos"}.get(
                mutation, "mlfq_last_run")

            def without_last_run(passes, layout):  # type: ignore[no-untyped-def]
                program = lowered(passes, layout)
                if program is None or dropped not in program.writes:
                    return program
                rows = program.write_rows.copy()
                rows[program.writes.index(dropped)] = -1
                return attrs.evolve(program, write_rows=rows)

            monkeypatch.setattr(SteadyProgram, "lower", staticmethod(without_last_run))
        seeds = {"lowered no map last run": (71, 72, 73), "lowered v0 running dropped": (62, 63),
                 "lowered slo dropped": (41, 42),
                 "lowered no v0 places": (65, 66, 67), "lowered no v0 clock": (61, 62, 64)}.get(mutation, (81, 82, 83))
        cases = [c for c in CASES if c["seed"] in seeds]
        assert any(replay(True, **case)[0] != replay(False, **case)[0] for case in cases), mutation
        return
    if mutation == "window rules ignored":  # every window taken as empty: a free seat or an oversized arrival missed
        import schedir.runtime.scheduler as runtime

        monkeypatch.setattr(runtime, "windows_empty", lambda rules, running, max_seqs, oversized: True)
        plain = [c for c in CASES if c["seed"] in (91, 92, 93, 94)]
        assert any(replay(True, **case)[0] != replay(False, **case)[0] for case in plain), mutation
        return
    if mutation == "v0 preempts nobody":
        monkeypatch.setattr(V0Running, "steady_state", lambda self, ctx: {})
        v0 = [c for c in CASES if c["seed"] in (62, 63)]
        assert any(replay(True, lowered=False, **case)[0] != replay(False, **case)[0] for case in v0), mutation
        return
    if mutation.startswith("no vtc"):
        monkeypatch.setattr(VtcAccount if mutation == "no vtc charge" else VtcOrder, "steady_state",
                            lambda self, ctx: {})
        assert any(replay(True, **case)[0] != replay(False, **case)[0] for case in VTC), mutation
        return

    if mutation == "running order":
        monkeypatch.setattr(SglangDecode, "steady_order", lambda self, ctx: None)
    elif mutation == "no decay":
        declared = SglangDecode.steady_state

        def no_decay(self, ctx):  # type: ignore[no-untyped-def]
            writes = declared(self, ctx)
            return writes and {k: v for k, v in writes.items() if k != "new_token_ratio"}

        monkeypatch.setattr(SglangDecode, "steady_state", no_decay)
    else:
        monkeypatch.setattr(SglangAdmit, "steady_state", lambda self, ctx: {})
    assert any(replay(True, **case)[0] != replay(False, **case)[0] for case in SGLANG), mutation


@pytest.mark.parametrize("family", ["sglang", "vtc"])
def test_held_steady_answers_decide_as_asked(monkeypatch, family):
    """A run of sglang (vtc) steady steps asks its passes again only when the queues, the request
    state or a value they read changed (`StepPass.steady_reads`; the decaying ratio is a `Decay`
    transition, VTC's lift and charge a `Lift` and a `Charge`, applied to each step); the steps
    are those of asking every pass every step."""
    from schedir.runtime.steady_answers import SteadyAnswers

    asked = []
    real = SteadyAnswers.answer

    def counted(self, *args):  # type: ignore[no-untyped-def]
        before = self.asked
        out = real(self, *args)
        asked.append(self.asked - before)
        return out

    monkeypatch.setattr(SteadyAnswers, "answer", counted)
    for case in (SGLANG if family == "sglang" else VTC):
        asked.clear()
        held, taken, _ = replay(True, **case)
        with_holding = sum(asked)
        asked.clear()
        every, taken_every, _ = replay(True, memo=False, **case)
        assert held == every and taken == taken_every
        assert sum(asked) == len(asked)  # without holding: every pass asked every step
        # (these traces' queues change every few steps, arrivals and finishes)
        assert with_holding < 0.8 * sum(asked), (case, with_holding, sum(asked))


def test_holding_needs_unchanged_queues(monkeypatch):
    """Answers held across a change of the queues (an arrival, a finish) are stale: with the check
    of the queues left out, the steps differ from the IR's."""
    from schedir.runtime.steady_answers import SteadyAnswers

    real = SteadyAnswers.answer

    def blind(self, running, waiting, writes, state, ctx_of):  # type: ignore[no-untyped-def]
        if self.held is not None:
            self.held = (running, waiting, writes, *self.held[3:])
        return real(self, running, waiting, writes, state, ctx_of)

    monkeypatch.setattr(SteadyAnswers, "answer", blind)
    assert any(replay(True, **case)[0] != replay(False, **case)[0] for case in SGLANG)
    assert any(replay(True, **case)[0] != replay(False, **case)[0] for case in VTC)


def test_holding_needs_the_ratio_as_a_transition(monkeypatch):
    """The ratio written as the value it decays to, not as a `Decay`, is held at that value: the
    steps differ from the IR's."""
    from schedir.passes.sglang_decode import SglangDecode

    real = SglangDecode.steady_state

    def valued(self, ctx):  # type: ignore[no-untyped-def]
        said = real(self, ctx)
        if said is not None:
            said = {k: (v.apply(ctx.scheduler_state[k]) if k == "new_token_ratio" else v) for k, v in said.items()}
        return said

    monkeypatch.setattr(SglangDecode, "steady_state", valued)
    assert any(replay(True, **case)[0] != replay(False, **case)[0] for case in SGLANG)


@pytest.mark.parametrize("which", ["charge", "lift"])
def test_holding_needs_vtc_writes_as_transitions(monkeypatch, which):
    """VTC's charge (lift) written as the counters it leads to, not as a `Charge` (`Lift`), is held
    at those counters: the steps differ from the IR's."""
    from schedir.passes.vtc_account import VtcAccount
    from schedir.passes.vtc_order import VtcOrder

    kind = VtcAccount if which == "charge" else VtcOrder
    real = kind.steady_state

    def valued(self, ctx):  # type: ignore[no-untyped-def]
        said = real(self, ctx)
        if said:
            said = {k: v.apply(ctx.scheduler_state[k]) for k, v in said.items()}
        return said

    monkeypatch.setattr(kind, "steady_state", valued)
    assert any(replay(True, **case)[0] != replay(False, **case)[0] for case in VTC)


def test_held_answers_follow_what_the_passes_read():
    """A pass is asked again when a value it declares it reads changed (not when another did);
    transitions compose with the values set before them in the same step."""
    from schedir.ir.state import Decay
    from schedir.ir.window import WindowContext
    from schedir.runtime.steady_answers import SteadyAnswers

    class Doubles(StepPass):
        name = "doubles"
        steady_reads = frozenset({"x"})

        def run(self, step) -> None:  # type: ignore[no-untyped-def]
            pass

        def steady_state(self, ctx):  # type: ignore[no-untyped-def]
            return {"y": 2 * ctx.scheduler_state["x"], "r": 5.0}

    class Decays(Doubles):
        name = "decays"
        steady_reads = frozenset()

        def steady_state(self, ctx):  # type: ignore[no-untyped-def]
            return {"r": Decay(1.0, 0.0, 9.0), "z": Decay(0.5, 0.0, 9.0)}

    state = {"x": 1.0, "y": 0.0, "r": -1.0, "z": -1.0, "other": 0.0}
    answers = SteadyAnswers([Doubles(), Decays()], [], state)
    running, waiting = np.arange(3), np.arange(0)

    def ctx_of(st):  # type: ignore[no-untyped-def]
        return WindowContext(running, waiting, 8, 0, 0, 0, 1, 1, WindowContext.NONE, st, None, None)

    def step() -> None:
        SteadyAnswers.write(state, answers.answer(running, waiting, 0, state, ctx_of))

    step()
    assert (state["y"], state["r"], state["z"], answers.asked) == (2.0, 4.0, 8.5, 1)  # r: set to 5, then decayed
    step()
    assert (state["r"], state["z"], answers.asked) == (4.0, 8.0, 1)  # held: the same writes, z decays again
    state["other"] = 1.0
    step()
    assert answers.asked == 1  # a value nobody reads
    state["x"] = 3.0
    step()
    assert (state["y"], answers.asked) == (6.0, 2)
    step()
    assert answers.asked == 2
    answers.answer(running, np.arange(1), 0, state, ctx_of)  # another waiting queue
    assert answers.asked == 3
    answers.answer(running, np.arange(1), 1, state, ctx_of)  # request state written
    assert answers.asked == 4


def test_which_presets_take_steady_steps():
    def steady(name: str) -> bool:
        return all(p.decodes_steadily() for p in parse_passes(PRESETS[name]))

    for name in ("vllm", "slo-aware", "slo-aware-reject", "base", "base-priority", "orca", "with-prefix-aware",
                 "sarathi", "sglang", "sglang-mixed", "vtc"):
        assert steady(name), name
    for name in ("vllm-v0", "vllm-v0-swap", "vllm-v0-priority"):  # swapped requests make a step unsteady
        assert steady(name), name
    assert steady("with-all-passes") and steady("fastserve") and steady("vllm-v0-chunked")
    # a queue option that points a waiting-queue pass at the running queue makes it unsteady
    assert not parse_passes("order-vllm{queue=running}")[0].decodes_steadily()

    class Plain(StepPass):
        name = "plain"

        def run(self, step) -> None:  # type: ignore[no-untyped-def]
            pass

    assert not Plain().decodes_steadily()  # the default: a pass must say so


def test_verify_each_runs_every_step_through_the_ir():
    cfg = SchedulerConfig(num_blocks=100, block_size=4, max_num_batched_tokens=32, max_num_seqs=4, max_model_len=128,
                          verify_each=True)
    sched = Scheduler(cfg)
    sched.add_request(Request("a", list(range(10)), max_tokens=12))
    while sched.has_unfinished_requests():
        out = sched.schedule()
        sched.update(out, np.where(out.sampled, 7, -1))
    assert sched.get_metrics()["steady_steps"] == 0 and sched.get_metrics()["steps"] > 10


def test_dumps_and_kept_ir_build_every_step(tmp_path):
    cfg = SchedulerConfig(num_blocks=100, block_size=4, max_num_batched_tokens=32, max_num_seqs=4, max_model_len=128)
    sched = Scheduler(cfg)
    sched.keep_ir = True
    sched.add_request(Request("a", list(range(10)), max_tokens=20))
    for _ in range(5):
        out = sched.schedule()
        assert sched.last_module is not None
        sched.last_module = None
        sched.update(out, np.where(out.sampled, 7, -1))


def test_a_lowered_budget_bounds_steady_steps():
    """sarathi-budget lowers the token budget below the running decodes (6 for 8): those steps
    are not steady (the IR defers two), and the decisions stay the IR's."""
    spec = ("reject-oversized,sarathi-budget{tbt-ms=9 step-us=8000 token-us=150},order-vllm,order-decodes-first,"
            "vllm-schedule-running,vllm-admit")
    runs = {}
    for steady in (True, False):
        sched = Scheduler(SchedulerConfig(pipeline=spec, num_blocks=200, block_size=4, max_num_batched_tokens=64,
                                          max_num_seqs=8, max_model_len=128))
        assert sched._steady_budget == 6
        if not steady:
            sched._steady_pipeline = False
        for i in range(12):
            sched.add_request(Request(f"r{i}", [i + 1, i + 2, i + 3], max_tokens=30 + i, arrival_time=float(i)))
        steps = []
        while sched.has_unfinished_requests():
            out = sched.schedule()
            steps.append(output_record(out) + state_record(sched))
            sched.update(out, np.where(out.sampled, 7, -1))
        runs[steady] = (steps, sched.get_metrics()["steady_steps"])
    assert runs[True][0] == runs[False][0]
    assert runs[True][1] > 10
    assert any(len(step[0]) == 6 for step in runs[True][0])  # capped steps happened


def test_the_steady_program_keeps_its_queue_memo():
    """FastServe with a queue deep behind its seats: most steady steps reuse the memo of the queued
    jobs (their head and next starvation step), and it is made again when the queues or their
    state change (an arrival, an IR step's writes), so the decisions stay the IR's (seed84 in
    `test_steady_steps_decide_as_the_ir` and `test_lowered_steady_answers_decide_as_asked`)."""
    from schedir.lowering import steady_program

    program_of: list = []
    real = steady_program.SteadyProgram.buffers_for

    def spy(self, *inputs):  # type: ignore[no-untyped-def]
        program_of.append(self)
        return real(self, *inputs)

    steady_program.SteadyProgram.buffers_for = spy  # type: ignore[method-assign]
    try:
        case = next(c for c in CASES if c["seed"] == 84)
        _, taken, _ = replay(True, **case)
    finally:
        steady_program.SteadyProgram.buffers_for = real  # type: ignore[method-assign]
    program = program_of[-1]
    kept = program.memo_kept[0]
    assert taken > 10 and 0 < kept < len(program_of), (taken, kept, len(program_of))


# deep queues behind few seats: the passes' answers over the queued requests (v0's ignore rule,
# order-slo's feasibility clock, vtc's waiting tenants) held across steady steps (WindowContext.queued)
QUEUED_HELD = [c for c in CASES if c["seed"] in (41, 42, 31, 33, 61, 63)]


def test_answers_over_the_queue_are_held_until_it_changes(monkeypatch):
    """Most asks of an answer over the queued requests take the one held since the queue last
    changed, asked in Python (`WindowContext.queued`) or lowered (the steady program's memo rows:
    v0's ignore rule, order-slo's feasibility clock); the decisions stay the IR's
    (`test_steady_steps_decide_as_the_ir` on these cases)."""
    from schedir.ir.window import WindowContext
    from schedir.lowering.steady_program import SteadyProgram

    real = WindowContext.queued
    asked = {"held": 0, "computed": 0}

    def spy(self, key, compute):  # type: ignore[no-untyped-def]
        asked["held" if self.queued_memo is not None and key in self.queued_memo else "computed"] += 1
        return real(self, key, compute)

    monkeypatch.setattr(WindowContext, "queued", spy)
    for case in QUEUED_HELD:
        replay(True, lowered=False, **case)
    assert asked["held"] > asked["computed"] > 0, asked

    programs: list = []
    buffers_for = SteadyProgram.buffers_for

    def kept(self, *inputs):  # type: ignore[no-untyped-def]
        programs.append(self)
        return buffers_for(self, *inputs)

    monkeypatch.setattr(SteadyProgram, "buffers_for", kept)
    held = {"kept": 0, "asked": 0}
    for case in [c for c in QUEUED_HELD if c["seed"] in (41, 42, 61, 63)]:
        programs.clear()
        replay(True, **case)
        asks = sum(1 for p in programs if p is programs[-1])
        assert 0 < programs[-1].memo_kept[0] < asks, (case["seed"], asks)
        held["kept"] += programs[-1].memo_kept[0]
        held["asked"] += asks
    assert 2 * held["kept"] > held["asked"], held


def test_answers_held_past_a_queue_change_are_caught(monkeypatch):
    """The same answers held for a whole run, never dropped when a request arrives, leaves or is
    written by an IR step: the steady steps then decide otherwise than the IR (so the key the
    runtime holds them under matters)."""
    from schedir.ir.window import WindowContext

    def stale(self, key, compute):  # type: ignore[no-untyped-def]
        memo = self.column_of.__self__.__dict__.setdefault("_never_dropped", {})  # one per scheduler
        if key not in memo:
            memo[key] = compute()
        return memo[key]

    monkeypatch.setattr(WindowContext, "queued", stale)
    assert any(replay(True, **case)[0] != replay(False, **case)[0] for case in QUEUED_HELD)



@pytest.mark.parametrize("waiting", [0, 3])
@pytest.mark.parametrize("running", [2, 4])
@pytest.mark.parametrize("oversized", [0, 1])
def test_lowered_window_rules_answer_as_the_default_answer(waiting, running, oversized):
    """The default-answer passes' lowered window rules (reject-oversized, schedule-running,
    admit-greedy, verify-step, orca-admit, order-fcfs, vllm-admit, vllm-schedule-running; the whole
    queue where options point elsewhere) answer as `StepPass.steady_state` over their
    `waiting_window` in a steady step: nothing written (ANSWERED) where it answers `{}`, the IR
    (ASK_IR) where None; and so does the runtime's Python twin of the kernel (`windows_empty`)."""
    from schedir.ir.window import WindowContext
    from schedir.lowering.steady_layout import ANSWERED, ASK_IR, SC_MAX_SEQS, SC_OVERSIZED, SC_SIZE, windows_empty
    from schedir.passes.admit_greedy import AdmitGreedy
    from schedir.passes.orca_admit import OrcaAdmit
    from schedir.passes.order_fcfs import OrderFcfs
    from schedir.passes.reject_oversized import RejectOversized
    from schedir.passes.schedule_running import ScheduleRunning
    from schedir.passes.verify_step import VerifyStep
    from schedir.passes.vllm_admit import VllmAdmit
    from schedir.passes.vllm_schedule_running import VllmScheduleRunning

    queue, batch = np.arange(10, 10 + waiting), np.arange(running)
    flagged = np.arange(min(oversized, waiting))
    ctx = WindowContext(batch, queue, 4, 100, 100, 64, 4, 64, flagged, {}, None, None, steady=True)
    sc = np.zeros(SC_SIZE, dtype=np.int64)
    sc[SC_MAX_SEQS], sc[SC_OVERSIZED] = 4, flagged.size
    none = np.zeros(0, dtype=np.int64)
    for p in (RejectOversized(), ScheduleRunning(), AdmitGreedy(), VerifyStep(), OrcaAdmit(), OrderFcfs(), VllmAdmit(),
              VllmScheduleRunning(), VllmScheduleRunning(long_prefill=8), VllmAdmit(running="other")):
        ctx.memo = {}
        said = p.steady_state(ctx)
        rule = np.array(p.steady_lowered_options(None), dtype=np.float64)
        got = type(p).steady_lowered(np.zeros((1, 1), dtype=np.int64), np.zeros((1, 1), dtype=np.int64), none,
                                     batch, queue, none, sc, np.zeros(0), rule, none,
                                     np.zeros((0, 0), dtype=np.int64), 0,
                                     np.zeros(4, dtype=np.int64), none)
        assert got == (ASK_IR if said is None else ANSWERED), (p.name, said, got)
        if waiting:  # the runtime's Python twin for a pipeline of default answers only (`windows_empty`)
            assert windows_empty(frozenset({int(rule[0])}), batch.size, 4, flagged.size) == (said is not None)


def test_a_lowered_default_answer_still_sees_an_oversized_arrival():
    """A request too long for the model arriving behind FastServe's full, steadily decoding batch is
    rejected at the next step, as the IR rejects it, not left waiting behind steady steps (the
    arrival is unplaced, so mlfq-levels' answer takes the IR; reject-oversized's lowered rule
    would too: `test_lowered_window_rules_answer_as_the_default_answer`)."""
    sched = Scheduler(SchedulerConfig(pipeline="fastserve", num_blocks=200, block_size=4, max_num_seqs=2,
                                      max_num_batched_tokens=64, max_model_len=64, num_cpu_blocks=50))
    for i in range(3):
        sched.add_request(Request(f"r{i}", list(range(1 + 10 * i, 9 + 10 * i)), max_tokens=40, arrival_time=0.0))
    for _ in range(6):
        out = sched.schedule()
        sched.update(out, np.where(out.sampled, 7, -1))
    steady = sched.metrics.steady_steps
    out = sched.schedule()
    sched.update(out, np.where(out.sampled, 7, -1))
    assert sched.metrics.steady_steps == steady + 1  # steady with r2 waiting behind the full batch
    sched.add_request(Request("long", list(range(1, 80)), max_tokens=4, arrival_time=0.0))
    out = sched.schedule()
    assert out.rejected == {"long": "too-long"}
