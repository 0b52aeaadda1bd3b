"""Invariant fuzzing of every preset: the CI-sized run, and each check shown to fail on a
deliberately broken schedir (a monkeypatched kernel or pool)."""

from __future__ import annotations

import numpy as np
import pytest

from schedir.passes import vllm_admit
from schedir.passes import vllm_kernels as K
from schedir.tools.parity.fuzz import SMALL_SIZE, FuzzCase, FuzzRequest, draw_case
from schedir.tools.parity.harness import ParityConfig
from schedir.tools.parity.invariants import (
    InvariantViolation,
    check_case,
    check_pool,
    fuzz_invariants,
    preset_names,
)

CI_CASES = {"vllm": 40, "base": 20, "base-priority": 20, "orca": 20, "fastserve": 20, "slo-aware": 20,
            "slo-aware-reject": 20, "sarathi": 20, "vtc": 20, "with-prefix-aware": 20, "with-all-passes": 20, "sglang": 20,
            "sglang-mixed": 20, "vllm-v0": 20, "vllm-v0-swap": 20,
            "vllm-v0-priority": 20,
            "vllm-v0-chunked": 20}
"""Small cases per preset in the CI run, each run twice (~30 s in all on this 2-core machine kind;
the `base` presets end with verify-step, ~0.3 ms a step, so they get fewer)."""


def test_every_preset_is_fuzzed() -> None:
    assert set(preset_names()) <= set(CI_CASES), "give a new preset a CI case count here"


@pytest.mark.parametrize("preset", sorted(CI_CASES))
def test_invariants_ci_run(preset: str) -> None:
    tallies = fuzz_invariants(range(CI_CASES[preset]), [preset], size=SMALL_SIZE)
    t = tallies[preset]
    assert t.cases == CI_CASES[preset] and t.steps > 10 * t.cases
    assert not t.violations, "\n".join(f"seed {s}: {why}" for s, why in t.violations)


def _tight() -> FuzzCase:
    """Tight cache, small budget and max_num_seqs, shared prefixes, aborts: every check has work."""
    for seed in range(500):
        c = draw_case(seed)
        cfg = c.config
        if (cfg.num_blocks - 1 <= 2 * -(-cfg.max_model_len // cfg.block_size) and cfg.prefix_caching
                and len(c.requests) >= 8 and cfg.max_num_seqs >= 4):
            return c
    raise AssertionError("no tight case among the first 500 seeds")


def test_checks_pass_on_the_tight_case() -> None:
    check_case(_tight(), "vllm")


def test_budget_overrun_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = K.admit_waiting

    def generous(rows, computed, total, stale, budget, *rest):  # type: ignore[no-untyped-def]
        return real(rows, computed, total, stale, budget + 64, *rest)

    monkeypatch.setattr(K, "admit_waiting", generous)
    case = FuzzCase(config=ParityConfig(num_blocks=200, max_num_batched_tokens=32, max_num_seqs=4, max_model_len=512),
                    requests=(FuzzRequest(arrival=0, unique=100, max_tokens=3),))
    with pytest.raises(InvariantViolation, match=r"preset vllm, .*step 0: 96 tokens scheduled, budget 32"):
        check_case(case, "vllm")


def test_max_num_seqs_overrun_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = K.admit_waiting

    def more_seats(rows, computed, total, stale, budget, seqs_left, *rest):  # type: ignore[no-untyped-def]
        return real(rows, computed, total, stale, budget, seqs_left + 1, *rest)

    monkeypatch.setattr(K, "admit_waiting", more_seats)
    case = FuzzCase(config=ParityConfig(num_blocks=200, max_num_batched_tokens=512, max_num_seqs=2, max_model_len=512),
                    requests=tuple(FuzzRequest(arrival=0, unique=20, max_tokens=4) for _ in range(3)))
    with pytest.raises(InvariantViolation, match=r"3 requests running, max_num_seqs 2"):
        check_case(case, "vllm")


def test_leaked_blocks_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """An abort that forgets to free its request's blocks: caught when the trace drains."""
    from schedir.lowering.kv_pool import KVPool
    from schedir.runtime.scheduler import Scheduler

    real_finish = Scheduler._finish
    real_free = KVPool.free_request
    leak = [False]

    def leaky_finish(self, row, completed=True):  # type: ignore[no-untyped-def]
        leak[0] = not completed
        try:
            return real_finish(self, row, completed)
        finally:
            leak[0] = False

    monkeypatch.setattr(Scheduler, "_finish", leaky_finish)
    monkeypatch.setattr(KVPool, "free_request", lambda pool, row: 0 if leak[0] else real_free(pool, row))
    case = FuzzCase(config=ParityConfig(num_blocks=200, max_num_batched_tokens=512, max_model_len=512),
                    requests=(FuzzRequest(arrival=0, unique=40, max_tokens=30, abort_step=3),))
    with pytest.raises(InvariantViolation, match=r"after the last step: drained, yet \d+ blocks are not free"):
        check_case(case, "vllm")


def test_ref_count_drift_is_caught() -> None:
    from schedir.lowering.kv_pool import KVPool, allocate

    pool = KVPool.create(10, 16, 4, rows=2)
    allocate(0, 2, pool.ref, pool.bhash, pool.dup_next, pool.nxt, pool.prv, pool.meta, pool.cache, pool.table,
             pool.nblk)
    check_pool(pool, "ok")
    pool.ref[1] += 1
    with pytest.raises(InvariantViolation, match=r"here: ref counts disagree with the block tables at blocks \[1\]"):
        check_pool(pool, "here")
    pool.ref[1] -= 1
    pool.meta[0] -= 1  # the free counter loses a block
    with pytest.raises(InvariantViolation, match=r"the free queue holds 7 blocks, the counter says 6"):
        check_pool(pool, "here")


def test_double_scheduling_and_nondeterminism_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    case = FuzzCase(config=ParityConfig(num_blocks=200, max_num_batched_tokens=512, max_model_len=512),
                    requests=(FuzzRequest(arrival=0, unique=20, max_tokens=3),
                              FuzzRequest(arrival=0, unique=20, max_tokens=3)))
    real = vllm_admit.VllmAdmit.run

    def twice(self, step):  # type: ignore[no-untyped-def]
        real(self, step)
        running = step.queue(self.running)
        if running is not None and len(running):
            value = running.results[0]
            step.schedule(value, "decode", step.ids(value)[:1], np.ones(1, dtype=np.int64))

    monkeypatch.setattr(vllm_admit.VllmAdmit, "run", twice)
    # a pass that schedules more than the steady decision must not declare it (decode steps would skip it)
    monkeypatch.setattr(vllm_admit.VllmAdmit, "decodes_steadily", lambda self: False)
    with pytest.raises(InvariantViolation, match=r"scheduled twice in one step: \['r0'\]"):
        check_case(case, "vllm")
    monkeypatch.undo()

    rng = np.random.default_rng()
    real_admit = K.admit_waiting

    def moody(rows, computed, total, stale, budget, *rest):  # type: ignore[no-untyped-def]
        return real_admit(rows, computed, total, stale, int(rng.integers(1, budget + 1)), *rest)

    monkeypatch.setattr(K, "admit_waiting", moody)
    big = FuzzCase(config=ParityConfig(num_blocks=200, max_num_batched_tokens=512, max_model_len=1024),
                   requests=tuple(FuzzRequest(arrival=0, unique=400, max_tokens=3) for _ in range(3)))
    with pytest.raises(InvariantViolation, match=r"not deterministic, two runs of one trace give decision hashes"):
        check_case(big, "vllm")


def test_stall_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduler that admits nobody: the first step with a waiting request and nothing scheduled."""
    real = K.admit_waiting

    def nobody(rows, computed, total, stale, budget, seqs_left, *rest):  # type: ignore[no-untyped-def]
        return real(rows, computed, total, stale, budget, 0, *rest)

    monkeypatch.setattr(K, "admit_waiting", nobody)
    case = FuzzCase(config=ParityConfig(num_blocks=200, max_num_batched_tokens=512, max_model_len=512),
                    requests=(FuzzRequest(arrival=0, unique=20, max_tokens=3),))
    with pytest.raises(InvariantViolation, match=r"step 0: stalled: nothing scheduled, preempted or rejected"):
        check_case(case, "vllm")
