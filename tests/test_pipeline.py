"""The pass manager: every refusal (with a message naming passes and facts), facts, verification, instrumentation."""

from __future__ import annotations

import io
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from conftest import BASE_PASSES, SMALL_STEP_TEXT, make_step
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import VerifyException

from schedir.dialects.req import ScheduleOp, SortOp
from schedir.ir.errors import PassFailure, PipelineError, SchedirError
from schedir.ir.pass_base import StepPass
from schedir.ir.pipeline import Instrumentation, PassManager, check_pipeline, parse_passes
from schedir.ir.step import Step, steps_of
from schedir.ir.textio import parse_step_file, parse_step_text, print_ir
from schedir.passes import PASSES
from schedir.passes.presets import PRESETS


# ---------------------------------------------------------------- test-only passes
@dataclass(frozen=True)
class ShuffleTest(StepPass):
    """Reverse the waiting queue (breaks any order established before)."""

    name: ClassVar[str] = "shuffle-test"
    provides: ClassVar[frozenset[str]] = frozenset({"shuffled"})
    invalidates: ClassVar[frozenset[str]] = frozenset({"order"})

    def run(self, step: Step) -> None:
        pending = step.pending("waiting")
        if pending is not None:
            step.sort(pending, ("shuffle",), step.ids(pending)[::-1].copy())


@dataclass(frozen=True)
class NeedsMagic(StepPass):
    """Requires a fact no pass provides."""

    name: ClassVar[str] = "needs-magic"
    requires: ClassVar[frozenset[str]] = frozenset({"magic"})

    def run(self, step: Step) -> None:
        pass


@dataclass(frozen=True)
class BuggyTest(StepPass):
    """Schedules a request that is not in its operand set: invalid IR."""

    name: ClassVar[str] = "buggy-test"

    def run(self, step: Step) -> None:
        pending = step.pending("waiting")
        assert pending is not None
        step.schedule(pending, "prefill", np.array([999], dtype=np.int64), np.array([1], dtype=np.int64))


@pytest.fixture
def registry(tmp_registry):
    for cls in (ShuffleTest, NeedsMagic, BuggyTest):
        tmp_registry[cls.name] = cls
    return tmp_registry


def small() -> ModuleOp:
    return parse_step_text(SMALL_STEP_TEXT, "small.mlir")


def refused(spec: str, module: ModuleOp | None = None, **kwargs) -> str:
    """Parse and run `spec`; it must be refused before anything changes the module. Returns the message."""
    module = module if module is not None else small()
    before = print_ir(module)
    with pytest.raises(PipelineError) as info:
        PassManager.parse(spec, **kwargs).run(module)
    assert print_ir(module) == before, "a refused pipeline must not touch the IR"
    return str(info.value)


# ---------------------------------------------------------------- refusals: parsing
def test_unknown_pass_suggests_the_closest_name():
    message = refused("reject-oversized,order-fcf,admit-greedy")
    assert "unknown pass 'order-fcf'" in message
    assert "did you mean 'order-fcfs'?" in message
    # ... and lists what exists, passes and presets both.
    for name in PASSES:
        assert name in message
    for name in PRESETS:
        assert name in message


def test_unknown_pass_suggests_a_preset():
    message = refused("bse")
    assert "unknown pass 'bse'" in message
    assert "did you mean 'base'?" in message


def test_unknown_pass_without_close_match_has_no_suggestion():
    message = refused("zzzzzz")
    assert "unknown pass 'zzzzzz'" in message
    assert "did you mean" not in message


def test_unknown_pass_from_a_private_registry_is_not_known_globally(registry):
    PassManager.parse("shuffle-test", registry=registry)  # fine with the registry
    assert "shuffle-test" not in PASSES  # the global table (imported before the fixture swapped it)
    with pytest.raises(PipelineError, match="unknown pass 'shuffle-test'"):
        parse_passes("shuffle-test", PASSES)


@pytest.mark.parametrize(
    ("spec", "pass_name", "option_hint"),
    [
        ("order-fcfs{queue=1}", "order-fcfs", "queue: str = waiting"),
        ("admit-greedy{chunk=3}", "admit-greedy", "chunk: bool"),
        ('admit-greedy{chunk="yes"}', "admit-greedy", "stop-at-first: bool"),
    ],
)
def test_bad_option_type(spec, pass_name, option_hint):
    message = refused(spec)
    assert f"pass '{pass_name}': bad option" in message
    assert "options:" in message and option_hint in message


def test_unknown_option():
    message = refused("order-fcfs,admit-greedy{bogus=1}")
    assert "pass 'admit-greedy': bad option" in message
    assert "bogus" in message
    assert "chunk: bool" in message and "queue: str" in message


def test_good_options_are_parsed():
    (admit, order) = parse_passes("admit-greedy{chunk=true stop-at-first=true},order-fcfs{queue=running}")
    assert (admit.chunk, admit.stop_at_first, admit.queue) == (True, True, "waiting")
    assert order.queue == "running"


@pytest.mark.parametrize("spec", ["order-fcfs{", "order-fcfs,{x=1}", "order-fcfs{queue=}"])
def test_malformed_spec(spec):
    message = refused(spec)
    assert f"cannot parse pipeline '{spec}'" in message


def test_empty_spec_is_no_passes():
    assert parse_passes("") == []
    assert parse_passes("   ") == []


# ---------------------------------------------------------------- refusals: dependencies
def test_requirement_nothing_before_provides_lists_providers():
    message = refused("schedule-running,admit-greedy")
    assert "pass 'admit-greedy' (#2) requires 'order'" in message
    assert "which no earlier pass provides" in message
    providers = message.split("add one of: ")[1].split(" before it")[0].split(", ")
    assert {"order-fcfs", "order-priority", "order-vllm", "order-slo", "mlfq-order"} <= set(providers)
    assert providers == sorted(providers)


def test_requirement_no_pass_provides(registry):
    message = refused("order-fcfs,needs-magic", registry=registry)
    assert "pass 'needs-magic' (#2) requires 'magic'" in message
    assert "no known pass provides it" in message


def test_requirement_provided_only_later():
    message = refused("admit-greedy,order-fcfs,schedule-running")
    assert "pass 'admit-greedy' (#1) requires 'order'" in message
    assert "provided only later, by 'order-fcfs' (#2)" in message
    assert "move it before 'admit-greedy'" in message


def test_requirement_provided_only_later_second_fact():
    # 'order' is met; 'running-scheduled' comes only from a later pass.
    message = refused("order-fcfs,admit-greedy,schedule-running")
    assert "pass 'admit-greedy' (#2) requires 'running-scheduled'" in message
    assert "provided only later, by 'schedule-running' (#3)" in message
    assert "move it before 'admit-greedy'" in message


def test_requirement_invalidated_by_an_earlier_pass(registry):
    message = refused("order-fcfs,schedule-running,shuffle-test,admit-greedy", registry=registry)
    assert "pass 'admit-greedy' (#4) requires 'order'" in message
    assert "'shuffle-test' invalidated it after 'order-fcfs' provided it" in message
    assert "run a pass that provides 'order' after 'shuffle-test'" in message


def test_requirement_invalidated_then_reestablished_is_accepted(registry):
    module = small()
    PassManager.parse(
        "order-fcfs,schedule-running,shuffle-test,order-priority,admit-greedy,verify-step",
        registry=registry,
        verify_each=True,
    ).run(module)
    assert "order" in steps_of(module)[0].fact_set()


def test_requirement_invalidated_when_the_input_provided_it(registry):
    module = small()
    steps_of(module)[0].facts = _facts("order", "running-scheduled")
    message = refused("shuffle-test,admit-greedy", module, registry=registry)
    assert "pass 'admit-greedy' (#2) requires 'order'" in message
    assert "'shuffle-test' invalidated it after the input step provided it" in message


def _facts(*names: str):
    from schedir.dialects.sched import facts_attr

    return facts_attr(names)


def test_requirement_satisfied_by_the_input_step_facts():
    text = SMALL_STEP_TEXT.replace("facts = []", 'facts = ["order", "running-scheduled"]')
    module = parse_step_text(text)
    manager = PassManager.parse("admit-greedy", verify_each=True)
    manager.run(module)
    facts = steps_of(module)[0].fact_set()
    assert facts == {"order", "running-scheduled", "waiting-scheduled"}
    # ... while the same pipeline on a step without those facts is refused.
    assert "requires 'order'" in refused("admit-greedy")


def test_check_pipeline_returns_facts_after():
    passes = parse_passes("base")
    assert check_pipeline(passes) == {"admissible", "order", "running-scheduled", "waiting-scheduled", "budget-legal"}
    assert check_pipeline(parse_passes("admit-greedy"), frozenset({"order", "running-scheduled", "x"})) == {
        "order", "running-scheduled", "x", "waiting-scheduled",
    }


def test_each_step_of_a_module_is_checked():
    first = small()
    second = parse_step_text(SMALL_STEP_TEXT.replace("facts = []", 'facts = ["order", "running-scheduled"]'))
    # Move the second module's step into the first: one step has the facts, one does not.
    step = steps_of(second)[0]
    step.detach()
    first.body.block.add_op(step)
    message = refused("admit-greedy", first)
    assert "pass 'admit-greedy' (#1) requires 'order'" in message


# ---------------------------------------------------------------- presets
def test_preset_expands_to_its_passes():
    assert [p.name for p in parse_passes("base")] == list(BASE_PASSES)
    assert [p.name for p in parse_passes("base-priority")] == [
        "reject-oversized", "order-priority", "schedule-running", "admit-greedy", "verify-step",
    ]
    assert PassManager.parse("base").spec == PassManager.parse(",".join(BASE_PASSES)).spec


def test_preset_inside_a_longer_pipeline():
    names = [p.name for p in parse_passes("base,verify-step{complete=false}")]
    assert names == [*BASE_PASSES, "verify-step"]


def test_preset_with_options_is_refused():
    message = refused("base{chunk=true}")
    assert "preset 'base' takes no options" in message


def test_a_pass_named_like_a_preset_wins(registry):
    @dataclass(frozen=True)
    class Base(StepPass):
        name: ClassVar[str] = "base"

        def run(self, step: Step) -> None:
            pass

    registry["base"] = Base
    assert [type(p) for p in parse_passes("base", registry)] == [Base]


# ---------------------------------------------------------------- input
def test_empty_module_is_refused():
    with pytest.raises(PipelineError, match="no sched.step"):
        PassManager.parse("base").run(ModuleOp([]))
    with pytest.raises(PipelineError, match="no sched.step"):
        PassManager.parse("base").run(parse_step_text("builtin.module {\n}\n"))


def test_errors_are_schedir_errors():
    assert issubclass(PipelineError, SchedirError) and issubclass(PassFailure, SchedirError)


# ---------------------------------------------------------------- facts recorded
def test_facts_recorded_after_each_pass(registry):
    module = small()
    seen: list[tuple[str, frozenset[str]]] = []
    manager = PassManager.parse("order-fcfs,schedule-running,shuffle-test,order-priority", registry=registry)
    manager.run(module, on_pass=lambda p, m: seen.append((p.name, steps_of(m)[0].fact_set())))
    assert seen == [
        ("order-fcfs", {"order"}),
        ("schedule-running", {"order", "running-scheduled"}),
        ("shuffle-test", {"running-scheduled", "shuffled"}),  # 'order' invalidated
        ("order-priority", {"order", "running-scheduled", "shuffled"}),
    ]
    # ... and printed, so a dump carries them.
    assert 'facts = ["order", "running-scheduled", "shuffled"]' in print_ir(module)


def test_facts_written_without_any_observer(registry):
    # No verify_each, no instrumentation, no on_pass: the final facts still reach the IR.
    module = small()
    PassManager.parse("base,shuffle-test", registry=registry).run(module)
    assert steps_of(module)[0].fact_set() == {
        "admissible", "budget-legal", "running-scheduled", "waiting-scheduled", "shuffled",
    }


def test_input_facts_are_kept():
    module = parse_step_text(SMALL_STEP_TEXT.replace("facts = []", 'facts = ["custom"]'))
    PassManager.parse("order-fcfs").run(module)
    assert steps_of(module)[0].fact_set() == {"custom", "order"}


def test_base_pipeline_result(small_step_text):
    module = parse_step_text(small_step_text)
    PassManager.parse("base", verify_each=True).run(module)
    text = print_ir(module)
    assert 'req.sort %w by ["arrival"] {id = [3, 4]}' in text
    assert "req.schedule %run decode {id = [1, 2], tokens = [1, 1]}" in text
    # 4 (50 tokens) gets the 22 left of the budget as a chunk (admit-greedy chunks by default).
    assert re.search(r"req\.schedule %\d+ prefill \{id = \[3, 4\], tokens = \[40, 22\]\}", text)
    assert "req.defer" not in text
    assert 'facts = ["admissible", "budget-legal", "order", "running-scheduled", "waiting-scheduled"]' in text


# ---------------------------------------------------------------- verify_each
def test_verify_each_catches_a_pass_that_leaves_invalid_ir(registry):
    module = small()
    manager = PassManager.parse("order-fcfs,buggy-test,schedule-running", registry=registry, verify_each=True)
    ran: list[str] = []
    with pytest.raises(PassFailure) as info:
        manager.run(module, on_pass=lambda p, m: ran.append(p.name))
    assert info.value.pass_name == "buggy-test"
    message = str(info.value)
    assert message.startswith("pass 'buggy-test': left invalid IR")
    assert "req.schedule" in message and "999" in message
    assert ran == ["order-fcfs"], "the pipeline stops at the failing pass"


def test_without_verify_each_invalid_ir_goes_unnoticed(registry):
    module = small()
    PassManager.parse("order-fcfs,buggy-test", registry=registry, verify_each=False).run(module)
    with pytest.raises(VerifyException, match="999"):
        module.verify()


def test_verify_step_failure_names_the_pass():
    with pytest.raises(PassFailure) as info:
        PassManager.parse("verify-step").run(small())
    assert info.value.pass_name == "verify-step"
    assert "request(s) [1, 2] of queue 'running' have no decision" in str(info.value)


# ---------------------------------------------------------------- timings
def test_timings_one_per_pass_in_order(registry):
    manager = PassManager.parse("base", verify_each=True)
    manager.run(small())
    assert [t.name for t in manager.timings] == list(BASE_PASSES)
    assert all(isinstance(t.seconds, float) for t in manager.timings)
    # A second run replaces (not extends) them.
    manager.run(small())
    assert [t.name for t in manager.timings] == list(BASE_PASSES)


# ---------------------------------------------------------------- instrumentation
HEADER = re.compile(r"^// -----// IR after (\S+) //----- //$", re.MULTILINE)


def test_print_ir_after_all():
    stream = io.StringIO()
    module = small()
    PassManager.parse("base", instrument=Instrumentation(print_ir_after_all=stream)).run(module)
    text = stream.getvalue()
    assert HEADER.findall(text) == ["input", *BASE_PASSES]
    # The last section is the final IR.
    assert text.rsplit("//----- //\n", 1)[1] == print_ir(module)


def test_dump_dir_one_file_per_pass(tmp_path):
    instrument = Instrumentation(dump_dir=tmp_path / "dumps")
    PassManager.parse("base", instrument=instrument).run(small())
    expected = ["00-input.mlir"] + [f"{i:02d}-{name}.mlir" for i, name in enumerate(BASE_PASSES, 1)]
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == expected
    assert [p.name for p in instrument.written] == expected
    # The input dump is the input.
    assert parse_step_file(tmp_path / "dumps" / "00-input.mlir") is not None
    assert print_ir(parse_step_file(tmp_path / "dumps" / "00-input.mlir")) == print_ir(small())


def test_dump_prefix(tmp_path):
    PassManager.parse("order-fcfs", instrument=Instrumentation(dump_dir=tmp_path, prefix="step-3-")).run(small())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-3-00-input.mlir", "step-3-01-order-fcfs.mlir"]


@pytest.mark.parametrize("svg", [None, False])
def test_dot_dir(tmp_path, svg):
    PassManager.parse("base", instrument=Instrumentation(dot_dir=tmp_path, svg=svg)).run(small())
    stems = ["00-input"] + [f"{i:02d}-{name}" for i, name in enumerate(BASE_PASSES, 1)]
    assert sorted(p.name for p in tmp_path.glob("*.dot")) == [f"{s}.dot" for s in stems]
    for path in tmp_path.glob("*.dot"):
        assert path.read_text().lstrip().startswith("digraph")
    svgs = sorted(p.name for p in tmp_path.glob("*.svg"))
    if svg is None and shutil.which("dot"):
        assert svgs == [f"{s}.svg" for s in stems]
        assert all("<svg" in (tmp_path / s).read_text() for s in svgs)
    else:
        assert svgs == []


def _replays(module: ModuleOp, spec: str, dump_dir: Path) -> None:
    """Run `spec` with dumps, then reload every dump and replay the rest: the same final IR each time."""
    manager = PassManager.parse(spec, verify_each=True, instrument=Instrumentation(dump_dir=dump_dir))
    manager.run(module)
    final = print_ir(module)
    names = [p.name for p in manager.passes]
    specs = [str(p.spec()) for p in manager.passes]
    dumps = sorted(dump_dir.glob("*.mlir"))
    assert len(dumps) == len(names) + 1
    for index, path in enumerate(dumps):
        assert path.name.endswith(f"-{names[index - 1]}.mlir" if index else "-input.mlir")
        reloaded = parse_step_file(path)  # parses and verifies
        rest = specs[index:]
        if rest:
            PassManager.parse(",".join(rest), verify_each=True).run(reloaded)
        assert print_ir(reloaded) == final, f"replaying from {path.name} gave a different result"


def test_any_dump_reloads_and_replays(tmp_path):
    _replays(small(), "base", tmp_path)


def test_replay_from_order_fcfs_dump(tmp_path):
    full = small()
    PassManager.parse("base", instrument=Instrumentation(dump_dir=tmp_path)).run(full)
    dumped = (tmp_path / "02-order-fcfs.mlir").read_text()
    assert 'facts = ["admissible", "order"]' in dumped
    reloaded = parse_step_text(dumped, "02-order-fcfs.mlir")
    PassManager.parse("schedule-running,admit-greedy,verify-step").run(reloaded)
    assert print_ir(reloaded) == print_ir(full)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n_running=st.integers(0, 5),
    n_waiting=st.integers(0, 6),
    token_budget=st.integers(1, 200),
    max_seqs=st.integers(1, 8),
    free_blocks=st.integers(0, 20),
    max_model_len=st.integers(30, 200),
    preset=st.sampled_from([
        "base",
        "base-priority",
        "base,verify-step",
        "reject-oversized,order-priority,schedule-running{chunk=false},admit-greedy{chunk=true},verify-step",
    ]),
)
def test_any_dump_reloads_and_replays_random_steps(
    tmp_path_factory, n_running, n_waiting, token_budget, max_seqs, free_blocks, max_model_len, preset
):
    module = make_step(
        n_running, n_waiting, token_budget=token_budget, max_seqs=max_seqs,
        free_blocks=free_blocks, total_blocks=20, max_model_len=max_model_len,
    )
    module.verify()
    _replays(module, preset, tmp_path_factory.mktemp("dumps"))


def test_make_step_builds_a_valid_step():
    module = make_step(3, 4, token_budget=128, facts=("order",))
    module.verify()
    (op,) = steps_of(module)
    step = Step(op)
    assert step.facts.token_budget == 128
    assert step.fact_set == {"order"}
    assert step.ids(step.queue("running").result).tolist() == [1, 2, 3]
    assert step.ids(step.queue("waiting").result).tolist() == [4, 5, 6, 7]
    # And it round-trips through text.
    assert print_ir(parse_step_text(print_ir(module))) == print_ir(module)


def test_sort_op_by_shuffle_is_recorded(registry):
    module = small()
    PassManager.parse("shuffle-test", registry=registry, verify_each=True).run(module)
    sorts = [op for op in steps_of(module)[0].body.block.ops if isinstance(op, SortOp)]
    assert [(s.keys, s.ids.tolist()) for s in sorts] == [(("shuffle",), [4, 3])]
    assert not [op for op in steps_of(module)[0].body.block.ops if isinstance(op, ScheduleOp)]


# ---------------------------------------------------------------- queue options name queues that exist
def test_queue_option_checked_against_every_step_of_the_input():
    waiting_only = SMALL_STEP_TEXT.split("  %run =")[0] + "  %w" + SMALL_STEP_TEXT.split("  %w")[1]
    waiting_only = waiting_only.replace("sched.step 3", "sched.step 4").replace("free_blocks = 10", "free_blocks = 20")
    module = parse_step_text(SMALL_STEP_TEXT + waiting_only)
    # a queue one step lacks (it has no such requests) is fine when another step has it
    PassManager.parse("order-fcfs{queue=running}").run(module)
    sorts = [op for op in module.walk() if isinstance(op, SortOp)]
    assert [s.keys for s in sorts] == [("arrival",)]
    # a queue no step has is refused before any pass runs, naming pass, option and queues
    fresh = parse_step_text(SMALL_STEP_TEXT + waiting_only)
    with pytest.raises(PipelineError) as info:
        PassManager.parse("order-fcfs{queue=runing}").run(fresh)
    assert str(info.value) == (
        "pass 'order-fcfs': option queue=runing names no queue of the step; did you mean 'running'? "
        "(its queues: running, waiting)"
    )
    assert not [op for op in fresh.walk() if isinstance(op, SortOp)]


def test_default_queue_absent_from_the_step_is_not_an_error():
    running_only = SMALL_STEP_TEXT.split("  %w =")[0] + "  sched.yield\n}\n"
    module = parse_step_text(running_only)
    PassManager.parse("base").run(module)  # order-fcfs / admit-greedy default to `waiting`: no such requests


def test_runtime_refuses_a_misspelt_queue_on_its_first_step():
    from schedir import Request, Scheduler, SchedulerConfig

    s = Scheduler(SchedulerConfig(num_blocks=64, block_size=16, max_num_batched_tokens=256, max_num_seqs=8,
                                  pipeline="reject-oversized,order-vllm{queue=waitingx},vllm-schedule-running,vllm-admit"))
    s.add_request(Request("a", prompt_token_ids=list(range(20)), max_tokens=4))
    with pytest.raises(PipelineError, match=r"pass 'order-vllm': option queue=waitingx names no queue of the step; "
                                            r"did you mean 'waiting'\? \(its queues: running, waiting\)"):
        s.schedule()
