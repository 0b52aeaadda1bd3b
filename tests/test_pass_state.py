"""Pass-declared state (`schedir.ir.state`): declared once on the pass, carried by the runtime
across steps, visible in the step IR, written back from `req.set_state` / `sched.set_state`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.ir.errors import PipelineError
from schedir.ir.pass_base import StepPass
from schedir.ir.pipeline import PassManager
from schedir.ir.state import RequestState, SchedulerState, StateConflict, declared_state
from schedir.ir.step import Step
from schedir.ir.textio import parse_step_text, print_ir
from schedir.passes import register_pass
from schedir.tools.cli import main as cli_main


@dataclass(frozen=True)
class CountRuns(StepPass):
    """Count the steps each request ran in; halve a scheduler value every step (test only)."""

    name: ClassVar[str] = "count-runs-test"
    request_state = (RequestState("runs", default=0, doc="steps run"), RequestState("tenant", default=-1))
    scheduler_state = (SchedulerState("decay", default=1.0),)

    def run(self, step: Step) -> None:
        scheduled = step.usage().scheduled_ids
        for queue in step.queues():
            value = queue.result
            ids = step.ids(value)
            ran = np.isin(ids, scheduled)
            if ran.any():
                runs = step.state_column(value, "runs", 0)
                step.set_request_state(value, ids[ran], runs=runs[ran] + 1)
        step.set_state(decay=step.state("decay", 1.0) / 2)


@dataclass(frozen=True)
class ReadsDecay(StepPass):
    """Declares `decay` with another default (test only)."""

    name: ClassVar[str] = "reads-decay-test"
    scheduler_state = (SchedulerState("decay", default=0.5),)

    def run(self, step: Step) -> None:
        pass


@pytest.fixture
def counting(tmp_registry):
    register_pass(CountRuns)
    register_pass(ReadsDecay)
    return tmp_registry


def _drive(s: Scheduler, steps: int) -> list[list[str]]:
    order = []
    for _ in range(steps):
        out = s.schedule()
        order.append(out.req_ids)
        s.update(out, {n: [5] for n in out.req_ids})
    return order


def test_request_state_persists_across_steps_and_starts_from_the_request(counting) -> None:
    s = Scheduler(SchedulerConfig(num_blocks=64, pipeline="base,count-runs-test"))
    s.add_request(Request("a", [1, 2, 3], max_tokens=5, state={"tenant": 7}))
    s.add_request(Request("b", [4, 5, 6, 7], max_tokens=2))
    _drive(s, 3)
    a = s.request_state("a")
    assert (a["runs"], a["tenant"]) == (3, 7)
    assert s.scheduler_state == {"decay": 0.125}
    _drive(s, 5)
    assert not s.has_unfinished_requests()


def test_state_survives_table_growth(counting) -> None:
    s = Scheduler(SchedulerConfig(num_blocks=2000, pipeline="base,count-runs-test"))
    for i in range(150):  # the table starts with 64 rows
        s.add_request(Request(f"r{i}", [i + 1] * 4, max_tokens=3, state={"tenant": i}))
    _drive(s, 2)
    assert [s.request_state(f"r{i}")["tenant"] for i in (0, 63, 64, 149)] == [0, 63, 64, 149]
    assert {s.request_state(f"r{i}")["runs"] for i in range(150)} == {2}


def test_undeclared_or_bad_state_is_refused_and_loses_nothing(counting) -> None:
    s = Scheduler(SchedulerConfig(num_blocks=64, pipeline="base,count-runs-test"))
    with pytest.raises(ValueError, match=r"request 'x': state 'tenantx' is declared by no pass \(this pipeline's "
                                         r"request state: runs, tenant; every pass's: .*\btenant\b.*\)"):
        s.add_request(Request("x", [1], state={"tenantx": 1}))
    with pytest.raises(ValueError, match="request 'x': state 'tenant' must be an integer, got 'a'"):
        s.add_request(Request("x", [1], state={"tenant": "a"}))
    assert not s.has_unfinished_requests() and "x" not in s.table.row_of
    s.add_request(Request("x", [1], state={"tenant": 2}))  # the id is still free
    plain = Scheduler(SchedulerConfig(num_blocks=64, pipeline="base"))
    with pytest.raises(ValueError, match="this pipeline's request state: none"):
        plain.add_request(Request("x", [1], state={"tenantx": 2}))
    # state some pass declares is kept under a pipeline that does not use it, for a later switch
    plain.add_request(Request("y", [1], max_tokens=8, state={"tenant": 5}))
    plain.set_pipeline("base,count-runs-test")
    assert plain.request_state("y")["tenant"] == 5


def test_the_step_ir_shows_the_state_and_the_writes(counting) -> None:
    s = Scheduler(SchedulerConfig(num_blocks=64, pipeline="base,count-runs-test"))
    s.keep_ir = True
    s.add_request(Request("a", [1, 2, 3], max_tokens=4, state={"tenant": 3}))
    _drive(s, 2)
    text = print_ir(s.last_module)
    assert "sched.state {decay = 0.5}" in text
    assert "runs = [1], tenant = [3]}" in text  # the running queue's state columns
    assert "req.set_state %running {id = [0], runs = [2]}" in text
    assert "sched.set_state {decay = 0.25}" in text


def test_recycled_and_dumped_steps_keep_the_same_state(counting, tmp_path: Path) -> None:
    def run(**extra) -> tuple[dict, list]:
        s = Scheduler(SchedulerConfig(num_blocks=40, block_size=4, pipeline="base,count-runs-test", **extra))
        for i in range(12):
            s.add_request(Request(f"r{i}", list(range(1, 6 + i)), max_tokens=4 + i % 3, arrival_time=float(i)))
        order = _drive(s, 6)
        return s.scheduler_state, [order, [s.request_state(n)["runs"] for n in sorted(s.table.row_of)]]

    assert run() == run(dump_dir=tmp_path, dump_steps="all", dump_dot=False)


def test_a_dumped_step_replays_with_its_state(counting, tmp_path: Path, capsys) -> None:
    s = Scheduler(SchedulerConfig(num_blocks=64, pipeline="base,count-runs-test", dump_dir=tmp_path, dump_steps=[2],
                                  dump_dot=False))
    s.add_request(Request("a", [1, 2, 3], max_tokens=4))
    _drive(s, 2)
    dumped = sorted(tmp_path.glob("step-00002-*count-runs-test.mlir"))[0].read_text()
    source = sorted(tmp_path.glob("step-00002-00-input.mlir"))[0]
    assert cli_main(["opt", str(source), "-p", "base,count-runs-test"]) == 0
    replayed = capsys.readouterr().out
    assert "sched.set_state {decay = 0.25}" in replayed and "runs = [2]" in replayed
    assert replayed.strip() == dumped.strip()


def test_a_step_without_sched_state_gets_the_declared_defaults(counting) -> None:
    module = parse_step_text(
        'sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 0, '
        'total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {\n'
        '  %w = req.queue waiting {id = [3], prompt = [40], computed = [0], total = [40], max_tokens = [8], '
        'priority = [0], arrival = [7], status = [waiting], blocks = [0]}\n}')
    PassManager.parse("base,count-runs-test", verify_each=True).run(module)
    text = print_ir(module)
    assert "sched.state {decay = 1.0}" in text and "sched.set_state {decay = 0.5}" in text
    assert "req.set_state %w {id = [3], runs = [1]}" in text  # a queue without the column reads the default


def test_conflicting_declarations_name_both_passes(counting) -> None:
    with pytest.raises(PipelineError, match="scheduler state 'decay' is declared by pass 'count-runs-test' with "
                                            "default 1.0 and by pass 'reads-decay-test' with default 0.5"):
        PassManager.parse("base,count-runs-test,reads-decay-test")
    with pytest.raises(StateConflict, match="declared per request by pass 'a' and per scheduler by pass 'b'"):
        declared_state([_Declares("a", (RequestState("x"),), ()), _Declares("b", (), (SchedulerState("x"),))])
    with pytest.raises(ValueError, match="would shadow the runtime's column"):
        RequestState("computed")
    with pytest.raises(ValueError, match="must be lower_snake_case"):
        SchedulerState("New-Ratio")


@dataclass(frozen=True)
class _Declares:
    name: str
    request_state: tuple
    scheduler_state: tuple


def test_set_pipeline_keeps_state_through_a_pipeline_without_it(counting) -> None:
    s = Scheduler(SchedulerConfig(num_blocks=64, pipeline="base,count-runs-test"))
    s.add_request(Request("a", [1, 2, 3], max_tokens=8, state={"tenant": 4}))
    _drive(s, 2)
    s.set_pipeline("base")
    _drive(s, 2)
    assert "sched.state" not in print_ir(_built_step(s))
    s.set_pipeline("base,count-runs-test")
    _drive(s, 1)
    a = s.request_state("a")
    assert (a["runs"], a["tenant"], s.scheduler_state["decay"]) == (3, 4, 0.125)


def _built_step(s: Scheduler):
    s.keep_ir = True
    _drive(s, 1)
    s.keep_ir = False
    return s.last_module


def test_schedir_passes_lists_declared_state(counting, capsys) -> None:
    assert cli_main(["passes"]) == 0
    out = capsys.readouterr().out
    assert "    state:       runs (per request, starts at 0): steps run\n" in out
    assert "    state:       decay (scheduler, starts at 1): " not in out  # no doc: nothing after the default
    assert "    state:       decay (scheduler, starts at 1)\n" in out


def test_queue_text_round_trips_state_columns() -> None:
    text = ('sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 0, '
            'total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {\n'
            '  sched.state {r = 0.25}\n'
            '  %w = req.queue waiting {id = [3], prompt = [40], computed = [0], total = [40], max_tokens = [8], '
            'priority = [0], arrival = [7], status = [waiting], blocks = [0], level = [2]}\n}')
    once = print_ir(parse_step_text(text))
    assert print_ir(parse_step_text(once)) == once
    assert "level = [2]" in once and "sched.state {r = 0.25}" in once
