"""Seed-style `OptimizationPass`es wrapped by `as_step_pass`: their order and filter in the IR, and their errors."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from conftest import make_step

from schedir.dialects.codes import Reason
from schedir.dialects.req import DeferOp, RejectOp, ScheduleOp, SelectOp, SortOp
from schedir.dialects.sched import StepFacts
from schedir.ir.errors import PassFailure, PipelineError
from schedir.ir.pass_base import StepPass
from schedir.ir.pipeline import PassManager
from schedir.ir.step import Step, steps_of
from schedir.ir.textio import parse_step_text, print_ir
from schedir.passes import register_pass
from schedir.passes.seed import OptimizationPass, RequestInfo, as_step_pass
from schedir.tools.cli import EXIT_OK, main


class ShortestPromptFirst(OptimizationPass):
    """Shortest prompt first; prompts longer than `max_prompt` wait."""

    name = "spf"

    def __init__(self, max_prompt: int = 100) -> None:
        self.max_prompt = max_prompt
        self.seen: list[list[RequestInfo]] = []
        self.facts: list[StepFacts] = []

    def optimize(self, requests: list[RequestInfo], facts: StepFacts) -> list[RequestInfo]:
        self.seen.append(list(requests))
        self.facts.append(facts)
        kept = [r for r in requests if r.prompt_len <= self.max_prompt]
        return sorted(kept, key=lambda r: r.prompt_len)


class Misbehaving(OptimizationPass):
    """Returns whatever `make` builds from the requests."""

    name = "misbehaving"

    def __init__(self, make: Callable[[list[RequestInfo]], object]) -> None:
        self.make = make

    def optimize(self, requests, facts):  # type: ignore[override]
        return self.make(requests)


PROMPTS = [50, 20, 200, 30, 5000]  # waiting ids 3..7; 7 is longer than the model (rejected first)


def seed_step():
    return make_step(
        2, 5,
        waiting={"prompt": PROMPTS, "total": PROMPTS},
        token_budget=64, max_seqs=8, free_blocks=50, total_blocks=100, max_model_len=1024,
    )


def ops_of(module, kind):
    return [op for op in steps_of(module)[0].body.block.ops if isinstance(op, kind)]


@pytest.fixture
def spf(tmp_registry):
    seed = ShortestPromptFirst(max_prompt=100)
    cls = as_step_pass(seed)
    tmp_registry[cls.name] = cls
    return seed, cls, tmp_registry


def test_seed_order_and_filter_in_the_ir(spf):
    seed, _cls, registry = spf
    module = seed_step()
    PassManager.parse(
        "reject-oversized,spf,schedule-running,admit-greedy,verify-step", registry=registry, verify_each=True
    ).run(module)

    # The seed saw the requests reject-oversized left, with their columns.
    (seen,) = seed.seen
    assert [r.request_id for r in seen] == [3, 4, 5, 6]
    assert [r.prompt_len for r in seen] == [50, 20, 200, 30]
    assert [r.arrival for r in seen] == [100, 101, 102, 103]
    assert all(r.computed == 0 and r.hit_tokens == 0 for r in seen)
    assert (seed.facts[0].step, seed.facts[0].token_budget, seed.facts[0].max_seqs) == (0, 64, 8)

    text = print_ir(module)
    # Its order is a req.sort keyed "seed:spf": the kept requests in its order, then the ones it left out.
    assert re.search(r'req\.sort %\w+ by \["seed:spf"\] \{id = \[4, 6, 3, 5\]\}', text), text
    (sort,) = ops_of(module, SortOp)
    assert sort.keys == ("seed:spf",)
    assert sort.ids.tolist() == [4, 6, 3, 5]

    # The request it left out is deferred with reason policy; the rest stay pending.
    defers = {tuple(d.ids.tolist()): d.col("reason").tolist() for d in ops_of(module, DeferOp)}
    assert defers[(5,)] == [int(Reason.POLICY)]
    policy_defer = next(d for d in ops_of(module, DeferOp) if d.ids.tolist() == [5])
    assert policy_defer.operands[0] is sort.result
    assert [s.ids.tolist() for s in ops_of(module, SelectOp)] == [[3, 4, 5, 6], [4, 6, 3]]
    assert re.search(r"req\.defer %\w+ \{id = \[5\], reason = \[policy\]\}", text)

    # Admission follows the seed's order: 4 then 6 fit the budget; 3 (50 tokens) gets the 12 left
    # as a chunk (admit-greedy chunks by default).
    prefill = [s for s in ops_of(module, ScheduleOp) if s.phase.data == "prefill"]
    assert [s.ids.tolist() for s in prefill] == [[4, 6, 3]]
    assert prefill[0].col("tokens").tolist() == [20, 30, 12]
    assert (3,) not in defers
    (reject,) = ops_of(module, RejectOp)
    assert reject.ids.tolist() == [7] and reject.col("reason").tolist() == [int(Reason.TOO_LONG)]
    assert steps_of(module)[0].fact_set() >= {"order", "waiting-scheduled", "budget-legal"}


def test_fcfs_admits_differently(spf):
    """The same step under base admits by arrival: the seed's order is what changed the outcome."""
    module = seed_step()
    PassManager.parse("base").run(module)
    prefill = [s for s in ops_of(module, ScheduleOp) if s.phase.data == "prefill"]
    assert [s.ids.tolist() for s in prefill] == [[3, 4]]
    assert prefill[0].col("tokens").tolist() == [50, 12]  # 4 (20 tokens) gets what 3 left: a chunk


def test_seed_pass_satisfies_order_for_admission(spf):
    _, cls, registry = spf
    assert cls.provides == {"order"} and cls.requires == frozenset()
    assert cls.summary() == "Shortest prompt first; prompts longer than `max_prompt` wait. (seed pass)"
    assert issubclass(cls, StepPass) and cls.options() == []
    with pytest.raises(PipelineError, match="requires 'order', which no earlier pass provides; add one of: .*spf"):
        PassManager.parse("schedule-running,admit-greedy", registry=registry).run(seed_step())


def test_seed_pass_declared_requirements_are_checked(tmp_registry):
    cls = as_step_pass(ShortestPromptFirst(), name="spf-strict", requires=("admissible",), invalidates=("x",))
    tmp_registry[cls.name] = cls
    assert cls.name == "spf-strict" and cls.invalidates == {"x"}
    with pytest.raises(PipelineError, match=r"pass 'spf-strict' \(#1\) requires 'admissible'.*reject-oversized"):
        PassManager.parse("spf-strict,schedule-running,admit-greedy", registry=tmp_registry).run(seed_step())
    PassManager.parse("reject-oversized,spf-strict", registry=tmp_registry).run(seed_step())


def test_seed_keeping_everything_emits_no_defer(tmp_registry):
    seed = ShortestPromptFirst(max_prompt=10_000)
    cls = as_step_pass(seed, name="spf-all")
    tmp_registry[cls.name] = cls
    module = seed_step()
    PassManager.parse("reject-oversized,spf-all", registry=tmp_registry, verify_each=True).run(module)
    (sort,) = ops_of(module, SortOp)
    assert sort.ids.tolist() == [4, 6, 3, 5]
    assert ops_of(module, DeferOp) == []
    assert [s.ids.tolist() for s in ops_of(module, SelectOp)] == [[3, 4, 5, 6]]  # reject-oversized's only


def test_seed_on_an_empty_queue(spf):
    seed, _, registry = spf
    module = make_step(2, 0)
    PassManager.parse("spf,schedule-running,admit-greedy,verify-step", registry=registry, verify_each=True).run(module)
    assert seed.seen == [[]]


def test_seed_sees_prefix_hits(spf):
    seed, _, registry = spf
    text = """
sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %w = req.queue waiting {id = [3, 4], prompt = [40, 50], computed = [0, 0], total = [40, 50], max_tokens = [8, 8], priority = [1, 0], arrival = [7, 8], status = [waiting, waiting], blocks = [0, 0]}
  mem.match %w {id = [3, 4], hit = [16, 32]}
  sched.yield
}
"""
    PassManager.parse("spf", registry=registry, verify_each=True).run(parse_step_text(text))
    assert [(r.request_id, r.hit_tokens) for r in seed.seen[0]] == [(3, 16), (4, 32)]


def test_seed_class_is_instantiated_and_name_can_be_overridden():
    cls = as_step_pass(ShortestPromptFirst, name="spf-2")
    assert cls.name == "spf-2"
    module = seed_step()
    cls().apply(None, module)  # type: ignore[arg-type]  # as a plain xDSL ModulePass
    (sort,) = ops_of(module, SortOp)
    assert sort.keys == ("seed:spf-2",)


def test_seed_pass_registered_globally_runs_from_the_cli(tmp_registry, tmp_path, capsys):
    from conftest import SMALL_STEP_TEXT

    register_pass(as_step_pass(ShortestPromptFirst(max_prompt=45)))
    assert "spf" in tmp_registry
    path = tmp_path / "step.mlir"
    path.write_text(SMALL_STEP_TEXT)
    assert main(["opt", str(path), "-p", "spf,schedule-running,admit-greedy,verify-step"]) == EXIT_OK
    out, err = capsys.readouterr()
    assert err == ""
    assert 'by ["seed:spf"] {id = [3, 4]}' in out
    assert re.search(r"req\.defer %\w+ \{id = \[4\], reason = \[policy\]\}", out)
    assert main(["passes"]) == EXIT_OK
    listing = capsys.readouterr().out
    assert "spf\n    Shortest prompt first; prompts longer than `max_prompt` wait. (seed pass)\n" in listing


# ---------------------------------------------------------------- errors
def _extra(requests: list[RequestInfo], rid: int) -> RequestInfo:
    return RequestInfo(rid, 1, 0, 1, 1, 0, 0)


class Boom(Exception):
    pass


def _raise(requests):
    raise Boom(f"cannot order request {requests[1].request_id}")


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda rs: rs + [_extra(rs, 999)], "returned request 999, which is not in the waiting set"),
        (lambda rs: [rs[1], rs[0], rs[1]], "returned request 4 twice"),
        (lambda rs: tuple(rs), "must return a list of RequestInfo, returned tuple"),
        (lambda rs: None, "must return a list of RequestInfo, returned NoneType"),
        (lambda rs: [r.request_id for r in rs], "returned 3, not a RequestInfo"),
        (_raise, "raised Boom: cannot order request 4"),
    ],
    ids=["unknown-id", "duplicate", "tuple", "none", "not-request-info", "raises"],
)
def test_seed_errors_name_the_pass_and_request(tmp_registry, make, expected):
    cls = as_step_pass(Misbehaving(make))
    tmp_registry[cls.name] = cls
    module = make_step(2, 2)  # waiting ids 3, 4
    before = print_ir(module)
    with pytest.raises(PassFailure) as info:
        PassManager.parse("misbehaving,schedule-running,admit-greedy", registry=tmp_registry).run(module)
    assert info.value.pass_name == "misbehaving"
    assert str(info.value) == f"pass 'misbehaving': {expected}"
    # Nothing of the failed seed pass reached the IR.
    assert print_ir(module) == before


def test_seed_exception_is_chained(tmp_registry):
    cls = as_step_pass(Misbehaving(_raise))
    with pytest.raises(PassFailure) as info:
        cls().run(Step(steps_of(make_step(2, 2))[0]))
    assert isinstance(info.value.__cause__, Boom)


def test_seed_request_from_another_queue_is_unknown(tmp_registry):
    # Request 1 is running, not waiting: the seed may only return what it was given.
    cls = as_step_pass(Misbehaving(lambda rs: rs + [_extra(rs, 1)]))
    with pytest.raises(PassFailure, match="returned request 1, which is not in the waiting set"):
        cls().run(Step(steps_of(make_step(2, 2))[0]))


def test_seed_pass_without_name_is_refused():
    class Nameless(OptimizationPass):
        def optimize(self, requests, facts):  # type: ignore[override]
            return requests

    with pytest.raises(ValueError, match="needs a name"):
        as_step_pass(Nameless)
    with pytest.raises(ValueError, match="needs a name"):
        as_step_pass(Nameless(), name="")
    assert as_step_pass(Nameless, name="named").name == "named"


def test_register_pass_refuses_a_clash_and_a_nameless_pass(tmp_registry):
    first = as_step_pass(ShortestPromptFirst())
    register_pass(first)
    register_pass(first)  # the same class again is fine
    with pytest.raises(ValueError, match="a pass named 'spf' is already registered"):
        register_pass(as_step_pass(ShortestPromptFirst()))
    nameless = as_step_pass(ShortestPromptFirst())
    nameless.name = ""  # type: ignore[misc]
    with pytest.raises(ValueError, match="has no name"):
        register_pass(nameless)
