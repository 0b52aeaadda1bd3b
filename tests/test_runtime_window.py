"""The vllm preset's admission window: a long waiting queue enters the step as its head only,
and the decisions are the same as with the whole queue in the step."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.dialects.req import QueueOp
from schedir.ir.step import steps_of
from schedir.runtime import table as T
from schedir.passes.mlfq_order import MlfqOrder


def run(window: bool, policy: str, seed: int, num_blocks: int) -> list[tuple]:
    cfg = SchedulerConfig(num_blocks=num_blocks, block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
                          max_model_len=256, policy=policy)
    sched = Scheduler(cfg)
    if not window:
        sched.window = 0
    else:
        assert sched.window == 4 + 16
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 1000, 32).tolist()
    n = 400  # far more than the window: most of the queue sits outside every step
    for i in range(n):
        length = int(rng.integers(1, 60))
        tokens = (shared[: int(rng.integers(0, 32))] + rng.integers(0, 1000, length).tolist())[:250]
        if i % 97 == 5:
            tokens = rng.integers(0, 1000, 300).tolist()  # longer than max_model_len: rejected
        sched.add_request(Request(f"r{i:04d}", tokens, max_tokens=int(rng.integers(1, 20)),
                                  priority=int(rng.integers(0, 3)), arrival_time=float(i // 50)))
    decisions = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        decisions.append((tuple(out.req_ids), tuple(out.num_tokens.tolist()), tuple(out.computed.tolist()),
                          tuple(sorted(out.preempted_req_ids)), tuple(sorted(out.rejected.items()))))
        sched.update(out, np.where(out.sampled, 7, -1))
        if window and policy == "fcfs":  # the window is the queue's head: it must stay in queued order
            queued = sched.table.data[T.QUEUED, sched.waiting]
            assert (np.diff(queued) > 0).all(), f"waiting out of queued order after step {len(decisions)}"
        assert len(decisions) < 20000
    assert sched.get_metrics()["finished_requests"] + sched.get_metrics()["rejected_requests"] == n
    return decisions


@pytest.mark.parametrize("num_blocks", [300, 40])  # 40: preemptions and exceeds-cache rejections
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_admission_window_keeps_every_decision(policy, num_blocks):
    windowed = run(True, policy, seed=3, num_blocks=num_blocks)
    whole = run(False, policy, seed=3, num_blocks=num_blocks)
    if num_blocks == 40:
        assert any(step[3] for step in whole) and any(step[4] for step in whole)
    assert len(windowed) == len(whole)
    for step, (a, b) in enumerate(zip(windowed, whole, strict=True)):
        assert a == b, f"step {step + 1} differs"


def test_pipelines_with_another_order_see_the_whole_queue():
    assert Scheduler(SchedulerConfig(pipeline="base")).window == 0


def run_bounded(window: bool, seed: int, depth: int, spy: list[tuple[int, ...]] | None = None) -> list[tuple]:
    """Long shared-prefix prompts chunked over a small budget and a tight pool, so most steps
    can admit nobody: the running requests' prefill chunks spend the budget, or the queue's
    head does not fit in the free blocks (its hits held by running requests counted).
    `depth` steps are in flight before the oldest output comes back (async scheduling if > 1).
    `spy` collects (bound, running) per windowed step, to which this adds how many were admitted."""
    cfg = SchedulerConfig(num_blocks=120, block_size=4, max_num_batched_tokens=48, max_num_seqs=6,
                          max_model_len=400, async_scheduling=depth > 1)
    sched = Scheduler(cfg)
    if not window:
        sched.window = 0
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 1000, 160).tolist() for _ in range(3)]
    n = 150
    for i in range(n):
        base = prefixes[int(rng.integers(0, 3))][: int(rng.integers(0, 160))]
        tokens = (base + rng.integers(0, 1000, int(rng.integers(1, 200))).tolist())[:380]
        sched.add_request(Request(f"r{i:04d}", tokens, max_tokens=int(rng.integers(1, 30)),
                                  arrival_time=float(i // 40)))
    decisions = []
    flight: list = []
    while sched.has_unfinished_requests() or flight:
        seen = len(spy) if spy is not None else 0
        out = sched.schedule()
        if spy is not None and len(spy) > seen:  # the bound this step's window used holds
            admitted = int(np.count_nonzero(out.kind != 0))
            assert admitted <= spy[-1][0], f"step {len(decisions) + 1}: {admitted} admitted, bound {spy[-1][0]}"
            spy[-1] = (spy[-1][0], spy[-1][1], admitted)
        decisions.append((tuple(out.req_ids), tuple(out.num_tokens.tolist()), tuple(out.computed.tolist()),
                          tuple(sorted(out.preempted_req_ids)), tuple(sorted(out.rejected.items()))))
        flight.append(out)
        while flight and (len(flight) >= depth or not sched.has_unfinished_requests()):
            done = flight.pop(0)
            sched.update(done, np.where(done.sampled, 7, -1))
        assert len(decisions) < 20000
    assert sched.get_metrics()["finished_requests"] + sched.get_metrics()["rejected_requests"] == n
    return decisions


@pytest.mark.parametrize("depth", [1, 2])
def test_window_bounded_by_budget_and_blocks_keeps_every_decision(monkeypatch, depth):
    """The vllm preset's window shrinks to the requests a step can admit (see
    `admissible_bound`): none while the running prefills spend the budget or the queue's head
    cannot fit, with the same decisions as the whole queue."""
    import schedir.runtime.scheduler as S

    bounds: list[tuple[int, ...]] = []
    real = S.admissible_bound

    def spy(data, running, *rest):  # type: ignore[no-untyped-def]
        bound = real(data, running, *rest)
        bounds.append((bound, running.size))
        return bound

    monkeypatch.setattr(S, "admissible_bound", spy)
    windowed = run_bounded(True, seed=5, depth=depth, spy=bounds)
    monkeypatch.setattr(S, "admissible_bound", real)
    whole = run_bounded(False, seed=5, depth=depth)
    assert any(step[3] for step in whole), "the case should preempt"
    nobody = sum(1 for b, r, *_ in bounds if b == 0 and r < 6)
    assert nobody > len(bounds) // 4, f"the bound should rule out admission often ({nobody} of {len(bounds)})"
    tight = sum(1 for b, _, *admitted in bounds if admitted and 0 < b == admitted[0])
    assert tight, "some step should admit exactly as many as the bound allows"
    assert len(windowed) == len(whole)
    for step, (a, b) in enumerate(zip(windowed, whole, strict=True)):
        assert a == b, f"step {step + 1} differs"


def test_window_counts_hits_a_running_prefill_registers_this_step():
    """The queue's head may fit only thanks to prefix blocks a running request registers in
    this very step (its last prefill chunk): the block bound counts those as hits, so the head
    still enters the step and is admitted, as with the whole queue."""
    def steps(window: bool) -> list[tuple]:
        cfg = SchedulerConfig(num_blocks=25, block_size=4, max_num_batched_tokens=50, max_num_seqs=4,
                              max_model_len=200)
        sched = Scheduler(cfg)
        if not window:
            sched.window = 0
        shared = list(range(1, 57))  # 14 blocks
        sched.add_request(Request("a", shared, max_tokens=2))  # step 1: 50 tokens (13 blocks), step 2: 6
        sched.add_request(Request("h", shared + list(range(1000, 1040)), max_tokens=1))  # 24 blocks, 14 shared
        for i in range(30):  # a queue longer than the window behind h
            sched.add_request(Request(f"f{i:02d}", list(range(2000 + 8 * i, 2008 + 8 * i)), max_tokens=1))
        out = []
        for _ in range(3):
            step = sched.schedule()
            out.append((tuple(step.req_ids), tuple(step.num_tokens.tolist())))
            sched.update(step, np.where(step.sampled, 7, -1))
        return out

    windowed = steps(True)
    # step 2: 11 blocks free before a's chunk takes one; h needs 24 minus the 14 a holds by then
    assert windowed[1] == (("a", "h"), (6, 40))
    assert windowed == steps(False)


def test_window_walks_the_budget_with_hits_registered_ahead(monkeypatch):
    """The budget bound walks the queue with each request's fewest tokens: h2's prefix is
    registered by h1 when h1 is admitted in the same step, so h2 takes 12 tokens, not 32,
    and h3 and h4 still fit in the budget (50 = 20 + 12 + 16 + 2). The bound is exact here."""
    import schedir.runtime.scheduler as S

    bounds: list[int] = []
    real = S.admissible_bound

    def spy(*args):  # type: ignore[no-untyped-def]
        bounds.append(real(*args))
        return bounds[-1]

    def first_step(window: bool) -> tuple:
        sched = Scheduler(SchedulerConfig(num_blocks=200, block_size=4, max_num_batched_tokens=50, max_num_seqs=8,
                                          max_model_len=200))
        if not window:
            sched.window = 0
        shared = list(range(1, 21))
        sched.add_request(Request("h1", shared, max_tokens=1))
        sched.add_request(Request("h2", shared + list(range(500, 512)), max_tokens=1))
        sched.add_request(Request("h3", list(range(600, 616)), max_tokens=1))
        sched.add_request(Request("h4", list(range(700, 708)), max_tokens=1))
        for i in range(30):
            sched.add_request(Request(f"f{i:02d}", list(range(1000 + 4 * i, 1004 + 4 * i)), max_tokens=1))
        out = sched.schedule()
        return tuple(out.req_ids), tuple(out.num_tokens.tolist()), tuple(out.computed.tolist())

    monkeypatch.setattr(S, "admissible_bound", spy)
    windowed = first_step(True)
    assert bounds == [4]
    assert windowed == (("h1", "h2", "h3", "h4"), (20, 12, 16, 2), (0, 20, 0, 0))
    monkeypatch.setattr(S, "admissible_bound", real)
    assert windowed == first_step(False)


def test_only_the_vllm_preset_bounds_the_window_by_seats_budget_and_blocks():
    """Another pipeline with vLLM's order may admit into the seats of requests it preempts
    in the same step (vLLM v0's chunked prefill does): its window stays max_num_seqs + 16."""
    from schedir.runtime.window import admissible_bound

    sched = Scheduler(SchedulerConfig(num_blocks=200, block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
                                      max_model_len=256))
    for i in range(3):
        sched.add_request(Request(f"r{i}", list(range(10 * i, 10 * i + 8)), max_tokens=4))
    sched.update(out := sched.schedule(), np.where(out.sampled, 7, -1))
    assert sched.running.size == 3 and sched._vllm_rules()
    pool = sched.pool

    def bound(vllm_rules: bool) -> int:
        return admissible_bound(sched.table.data, sched.running, sched.waiting, sched._oversized, 4, 64, 256,
                                vllm_rules, pool.num_free, True, pool.rhash, pool.nhash, pool.nblk, pool.ncached,
                                pool.cache, 4)

    assert bound(True) == 1  # one free seat
    assert bound(False) == 4
    assert not Scheduler(SchedulerConfig(pipeline="sarathi"))._vllm_rules()
    assert not Scheduler(SchedulerConfig(long_prefill_token_threshold=32))._vllm_rules()


def run_declared(window: bool, pipeline: str, policy: str, seed: int, num_blocks: int,
                 metrics: dict | None = None) -> tuple[list[tuple], int]:
    """A pipeline whose passes declare a waiting window (`StepPass.waiting_window`), over arrivals
    far more than max_num_seqs serves (shared prefixes, four tenants, tight TTFT targets, a few
    prompts no pool could hold, preemptions or retractions when the pool is small), with or
    without the window: every step's output and every piece of state must agree. `metrics`,
    when given, gets the run's ranked steps and array steps."""
    whole_prompts = pipeline in ("orca", "vllm-v0", "vllm-v0-swap", "vllm-v0-priority")  # budgets hold max_model_len
    v0 = pipeline.startswith("vllm-v0")
    cfg = SchedulerConfig(num_blocks=num_blocks, block_size=4, max_num_batched_tokens=256 if whole_prompts else 64,
                          max_num_seqs=4, max_model_len=256, pipeline=pipeline, policy=policy,
                          enable_prefix_caching=not v0,
                          num_cpu_blocks=40 if pipeline in ("vllm-v0-swap", "fastserve") else 0)
    now = [0.0]
    sched = Scheduler(cfg, clock=lambda: now[0])
    assert sched._declared_window
    sched._steady_pipeline = False  # every step through the window (steady steps skip it: test_runtime_steady)
    if not window:
        sched._declared_window = False
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 1000, 48).tolist()
    n = 160
    decisions = []
    windowed_steps = 0
    arrived = 0
    while arrived < n or sched.has_unfinished_requests():
        for _ in range(min(int(rng.integers(0, 6)), n - arrived)):  # arrivals between steps
            length = int(rng.integers(1, 60))
            tokens = (shared[: int(rng.integers(0, 48))] + rng.integers(0, 1000, length).tolist())[:250]
            if arrived % 37 == 5:
                tokens = rng.integers(0, 1000, 300).tolist()  # longer than max_model_len: rejected
            state = {}
            if "vtc" in pipeline:
                state = {"tenant": int(rng.integers(0, 4))}
            elif "slo" in pipeline:
                state = {"ttft_slo_ms": int(rng.integers(5, 200))}
            sched.add_request(Request(f"r{arrived:04d}", tokens, max_tokens=int(rng.integers(1, 40)),
                                      arrival_time=now[0], state=state, priority=int(rng.integers(0, 3))))
            arrived += 1
        original = sched._waiting_window
        sizes: list[tuple[int, int]] = []

        def spy(w: np.ndarray, *rest: bool) -> np.ndarray:
            kept = original(w, *rest)
            sizes.append((w.size, kept.size))
            return kept

        sched._waiting_window = spy  # type: ignore[method-assign]
        out = sched.schedule()
        sched._waiting_window = original  # type: ignore[method-assign]
        windowed_steps += any(kept < size for size, kept in sizes)  # the window left somebody out
        state = tuple(sorted((k, np.asarray(v, dtype=np.float64).tobytes()) for k, v in sched.scheduler_state.items()))
        rows = np.sort(np.concatenate([sched.running, sched.waiting]))
        table_state = sched.table.state[:, rows].tobytes()
        decisions.append((tuple(out.req_ids), tuple(out.num_tokens.tolist()), tuple(out.computed.tolist()),
                          tuple(sorted(out.preempted_req_ids | out.swapped_out_req_ids)),
                          tuple(sorted(out.rejected.items())), state, table_state,
                          out.blocks_to_swap_out.tobytes(), out.blocks_to_swap_in.tobytes()))
        sched.update(out, np.where(out.sampled, 7, -1))
        now[0] += 0.01
        assert len(decisions) < 20000
    done = sched.get_metrics()
    assert done["finished_requests"] + done["rejected_requests"] == n
    if metrics is not None:
        metrics.update(ranked=sched.metrics.ranked_steps, rebuilt=sched.metrics.ranked_rebuilt,
                       arrays=sched.metrics.array_steps)
    return decisions, windowed_steps


# FastServe with recompute (no swapped queue) and a quick starvation clock: promotions in the queue
FASTSERVE_RECOMPUTE = ("reject-oversized,mlfq-levels{quantum=2 starve-steps=30},mlfq-order,schedule-running,"
                       "admit-greedy,mlfq-account,verify-step")


@pytest.mark.parametrize("num_blocks", [400, 50])  # 50: preemptions / retractions
@pytest.mark.parametrize("pipeline,policy", [("sglang", "lpm"), ("sglang", "fcfs"), ("sglang-mixed", "lpm"),
                                             ("sglang-mixed", "fcfs"), ("vtc", "fcfs"), ("slo-aware", "fcfs"),
                                             ("slo-aware-reject", "fcfs"), ("base", "fcfs"),
                                             ("base-priority", "priority"), ("orca", "fcfs"),
                                             ("with-prefix-aware", "fcfs"), ("with-all-passes", "fcfs"),
                                             ("vllm-v0", "fcfs"), ("vllm-v0-priority", "priority"),
                                             ("vllm-v0-swap", "fcfs"), ("vllm-v0-chunked", "fcfs"),
                                             ("fastserve", "fcfs"),
                                             (FASTSERVE_RECOMPUTE, "fcfs")])
def test_declared_window_keeps_every_decision_and_state(pipeline, policy, num_blocks):
    windowed, steps = run_declared(True, pipeline, policy, seed=4, num_blocks=num_blocks)
    whole, _ = run_declared(False, pipeline, policy, seed=4, num_blocks=num_blocks)
    # slo-aware-reject judges every waiting request every step (no window); Orca's reservations in a
    # tight pool keep sequence slots free (its window needs them all taken)
    if pipeline != "slo-aware-reject" and not (pipeline == "orca" and num_blocks == 50):
        assert steps > 20  # the window left requests out behind a full batch
    if num_blocks == 50 and pipeline != "orca":  # Orca reserves each request's whole KV: it never preempts
        assert any(step[3] for step in whole)  # preemptions or retractions happened
    if pipeline != "vllm-v0-chunked":  # (which compares the chunk, cut to the budget, with max_model_len)
        assert any(step[4] for step in whole)  # so did rejections
    assert len(windowed) == len(whole)
    for step, (a, b) in enumerate(zip(windowed, whole, strict=True)):
        assert a == b, f"step {step + 1} differs"


@pytest.mark.parametrize("pipeline,policy", [("base", "fcfs"), ("base-priority", "priority"),
                                             ("with-prefix-aware", "fcfs")])
def test_fcfs_and_priority_orders_give_admission_a_ranked_window(pipeline, policy):
    """order-fcfs, order-priority and prefix-cache-aware (hit blocks, then arrival, from the hits
    the step will match) declare the key they sort by (`waiting_rank`), so the seed's
    admission (admit-greedy, a ranked walker) is built over the head of that order under a long
    queue and checked after the step, as FastServe's: the same decisions as the whole queue."""
    metrics: dict = {}
    windowed, _ = run_declared(True, pipeline, policy, seed=6, num_blocks=400, metrics=metrics)
    whole, _ = run_declared(False, pipeline, policy, seed=6, num_blocks=400)
    assert metrics["ranked"] > 50 and metrics["arrays"] > 200
    assert windowed == whole


@pytest.mark.parametrize("orders", ["order-fcfs,batching-efficiency", "batching-efficiency,order-priority",
                                    "prefix-cache-aware,order-priority",
                                    "prefix-cache-aware,batching-efficiency,order-priority"])
def test_several_orders_compose_their_ranks(orders):
    """Several order passes sort the step's order stably one after the other: the last one's key
    ranks first and each earlier one breaks the ties left (equal priority and arrival, as several
    requests arriving between two steps have; batching-efficiency's groups led by their oldest
    member). Their declared columns (`StepPass.rank_columns`) compose into one rank, so the seed's
    admission is built over its head (with each length group's oldest member), and decides as
    over the whole queue. A keyed order's own key alone would not: with order-priority's key after
    batching-efficiency the steps decided otherwise (stop 38)."""
    spec = f"reject-oversized,{orders},schedule-running,admit-greedy,verify-step"
    metrics: dict = {}
    windowed, steps = run_declared(True, spec, "fcfs", seed=6, num_blocks=400, metrics=metrics)
    assert metrics["ranked"] > 50 and steps > 50
    assert windowed == run_declared(False, spec, "fcfs", seed=6, num_blocks=400)[0]


def test_memory_aware_preemption_names_the_head_it_preempts_for(monkeypatch):
    """with-all-passes under a long queue: memory-aware-preemption asks nobody while no running
    request is less urgent than the most urgent waiting one, else the ranked head when that head
    already needs more blocks than are free (the request it preempts for is in it), else the whole
    queue; every answer decides as the whole queue (a small pool: preemptions)."""
    from schedir.passes.memory_aware_preemption import MemoryAwarePreemption

    answers: list[str] = []
    asked = MemoryAwarePreemption.waiting_window

    def spy(self, ctx):  # noqa: ANN001, ANN202
        at = asked(self, ctx)
        answers.append("all" if at is None else "nobody" if not at.size else "head")
        return at

    monkeypatch.setattr(MemoryAwarePreemption, "waiting_window", spy)
    metrics: dict = {}
    windowed, _ = run_declared(True, "with-all-passes", "fcfs", seed=6, num_blocks=50, metrics=metrics)
    assert {"nobody", "head"} <= set(answers) and metrics["ranked"] > 20
    whole, _ = run_declared(False, "with-all-passes", "fcfs", seed=6, num_blocks=50)
    assert any(step[3] for step in whole)  # it preempted
    assert windowed == whole


def test_an_order_of_no_columns_ends_the_rank():
    """An order pass after another that declares no rank columns (order-slo: its key reads each
    request's deadline against the clock) leaves no rank: no ranked window, the whole queue."""
    spec = "reject-oversized,order-priority,order-slo,schedule-running,admit-greedy,verify-step"
    metrics: dict = {}
    windowed, _ = run_declared(True, spec, "fcfs", seed=6, num_blocks=400, metrics=metrics)
    assert metrics["ranked"] == 0
    assert windowed == run_declared(False, spec, "fcfs", seed=6, num_blocks=400)[0]


def test_a_window_only_where_every_pass_declares_one():
    """The declared window (`StepPass.waiting_window`) applies when every pass of the pipeline
    declares what it needs; a pass that does not (or one reading other queues) sees everything."""
    from schedir.ir.window import WindowContext
    from schedir.passes.sglang_decode import SglangDecode

    assert Scheduler(SchedulerConfig(pipeline="sglang", block_size=1, num_blocks=257))._declared_window
    assert not Scheduler(SchedulerConfig(pipeline="vllm"))._declared_window  # its own window (above)
    assert Scheduler(SchedulerConfig(pipeline="base"))._declared_window
    assert Scheduler(SchedulerConfig(pipeline="with-all-passes"))._declared_window  # a composed rank
    assert Scheduler(SchedulerConfig(pipeline="fastserve", num_cpu_blocks=8))._declared_window  # a ranked window
    zeros = lambda name, rows: np.zeros(rows.size, dtype=np.int64)  # noqa: E731
    ctx = WindowContext(running=np.array([1, 2]), waiting=np.array([3, 4]), max_seqs=2, free_blocks=0,
                        total_blocks=8, token_budget=64,
                        block_size=4, max_model_len=64, oversized=WindowContext.NONE, scheduler_state={},
                        request_state=zeros, column=zeros)
    assert SglangDecode().waiting_window(ctx).tolist() == []
    assert SglangDecode(waiting="running").waiting_window(ctx) is None
    assert ctx.seats_stay_taken()  # two running, two seats, nothing more to hold
    full = attrs.evolve(ctx, column=lambda name, rows: np.full(rows.size, 9 if name == "total" else 0),
                        memo={})
    assert not full.seats_stay_taken()  # 9 known tokens each need 3 blocks, none are free


@pytest.mark.parametrize("pipeline", ["sglang", "vtc", "slo-aware", "base", "base-priority", "orca",
                                      "with-prefix-aware", "vllm-v0", "vllm"])
def test_a_full_batch_keeps_a_long_queue_out_of_the_step(pipeline):
    """Behind a full running batch the step carries a handful of waiting requests, not the
    queue: its size (and cost) follows the policy, not the load."""
    v0 = pipeline.startswith("vllm-v0")
    cfg = SchedulerConfig(num_blocks=400, block_size=4, max_num_batched_tokens=256, max_num_seqs=4,
                          max_model_len=256, pipeline=pipeline, enable_prefix_caching=not v0,
                          policy="priority" if pipeline == "base-priority" else "fcfs")
    sched = Scheduler(cfg, clock=lambda: 0.0)
    for i in range(504):
        sched.add_request(Request(f"r{i:03d}", list(range(i, i + 8)), max_tokens=200, arrival_time=0.0,
                                  state={"tenant": i % 4} if pipeline == "vtc" else {}))
    for _ in range(3):  # the first four prefill, then decode
        out = sched.schedule()
        sched.update(out, np.where(out.sampled, 7, -1))
    sched.keep_ir = True
    out = sched.schedule()
    assert sched.running.size == 4 and sched.waiting.size == 500
    step = steps_of(sched.last_module)[0]
    waiting = next(op for op in step.body.block.ops if isinstance(op, QueueOp) and op.queue.data == "waiting")
    assert len(waiting) <= 4, f"{len(waiting)} waiting requests in the step"
    assert len(out.req_ids) == 4  # the batch decodes


def _spied_scheduler(cfg: SchedulerConfig, ranked: bool, arrays: bool,
                     swapped_sizes: list[tuple[int, int]] | None = None) -> tuple[Scheduler, list[int]]:
    """A scheduler whose IR steps (built or decided over arrays) record the waiting requests they
    carry into the returned list (`swapped_sizes`: the swapped queue's and the step's swapped
    requests, per step over a ranked window); `ranked` false: no declared windows; `arrays`
    false: every IR step builds its IR."""
    sched = Scheduler(cfg, clock=lambda: 0.0)
    sched._arrays_allowed = arrays
    if not ranked:
        sched._declared_window = False
    built: list[int] = []

    def spy(real):  # type: ignore[no-untyped-def]
        def step_over(step, waiting, *rest):  # type: ignore[no-untyped-def]
            built.append(waiting.size)
            if swapped_sizes is not None and sched._ranked_prefix is not None:
                swapped_sizes.append((sched.swapped.size, sched._ranked_prefix[3].size))
            return real(step, waiting, *rest)
        return step_over

    sched._build_and_run = spy(sched._build_and_run)  # type: ignore[method-assign]
    sched._decide_arrays = spy(sched._decide_arrays)  # type: ignore[method-assign]
    return sched, built


def _fastserve_overload(ranked: bool, num_blocks: int, seed: int = 9, num_cpu_blocks: int = 60,
                        swapped_sizes: list[tuple[int, int]] | None = None,
                        arrays: bool = True) -> tuple[list[tuple], Scheduler, list[int]]:
    """FastServe behind 4 seats with ~300 waiting (mixed prompt lengths: several skip-join levels,
    demotions and swaps); returns the decisions, the scheduler and the waiting queue's length in
    each IR step built or decided over arrays (`swapped_sizes`: the swapped queue's and the step's
    swapped requests, per step over a ranked window). `arrays` false: every IR step builds its IR."""
    cfg = SchedulerConfig(num_blocks=num_blocks, block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
                          max_model_len=256, pipeline="fastserve", num_cpu_blocks=num_cpu_blocks)
    sched, built = _spied_scheduler(cfg, ranked, arrays, swapped_sizes)
    rng = np.random.default_rng(seed)
    decisions = []
    for i in range(300):
        sched.add_request(Request(f"r{i:03d}", rng.integers(0, 1000, int(rng.integers(1, 120))).tolist(),
                                  max_tokens=int(rng.integers(1, 60))))
    while sched.has_unfinished_requests():
        out = sched.schedule()
        decisions.append((tuple(out.req_ids), tuple(out.num_tokens.tolist()), tuple(out.computed.tolist()),
                          tuple(sorted(out.preempted_req_ids | out.swapped_out_req_ids)),
                          out.blocks_to_swap_out.tobytes(), out.blocks_to_swap_in.tobytes(),
                          sched.table.state[:, np.sort(np.concatenate([sched.running, sched.waiting,
                                                                       sched.swapped]))].tobytes()))
        sched.update(out, np.where(out.sampled, 7, -1))
        assert len(decisions) < 50000
    return decisions, sched, built


@pytest.mark.parametrize("num_blocks", [600, 60])  # 60: admission misfits, so some windows do not hold
def test_fastserve_ir_steps_carry_the_head_of_its_order(num_blocks):
    """FastServe's IR steps under a long queue are built over a ranked window: the head of
    mlfq-order's (level, arrival) order and the jobs mlfq-levels moves, checked after the step
    (admission out of seats or tokens within the head; swapped jobs ranked past it not reached)
    and built again over the whole queue where that fails (then not tried for a while: a pool too
    tight for the head to fill the seats stays so). Decisions, swaps and request state equal the
    whole queue's at every step."""
    windowed, sched, built = _fastserve_overload(True, num_blocks)  # (its IR steps over arrays)
    whole, _, whole_built = _fastserve_overload(False, num_blocks, arrays=False)
    assert sched.metrics.array_steps > 0.9 * len(built)
    metrics = sched.metrics
    assert metrics.ranked_steps > 20
    assert max(whole_built) > 250  # the whole queue entered the IR there
    held = metrics.ranked_steps - metrics.ranked_rebuilt
    assert held > 10
    if num_blocks == 600:
        assert sorted(built)[len(built) // 2] <= 4 + 16 + 8  # the median IR step: the head and a few moved jobs
    else:  # the fallback ran, and backing off after it keeps steps built twice rare
        assert 0 < metrics.ranked_rebuilt < 0.2 * len(built)
    assert len(windowed) == len(whole)
    for step, (a, b) in enumerate(zip(windowed, whole, strict=True)):
        assert a == b, f"step {step + 1} differs"


@pytest.mark.parametrize("num_blocks", [600, 60])
def test_fastserve_ir_steps_carry_the_head_of_a_long_swapped_queue(num_blocks):
    """With a host tier large enough that ~150 jobs wait swapped out, FastServe's ranked IR steps
    carry the head of the swapped queue too (the first max_num_seqs + 16 by rank, and the jobs
    mlfq-levels moves, `StepPass.swapped_window`): swap-in resumes a job only into a free seat,
    so its walk stops within that head. Decisions, swaps and every job's state (the swapped ones'
    levels included) equal the whole queues' at every step."""
    sizes: list[tuple[int, int]] = []
    windowed, sched, _ = _fastserve_overload(True, num_blocks, num_cpu_blocks=4000, swapped_sizes=sizes)
    whole, _, _ = _fastserve_overload(False, num_blocks, num_cpu_blocks=4000, arrays=False)
    long = [(queue, in_step) for queue, in_step in sizes if queue > 4 + 16]
    assert len(long) > 100 and max(queue for queue, _ in long) > 100  # the swapped queue grew long
    assert all(in_step < queue for queue, in_step in long)  # ... and the steps held its head only
    assert sorted(in_step for _, in_step in long)[len(long) // 2] <= 4 + 16 + 4
    assert len(windowed) == len(whole)
    for step, (a, b) in enumerate(zip(windowed, whole, strict=True)):
        assert a == b, f"step {step + 1} differs"


@pytest.mark.parametrize("arrays", [False, True], ids=["ir", "arrays"])
@pytest.mark.parametrize("mutation", ["no exhaustion check", "no swapped check"])
def test_a_ranked_window_needs_both_checks(mutation, arrays, monkeypatch):
    """Without either half of `_ranked_window_held` (admission out of seats or tokens within the
    head; swapped jobs ranked past a left-out job not reached), or of its array-step twin
    `_ranked_arrays_held`, a tight pool's steps decide otherwise than over the whole queue."""
    name = "_ranked_arrays_held" if arrays else "_ranked_window_held"
    real = getattr(Scheduler, name)

    def mutated(self, *args):  # type: ignore[no-untyped-def]
        head, beyond, behind, _ = self._ranked_prefix
        if mutation == "no swapped check":
            self._ranked_prefix = (head, beyond, behind[:0], self._ranked_prefix[3])
            return real(self, *args)
        if arrays:
            scheduled = args[0].scheduled_rows()
        else:
            from schedir.ir.step import Step
            scheduled = Step(steps_of(args[0])[0]).usage().scheduled_ids
        return not np.isin(scheduled, beyond).any()

    monkeypatch.setattr(Scheduler, name, mutated)
    windowed, _, _ = _fastserve_overload(True, 60, arrays=arrays)
    monkeypatch.setattr(Scheduler, name, real)
    whole, _, _ = _fastserve_overload(False, 60, arrays=False)
    assert windowed != whole


def _admission_steps_in_step(pipeline: str) -> list[tuple[int, int, int]]:
    """(free seats, waiting requests in the step, waiting in the queue) of each step of a long
    queue (504 requests, max_num_seqs 4, four tenants, short outputs) that had a seat free."""
    cfg = SchedulerConfig(num_blocks=400, block_size=4, max_num_batched_tokens=256, max_num_seqs=4,
                          max_model_len=256, pipeline=pipeline,
                          enable_prefix_caching=not pipeline.startswith("vllm-v0"))
    sched = Scheduler(cfg, clock=lambda: 0.0)
    for i in range(504):
        sched.add_request(Request(f"r{i:03d}", list(range(i, i + 8)), max_tokens=2 + i % 5, arrival_time=0.0,
                                  state={"tenant": i % 4} if pipeline == "vtc" else {}))
    sched.keep_ir = True
    seen = []
    for _ in range(40):
        free = cfg.max_num_seqs - sched.running.size
        queued = sched.waiting.size
        out = sched.schedule()
        step = steps_of(sched.last_module)[0]
        waiting = next(op for op in step.body.block.ops if isinstance(op, QueueOp) and op.queue.data == "waiting")
        if free > 0:
            seen.append((free, len(waiting), queued))
        sched.update(out, np.where(out.sampled, 7, -1))
    return seen


@pytest.mark.parametrize("pipeline", ["vtc", "slo-aware", "vllm-v0", "vllm-v0-chunked", "sglang", "sglang-mixed"])
def test_admission_over_a_ranked_order_takes_the_head_it_can_reach(pipeline):
    """vtc-order, order-slo and order-vllm (FCFS) rank the queue (`waiting_rank`), so vllm-admit
    and v0's prefill loops name the head they can reach (free seats + 1) as their window: a step
    that admits carries that head (and one request per tenant for VTC's counter lift), not the
    queue. The decisions are the whole queue's (test_declared_window_keeps_every_decision_and_state,
    test_admission_heads_decide_as_the_whole_queue)."""
    seen = _admission_steps_in_step(pipeline)[1:]  # (the first places all 504 in SGLang's list)
    assert len(seen) > 5 and all(queued > 400 for _, _, queued in seen)
    if pipeline.startswith("sglang"):
        # a seat more where the chunked request runs; every 32nd ordering touches the list's
        # first 128 (`_touch_waiting_prefixes`), so those steps carry them
        over = [(free, in_step) for free, in_step, _ in seen if in_step > free + 2]
        assert len(over) <= len(seen) // 8 and all(n <= 128 + free + 2 for free, n in over), over
        return
    extra = 4 if pipeline == "vtc" else 0  # one per tenant
    for free, in_step, _ in seen:
        assert in_step <= free + 1 + extra, (free, in_step)


def _long_queue_run(pipeline: str, window: bool, policy: str = "fcfs",
                    sizes: list[tuple[int, int]] | None = None, in_arrival_order: bool = False) -> list[tuple]:
    """Every step's decisions for 600 requests queued at once behind max_num_seqs 8 (short
    outputs, so several seats free in one step; four tenants; TTFT targets some can meet),
    with the declared window or over the whole queue. Under `lpm` the prompts share prefixes
    (five families), so the longest-prefix order moves requests once fewer than 128 wait.
    `sizes` gets each step's (waiting, in the step). `in_arrival_order`: the requests arrive in
    the order they are added (else each at a random instant in the first 0.5 s)."""
    cfg = SchedulerConfig(num_blocks=400, block_size=4, max_num_batched_tokens=96, max_num_seqs=8,
                          max_model_len=256, pipeline=pipeline, policy=policy,
                          enable_prefix_caching=not pipeline.startswith("vllm-v0"))
    now = [0.0]
    sched = Scheduler(cfg, clock=lambda: now[0])
    sched._steady_pipeline = False
    sched._declared_window = window
    if sizes is not None:
        original = sched._waiting_window

        def spy(w: np.ndarray, *rest: bool) -> np.ndarray:
            kept = original(w, *rest)
            sizes.append((w.size, kept.size))
            return kept

        sched._waiting_window = spy  # type: ignore[method-assign]
    rng = np.random.default_rng(11)
    families = rng.integers(0, 1000, (5, 24)).tolist()
    for i in range(600):
        own = rng.integers(0, 1000, int(rng.integers(2, 30))).tolist()
        if policy == "lpm":
            own = families[i % 5][: int(rng.integers(0, 25))] + own
        sched.add_request(Request(f"r{i:03d}", own,
                                  max_tokens=int(rng.integers(1, 5)),
                                  arrival_time=i * 1e-3 if in_arrival_order else float(rng.uniform(0, 0.5)),
                                  state={"tenant": int(rng.integers(0, 4)), "ttft_slo_ms": int(rng.integers(50, 4000))}
                                  if pipeline == "vtc" else {"ttft_slo_ms": int(rng.integers(50, 4000))}))
    decisions = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        decisions.append((tuple(out.req_ids), tuple(out.num_tokens.tolist()),
                          tuple(np.asarray(v).tobytes() for v in sched.scheduler_state.values())))
        sched.update(out, np.where(out.sampled, 7, -1))
        now[0] += 0.02
        assert len(decisions) < 5000
    return decisions


@pytest.mark.parametrize("pipeline", ["vtc", "slo-aware", "vllm-v0", "vllm-v0-chunked", "sglang", "sglang-mixed"])
def test_admission_heads_decide_as_the_whole_queue(pipeline):
    """Several seats free at once over a 600-request queue: the steps built over vllm-admit's head
    of the ranked order decide as the whole queue does, step for step."""
    assert _long_queue_run(pipeline, True) == _long_queue_run(pipeline, False)


@pytest.mark.parametrize("pipeline", ["sglang", "sglang-mixed"])
def test_sglang_lpm_over_128_waiting_takes_the_fcfs_head(pipeline):
    """SGLang's `lpm` is FCFS while more than 128 requests wait (`_determine_active_policy`), so
    above that the steps hold the head of the list, not the list, and count it from their
    `waiting_count` fact; below it a step that admits holds the whole list. Step for step as the whole
    queue decides, across the change: a step over the head that counted only itself would sort
    it by prefix and renumber it (the state compared here)."""
    sizes: list[tuple[int, int]] = []
    assert _long_queue_run(pipeline, True, "lpm", sizes) == _long_queue_run(pipeline, False, "lpm")
    over = [(queued, held) for queued, held in sizes if queued > 140]
    assert len(over) > 20 and sum(held < queued for queued, held in over) > len(over) // 2
    assert any(held == queued for queued, held in sizes if queued <= 128)


def test_sglang_lpm_head_needs_the_waiting_count(monkeypatch):
    """With the `waiting_count` fact hidden from sglang-order (a step over the head counting only
    what it holds), the steps decide otherwise than over the whole queue: the test above can fail."""
    from schedir.ir.step import Step

    real = Step.facts.fget  # type: ignore[attr-defined]
    monkeypatch.setattr(Step, "facts", property(lambda self: attrs.evolve(real(self), waiting_count=-1)))
    assert _long_queue_run("sglang", True, "lpm") != _long_queue_run("sglang", False, "lpm")


@pytest.mark.parametrize("mutation", ["a seat short", "arrival order"])
def test_vllm_admit_window_needs_its_reach_and_the_rank(mutation, monkeypatch):
    """Without vllm-admit's full reach (its head two requests short) or with VTC's rank replaced
    by arrival order, the steps decide otherwise than over the whole queue: the equality test
    above can fail."""
    from schedir.passes.vllm_admit import VllmAdmit
    from schedir.passes.vtc_order import VtcOrder

    if mutation == "a seat short":
        real = VllmAdmit.waiting_window

        def short(self, ctx):  # type: ignore[no-untyped-def]
            at = real(self, ctx)
            if at is None or ctx.rank is None or not at.size:
                return at
            return ctx.first_by_rank(ctx.rank[0], max(at.size - 2, 0))

        monkeypatch.setattr(VllmAdmit, "waiting_window", short)
    else:
        monkeypatch.setattr(VtcOrder, "waiting_rank", lambda self, ctx: (
            ctx.column_of("arrival")[ctx.waiting], np.zeros(ctx.swapped.size, dtype=np.int64)))
    windowed = _long_queue_run("vtc", True)
    monkeypatch.undo()
    assert windowed != _long_queue_run("vtc", False)


def test_vtc_partial_rank_decides_as_the_whole_queue(monkeypatch):
    """With the queue in arrival order vtc-order places only the head of its pick order (a
    partial rank, `vtc_head_keys`): the steps decide as over the whole queue, step for step, and
    placing that head in queue order instead makes them differ (the test can fail)."""
    from schedir.ir.window import WindowContext
    from schedir.passes import vtc_order

    partial = [0]
    real = WindowContext.partial_rank

    def counted(self, keys, placed):  # type: ignore[no-untyped-def]
        partial[0] += 1
        return real(self, keys, placed)

    monkeypatch.setattr(WindowContext, "partial_rank", counted)
    windowed = _long_queue_run("vtc", True, in_arrival_order=True)
    assert partial[0] > 20
    assert windowed == _long_queue_run("vtc", False, in_arrival_order=True)
    real_keys = vtc_order.vtc_head_keys

    def queue_order(*args):  # type: ignore[no-untyped-def]
        outcome, keys, placed = real_keys(*args)
        head = keys < placed
        keys[head] = np.argsort(np.argsort(np.flatnonzero(head)))  # the placed ones in queue order
        return outcome, keys, placed

    monkeypatch.setattr(vtc_order, "vtc_head_keys", queue_order)
    assert _long_queue_run("vtc", True, in_arrival_order=True) != windowed


def test_the_step_reads_the_clock_once():
    """A pipeline that reads the clock (order-slo) sees one instant per step: its window (the
    rank it computes from now) and its IR step agree even on a wall clock that moves."""
    calls = [0]

    def clock() -> float:
        calls[0] += 1
        return calls[0] * 1e-3

    sched = Scheduler(SchedulerConfig(num_blocks=400, block_size=4, max_num_batched_tokens=256, max_num_seqs=4,
                                      max_model_len=256, pipeline="slo-aware"), clock=clock)
    for i in range(400):
        sched.add_request(Request(f"r{i:03d}", list(range(i, i + 8)), max_tokens=2 + i % 5))
    for _ in range(30):
        before = calls[0]
        out = sched.schedule()
        assert calls[0] - before <= 1
        sched.update(out, np.where(out.sampled, 7, -1))


def test_rank_heads_match_a_stable_sort():
    """`rank_head` (a heap for a short head, a partition for a long one) and `first_by_rank`
    give a stable sort's first k, ties by position, negative and huge keys included."""
    from schedir.ir.window import first_by_rank, rank_head

    rng = np.random.default_rng(5)
    for case in range(600):
        n = int(rng.integers(0, 400))
        k = int(rng.integers(1, 300))
        high = [3, 1000, 1 << 61][case % 3]
        keys = rng.integers(-2 if case % 5 == 0 else 0, high, n).astype(np.int64)
        expected = np.argsort(keys, kind="stable")[:k]
        assert rank_head(keys, k).tolist() == expected.tolist()
        assert first_by_rank(keys, k).tolist() == np.sort(expected).tolist()


def _fastserve_displacing(ranked: bool, arrays: bool = True) -> tuple[list[tuple], Scheduler, list[int]]:
    """FastServe with 16 seats and 400 short jobs queued at once (all skip-join to the top level):
    running jobs are demoted past their quantum and the queue's new jobs displace several of them
    a step, by swap while the host tier has room, then by recompute; returns the decisions, the
    scheduler and the waiting requests in each step decided over arrays or built."""
    cfg = SchedulerConfig(num_blocks=400, block_size=4, max_num_batched_tokens=256, max_num_seqs=16,
                          max_model_len=256, pipeline="fastserve", num_cpu_blocks=120)
    sched, built = _spied_scheduler(cfg, ranked, arrays)
    rng = np.random.default_rng(5)
    for i in range(400):
        sched.add_request(Request(f"r{i:03d}", rng.integers(0, 1000, int(rng.integers(4, 40))).tolist(),
                                  max_tokens=int(rng.integers(10, 60))))
    decisions = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        decisions.append((tuple(out.req_ids), tuple(out.num_tokens.tolist()),
                          tuple(sorted(out.preempted_req_ids | out.swapped_out_req_ids)),
                          sched.table.state[:, np.sort(np.concatenate([sched.running, sched.waiting,
                                                                       sched.swapped]))].tobytes()))
        sched.update(out, np.where(out.sampled, 7, -1))
        assert len(decisions) < 20000
    return decisions, sched, built


def test_fastserve_heads_are_as_long_as_its_pick_can_displace():
    """mlfq-order's pick displaces only running jobs of a lower level than the queue's best, so
    its window and the walks' heads are the free seats + those jobs (+ 1, + 16), not max_seqs + 16:
    steps where the batch is all of the queue's best level carry a short head. Decisions, swaps
    and request state equal the whole queue's at every step, steps that displace several jobs
    included (a head one job short would displace fewer: the mutation test below)."""
    windowed, sched, built = _fastserve_displacing(True)
    whole, _, _ = _fastserve_displacing(False, arrays=False)
    displacing = sum(len(d[2]) >= 4 for d in windowed)
    assert displacing > 10  # steps that gave 4 or more seats away
    metrics = sched.metrics
    assert metrics.ranked_steps - metrics.ranked_rebuilt > 20
    long = [n for n in built if n > 0]
    assert sorted(long)[len(long) // 4] < 16 + 16  # a quarter of the steps carried a head shorter than max_seqs + 16
    assert len(windowed) == len(whole)
    for step, (a, b) in enumerate(zip(windowed, whole, strict=True)):
        assert a == b, f"step {step + 1} differs"


def test_fastserve_heads_need_the_displaceable_count(monkeypatch):
    """Counting no displaceable job (the heads the free seats + 1 and + 16 long) decides otherwise
    than the whole queue where the pick displaces several jobs a step."""
    monkeypatch.setattr(MlfqOrder, "_displaceable", lambda self, ctx, rank: 0)
    windowed, _, _ = _fastserve_displacing(True)
    monkeypatch.undo()
    whole, _, _ = _fastserve_displacing(False, arrays=False)
    assert windowed != whole
