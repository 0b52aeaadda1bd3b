"""`Engine`: one simulated engine instance — a schedir runtime, its cost model and its records.

The single-engine `Simulator` drives one of these; the fleet simulator (`schedir.sim.fleet`)
drives several, each with its own clock, pipeline and KV pool, writing into one shared
`RequestLog` indexed by the workload's request number. One `step()` is one engine
iteration: schedule() -> cost model -> per-request accounting (one Numba kernel) ->
update(), with the engine's clock moved by the step's GPU time.
"""

from __future__ import annotations

import time
from enum import IntEnum

import numpy as np

from schedir.runtime.config import Request
from schedir.runtime.scheduler import Scheduler
from schedir.sim.config import SimConfig
from schedir.sim.cost_model import CostModel
from schedir.sim.models import get_model
from schedir.sim.records import RequestLog, StepLog, account_step

_NO_TOKENS = np.zeros(0, dtype=np.int64)


class StepStatus(IntEnum):
    RAN = 0  # a batch ran: the clock moved by its GPU time
    CHANGED = 1  # nothing ran, but requests were rejected or preempted: decide again now
    IDLE = 2  # nothing ran and nothing changed: only a new request can unblock it


def engine_sizes(config: SimConfig) -> tuple[CostModel, int, int, int]:
    """(cost model, vocabulary size, context limit, KV blocks) of a deployment, as an engine
    sizes itself: the KV cache is what the GPU memory holds unless the config says."""
    model = get_model(config.model)
    cost = CostModel.create(config.model, config.gpu, config.tp)
    max_model_len = config.max_model_len or model.max_model_len
    num_blocks = config.num_blocks or cost.kv_cache_blocks(config.block_size, config.gpu_memory_utilization)
    if num_blocks < 2 and config.num_blocks:
        raise ValueError(f"num_blocks={config.num_blocks}: a KV cache needs at least 2 blocks "
                         "(block 0 is reserved, as in vLLM)")
    if num_blocks < 2:
        raise ValueError(f"{config.model} on {config.gpu} (TP {config.tp}) leaves no memory for the KV cache "
                         f"at gpu_memory_utilization={config.gpu_memory_utilization}")
    return cost, model.vocab_size, max_model_len, num_blocks


class Engine:
    """One engine instance over a shared `RequestLog` (request names are their log index)."""

    def __init__(self, config: SimConfig, reqs: RequestLog, steps: StepLog | None = None,
                 sizes: tuple[CostModel, int, int, int] | None = None) -> None:
        self.config = config
        self.cost, self.vocab_size, self.max_model_len, self.num_blocks = sizes or engine_sizes(config)
        self.now = 0.0
        host = self.cost.host_blocks(config.swap_space_gib, config.block_size)
        self.sched = Scheduler(config.scheduler_config(self.num_blocks, self.max_model_len, host), clock=self._clock)
        self.reqs = reqs
        self.steps = steps if steps is not None else StepLog()
        self.row_index = np.full(self.sched.table.capacity, -1, dtype=np.int64)  # runtime row -> request index
        self.finished: list[int] = []  # request indices finished by the last step
        self.rejected: list[int] = []  # request indices the last step rejected
        self.preempted: list[int] = []  # request indices the last step preempted
        self.batch: np.ndarray = _NO_TOKENS  # request indices the last step ran (its records changed)
        self.sched_us = 0.0
        self.steady = False  # the last step was a steady decode step (a decode run may follow: `run_decodes`)
        self.decode_run_steps = 0  # steps run in decode runs so far

    def _clock(self) -> float:
        return self.now

    @property
    def busy(self) -> bool:
        return self.sched.has_unfinished_requests()

    def add(self, index: int, prompt: np.ndarray, max_tokens: int, priority: int, arrival: float) -> None:
        """Queue request `index` of the log."""
        sched = self.sched
        name = str(index)
        sched.add_request(Request(name, prompt, max_tokens=max_tokens, priority=priority, arrival_time=arrival,
                                  ignore_eos=True))
        row = sched.table.row_of[name]
        if row >= self.row_index.size:
            self.row_index = np.concatenate([self.row_index, np.full(sched.table.capacity - self.row_index.size, -1,
                                                                     np.int64)])
        self.row_index[row] = index

    def step(self) -> StepStatus:
        """One engine iteration at `self.now`; `finished` / `rejected` list what it ended."""
        sched = self.sched
        reqs = self.reqs
        perf = time.perf_counter
        self.finished = []
        self.preempted = []
        self.batch = _NO_TOKENS
        metrics = sched.metrics
        steady_before = metrics.steady_steps - metrics.running_steps
        w0 = perf()
        out = sched.schedule()
        w1 = perf()
        self.steady = metrics.steady_steps - metrics.running_steps > steady_before
        rejected = self.rejected = []
        if out.rejected:
            for name, why in out.rejected.items():
                reqs.rejected[int(name)] = why
                rejected.append(int(name))
        if out.preempted_req_ids or out.swapped_out_req_ids:
            for name in out.preempted_req_ids | out.swapped_out_req_ids:
                reqs.preemptions[int(name)] += 1
                self.preempted.append(int(name))
        rows = out.rows
        k = rows.size
        if k == 0:
            sched.update(out, _NO_TOKENS)
            return StepStatus.CHANGED if (out.rejected or out.preempted_req_ids) else StepStatus.IDLE
        idx = self.batch = self.row_index[rows]
        num_tokens = out.num_tokens
        computed = out.computed
        gpu_s, flops = self.cost.step_cost(num_tokens, computed)
        moved = len(out.blocks_to_swap_out) + len(out.blocks_to_swap_in)
        if moved:  # vLLM v0's swap: the step waits for its block copies over PCIe
            gpu_s += self.cost.swap_time(moved, sched.config.block_size)
        start = self.now
        now = self.now = start + gpu_s
        # One kernel: the sampled tokens for update() and the step's per-request records.
        tokens = np.empty(k, dtype=np.int64)
        prefill_tokens, decode_tokens, reqs.gap_count = account_step(
            idx, num_tokens, computed, out.sampled, out.kind, reqs.input_len, self.vocab_size, start, now,
            reqs.first_scheduled_s, reqs.prefix_hit_tokens, reqs.first_token_s, reqs.last_token_s, reqs.tokens_out,
            reqs.reserve_gaps(k), reqs.gap_count, tokens)
        w2 = perf()
        finished = sched.update(out, tokens)
        w3 = perf()
        if finished:
            fin = self.finished = [int(name) for name in finished]
            reqs.finish_s[fin] = now
        pool = sched.pool
        self.sched_us = ((w1 - w0) + (w3 - w2)) * 1e6
        self.steps.append(start, gpu_s, prefill_tokens, decode_tokens, k, sched.waiting.size,
                          1.0 - pool.num_free / pool.usable_blocks, self.sched_us, flops)
        return StepStatus.RAN

    def abort_all(self) -> list[int]:
        """Abort every unfinished request (the instance leaves the fleet); returns their indices, sorted."""
        sched = self.sched
        rows = np.concatenate([sched.running, sched.waiting, sched.swapped])
        names = [sched.table.names[r] for r in rows.tolist()]
        sched.finish_requests(names, reason="abort")
        return sorted(int(x) for x in names)

    def first_waiting(self, limit: int = 5) -> str:
        names = [self.sched.table.names[r] for r in self.sched.waiting[:limit].tolist()]
        return ", ".join(str(x) for x in names) or "-"
