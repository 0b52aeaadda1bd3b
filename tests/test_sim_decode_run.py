"""Decode runs (`schedir.sim.decode_run`): steady decode steps between arrivals in one kernel call
give the one-step path's steps, records and metrics exactly (only the wall time differs)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest

from schedir.sim import decode_run as DR
from schedir.sim.config import SimConfig
from schedir.sim.records import STEP_FIELDS
from schedir.sim.simulator import Simulator
from schedir.sim.workloads import builtin_workload, load_trace

MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "mooncake" / "conversation_trace.jsonl"
REQUEST_COLUMNS = ("first_scheduled_s", "first_token_s", "last_token_s", "finish_s", "tokens_out", "preemptions",
                   "prefix_hit_tokens")


def both(config: SimConfig, workload) -> tuple:  # type: ignore[no-untyped-def]
    return (Simulator(config, decode_runs=True).run(workload), Simulator(config, decode_runs=False).run(workload))


def assert_same(fast, slow) -> None:  # type: ignore[no-untyped-def]
    assert fast.steps.size == slow.steps.size
    for name in STEP_FIELDS:
        if name != "sched_us":  # wall time: the one thing a run changes
            assert np.array_equal(fast.steps.column(name), slow.steps.column(name)), name
    for name in REQUEST_COLUMNS:
        assert np.array_equal(getattr(fast.requests, name), getattr(slow.requests, name), equal_nan=True), name
    assert np.array_equal(fast.requests.gaps(), slow.requests.gaps())
    assert fast.requests.rejected == slow.requests.rejected
    wall = ("schedule_us_median", "schedule_us_p99")
    assert {k: v for k, v in fast.runtime_metrics.items() if k not in wall} == \
        {k: v for k, v in slow.runtime_metrics.items() if k not in wall}
    assert fast.stalled == slow.stalled


CASES = [
    # (pipeline, workload, requests, config overrides): a queue that waits (admission bound), ample
    # and tight KV (preemption between runs), priority, a lowered steady budget, a count-level pipeline
    ("vllm", "conversation", 150, {}),
    ("vllm", "chat-short", 200, {"num_blocks": 800}),
    ("vllm", "bursty-priority", 150, {"policy": "priority", "num_blocks": 2000}),
    ("vllm", "chat-short", 200, {"enable_prefix_caching": False, "max_num_seqs": 16}),
    ("sarathi", "chat-short", 150, {}),
    ("base", "chat-short", 150, {"num_blocks": 4000}),
    ("orca", "chat-short", 120, {"max_model_len": 8192}),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_decode_runs_take_the_one_step_paths_steps(case, monkeypatch):
    pipeline, name, n, overrides = case
    calls = []
    real = DR.decode_run

    def spy(*args):  # type: ignore[no-untyped-def]
        out = real(*args)
        calls.append(out[0])
        return out

    monkeypatch.setattr(DR, "decode_run", spy)
    fast, slow = both(SimConfig(pipeline=pipeline, **overrides), builtin_workload(name, num_requests=n))
    assert_same(fast, slow)
    assert sum(calls) > 100, f"only {sum(calls)} steps in decode runs: the case does not exercise them"
    if "num_blocks" in overrides and pipeline == "vllm":
        assert fast.runtime_metrics["preemptions"] > 0  # the tight cases preempt between runs


def test_pipelines_without_plain_steady_steps_never_run_decodes(monkeypatch):
    """SGLang's pool and per-pass steady answers (sglang, vtc), swapping (vllm-v0-swap) and MLFQ
    state keep the one-step path."""
    monkeypatch.setattr(DR, "decode_run", lambda *a: pytest.fail("a decode run was attempted"))
    w = builtin_workload("chat-short", num_requests=40)
    for pipeline, extra in (("sglang", {}), ("vtc", {}), ("fastserve", {"enable_prefix_caching": False})):
        Simulator(SimConfig(pipeline=pipeline, **extra)).run(w)


@pytest.mark.parametrize("mutation", ["past arrivals", "cost"])
def test_the_comparison_sees_a_run_that_differs(mutation, monkeypatch):
    """A run that ignores the next arrival (runs on past it), or prices its steps otherwise, is
    caught by the comparison above."""
    real = DR.decode_run

    def mutated(until, now, *rest):  # type: ignore[no-untyped-def]
        if mutation == "past arrivals":
            until = np.inf
        else:
            rest = list(rest)
            at = list(inspect.signature(real.py_func).parameters).index("total_s") - 2  # (until, now)
            rest[at] += 1e-6  # the token-count seconds of the step time
        return real(until, now, *rest)

    monkeypatch.setattr(DR, "decode_run", mutated)
    fast, slow = both(SimConfig(), builtin_workload("chat-short", num_requests=80))
    with pytest.raises(AssertionError):
        assert_same(fast, slow)


@pytest.mark.skipif(not MOONCAKE.exists(), reason="the Mooncake trace is in ../shared/data (not shipped)")
def test_decode_runs_on_the_mooncake_trace():
    fast, slow = both(SimConfig(), load_trace(MOONCAKE).head(300))
    assert_same(fast, slow)


@pytest.mark.parametrize("router", ["round-robin", "mooncake", "mooncake-pd"])
def test_fleet_instances_take_the_same_steps_with_decode_runs(router, monkeypatch):
    """Each instance of a fleet runs its steady steps to the next event in one call: routing,
    P/D hand-overs and every record as with one step at a time."""
    from schedir.sim.fleet import FleetConfig, FleetSimulator
    from schedir.sim.fleet_instances import InstanceCore
    from schedir.sim.metrics import summarize

    workload = builtin_workload("conversation", num_requests=80, rate=6.0, seed=1)
    pd = router.endswith("-pd")
    fleet = FleetConfig(instances=4, router=router, prefill_instances=2 if pd else 0)
    engine = SimConfig(num_blocks=40000 if pd else 4000)
    import schedir.sim.fleet_instances as FI

    counted = []
    real = FI.run_decodes

    def spy(*args):  # type: ignore[no-untyped-def]
        counted.append(real(*args))
        return counted[-1]

    monkeypatch.setattr(FI, "run_decodes", spy)
    runs = {}
    for on in (True, False):
        monkeypatch.setattr(InstanceCore, "decode_runs", on)
        runs[on] = FleetSimulator(engine, fleet).run(workload)
    assert sum(counted) > 100, f"only {sum(counted)} steps in decode runs"
    fast, slow = runs[True], runs[False]
    np.testing.assert_array_equal(fast.instance_of, slow.instance_of)
    np.testing.assert_array_equal(fast.finish_count, slow.finish_count)
    assert_same(fast.result, slow.result)
    a, b = summarize(fast.result), summarize(slow.result)
    for m in (a, b):
        for key in ("sim_wall_s", "scheduler_us_per_step", "scheduler_us", "scheduler_share_of_gpu_time"):
            m.pop(key, None)
    assert a == b


def test_the_cli_says_how_many_steps_ran_in_decode_runs_and_can_turn_them_off(tmp_path, capsys):
    from schedir.tools.cli import EXIT_OK, main

    counts = {}
    for flag in ((), ("--no-decode-runs",)):
        out = tmp_path / f"run{len(flag)}.json"
        assert main(["sim", "--workload", "chat-short", "--num-requests", "30", "--quiet", "--json", str(out),
                     *flag]) == EXIT_OK
        printed = capsys.readouterr().out
        counts[bool(flag)] = json.loads(out.read_text())["decode_run_steps"]
        assert ("ran in decode runs" in printed) == (not flag)
    assert counts[True] == 0 < counts[False]


def test_a_fleet_refuses_no_decode_runs_with_a_clear_error(capsys):
    from schedir.tools.cli import EXIT_BAD_INPUT, main

    code = main(["sim", "--workload", "chat-short", "--instances", "2", "--no-decode-runs", "--quiet"])
    assert code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "--no-decode-runs applies to one engine" in err and "Traceback" not in err
