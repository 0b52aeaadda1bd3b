"""The discrete-event loop: arrivals -> schedule() -> cost model -> update() -> next step.

Simulated time only moves by the cost model's step time (or jumps to the next
arrival when the engine is idle); the scheduler's own wall time per step is
measured beside it. Every request is generated to its trace's output length
(`ignore_eos`), so the policy, not the sampler, decides what happens.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs
import numpy as np

from schedir.runtime.config import Request
from schedir.runtime.scheduler import Scheduler
from schedir.sim.config import SimConfig
from schedir.sim.cost_model import CostModel
from schedir.sim.models import get_model
from schedir.sim.records import RequestLog, SimResult, StepLog
from schedir.sim.workloads import Workload

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
        cost = self.cost
        vocab = self.vocab_size
        n = len(workload)
        arrivals = np.asarray(workload.arrival_s, dtype=np.float64)
        reqs = RequestLog(arrivals, workload.input_len, workload.output_len)
        steps = StepLog()
        row_index = np.full(sched.table.capacity, -1, dtype=np.int64)
        input_len = reqs.input_len
        table = sched.table
        pool = sched.pool
        usable = pool.usable_blocks
        self.now = 0.0
        nxt = 0
        done = 0
        stalled: str | None = None
        wall_start = time.perf_counter()
        perf = time.perf_counter
        while True:
            while nxt < n and arrivals[nxt] <= self.now:
                name = str(nxt)
                sched.add_request(Request(name, workload.prompt_tokens(nxt, vocab), max_tokens=int(workload.output_len[nxt]),
                                          priority=int(workload.priority[nxt]), arrival_time=float(arrivals[nxt]),
                                          ignore_eos=True))
                row = table.row_of[name]
                if row >= row_index.size:
                    row_index = np.concatenate([row_index, np.full(table.capacity - row_index.size, -1, np.int64)])
                row_index[row] = nxt
                nxt += 1
            if not sched.has_unfinished_requests():
                if nxt >= n:
                    break
                self.now = max(self.now, float(arrivals[nxt]))
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
            k = out.rows.size
            if k == 0:
                sched.update(out, np.zeros(0, dtype=np.int64))
                if out.rejected or out.preempted_req_ids:
                    continue  # something changed: decide again at the same instant
                if nxt < n:
                    self.now = max(self.now, float(arrivals[nxt]))
                    continue
                stalled = (f"step {out.step}: pipeline '{cfg.pipeline}' scheduled nothing with "
                           f"{sched.get_num_unfinished_requests()} requests unfinished and no arrivals left "
                           f"(first waiting: {_first_names(sched)})")
                break

            idx = row_index[out.rows]
            num_tokens = out.num_tokens
            computed = out.computed
            gpu_s, flops = cost.step_cost(num_tokens, computed)
            start = self.now
            self.now = start + gpu_s
            sampled = out.sampled
            tokens = np.where(sampled, (idx * 7919 + computed + num_tokens) % vocab, -1)
            w2 = perf()
            finished = sched.update(out, tokens)
            w3 = perf()

            # Requests admitted for the first time: queueing delay and prefix hit.
            fresh = idx[out.kind == 1]
            if fresh.size:
                new_ones = fresh[np.isnan(reqs.first_scheduled_s[fresh])]
                reqs.first_scheduled_s[new_ones] = start
                hits = computed[out.kind == 1]
                first = reqs.prefix_hit_tokens[fresh] < 0
                reqs.prefix_hit_tokens[fresh[first]] = hits[first]
            # Tokens delivered at the end of this step.
            got = idx[sampled]
            if got.size:
                later = reqs.tokens_out[got] > 0
                reqs.add_gaps(self.now - reqs.last_token_s[got[later]])
                reqs.first_token_s[got[~later]] = self.now
                reqs.last_token_s[got] = self.now
                reqs.tokens_out[got] += 1
            for name in finished:
                reqs.finish_s[int(name)] = self.now
            done += len(finished)

            decode = (num_tokens == 1) & (computed >= input_len[idx])
            decode_tokens = int(decode.sum())
            steps.append(start, gpu_s, int(num_tokens.sum()) - decode_tokens, decode_tokens, k,
                         int(sched.waiting.size), 1.0 - pool.num_free / usable, ((w1 - w0) + (w3 - w2)) * 1e6,
                         flops)
            if progress is not None and steps.size % progress_every == 0:
                progress(done, n, self.now)
        wall = time.perf_counter() - wall_start
        if progress is not None:
            progress(done, n, self.now)
        return SimResult(
            config_name=cfg.name, config=attrs.asdict(cfg, value_serializer=_plain),
            workload={"name": workload.name, "source": workload.source, **workload.stats()},
            num_blocks=self.num_blocks, max_model_len=self.max_model_len, peak_flops=cost.peak_flops,
            requests=reqs, steps=steps, runtime_metrics=sched.get_metrics(), sim_wall_s=wall, stalled=stalled,
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
