"""The `orca` preset (Orca, OSDI '22): whole prompts, the whole KV reserved at admission.

Orca's claim is structural: a request admitted with its longest sequence's KV reserved can
always decode, so nothing is ever preempted, whatever the trace. tests/test_invariants.py drives
the preset through the invariant checks; here every run must end without one preemption.
"""

from __future__ import annotations

import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.dialects.sched import StepFacts
from schedir.ir.builder import build_step
from schedir.ir.errors import PassFailure, PipelineError
from schedir.ir.pipeline import PassManager
from schedir.tools.parity.fuzz import SMALL_SIZE, draw_case
from schedir.tools.parity.harness import RunStats, SchedirEngine, run_engine
from schedir.tools.parity.invariants import config_for


def test_orca_never_preempts() -> None:
    """Over random traces (tight caches included) no step preempts; test_invariants.py runs the
    same preset through every invariant check."""
    for seed in range(40):
        case = draw_case(seed, SMALL_SIZE)
        records = run_engine(SchedirEngine(config_for(case, "orca"), pipeline="orca"), case.trace())
        assert RunStats.of(records).preemptions == 0, f"seed {seed}"


def test_orca_runs_each_prompt_whole() -> None:
    s = Scheduler(SchedulerConfig(num_blocks=400, block_size=16, max_num_batched_tokens=2048, max_model_len=2048,
                                  pipeline="orca", enable_prefix_caching=False))
    s.add_request(Request("long", list(range(3, 1503)), max_tokens=4, ignore_eos=True))
    s.add_request(Request("next", list(range(3, 903)), max_tokens=4, ignore_eos=True))
    out = s.schedule()
    # vLLM would chunk "next" into the 548 tokens left; Orca leaves it for the next iteration
    assert list(out.req_ids) == ["long"] and out.num_tokens.tolist() == [1500]
    s.update(out, np.where(out.sampled, 7, -1))
    out = s.schedule()
    assert list(out.req_ids) == ["long", "next"] and out.num_tokens.tolist() == [1, 900]


def test_orca_refuses_a_budget_below_the_model_length() -> None:
    """The runtime refuses it when the scheduler is made (`schedir bench --configs orca` said so
    only at its first step, after warming the other configs); the pass still refuses a
    hand-written step."""
    with pytest.raises(PipelineError, match=r"pass 'orca-admit' runs every prompt whole, so "
                                            r"max_num_batched_tokens 512 is below max_model_len 1024"):
        Scheduler(SchedulerConfig(max_num_batched_tokens=512, max_model_len=1024, pipeline="orca"))
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=1024, max_model_len=1024, pipeline="orca"))
    s.add_request(Request("a", [5, 6, 7], max_tokens=4))
    s.schedule()  # a budget that holds max_model_len runs
    facts = StepFacts(step=1, token_budget=512, max_seqs=4, block_size=16, free_blocks=10, cached_free_blocks=0,
                      total_blocks=20, max_model_len=1024)
    module = build_step(facts, {"waiting": {"id": np.array([0]), "prompt": np.array([3]), "computed": np.array([0]),
                                            "total": np.array([3]), "max_tokens": np.array([4]),
                                            "arrival": np.array([0]), "blocks": np.array([0])}})
    with pytest.raises(PassFailure, match=r"pass 'orca-admit': token_budget 512 is below max_model_len 1024"):
        PassManager.parse("reject-oversized,order-fcfs,schedule-running,orca-admit").run(module)
