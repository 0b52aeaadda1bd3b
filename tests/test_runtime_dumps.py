"""Dumps from a live run: every pass's IR (text and DOT) for the chosen steps, and a dumped
step reloaded with `schedir opt` and the same pipeline gives the same decisions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.tools.cli import main as schedir_main

PASS_FILES = ("00-input", "01-reject-oversized", "02-order-vllm", "03-vllm-schedule-running", "04-vllm-admit")


def run_trace(scheduler: Scheduler, seed: int = 1, n: int = 10) -> set[int]:
    """Drive a shared-prefix trace to the end; returns the steps that preempted."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(3, 32000, 120).tolist()
    for i in range(n):
        prompt = shared[: 40 + 10 * i] + rng.integers(3, 32000, 30).tolist()
        scheduler.add_request(Request(f"r{i}", prompt, max_tokens=80, arrival_time=0.0, ignore_eos=True,
                                      priority=i % 3))
    preempting = set()
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        if out.preempted_req_ids:
            preempting.add(out.step)
        tokens = np.where(out.sampled, 1000 + (out.computed + out.num_tokens) * 7919 % 30000, -1)
        scheduler.update(out, tokens)
    return preempting


def config(tmp: Path | None, steps: object, policy: str = "fcfs", threshold: int = 0) -> SchedulerConfig:
    return SchedulerConfig(num_blocks=40, block_size=16, max_num_batched_tokens=256, dump_dir=tmp,
                           dump_steps=steps, policy=policy, long_prefill_token_threshold=threshold)


@pytest.mark.parametrize(("policy", "threshold"), [("fcfs", 0), ("priority", 64)])
def test_dumped_steps_replay_to_the_same_decisions(tmp_path: Path, policy: str, threshold: int,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    preempting = run_trace(Scheduler(config(None, None, policy, threshold)))
    assert preempting, "the trace must preempt, so replay covers preemption"
    chosen = sorted(preempting)[:2] + [1]
    scheduler = Scheduler(config(tmp_path, chosen, policy, threshold))
    assert run_trace(scheduler) == preempting, "dumping must not change the run"
    for step in chosen:
        stem = f"step-{step:05d}-"
        for name in PASS_FILES:
            assert (tmp_path / f"{stem}{name}.mlir").is_file()
            assert (tmp_path / f"{stem}{name}.dot").read_text().startswith("digraph")
        capsys.readouterr()
        code = schedir_main(["opt", str(tmp_path / f"{stem}00-input.mlir"), "-p", scheduler.spec])
        replayed = capsys.readouterr().out
        assert code == 0
        live = (tmp_path / f"{stem}04-vllm-admit.mlir").read_text()
        assert replayed == live, f"step {step}: replay differs from the live run"
        if step in preempting:
            assert "req.preempt" in live


def test_only_chosen_steps_are_dumped(tmp_path: Path) -> None:
    run_trace(Scheduler(config(tmp_path, [2])), n=3)
    steps = {p.name.split("-")[1] for p in tmp_path.glob("*.mlir")}
    assert steps == {"00002"}


def test_a_dumped_pool_that_lost_blocks_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scheduler = Scheduler(config(tmp_path, [2]))
    run_trace(scheduler, n=3)
    text = (tmp_path / "step-00002-00-input.mlir").read_text()
    start = text.index("free = [") + len("free = [")
    broken = text[:start] + text[text.index(",", start) + 2:]  # drop the first free block
    path = tmp_path / "broken.mlir"
    path.write_text(broken)
    code = schedir_main(["opt", str(path), "-p", "vllm"])
    err = capsys.readouterr().err
    assert code == 2
    assert "mem.pool: blocks are lost" in err and "broken.mlir" in err
