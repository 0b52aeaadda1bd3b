"""What each built-in pass decides, through the Python API, and a reference model of `base`.

Steps are built with `build_step` (or parsed from text for verify-step's illegal
steps), run through the pass manager with `verify_each=True`, and read back by
walking the step's ops. The main property compares the `base` pipeline (and
variants with options) against `reference`, a plain-Python implementation of the
same greedy algorithm written from the pass docstrings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
from conftest import draw_until_covered
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xdsl.dialects.builtin import ModuleOp

from schedir.dialects.base import ColumnOpMixin
from schedir.dialects.codes import Reason, Status
from schedir.dialects.mem import EvictOp, MatchOp
from schedir.dialects.req import QUEUE_COLUMNS, DeferOp, QueueOp, RejectOp, ScheduleOp, SelectOp, SortOp
from schedir.dialects.sched import StepFacts, YieldOp
from schedir.ir.builder import build_step
from schedir.ir.errors import PassFailure
from schedir.ir.pipeline import PassManager
from schedir.ir.step import Step, steps_of
from schedir.ir.textio import parse_step_text

BUDGET, MAX_SEQS, MEMORY, BLOCKED = Reason.BUDGET, Reason.MAX_SEQS, Reason.MEMORY, Reason.BLOCKED
IN_FLIGHT, TOO_LONG, EXCEEDS_CACHE = Reason.IN_FLIGHT, Reason.TOO_LONG, Reason.EXCEEDS_CACHE


# ---------------------------------------------------------------- building steps
def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Req:
    """One request as plain Python values (a row of a `req.queue`)."""

    id: int
    prompt: int
    computed: int = 0
    total: int | None = None  # None: the prompt
    blocks: int = 0
    priority: int = 0
    arrival: int = 0
    max_tokens: int = 16
    status: int = int(Status.WAITING)

    def __post_init__(self) -> None:
        if self.total is None:
            self.total = self.prompt


def running_req(rid: int, computed: int, *, block_size: int, left: int = 1, blocks: int | None = None, **kw) -> Req:
    """A running request with `left` tokens still to compute and the blocks its computed tokens fill."""
    return Req(
        rid, prompt=max(1, min(computed, 8)), computed=computed, total=computed + left,
        blocks=ceil_div(computed, block_size) if blocks is None else blocks, status=int(Status.RUNNING), **kw,
    )


def columns(reqs: Sequence[Req]) -> dict[str, np.ndarray]:
    return {name: np.asarray([getattr(r, name) for r in reqs], dtype=np.int64) for name in QUEUE_COLUMNS}


def make_facts(**kw) -> StepFacts:
    values = {
        "step": 0, "token_budget": 512, "max_seqs": 16, "block_size": 16, "free_blocks": 100, "cached_free_blocks": 0,
        "total_blocks": 200, "max_model_len": 4096,
    }
    values.update(kw)
    return StepFacts(**values)  # type: ignore[arg-type]


def make_module(
    facts: StepFacts,
    running: Sequence[Req] = (),
    waiting: Sequence[Req] = (),
    hits: Mapping[int, tuple[int, int]] | None = None,
) -> ModuleOp:
    """`hits`: request id -> (hit tokens, cached-free blocks) for waiting requests."""
    hit_cols = None
    if hits is not None:
        ids = list(hits)
        hit_cols = {
            "waiting": {
                "id": np.asarray(ids, dtype=np.int64),
                "hit": np.asarray([hits[i][0] for i in ids], dtype=np.int64),
                "cached_free": np.asarray([hits[i][1] for i in ids], dtype=np.int64),
            }
        }
    return build_step(facts, {"running": columns(running), "waiting": columns(waiting)}, hits=hit_cols)


def run(module: ModuleOp, spec: str) -> ModuleOp:
    PassManager.parse(spec, verify_each=True).run(module)
    return module


# ---------------------------------------------------------------- reading decisions back
@dataclass
class Log:
    """The decisions of one step, per (op name, queue): ids and decision columns, in IR order."""

    ops: dict[tuple[str, str], list[dict[str, list[int]]]] = field(default_factory=dict)
    phases: dict[str, list[str]] = field(default_factory=dict)  # queue -> schedule phases
    sort_keys: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)
    batch: list[list[int]] = field(default_factory=list)  # sched.yield: ids of each scheduled set
    evicted: int = 0

    def one(self, name: str, queue: str) -> dict[str, list[int]] | None:
        found = self.ops.get((name, queue), [])
        assert len(found) <= 1, f"{len(found)} {name} ops over queue '{queue}'"
        return found[0] if found else None

    def ids(self, name: str, queue: str) -> list[int]:
        op = self.one(name, queue)
        return op["id"] if op else []

    def col(self, name: str, queue: str, column: str) -> dict[int, int]:
        op = self.one(name, queue)
        return dict(zip(op["id"], op[column], strict=True)) if op else {}

    def scheduled(self, queue: str) -> dict[int, int]:
        return self.col("req.schedule", queue, "tokens")

    def deferred(self, queue: str) -> dict[int, Reason]:
        return {i: Reason(r) for i, r in self.col("req.defer", queue, "reason").items()}

    def rejected(self, queue: str = "waiting") -> dict[int, Reason]:
        return {i: Reason(r) for i, r in self.col("req.reject", queue, "reason").items()}

    def allocs(self, queue: str) -> dict[int, int]:
        return self.col("mem.alloc", queue, "blocks")

    def shares(self, queue: str) -> dict[int, tuple[int, int]]:
        op = self.one("mem.share", queue)
        if not op:
            return {}
        return {i: (b, r) for i, b, r in zip(op["id"], op["blocks"], op["revived"], strict=True)}


def read_log(module: ModuleOp) -> Log:
    (step_op,) = steps_of(module)
    step = Step(step_op)
    log = Log()
    for op in step.ops():
        if isinstance(op, YieldOp):
            log.batch = [list(v.owner.ids.tolist()) for v in op.operands]  # type: ignore[union-attr]
            continue
        if isinstance(op, EvictOp):
            log.evicted += op.count
            continue
        if isinstance(op, QueueOp) or not isinstance(op, ColumnOpMixin):
            continue
        queue = step.root(op.operands[0]).queue.data
        cols = {name: values.tolist() for name, values in op.columns.as_dict().items()}
        log.ops.setdefault((op.name, queue), []).append(cols)
        if isinstance(op, ScheduleOp):
            log.phases.setdefault(queue, []).append(op.phase.data)
        if isinstance(op, SortOp):
            log.sort_keys.setdefault(queue, []).append(op.keys)
    return log


def block_op_names(module: ModuleOp) -> list[str]:
    (step_op,) = steps_of(module)
    return [op.name for op in step_op.body.block.ops]


# ================================================================ reject-oversized
def test_reject_oversized_reasons_and_the_rest_kept_in_order() -> None:
    facts = make_facts(max_model_len=100, block_size=16, total_blocks=4, free_blocks=4)
    waiting = [
        Req(1, prompt=100),  # no room for a token under max_model_len
        Req(2, prompt=65),  # 5 blocks > 4 in the whole cache
        Req(3, prompt=64, max_tokens=1),  # exactly the cache: kept
        Req(4, prompt=300),  # both: too long wins
        Req(5, prompt=10),
        Req(9, prompt=10, max_tokens=60),  # the prompt fits, its generation (69 tokens) does not
        Req(6, prompt=50, computed=0, total=99),  # under the model length, but 7 blocks > 4
        Req(7, prompt=5, total=99),  # total (not prompt) counts
        Req(8, prompt=20, total=33, max_tokens=29),  # 48 tokens at most: 3 blocks, kept
    ]
    log = read_log(run(make_module(facts, waiting=waiting), "reject-oversized"))
    assert log.ids("req.reject", "waiting") == [1, 2, 4, 9, 6, 7]
    assert log.rejected() == {1: TOO_LONG, 2: EXCEEDS_CACHE, 4: TOO_LONG, 6: EXCEEDS_CACHE, 7: EXCEEDS_CACHE,
                              9: EXCEEDS_CACHE}
    assert log.ids("req.select", "waiting") == [3, 5, 8]


def test_reject_oversized_boundaries_are_kept() -> None:
    facts = make_facts(max_model_len=65, block_size=16, total_blocks=4, free_blocks=0)  # 64: one token of room
    waiting = [Req(1, prompt=64), Req(2, prompt=1), Req(3, prompt=48, total=64, max_tokens=17)]  # max_tokens: 16
    module = run(make_module(facts, waiting=waiting), "reject-oversized")
    assert block_op_names(module) == ["req.queue", "req.queue", "sched.yield"], "nothing rejected: no ops"


def test_reject_oversized_leaves_running_alone_and_the_pending_set_is_the_select() -> None:
    facts = make_facts(max_model_len=10, total_blocks=1, free_blocks=1)
    running = [running_req(1, 50, block_size=16)]  # longer than the model, but already running
    waiting = [Req(2, prompt=11), Req(3, prompt=4)]
    module = run(make_module(facts, running, waiting), "reject-oversized")
    log = read_log(module)
    assert log.rejected() == {2: TOO_LONG}
    assert ("req.reject", "running") not in log.ops
    step = Step(steps_of(module)[0])
    pending = step.pending("waiting")
    assert isinstance(pending.owner, SelectOp) and step.ids(pending).tolist() == [3]
    np.testing.assert_array_equal(step.column(pending, "prompt"), [4])


def test_a_rejected_head_never_stalls_the_queue() -> None:
    facts = make_facts(max_model_len=1000, block_size=16, total_blocks=50, free_blocks=50, token_budget=200)
    waiting = [
        Req(1, prompt=5000, arrival=0),  # the head: too long
        Req(2, prompt=900, total=999, arrival=1),  # 63 blocks > 50: can never fit
        Req(3, prompt=40, arrival=2),
        Req(4, prompt=60, arrival=3),
    ]
    module = run(make_module(facts, waiting=waiting), "base")
    log = read_log(module)
    assert log.rejected() == {1: TOO_LONG, 2: EXCEEDS_CACHE}
    assert log.scheduled("waiting") == {3: 40, 4: 60}
    assert log.deferred("waiting") == {}
    # The same head without reject-oversized blocks everything behind it under stop-at-first.
    module = run(
        make_module(facts, waiting=waiting),
        "order-fcfs,schedule-running,admit-greedy{chunk=false stop-at-first=true},verify-step",
    )
    log = read_log(module)
    assert log.scheduled("waiting") == {}
    assert log.deferred("waiting") == {1: BUDGET, 2: BLOCKED, 3: BLOCKED, 4: BLOCKED}


# ================================================================ order-fcfs / order-priority
@st.composite
def order_rows(draw) -> list[Req]:
    n = draw(st.integers(0, 30))
    ids = draw(st.lists(st.integers(0, 10**9), min_size=n, max_size=n, unique=True))
    return [
        Req(i, prompt=draw(st.integers(1, 50)), priority=draw(st.integers(-3, 3)), arrival=draw(st.integers(0, 8)))
        for i in ids
    ]


@settings(max_examples=60, deadline=None)
@given(order_rows())
def test_order_fcfs_is_a_stable_sort_by_arrival(rows: list[Req]) -> None:
    log = read_log(run(make_module(make_facts(), waiting=rows), "order-fcfs"))
    if not rows:  # an empty queue is decided already: nothing to sort
        assert "waiting" not in log.sort_keys
        return
    assert log.sort_keys["waiting"] == [("arrival",)]
    assert log.ids("req.sort", "waiting") == [r.id for r in sorted(rows, key=lambda r: r.arrival)]
    assert "running" not in log.sort_keys


@settings(max_examples=60, deadline=None)
@given(order_rows())
def test_order_priority_is_a_stable_sort_by_priority_then_arrival(rows: list[Req]) -> None:
    log = read_log(run(make_module(make_facts(), waiting=rows), "order-priority"))
    if not rows:  # an empty queue is decided already: nothing to sort
        assert "waiting" not in log.sort_keys
        return
    assert log.sort_keys["waiting"] == [("priority", "arrival")]
    assert log.ids("req.sort", "waiting") == [r.id for r in sorted(rows, key=lambda r: (r.priority, r.arrival))]


def test_order_sorts_what_reject_oversized_kept() -> None:
    rows = [Req(1, prompt=9, arrival=5), Req(2, prompt=99, arrival=0), Req(3, prompt=9, arrival=1)]
    module = run(make_module(make_facts(max_model_len=50), waiting=rows), "reject-oversized,order-fcfs")
    step = Step(steps_of(module)[0])
    sort = step.pending("waiting").owner
    assert isinstance(sort, SortOp) and isinstance(sort.operands[0].owner, SelectOp)
    assert sort.ids.tolist() == [3, 1]


def test_order_on_another_queue() -> None:
    running = [running_req(1, 10, block_size=16, arrival=9), running_req(2, 10, block_size=16, arrival=3)]
    log = read_log(run(make_module(make_facts(), running), "order-fcfs{queue=running}"))
    assert log.ids("req.sort", "running") == [2, 1]


# ================================================================ schedule-running
def test_decodes_get_one_token_and_blocks_only_across_a_boundary() -> None:
    bs = 16
    running = [
        running_req(1, 15, block_size=bs),  # token 16 still fits block 1
        running_req(2, 16, block_size=bs),  # token 17 needs block 2
        running_req(3, 31, block_size=bs),  # token 32 fits block 2
        running_req(4, 32, block_size=bs),  # token 33 needs block 3
        running_req(5, 0, block_size=bs),  # the first token needs block 1
        running_req(6, 16, block_size=bs, blocks=2),  # already holds the next block
    ]
    module = run(make_module(make_facts(block_size=bs), running), "schedule-running")
    log = read_log(module)
    assert log.scheduled("running") == {i: 1 for i in range(1, 7)}
    assert log.phases["running"] == ["decode"]
    assert log.allocs("running") == {2: 1, 4: 1, 5: 1}
    assert log.deferred("running") == {}
    assert log.batch == [[1, 2, 3, 4, 5, 6]]


@pytest.mark.parametrize(
    ("facts", "scheduled", "deferred"),
    [
        ({"token_budget": 2}, [1, 2], {3: BUDGET, 4: BUDGET}),
        ({"max_seqs": 3}, [1, 2, 3], {4: MAX_SEQS}),
        ({"max_seqs": 1, "token_budget": 1}, [1], {2: MAX_SEQS, 3: MAX_SEQS, 4: MAX_SEQS}),
        # Requests 2 and 4 cross a block boundary; only one free block.
        ({"free_blocks": 1}, [1, 2, 3], {4: MEMORY}),
        ({"free_blocks": 0}, [1, 3], {2: MEMORY, 4: MEMORY}),
    ],
)
def test_running_deferrals_have_the_right_reason(facts, scheduled, deferred) -> None:
    bs = 16
    running = [
        running_req(1, 10, block_size=bs),
        running_req(2, 16, block_size=bs),
        running_req(3, 20, block_size=bs),
        running_req(4, 48, block_size=bs),
    ]
    log = read_log(run(make_module(make_facts(block_size=bs, **facts), running),
                       "schedule-running{preempt=false},verify-step"))
    assert list(log.scheduled("running")) == scheduled
    assert log.deferred("running") == deferred


@pytest.mark.parametrize(
    ("facts", "scheduled", "deferred", "preempted"),
    [
        # 2 needs a block: 4 (last, 3 blocks) is preempted, 2 waits a step for its blocks; 3 runs.
        ({"free_blocks": 0}, [1, 3], {2: MEMORY}, [4]),
        # 2 takes the free block; 4 needs one, with nobody behind it: it preempts itself.
        ({"free_blocks": 1}, [1, 2, 3], {}, [4]),
        # Priority: the largest (priority, arrival) behind 2 goes, 3 (priority 5), not 4; 4 then
        # waits for 3's blocks rather than preempting itself.
        ({"free_blocks": 0, "policy": "priority"}, [1], {2: MEMORY, 4: MEMORY}, [3]),
    ],
)
def test_running_preempts_behind_it_when_short_of_blocks(facts, scheduled, deferred, preempted) -> None:
    bs = 16
    running = [
        running_req(1, 10, block_size=bs),
        running_req(2, 16, block_size=bs),
        running_req(3, 20, block_size=bs, priority=5),
        running_req(4, 48, block_size=bs, priority=1),
    ]
    log = read_log(run(make_module(make_facts(block_size=bs, **facts), running), "schedule-running,verify-step"))
    assert list(log.scheduled("running")) == scheduled
    assert log.deferred("running") == deferred
    assert log.ids("req.preempt", "running") == preempted
    assert ("mem.free", "running") not in log.ops  # the victims' blocks count from the next step


def test_running_does_not_preempt_itself_while_a_request_behind_it_is_in_flight() -> None:
    bs = 16
    running = [running_req(1, 16, block_size=bs), running_req(2, 20, block_size=bs, left=0)]  # 2: in flight
    log = read_log(run(make_module(make_facts(block_size=bs, free_blocks=0), running), "schedule-running,verify-step"))
    assert log.deferred("running") == {1: MEMORY, 2: IN_FLIGHT}
    assert log.ids("req.preempt", "running") == []


def test_in_flight_requests_are_deferred_and_cost_nothing() -> None:
    bs = 16
    running = [running_req(1, 20, block_size=bs, left=0), running_req(2, 20, block_size=bs)]
    log = read_log(run(make_module(make_facts(block_size=bs, token_budget=1, max_seqs=1), running), "schedule-running"))
    assert log.scheduled("running") == {2: 1}
    assert log.deferred("running") == {1: IN_FLIGHT}


def test_running_prefill_is_chunked_by_default_and_deferred_without_chunk() -> None:
    bs = 16
    running = [
        running_req(1, 20, block_size=bs),  # decode: 1 token
        Req(2, prompt=100, computed=10, total=100, blocks=1, status=int(Status.RUNNING)),  # 90 tokens of prefill left
    ]
    facts = make_facts(block_size=bs, token_budget=41)
    log = read_log(run(make_module(facts, running), "schedule-running,verify-step"))
    assert log.scheduled("running") == {1: 1, 2: 40}
    assert log.phases["running"] == ["mixed"]
    assert log.allocs("running") == {2: ceil_div(10 + 40, bs) - 1}
    log = read_log(run(make_module(facts, running), "schedule-running{chunk=false},verify-step"))
    assert log.scheduled("running") == {1: 1}
    assert log.phases["running"] == ["decode"]
    assert log.deferred("running") == {2: BUDGET}
    # The whole prefill fits: no chunk needed.
    facts = make_facts(block_size=bs, token_budget=91)
    log = read_log(run(make_module(facts, running), "schedule-running{chunk=false}"))
    assert log.scheduled("running") == {1: 1, 2: 90}


def test_a_chunk_that_needs_too_many_blocks_is_deferred_for_memory() -> None:
    bs = 4
    running = [Req(1, prompt=100, computed=0, total=100, status=int(Status.RUNNING))]
    facts = make_facts(block_size=bs, token_budget=40, free_blocks=9)
    log = read_log(run(make_module(facts, running), "schedule-running"))
    assert log.deferred("running") == {1: MEMORY}
    facts = make_facts(block_size=bs, token_budget=40, free_blocks=10)
    log = read_log(run(make_module(facts, running), "schedule-running"))
    assert log.scheduled("running") == {1: 40} and log.allocs("running") == {1: 10}


# ================================================================ admit-greedy
ADMIT = "order-fcfs,schedule-running,admit-greedy{chunk=false},verify-step"  # the seed's admission
STOP_AT_FIRST = "order-fcfs,schedule-running,admit-greedy{chunk=false stop-at-first=true},verify-step"


def test_admission_skips_a_misfit_and_goes_on() -> None:
    waiting = [Req(1, prompt=60, arrival=0), Req(2, prompt=50, arrival=1), Req(3, prompt=30, arrival=2)]
    facts = make_facts(token_budget=100)
    log = read_log(run(make_module(facts, waiting=waiting), ADMIT))
    assert log.scheduled("waiting") == {1: 60, 3: 30}
    assert log.deferred("waiting") == {2: BUDGET}
    assert log.phases["waiting"] == ["prefill"]


def test_stop_at_first_blocks_everyone_behind_the_misfit() -> None:
    waiting = [Req(1, prompt=60, arrival=0), Req(2, prompt=50, arrival=1), Req(3, prompt=30, arrival=2)]
    facts = make_facts(token_budget=100)
    log = read_log(run(make_module(facts, waiting=waiting), STOP_AT_FIRST))
    assert log.scheduled("waiting") == {1: 60}
    assert log.deferred("waiting") == {2: BUDGET, 3: BLOCKED}


def test_stop_at_first_does_not_stop_at_an_in_flight_request() -> None:
    waiting = [Req(1, prompt=10, computed=10, arrival=0), Req(2, prompt=10, arrival=1)]
    log = read_log(run(make_module(make_facts(), waiting=waiting), STOP_AT_FIRST))
    assert log.deferred("waiting") == {1: IN_FLIGHT}
    assert log.scheduled("waiting") == {2: 10}


def test_admission_chunks_the_request_that_does_not_fit_the_budget() -> None:
    bs = 16
    waiting = [Req(1, prompt=60, arrival=0), Req(2, prompt=50, arrival=1), Req(3, prompt=30, arrival=2)]
    facts = make_facts(token_budget=100, block_size=bs)
    log = read_log(run(make_module(facts, waiting=waiting), "order-fcfs,schedule-running,admit-greedy{chunk=true}"))
    assert log.scheduled("waiting") == {1: 60, 2: 40}
    assert log.deferred("waiting") == {3: BUDGET}
    assert log.allocs("waiting") == {1: 4, 2: 3}


def test_admission_uses_what_running_left() -> None:
    bs = 16
    running = [running_req(1, 16, block_size=bs), running_req(2, 20, block_size=bs)]  # 2 tokens, 1 new block
    waiting = [Req(3, prompt=30, arrival=0), Req(4, prompt=3, arrival=1), Req(5, prompt=9, arrival=2)]
    facts = make_facts(block_size=bs, token_budget=40, max_seqs=4, free_blocks=3)
    log = read_log(run(make_module(facts, running, waiting), "base"))
    assert log.scheduled("running") == {1: 1, 2: 1}
    assert log.scheduled("waiting") == {3: 30}  # 2 blocks: the last 2 free ones; 8 tokens left
    assert log.deferred("waiting") == {4: MEMORY, 5: MEMORY}  # base chunks: 8 of 9 tokens, but no block left
    assert log.batch == [[1, 2], [3]]
    unchunked = "reject-oversized,order-fcfs,schedule-running,admit-greedy{chunk=false},verify-step"
    assert read_log(run(make_module(facts, running, waiting), unchunked)).deferred("waiting") == {4: MEMORY, 5: BUDGET}
    # One sequence slot fewer: the running batch and request 3 fill max_seqs.
    log = read_log(run(make_module(make_facts(block_size=bs, token_budget=40, max_seqs=3, free_blocks=3),
                                   running, waiting), "base"))
    assert log.deferred("waiting") == {4: MAX_SEQS, 5: MAX_SEQS}


@pytest.mark.parametrize(
    ("total", "hit", "tokens", "shared", "alloc"),
    [
        (100, 64, 36, 4, 3),  # hit of whole blocks: computed from token 64 on
        (100, 70, 36, 4, 3),  # a partial block of hit is recomputed
        (64, 64, 16, 3, 1),  # a full hit recomputes the last token: the last block goes
        (65, 64, 1, 4, 1),  # hit is everything but the last token
        (100, 0, 100, 0, 7),
        (100, 15, 100, 0, 7),  # less than a block: no use
        (10, 500, 10, 0, 1),  # a hit longer than the request: less than a block of it is usable
    ],
)
def test_prefix_hits_count_as_computed(total, hit, tokens, shared, alloc) -> None:
    bs = 16
    waiting = [Req(1, prompt=total)]
    module = run(make_module(make_facts(block_size=bs), waiting=waiting, hits={1: (hit, 0)}), ADMIT)
    log = read_log(module)
    assert log.scheduled("waiting") == {1: tokens}
    assert log.shares("waiting") == ({1: (shared, 0)} if shared else {})
    assert log.allocs("waiting") == ({1: alloc} if alloc else {})


def test_shared_blocks_are_not_charged_but_revived_ones_are() -> None:
    bs = 16
    waiting = [Req(1, prompt=100)]  # 7 blocks in all; a 64-token hit covers 4 of them
    # Without the hit, 7 blocks do not fit in 3.
    log = read_log(run(make_module(make_facts(block_size=bs, free_blocks=3), waiting=waiting), ADMIT))
    assert log.deferred("waiting") == {1: MEMORY}
    # With it, 3 new blocks fit (the 4 shared ones were not in the free queue).
    module = make_module(make_facts(block_size=bs, free_blocks=3), waiting=waiting, hits={1: (64, 0)})
    log = read_log(run(module, ADMIT))
    assert log.scheduled("waiting") == {1: 36} and log.allocs("waiting") == {1: 3}
    assert log.shares("waiting") == {1: (4, 0)}
    # Shared blocks that sat in the free queue leave it: 3 new + 2 revived = 5 > 4 free.
    facts = make_facts(block_size=bs, free_blocks=4, cached_free_blocks=2)
    log = read_log(run(make_module(facts, waiting=waiting, hits={1: (64, 2)}), ADMIT))
    assert log.deferred("waiting") == {1: MEMORY}
    facts = make_facts(block_size=bs, free_blocks=5, cached_free_blocks=2)
    module = run(make_module(facts, waiting=waiting, hits={1: (64, 2)}), ADMIT)
    log = read_log(module)
    assert log.scheduled("waiting") == {1: 36}
    assert log.shares("waiting") == {1: (4, 2)}
    usage = Step(steps_of(module)[0]).usage()
    assert usage.blocks_taken == 3 + 2 and usage.free_left(facts) == 0


def test_revived_blocks_limit_the_next_admission() -> None:
    bs = 16
    waiting = [Req(1, prompt=100, arrival=0), Req(2, prompt=16, arrival=1)]
    facts = make_facts(block_size=bs, free_blocks=6, cached_free_blocks=4)
    log = read_log(run(make_module(facts, waiting=waiting, hits={1: (64, 3)}), ADMIT))
    assert log.scheduled("waiting") == {1: 36}  # 3 new + 3 revived = 6
    assert log.deferred("waiting") == {2: MEMORY}


def test_hits_of_blocks_the_request_already_holds_are_not_shared_again() -> None:
    bs = 16
    waiting = [Req(1, prompt=100, computed=32, blocks=2, status=int(Status.PREEMPTED))]
    log = read_log(run(make_module(make_facts(block_size=bs), waiting=waiting, hits={1: (64, 4)}), ADMIT))
    assert log.scheduled("waiting") == {1: 36}
    assert log.shares("waiting") == {1: (2, 2)}  # blocks 3 and 4; at most those can be revived
    assert log.allocs("waiting") == {1: 3}


def test_hits_for_part_of_the_queue_in_any_order() -> None:
    bs = 16
    waiting = [Req(1, prompt=100, arrival=0), Req(2, prompt=100, arrival=1), Req(3, prompt=100, arrival=2)]
    hits = {3: (32, 0), 1: (64, 0)}  # request 2 has no hit; ids not in queue order
    log = read_log(run(make_module(make_facts(block_size=bs), waiting=waiting, hits=hits), ADMIT))
    assert log.scheduled("waiting") == {1: 36, 2: 100, 3: 68}
    assert log.shares("waiting") == {1: (4, 0), 3: (2, 0)}


# ================================================================ reference model of `base`
@dataclass
class Decisions:
    """What a step decided, in the shape `reference` builds and `decisions_of` reads."""

    rejected: list[tuple[int, int]] = field(default_factory=list)
    kept: list[int] | None = None  # req.select after rejection (None: no select)
    order: list[int] = field(default_factory=list)  # req.sort of waiting
    run_phase: str | None = None
    run_tokens: list[tuple[int, int]] = field(default_factory=list)
    run_alloc: list[tuple[int, int]] = field(default_factory=list)
    run_defer: list[tuple[int, int]] = field(default_factory=list)
    run_preempt: list[int] = field(default_factory=list)  # in the order preempted
    wait_tokens: list[tuple[int, int]] = field(default_factory=list)
    wait_alloc: list[tuple[int, int]] = field(default_factory=list)
    wait_share: list[tuple[int, int, int]] = field(default_factory=list)
    wait_defer: list[tuple[int, int]] = field(default_factory=list)
    batch: list[list[int]] = field(default_factory=list)


@dataclass
class Budgets:
    tokens: int
    seqs: int
    free: int


def fit_queue(
    rows: Sequence[Req],
    budgets: Budgets,
    block_size: int,
    *,
    chunk: bool,
    stop_at_first: bool,
    hits: Mapping[int, tuple[int, int]],
    victim_rank: Sequence[int] | None = None,
) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int, int]], list[tuple[int, int]], bool,
           list[int]]:
    """Walk `rows` in order and take each request that fits what is left (the docstrings' rule).

    A request's start is what it has computed, or the whole blocks of its prefix hit
    (never its last token), whichever is more; it needs the rest. Nothing left to
    compute: in flight. Otherwise it is refused for sequence slots first, then for an
    empty or too small token budget (unless chunked), then for blocks: the blocks it
    must add for start + tokens beyond what it holds and what it shares, plus the
    shared blocks that leave the free queue.

    With `victim_rank`, one short of blocks preempts the undecided requests behind it that
    hold blocks and are not in flight, highest rank first, until their blocks cover the
    shortfall (it still waits: they are free only next step); with none to take, none in
    flight behind it and no one preempted yet, it preempts itself.
    """
    tokens, allocs, shares, defers, preempted = [], [], [], [], []
    all_decode = True
    stopped = False
    for idx, r in enumerate(rows):
        if r.id in preempted:
            continue
        hit, cached_free = hits.get(r.id, (0, 0))
        usable = min(hit, max(r.total - 1, 0)) // block_size * block_size
        start = max(r.computed, usable)
        shared = max(0, usable // block_size - r.blocks)
        revived = min(cached_free, shared)
        need = r.total - start
        reason = None
        if need <= 0:
            reason = IN_FLIGHT
        elif stopped:
            reason = BLOCKED
        elif budgets.seqs <= 0:
            reason = MAX_SEQS
        elif budgets.tokens <= 0:
            reason = BUDGET
        else:
            take = need
            if take > budgets.tokens:
                if chunk:
                    take = budgets.tokens
                else:
                    reason = BUDGET
            if reason is None:
                new = max(0, ceil_div(start + take, block_size) - r.blocks - shared)
                if new + revived > budgets.free:
                    reason = MEMORY
                    if victim_rank is not None:
                        short, found, waiting_on = new + revived - budgets.free, 0, False
                        while found < short:
                            takeable = []
                            for j in range(idx + 1, len(rows)):
                                q = rows[j]
                                if q.id in preempted or q.blocks <= 0:
                                    continue
                                if q.total <= q.computed:
                                    waiting_on = True
                                else:
                                    takeable.append(j)
                            if not takeable:
                                break
                            v = max(takeable, key=lambda j: victim_rank[j])
                            preempted.append(rows[v].id)
                            found += rows[v].blocks
                        if found == 0 and not waiting_on and not preempted and r.blocks > 0:
                            preempted.append(r.id)
                            continue
        if reason is None:
            budgets.tokens -= take
            budgets.seqs -= 1
            budgets.free -= new + revived
            tokens.append((r.id, take))
            all_decode = all_decode and need == 1
            if new:
                allocs.append((r.id, new))
            if shared:
                shares.append((r.id, shared, revived))
        else:
            defers.append((r.id, int(reason)))
            if stop_at_first and reason != IN_FLIGHT:
                stopped = True
    return tokens, allocs, shares, defers, all_decode, preempted


def reference(
    facts: StepFacts,
    running: Sequence[Req],
    waiting: Sequence[Req],
    hits: Mapping[int, tuple[int, int]],
    *,
    priority: bool = False,
    run_chunk: bool = True,
    admit_chunk: bool = False,
    stop_at_first: bool = False,
    preempt: bool = True,
) -> Decisions:
    out = Decisions()
    bs = facts.block_size
    kept = []
    for r in waiting:
        if r.total >= facts.max_model_len:  # no room for one new token
            out.rejected.append((r.id, int(TOO_LONG)))
        elif ceil_div(max(r.total, min(r.prompt + r.max_tokens, facts.max_model_len) - 1), bs) > facts.total_blocks:
            out.rejected.append((r.id, int(EXCEEDS_CACHE)))  # the KV its last step holds outgrows the cache
        else:
            kept.append(r)
    if out.rejected:
        out.kept = [r.id for r in kept]
    key = (lambda r: (r.priority, r.arrival)) if priority else (lambda r: r.arrival)
    ordered = sorted(kept, key=key)
    out.order = [r.id for r in ordered]
    budgets = Budgets(facts.token_budget, facts.max_seqs, facts.free_blocks)
    rank = None
    if preempt:  # the step's policy picks victims: FCFS the last first, priority the largest (priority, arrival)
        by_priority = facts.policy == "priority"
        order = sorted(range(len(running)), key=lambda j: (running[j].priority, running[j].arrival) if by_priority else j)
        rank = [0] * len(running)
        for k, j in enumerate(order):
            rank[j] = k
    out.run_tokens, out.run_alloc, _, out.run_defer, all_decode, out.run_preempt = fit_queue(
        running, budgets, bs, chunk=run_chunk, stop_at_first=False, hits={}, victim_rank=rank
    )
    if out.run_tokens:
        out.run_phase = "decode" if all_decode else "mixed"
        out.batch.append([i for i, _ in out.run_tokens])
    budgets.seqs -= len(out.run_defer)  # running requests left out keep their sequence slots
    out.wait_tokens, out.wait_alloc, out.wait_share, out.wait_defer, _, _ = fit_queue(
        ordered, budgets, bs, chunk=admit_chunk, stop_at_first=stop_at_first, hits=hits
    )
    if out.wait_tokens:
        out.batch.append([i for i, _ in out.wait_tokens])
    return out


def decisions_of(module: ModuleOp) -> Decisions:
    log = read_log(module)
    out = Decisions()

    def pairs(name: str, queue: str, column: str) -> list[tuple[int, int]]:
        op = log.one(name, queue)
        return list(zip(op["id"], op[column], strict=True)) if op else []

    out.rejected = pairs("req.reject", "waiting", "reason")
    select = log.one("req.select", "waiting")
    out.kept = select["id"] if select else None
    out.order = log.ids("req.sort", "waiting")
    phases = log.phases.get("running", [])
    assert len(phases) <= 1
    out.run_phase = phases[0] if phases else None
    assert log.phases.get("waiting", ["prefill"]) == ["prefill"]
    out.run_tokens = pairs("req.schedule", "running", "tokens")
    out.run_alloc = pairs("mem.alloc", "running", "blocks")
    out.run_defer = pairs("req.defer", "running", "reason")
    preempt = log.one("req.preempt", "running")
    out.run_preempt = preempt["id"] if preempt else []
    out.wait_tokens = pairs("req.schedule", "waiting", "tokens")
    out.wait_alloc = pairs("mem.alloc", "waiting", "blocks")
    share = log.one("mem.share", "waiting")
    out.wait_share = list(zip(share["id"], share["blocks"], share["revived"], strict=True)) if share else []
    out.wait_defer = pairs("req.defer", "waiting", "reason")
    out.batch = log.batch
    assert ("mem.share", "running") not in log.ops
    assert not any(name == "req.reject" and q == "running" for name, q in log.ops)
    return out


@dataclass
class Scenario:
    facts: StepFacts
    running: list[Req]
    waiting: list[Req]
    hits: dict[int, tuple[int, int]]

    def __repr__(self) -> str:
        """One line per request (what Hypothesis shows for a failing example)."""

        def row(r: Req) -> str:
            return (f"  Req({r.id}, prompt={r.prompt}, computed={r.computed}, total={r.total}, blocks={r.blocks}, "
                    f"priority={r.priority}, arrival={r.arrival}, status={r.status}),")

        lines = [f"Scenario(\n facts={self.facts!r},", " running=["]
        lines += [row(r) for r in self.running]
        lines += [" ],", " waiting=["]
        lines += [row(r) for r in self.waiting]
        lines += [f" ],\n hits={self.hits!r},\n)"]
        return "\n".join(lines)

    def module(self) -> ModuleOp:
        return make_module(self.facts, self.running, self.waiting, self.hits or None)


@st.composite
def scenarios(draw) -> Scenario:
    bs = draw(st.sampled_from([1, 2, 4, 16, 32]))
    total_blocks = draw(st.one_of(st.integers(0, 40), st.integers(0, 600)))
    free = draw(st.one_of(st.integers(0, min(total_blocks, 20)), st.integers(0, total_blocks)))
    facts = make_facts(
        step=draw(st.integers(0, 1000)),
        token_budget=draw(st.one_of(st.integers(1, 64), st.integers(1, 1500))),
        max_seqs=draw(st.one_of(st.integers(1, 8), st.integers(1, 80))),
        block_size=bs,
        free_blocks=free,
        cached_free_blocks=draw(st.integers(0, free)),
        total_blocks=total_blocks,
        max_model_len=draw(st.one_of(st.integers(1, 400), st.just(4096))),
        policy=draw(st.sampled_from(["fcfs", "priority"])),  # picks preemption victims
    )
    n_run = draw(st.integers(0, 40))
    n_wait = draw(st.integers(0, 40))
    ids = draw(
        st.lists(
            st.integers(0, draw(st.sampled_from([100, 2**40]))), min_size=n_run + n_wait, max_size=n_run + n_wait,
            unique=True,
        )
    )
    running = []
    for rid in ids[:n_run]:
        prompt = draw(st.integers(1, 300))
        total = prompt + draw(st.integers(0, 100))
        kind = draw(st.sampled_from(["decode", "decode", "decode", "in_flight", "prefill"]))
        if kind == "decode":
            computed = total - 1
        elif kind == "in_flight":
            computed = total
        else:
            computed = draw(st.integers(0, total))
        blocks = max(0, ceil_div(computed, bs) + draw(st.sampled_from([0, 0, 0, -1, 1])))
        running.append(
            Req(rid, prompt, computed, total, blocks, draw(st.integers(-2, 2)), draw(st.integers(0, 20)),
                status=int(Status.RUNNING))
        )
    waiting = []
    hits: dict[int, tuple[int, int]] = {}
    with_hits = draw(st.booleans())
    for rid in ids[n_run:]:
        prompt = draw(st.integers(1, 500))
        total = prompt + draw(st.sampled_from([0, 0, draw(st.integers(0, 50))]))
        computed = draw(st.sampled_from([0, 0, 0, draw(st.integers(0, total))]))
        blocks = ceil_div(computed, bs) if computed else 0
        status = draw(st.sampled_from([Status.WAITING, Status.PREEMPTED, Status.SWAPPED]))
        waiting.append(Req(rid, prompt, computed, total, blocks, draw(st.integers(-2, 2)), draw(st.integers(0, 20)),
                           status=int(status)))
        if with_hits and draw(st.integers(0, 2)):
            hit = draw(st.integers(0, ceil_div(total, bs) + 1)) * bs + draw(st.sampled_from([0, 0, 1, bs // 2]))
            hits[rid] = (hit, draw(st.integers(0, hit // bs)))
    return Scenario(facts, running, waiting, hits)


PIPELINES = {
    "base": ("base", {"admit_chunk": True}),
    "base-priority": ("base-priority", {"priority": True, "admit_chunk": True}),
    "base-unchunked": ("reject-oversized,order-fcfs,schedule-running,admit-greedy{chunk=false},verify-step", {}),
    "options": (
        ("reject-oversized,order-fcfs,schedule-running{chunk=false},admit-greedy{chunk=true stop-at-first=true},"
        "verify-step"),
        {"run_chunk": False, "admit_chunk": True, "stop_at_first": True},
    ),
    "greedy-chunk": (
        "reject-oversized,order-priority,schedule-running,admit-greedy{chunk=true},verify-step",
        {"priority": True, "admit_chunk": True},
    ),
}


def check_wiring(module: ModuleOp) -> None:
    """Each decision is taken on the set the docstrings say: rejections on the queue, waiting
    decisions on the sorted set, running ones on the running queue, block effects on the
    scheduled set (and only for requests of it)."""
    (step_op,) = steps_of(module)
    for op in step_op.body.block.ops:
        if isinstance(op, (QueueOp, YieldOp, MatchOp)):
            continue
        source = op.operands[0].owner
        queue = Step(step_op).root(op.operands[0]).queue.data
        if op.name in ("req.reject", "req.select"):
            assert isinstance(source, QueueOp) and queue == "waiting", op.name
        elif op.name == "req.sort":
            assert isinstance(source, (QueueOp, SelectOp)) and queue == "waiting"
        elif op.name in ("req.schedule", "req.defer"):
            assert isinstance(source, SortOp if queue == "waiting" else QueueOp), (op.name, queue)
        elif op.name in ("mem.alloc", "mem.share"):
            assert isinstance(source, ScheduleOp), op.name
            assert set(op.ids.tolist()) <= set(source.ids.tolist())
        elif op.name == "req.preempt":
            assert isinstance(source, QueueOp) and queue == "running", (op.name, queue)
        else:
            raise AssertionError(f"unexpected op {op.name} in a base step")


@pytest.mark.parametrize("pipeline", list(PIPELINES))
@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_pipeline_matches_the_reference(pipeline: str, scenario: Scenario) -> None:
    spec, options = PIPELINES[pipeline]
    module = run(scenario.module(), spec)  # verify_each=True; the pipeline ends with verify-step
    check_wiring(module)
    got = decisions_of(module)
    want = reference(scenario.facts, scenario.running, scenario.waiting, scenario.hits, **options)
    assert got == want
    # Every request has exactly one decision.
    decided = [i for i, _ in got.rejected + got.run_tokens + got.run_defer + got.wait_tokens + got.wait_defer]
    decided += got.run_preempt
    assert sorted(decided) == sorted(r.id for r in scenario.running + scenario.waiting)
    # The budgets hold (verify-step checked them too; this is the plain sum).
    f = scenario.facts
    tokens = [t for _, t in got.run_tokens + got.wait_tokens]
    assert sum(tokens) <= f.token_budget and len(tokens) <= f.max_seqs
    taken = sum(b for _, b in got.run_alloc + got.wait_alloc) + sum(r for _, _, r in got.wait_share)
    assert taken <= f.free_blocks


def test_the_scenarios_reach_every_reason() -> None:
    """The reference comparison is only as good as the cases it sees: check they cover the rules."""
    seen: set[str] = set()
    wanted = {
        "run:BUDGET", "run:MAX_SEQS", "run:MEMORY", "run:IN_FLIGHT",
        "wait:BUDGET", "wait:MAX_SEQS", "wait:MEMORY", "wait:IN_FLIGHT",
        "TOO_LONG", "EXCEEDS_CACHE", "share", "revived", "decode", "mixed", "preempt",
    }

    def covers_every_reason(scenario: Scenario) -> bool:
        want = reference(scenario.facts, scenario.running, scenario.waiting, scenario.hits)
        seen.update(f"run:{Reason(r).name}" for _, r in want.run_defer)
        seen.update(f"wait:{Reason(r).name}" for _, r in want.wait_defer)
        seen.update(Reason(r).name for _, r in want.rejected)
        if want.wait_share:
            seen.add("share")
        if any(r for _, _, r in want.wait_share):
            seen.add("revived")
        if want.run_phase:
            seen.add(want.run_phase)
        if want.run_preempt:
            seen.add("preempt")
        return wanted <= seen

    # Up to 2000 examples, stopping once every reason was seen (~600 with hypothesis 6.15x: drawing
    # the other 1,400 took ~40 s): with 500, the derandomized draw of one hypothesis release (6.170)
    # never hit a shared prefix block, while another (6.155) did; coverage must not hang on the release.
    draw_until_covered(scenarios(), covers_every_reason, 2000)
    assert wanted <= seen, f"never reached: {sorted(wanted - seen)}"


def test_reference_on_a_hand_checked_step() -> None:
    """The reference itself, on a step small enough to check by hand (and the pipeline agrees)."""
    bs = 16
    facts = make_facts(block_size=bs, token_budget=50, max_seqs=4, free_blocks=4, max_model_len=200, total_blocks=10)
    running = [running_req(1, 16, block_size=bs), running_req(2, 20, block_size=bs, left=0)]
    waiting = [
        Req(3, prompt=300, arrival=0),  # too long
        Req(4, prompt=40, arrival=2),  # 40 tokens need 3 blocks; only 2 are left by then
        Req(5, prompt=5, arrival=1),  # first by arrival: 5 tokens, 1 block
        Req(6, prompt=4, arrival=3),  # greedy: skips request 4 and takes the last block
    ]
    want = reference(facts, running, waiting, {})
    assert want.rejected == [(3, int(TOO_LONG))] and want.kept == [4, 5, 6]
    assert want.order == [5, 4, 6]
    assert want.run_phase == "decode"
    assert want.run_tokens == [(1, 1)] and want.run_alloc == [(1, 1)] and want.run_defer == [(2, int(IN_FLIGHT))]
    assert want.wait_tokens == [(5, 5), (6, 4)] and want.wait_alloc == [(5, 1), (6, 1)]
    assert want.wait_defer == [(4, int(MEMORY))]
    assert want.batch == [[1], [5, 6]]
    assert decisions_of(run(make_module(facts, running, waiting), "base")) == want


# ================================================================ verify-step
STEP = """\
builtin.module {{
  sched.step 7 {{token_budget = {budget}, max_seqs = {max_seqs}, block_size = 16, free_blocks = {free}, cached_free_blocks = {cached}, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []}} {{
    %run = req.queue running {{id = [1, 2, 5], prompt = [10, 20, 9], computed = [12, 21, 15], total = [13, 22, 16], max_tokens = [32, 32, 32], priority = [0, 0, 0], arrival = [5, 6, 1], status = [running, running, running], blocks = [1, 2, 1]}}
    %w = req.queue waiting {{id = [3, 4], prompt = [40, 50], computed = [0, 0], total = [40, 50], max_tokens = [8, 8], priority = [1, 0], arrival = [7, 8], status = [waiting, waiting], blocks = [0, 0]}}
{body}
  }}
}}
"""

LEGAL_BODY = """\
    %a = req.schedule %run decode {id = [1, 2], tokens = [1, 1]}
    %p = req.preempt %run recompute {id = [5]}
    mem.free %p {id = [5], blocks = [1]}
    %b = req.schedule %w prefill {id = [3], tokens = [40]}
    mem.alloc %b {id = [3], blocks = [3]}
    req.defer %w {id = [4], reason = [budget]}
    sched.yield %a, %b"""


def verify(body: str = LEGAL_BODY, spec: str = "verify-step", template: str = STEP, **facts: int) -> None:
    values = {"budget": 64, "max_seqs": 4, "free": 10, "cached": 0}
    values.update(facts)
    module = parse_step_text(template.format(body=body, **values))
    PassManager.parse(spec, verify_each=True).run(module)


def refused(body: str = LEGAL_BODY, **facts: int) -> str:
    with pytest.raises(PassFailure) as info:
        verify(body, **facts)
    assert info.value.pass_name == "verify-step"
    message = str(info.value)
    assert message.startswith("pass 'verify-step': step 7 is illegal: ")
    return message


def test_verify_accepts_the_legal_step() -> None:
    verify()
    verify(budget=42, max_seqs=3, free=2)  # exactly at every limit (2 free + 1 given back = 3 taken)


def test_verify_refuses_over_budget() -> None:
    assert "42 tokens scheduled, token budget is 41" in refused(budget=41)


def test_verify_refuses_over_max_seqs() -> None:
    assert "3 requests scheduled, max_seqs is 2" in refused(max_seqs=2)


def test_verify_refuses_a_request_scheduled_twice() -> None:
    again = "    %c = req.schedule %run decode {id = [2], tokens = [1]}\n"
    body = LEGAL_BODY.replace("    sched.yield %a, %b", again + "    sched.yield %a, %b, %c")
    message = refused(body)
    assert "request(s) [2] scheduled more than once" in message
    assert "request(s) [2] of queue 'running' have more than one decision" in message


def test_verify_refuses_more_blocks_than_free_plus_given() -> None:
    assert "3 blocks taken, but only 1 free + 1 given back this step" in refused(free=1)
    body = LEGAL_BODY.replace("    mem.free %p {id = [5], blocks = [1]}\n", "")
    assert "3 blocks taken, but only 2 free + 0 given back this step" in refused(body, free=2)


def test_verify_counts_revived_shares_as_taken() -> None:
    body = LEGAL_BODY.replace(
        "    mem.alloc %b {id = [3], blocks = [3]}",
        "    mem.share %b {id = [3], blocks = [1], revived = [1]}\n    mem.alloc %b {id = [3], blocks = [2]}",
    )
    verify(body, free=2)  # 2 + 1 revived = 3 taken, 2 free + 1 given
    assert "3 blocks taken, but only 1 free + 1 given back" in refused(body, free=1)


def test_verify_refuses_evicting_more_than_cached_free() -> None:
    body = LEGAL_BODY.replace("    sched.yield", "    mem.evict 3\n    sched.yield")
    verify(body, cached=3)
    assert "3 blocks evicted, only 2 cached-free" in refused(body, cached=2)


def test_verify_refuses_more_tokens_than_left_to_compute() -> None:
    body = LEGAL_BODY.replace("tokens = [1, 1]", "tokens = [1, 2]")
    assert "request(s) [2] scheduled more tokens than they have left to compute" in refused(body)


def test_verify_refuses_too_few_blocks() -> None:
    body = LEGAL_BODY.replace("mem.alloc %b {id = [3], blocks = [3]}", "mem.alloc %b {id = [3], blocks = [2]}")
    assert "request(s) [3] hold too few blocks for the tokens scheduled" in refused(body)
    # Request 5 decoding: token 16 fits its block, token 17 needs a second one.
    body = LEGAL_BODY.replace("{id = [1, 2], tokens = [1, 1]}", "{id = [1, 2, 5], tokens = [1, 1, 1]}")
    preempt = "    %p = req.preempt %run recompute {id = [5]}\n    mem.free %p {id = [5], blocks = [1]}\n"
    assert preempt in body
    body = body.replace(preempt, "")
    verify(body)
    crossing = STEP.replace(
        "computed = [12, 21, 15], total = [13, 22, 16]", "computed = [12, 21, 16], total = [13, 22, 17]"
    )
    assert crossing != STEP
    with pytest.raises(PassFailure, match=r"request\(s\) \[5\] hold too few blocks"):
        verify(body, template=crossing)
    with_alloc = body.replace("    sched.yield", "    mem.alloc %a {id = [5], blocks = [1]}\n    sched.yield")
    verify(with_alloc, template=crossing)


def test_verify_refuses_a_request_with_no_decision() -> None:
    body = LEGAL_BODY.replace("    req.defer %w {id = [4], reason = [budget]}\n", "")
    message = refused(body)
    assert "request(s) [4] of queue 'waiting' have no decision" in message
    verify(body, spec="verify-step{complete=false}")


def test_verify_refuses_a_request_with_two_decisions() -> None:
    body = LEGAL_BODY.replace("{id = [4], reason = [budget]}", "{id = [4, 3], reason = [budget, memory]}")
    assert "request(s) [3] of queue 'waiting' have more than one decision" in refused(body)
    # complete=false does not look at decisions at all.
    verify(body, spec="verify-step{complete=false}")


def test_verify_reports_every_problem_at_once() -> None:
    body = LEGAL_BODY.replace("    req.defer %w {id = [4], reason = [budget]}\n", "")
    message = refused(body, budget=10, max_seqs=1)
    assert "token budget is 10" in message and "max_seqs is 1" in message and "no decision" in message


def test_verify_takes_prefix_hits_as_computed() -> None:
    hit = "    mem.match %w {id = [3], hit = [32]}\n"
    body = hit + LEGAL_BODY.replace(
        "    %b = req.schedule %w prefill {id = [3], tokens = [40]}\n    mem.alloc %b {id = [3], blocks = [3]}",
        "    %b = req.schedule %w prefill {id = [3], tokens = [8]}\n"
        "    mem.share %b {id = [3], blocks = [2], revived = [0]}\n    mem.alloc %b {id = [3], blocks = [1]}",
    )
    verify(body)
    assert "scheduled more tokens than they have left" in refused(body.replace("tokens = [8]", "tokens = [9]"))
    assert "hold too few blocks" in refused(body.replace("blocks = [2], revived", "blocks = [1], revived"))
    # A hit that is not shared is not computed: the request computes its whole prompt.
    verify(hit + LEGAL_BODY)


def test_verify_step_is_what_base_ends_with() -> None:
    """A base step, tampered with after the fact, is refused by a second verify-step."""
    bs = 16
    module = run(make_module(make_facts(block_size=bs, token_budget=10), [running_req(1, 3, block_size=bs)],
                             [Req(2, prompt=9)]), "base")
    step = Step(steps_of(module)[0])
    (sched,) = [op for op in step.ops_of(ScheduleOp) if op.phase.data == "prefill"]
    decided_on = sched.operands[0]  # the sorted waiting set
    step.schedule(decided_on, "prefill", np.asarray([2], dtype=np.int64), np.asarray([1], dtype=np.int64))
    with pytest.raises(PassFailure, match=r"request\(s\) \[2\] scheduled more than once"):
        PassManager.parse("verify-step").run(module)
    assert sched.ids.tolist() == [2]


def test_verify_adds_up_two_allocations_of_one_request() -> None:
    """Step.usage charges every mem.alloc, so the block check must credit every one too."""
    body = LEGAL_BODY.replace(
        "    mem.alloc %b {id = [3], blocks = [3]}",
        "    mem.alloc %b {id = [3], blocks = [1]}\n    mem.alloc %b {id = [3], blocks = [2]}",
    )
    verify(body)
    assert "hold too few blocks" in refused(body.replace("blocks = [2]", "blocks = [1]"))


def test_match_op_is_only_read_not_charged() -> None:
    """A mem.match alone changes no budget (its blocks are charged only when shared)."""
    module = make_module(make_facts(), waiting=[Req(1, prompt=10)], hits={1: (64, 4)})
    step = Step(steps_of(module)[0])
    assert len(step.ops_of(MatchOp)) == 1
    usage = step.usage()
    assert (usage.tokens, usage.seqs, usage.blocks_taken, usage.blocks_given) == (0, 0, 0, 0)


def test_reject_op_reasons_are_rejection_reasons() -> None:
    module = run(make_module(make_facts(max_model_len=5), waiting=[Req(1, prompt=6)]), "reject-oversized")
    step = Step(steps_of(module)[0])
    (reject,) = step.ops_of(RejectOp)
    assert reject.col("reason").tolist() == [int(TOO_LONG)]
    assert not step.ops_of(DeferOp)


def test_verify_refuses_a_schedule_missing_from_the_batch() -> None:
    message = refused(LEGAL_BODY.replace("sched.yield %a, %b", "sched.yield %a"))
    assert "request(s) [3] are scheduled but not in the batch (sched.yield)" in message


def test_verify_counts_hits_only_for_requests_that_share_them() -> None:
    """A pass that ignores the prefix cache recomputes the whole prompt: legal."""
    verify("    mem.match %w {id = [3], hit = [32]}\n" + LEGAL_BODY)


def test_a_second_admission_finds_nothing_pending() -> None:
    """After admit-greedy decided every waiting request, the queue has no pending set."""
    module = run(make_module(make_facts(), [], [Req(1, prompt=10), Req(2, prompt=10)]), "base")
    step = Step(steps_of(module)[0])
    assert step.pending("waiting") is None
    PassManager.parse("admit-greedy,verify-step").run(module)  # decides nothing twice


def test_partly_decided_set_without_keep_is_reported() -> None:
    module = make_module(make_facts(), [], [Req(1, prompt=10), Req(2, prompt=10)])
    step = Step(steps_of(module)[0])
    waiting = step.pending("waiting")
    step.defer(waiting, np.asarray([1], dtype=np.int64), np.asarray([int(Reason.POLICY)], dtype=np.int64))
    with pytest.raises(ValueError, match=r"requests \[2\] of queue 'waiting' were left undecided"):
        step.pending("waiting")


# ---------------------------------------------------------------- kernels
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-5, 40), max_size=30), st.lists(st.integers(-5, 40), max_size=30))
def test_count_members_matches_numpy_isin(values: list[int], pool: list[int]) -> None:
    """admit-greedy counts running requests already decided with a kernel instead of np.isin."""
    from schedir.passes.kernels import count_members

    v, p = np.array(values, dtype=np.int64), np.array(pool, dtype=np.int64)
    assert count_members(v, p) == int(np.isin(v, p).sum())
