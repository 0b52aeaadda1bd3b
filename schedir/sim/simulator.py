"""The discrete-event loop: arrivals -> schedule() -> cost model -> update() -> next step.

Simulated time only moves by the cost model's step time (or jumps to the next
arrival when the engine is idle); the scheduler's own wall time per step is
measured beside it. Every request is generated to its trace's output length
(`ignore_eos`), so the policy, not the sampler, decides what happens.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from schedir.runtime.scheduler import Scheduler
from schedir.sim.config import SimConfig, plain_value  # noqa: F401 (plain_value: the fleet's import)
from schedir.sim.decode_run import run_decodes
from schedir.sim.engine import Engine, StepStatus, engine_sizes
from schedir.sim.records import RequestLog, SimResult, StepLog
from schedir.sim.workloads import Workload

Progress = Callable[[int, int, float], None]  # (requests done, requests total, simulated seconds)


class SimulationStalled(RuntimeError):
    """The pipeline scheduled nothing while requests wait and nothing else can change."""


class Simulator:
    """Replays one workload through one `SimConfig`."""

    def __init__(self, config: SimConfig, *, decode_runs: bool = True) -> None:
        self.config = config
        # steady decode steps between arrivals run as one kernel call (`schedir.sim.decode_run`):
        # the same steps and records, a fraction of the wall time; off only to test that
        self.decode_runs = decode_runs
        self.sizes = engine_sizes(config)
        self.cost, self.vocab_size, self.max_model_len, self.num_blocks = self.sizes
        self.now = 0.0

    def check(self) -> None:
        """Build the engine's scheduler once, so that a pipeline or a setting the runtime refuses
        (an unknown pass, a swapping pipeline without a host tier, ...) is reported before a run
        prints anything (the CLI calls it first; `run` builds its own scheduler)."""
        cfg = self.config
        host = self.cost.host_blocks(cfg.swap_space_gib, cfg.block_size)
        Scheduler(cfg.scheduler_config(self.num_blocks, self.max_model_len, host), clock=lambda: 0.0)

    def run(self, workload: Workload, progress: Progress | None = None, progress_every: int = 200) -> SimResult:
        cfg = self.config
        vocab = self.vocab_size
        n = len(workload)
        arrivals = np.asarray(workload.arrival_s, dtype=np.float64)
        reqs = RequestLog(arrivals, workload.input_len, workload.output_len)
        steps = StepLog()
        engine = Engine(cfg, reqs, steps, self.sizes)
        sched = engine.sched
        # Arrivals as plain Python numbers: the loop compares one float per step, and builds
        # a Request per arrival without numpy scalars.
        arrival_at = arrivals.tolist()
        max_tokens = np.asarray(workload.output_len).tolist()
        priority = np.asarray(workload.priority).tolist()
        next_arrival = arrival_at[0] if n else math.inf
        now = self.now = engine.now = 0.0
        nxt = 0
        done = 0
        add_s = 0.0
        next_report = progress_every
        stalled: str | None = None
        wall_start = time.perf_counter()
        perf = time.perf_counter
        while True:
            if next_arrival <= now:
                a0 = perf()
                while next_arrival <= now:
                    engine.add(nxt, workload.prompt_tokens(nxt, vocab), max_tokens[nxt], priority[nxt], next_arrival)
                    nxt += 1
                    next_arrival = arrival_at[nxt] if nxt < n else math.inf
                add_s += perf() - a0
            if not engine.busy:
                if nxt >= n:
                    break
                now = self.now = engine.now = max(now, next_arrival)
                continue
            status = engine.step()
            done += len(engine.rejected) + len(engine.finished)
            if status is StepStatus.RAN and self.decode_runs and engine.steady and next_arrival > engine.now:
                if run_decodes(engine, next_arrival):
                    done += len(engine.finished)
            if status is StepStatus.CHANGED:
                continue  # something changed: decide again at the same instant
            if status is StepStatus.IDLE:
                if nxt < n:
                    now = self.now = engine.now = max(now, next_arrival)
                    continue
                stalled = (f"step {sched._step}: pipeline '{cfg.pipeline}' scheduled nothing with "
                           f"{sched.get_num_unfinished_requests()} requests unfinished and no arrivals left "
                           f"(first waiting: {engine.first_waiting()})")
                break
            now = self.now = engine.now
            if progress is not None and steps.size >= next_report:
                next_report = steps.size + progress_every
                progress(done, n, now)
        wall = time.perf_counter() - wall_start
        if progress is not None:
            progress(done, n, self.now)
        return SimResult(
            config_name=cfg.name, config=cfg.recorded(),
            workload={"name": workload.name, "source": workload.source, **workload.stats()},
            num_blocks=self.num_blocks, max_model_len=self.max_model_len, peak_flops=self.cost.peak_flops,
            requests=reqs, steps=steps, runtime_metrics=sched.get_metrics(), sim_wall_s=wall, stalled=stalled,
            add_wall_s=add_s, decode_run_steps=engine.decode_run_steps,
        )
