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

import attrs
import numpy as np

from schedir.runtime.config import Request
from schedir.runtime.scheduler import Scheduler
from schedir.sim.config import SimConfig
from schedir.sim.cost_model import CostModel
from schedir.sim.models import get_model
from schedir.sim.records import RequestLog, SimResult, StepLog, account_step
from schedir.sim.workloads import Workload

_NO_TOKENS = np.zeros(0, dtype=np.int64)

Progress = Callable[[int, int, float], None]  # (requests done, requests total, simulated seconds)


class SimulationStalled(RuntimeError):
    """The pipeline scheduled nothing while requests wait and nothing else can change."""


class Simulator:
    """Replays one workload through one `SimConfig`."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        model = get_model(config.model)
        self.cost = CostModel.create(config.model, config.gpu, config.tp)
        self.vocab_size = model.vocab_size
        self.max_model_len = config.max_model_len or model.max_model_len
        self.num_blocks = config.num_blocks or self.cost.kv_cache_blocks(config.block_size,
                                                                         config.gpu_memory_utilization)
        if self.num_blocks < 2 and config.num_blocks:
            raise ValueError(f"num_blocks={config.num_blocks}: a KV cache needs at least 2 blocks "
                             "(block 0 is reserved, as in vLLM)")
        if self.num_blocks < 2:
            raise ValueError(f"{config.model} on {config.gpu} (TP {config.tp}) leaves no memory for the KV cache "
                             f"at gpu_memory_utilization={config.gpu_memory_utilization}")
        self.now = 0.0

    def _clock(self) -> float:
        return self.now

    def run(self, workload: Workload, progress: Progress | None = None, progress_every: int = 200) -> SimResult:
        cfg = self.config
        sched = Scheduler(cfg.scheduler_config(self.num_blocks, self.max_model_len), clock=self._clock)
        step_cost = self.cost.step_cost
        vocab = self.vocab_size
        n = len(workload)
        arrivals = np.asarray(workload.arrival_s, dtype=np.float64)
        reqs = RequestLog(arrivals, workload.input_len, workload.output_len)
        steps = StepLog()
        # Arrivals as plain Python numbers: the loop compares one float per step, and builds
        # a Request per arrival without numpy scalars.
        arrival_at = arrivals.tolist()
        max_tokens = np.asarray(workload.output_len).tolist()
        priority = np.asarray(workload.priority).tolist()
        next_arrival = arrival_at[0] if n else math.inf
        row_index = np.full(sched.table.capacity, -1, dtype=np.int64)  # runtime row -> request index
        input_len = reqs.input_len
        first_scheduled_s, prefix_hit_tokens = reqs.first_scheduled_s, reqs.prefix_hit_tokens
        first_token_s, last_token_s, tokens_out = reqs.first_token_s, reqs.last_token_s, reqs.tokens_out
        finish_s = reqs.finish_s
        table = sched.table
        row_of = table.row_of
        pool = sched.pool
        usable = pool.usable_blocks
        now = self.now = 0.0
        nxt = 0
        done = 0
        add_s = 0.0
        stalled: str | None = None
        wall_start = time.perf_counter()
        perf = time.perf_counter
        while True:
            if next_arrival <= now:
                a0 = perf()
                while next_arrival <= now:
                    name = str(nxt)
                    sched.add_request(Request(name, workload.prompt_tokens(nxt, vocab), max_tokens=max_tokens[nxt],
                                              priority=priority[nxt], arrival_time=next_arrival, ignore_eos=True))
                    row = row_of[name]
                    if row >= row_index.size:
                        row_index = np.concatenate([row_index, np.full(table.capacity - row_index.size, -1,
                                                                       np.int64)])
                    row_index[row] = nxt
                    nxt += 1
                    next_arrival = arrival_at[nxt] if nxt < n else math.inf
                add_s += perf() - a0
            if not sched.has_unfinished_requests():
                if nxt >= n:
                    break
                now = self.now = max(now, next_arrival)
                continue

            w0 = perf()
            out = sched.schedule()
            w1 = perf()
            if out.rejected:
                for name, why in out.rejected.items():
                    reqs.rejected[int(name)] = why
                    done += 1
            if out.preempted_req_ids:
                for name in out.preempted_req_ids:
                    reqs.preemptions[int(name)] += 1
            rows = out.rows
            k = rows.size
            if k == 0:
                sched.update(out, _NO_TOKENS)
                if out.rejected or out.preempted_req_ids:
                    continue  # something changed: decide again at the same instant
                if nxt < n:
                    now = self.now = max(now, next_arrival)
                    continue
                stalled = (f"step {out.step}: pipeline '{cfg.pipeline}' scheduled nothing with "
                           f"{sched.get_num_unfinished_requests()} requests unfinished and no arrivals left "
                           f"(first waiting: {_first_names(sched)})")
                break

            idx = row_index[rows]
            num_tokens = out.num_tokens
            computed = out.computed
            gpu_s, flops = step_cost(num_tokens, computed)
            start = now
            now = self.now = start + gpu_s
            # One kernel: the sampled tokens for update() and the step's per-request records.
            tokens = np.empty(k, dtype=np.int64)
            prefill_tokens, decode_tokens, reqs.gap_count = account_step(
                idx, num_tokens, computed, out.sampled, out.kind, input_len, vocab, start, now, first_scheduled_s,
                prefix_hit_tokens, first_token_s, last_token_s, tokens_out, reqs.reserve_gaps(k), reqs.gap_count,
                tokens)
            w2 = perf()
            finished = sched.update(out, tokens)
            w3 = perf()
            if finished:
                for name in finished:
                    finish_s[int(name)] = now
                done += len(finished)
            steps.append(start, gpu_s, prefill_tokens, decode_tokens, k, sched.waiting.size,
                         1.0 - pool.num_free / usable, ((w1 - w0) + (w3 - w2)) * 1e6, flops)
            if progress is not None and steps.size % progress_every == 0:
                progress(done, n, now)
        wall = time.perf_counter() - wall_start
        if progress is not None:
            progress(done, n, self.now)
        return SimResult(
            config_name=cfg.name, config=attrs.asdict(cfg, value_serializer=_plain),
            workload={"name": workload.name, "source": workload.source, **workload.stats()},
            num_blocks=self.num_blocks, max_model_len=self.max_model_len, peak_flops=self.cost.peak_flops,
            requests=reqs, steps=steps, runtime_metrics=sched.get_metrics(), sim_wall_s=wall, stalled=stalled,
            add_wall_s=add_s,
        )


def _first_names(sched: Scheduler, limit: int = 5) -> str:
    names = [sched.table.names[r] for r in sched.waiting[:limit].tolist()]
    return ", ".join(str(x) for x in names) or "-"


def _plain(instance: object, attribute: attrs.Attribute | None, value: object) -> object:
    if isinstance(value, (tuple, frozenset)):
        return list(value)
    if hasattr(value, "__fspath__"):
        return str(value)
    return value
