"""A fleet instance that is a real vLLM 0.32 engine on schedir's scheduler (tiny random-weight Llama, CPU).

`VllmEngine` has the simulator `Engine`'s interface (`add`, `step`, `abort_all`, `sched`,
`now`, the per-step `finished` / `rejected` / `preempted` / `batch`), so the fleet's
`InstanceCore` drives it unchanged, in a Ray actor (`RayBackend(kind="vllm")`). Each `step()`
is one `LLMEngine.step()`: schedir's plug-in (`schedir.engines.vllm.Scheduler`) decides the
batch, vLLM's model runner executes it and samples real tokens, and the plug-in's update
applies them.

The fleet's clock stays the cost model's: a step moves the instance's clock by the simulated
GPU time of the batch it actually ran (the tiny model's CPU wall time would make the router's
decisions depend on the machine's load). With the same engine settings the plug-in's runtime
decides every step as the simulator's does, so a fleet of these makes the simulated fleet's
routing decisions while really serving the requests; each request's output length from vLLM
is checked against the runtime's count when it finishes.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from schedir.runtime.config import Request
from schedir.sim.config import SimConfig
from schedir.sim.cost_model import CostModel
from schedir.sim.engine import StepStatus
from schedir.sim.records import RequestLog, StepLog, account_step
from schedir.tools.parity.engine_run import BLOCK_SIZE, KV_BYTES_PER_BLOCK, TINY_LLAMA

_NONE = np.zeros(0, dtype=np.int64)


def check_vllm_config(config: SimConfig, vocab_size: int) -> None:
    """The engine settings a tiny-Llama vLLM instance can take (ValueError naming the option otherwise)."""
    if config.block_size != BLOCK_SIZE:
        raise ValueError(f"--instance-engine vllm needs --block-size {BLOCK_SIZE} (vLLM's CPU attention), got "
                         f"{config.block_size}")
    if vocab_size != TINY_LLAMA["vocab_size"]:
        raise ValueError(f"--instance-engine vllm runs a tiny Llama with a {TINY_LLAMA['vocab_size']}-token "
                         f"vocabulary: simulate a model with that vocabulary (--model llama-2-7b), got {config.model}")
    if config.num_blocks is None or config.max_model_len is None:
        raise ValueError("--instance-engine vllm needs --num-blocks and --max-model-len (its KV cache is sized in "
                         "blocks)")


class VllmEngine:
    """A real vLLM engine with the simulator `Engine`'s interface (see the module docstring)."""

    def __init__(self, config: SimConfig, reqs: RequestLog, steps: StepLog,
                 sizes: tuple[CostModel, int, int, int]) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: the class object below
        os.environ["VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"] = "1"  # request ids stay the fleet's request numbers
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM, SamplingParams
        from vllm.exceptions import VLLMValidationError

        self.config = config
        self.cost, self.vocab_size, self.max_model_len, self.num_blocks = sizes
        check_vllm_config(config, self.vocab_size)
        self.SamplingParams = SamplingParams
        self.ValidationError = VLLMValidationError
        self.reqs = reqs
        self.steps = steps
        self.now = 0.0
        self.finished: list[int] = []
        self.rejected: list[int] = []
        self.preempted: list[int] = []
        self.batch: np.ndarray = _NONE
        self.seen: dict[str, Any] = {}
        model_dir = Path(tempfile.mkdtemp(prefix="schedir-fleet-llama-"))
        (model_dir / "config.json").write_text(json.dumps(TINY_LLAMA))
        self.llm = LLM(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", seed=0,
                       enforce_eager=True, max_model_len=self.max_model_len, max_num_seqs=config.max_num_seqs,
                       max_num_batched_tokens=config.max_num_batched_tokens,
                       enable_prefix_caching=config.prefix_caching, scheduling_policy=config.policy,
                       long_prefill_token_threshold=config.long_prefill_token_threshold, block_size=BLOCK_SIZE,
                       kv_cache_memory_bytes=self.num_blocks * KV_BYTES_PER_BLOCK,
                       scheduler_cls=_fleet_scheduler(self.seen),
                       additional_config={"schedir_pipeline": config.pipeline})
        self.engine = self.llm.llm_engine
        plugin = self.seen["scheduler"]
        self.sched = plugin.runtime
        self.sched.clock = self._clock  # the fleet's clock, as the simulator's runtime has
        # the plug-in builds batch plans (vLLM's model runner reads them); the simulated engine does not
        want = attrs.evolve(config.scheduler_config(self.num_blocks, self.max_model_len), batch_plan=True)
        if plugin.config != want:
            raise ValueError(f"the vLLM instance's scheduler settings differ from the simulated engine's: "
                             f"{plugin.config} != {want}")

    def _clock(self) -> float:
        return self.now

    @property
    def busy(self) -> bool:
        return self.sched.has_unfinished_requests()

    def add(self, index: int, prompt: np.ndarray, max_tokens: int, priority: int, arrival: float) -> None:
        params = self.SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False, temperature=0.0)
        try:
            self.engine.add_request(str(index), {"prompt_token_ids": prompt.astype(np.int64).tolist()}, params,
                                    arrival_time=arrival, priority=priority)
        except self.ValidationError:
            if prompt.size <= self.max_model_len:
                raise
            # vLLM's front end refuses a prompt longer than the model; the simulator's runtime queues
            # it and its pipeline rejects it at the next step. Queue it in the plug-in's runtime only
            # (vLLM never sees it): the instance's facts and the rejection are the simulator's.
            self.sched.add_request(Request(str(index), prompt, max_tokens=max_tokens, priority=priority,
                                           arrival_time=arrival, ignore_eos=True))

    def step(self) -> StepStatus:
        """One `LLMEngine.step()`; the clock moves by the cost model's time for the batch it ran."""
        reqs = self.reqs
        self.finished, self.rejected, self.preempted, self.batch = [], [], [], _NONE
        self.seen["out"] = None
        self.seen["sched_s"] = 0.0
        outputs = self.engine.step()
        got = self.seen["out"]
        if got is None:
            return StepStatus.IDLE
        names, num_tokens, computed, sampled, kind, rejected, preempted = got
        for name, why in rejected.items():
            reqs.rejected[int(name)] = why
            self.rejected.append(int(name))
        for name in preempted:
            reqs.preemptions[int(name)] += 1
            self.preempted.append(int(name))
        k = len(names)
        if k == 0:
            return StepStatus.CHANGED if (rejected or preempted) else StepStatus.IDLE
        idx = self.batch = np.array([int(n) for n in names], dtype=np.int64)
        gpu_s, flops = self.cost.step_cost(num_tokens, computed)
        start = self.now
        now = self.now = start + gpu_s
        tokens = np.empty(k, dtype=np.int64)  # the simulator's token stand-ins: vLLM sampled the real ones
        prefill_tokens, decode_tokens, reqs.gap_count = account_step(
            idx, num_tokens, computed, sampled, kind, reqs.input_len, self.vocab_size, start, now,
            reqs.first_scheduled_s, reqs.prefix_hit_tokens, reqs.first_token_s, reqs.last_token_s, reqs.tokens_out,
            reqs.reserve_gaps(k), reqs.gap_count, tokens)
        for ro in outputs:
            if not ro.finished:
                continue
            r = int(ro.request_id)
            if r in self.rejected:
                continue
            got_tokens = len(ro.outputs[0].token_ids)
            if got_tokens != int(reqs.tokens_out[r]):
                raise RuntimeError(f"request {r}: vLLM returned {got_tokens} tokens, the runtime counted "
                                   f"{int(reqs.tokens_out[r])}")
            self.finished.append(r)
            reqs.finish_s[r] = now
        pool = self.sched.pool
        self.steps.append(start, gpu_s, prefill_tokens, decode_tokens, k, self.sched.waiting.size,
                          1.0 - pool.num_free / pool.usable_blocks, self.seen["sched_s"] * 1e6, flops)
        return StepStatus.RAN

    def abort_all(self) -> list[int]:
        sched = self.sched
        rows = np.concatenate([sched.running, sched.waiting])
        names = [sched.table.names[r] for r in rows.tolist()]
        if names:
            self.engine.abort_request(names)
        return sorted(int(x) for x in names)

    def first_waiting(self, limit: int = 5) -> str:
        names = [self.sched.table.names[r] for r in self.sched.waiting[:limit].tolist()]
        return ", ".join(str(x) for x in names) or "-"


def _fleet_scheduler(seen: dict[str, Any]) -> type:
    """schedir's vLLM plug-in, keeping each step's decision (batch order, tokens, computed,
    sampled, admission kind, rejected, preempted) and its own wall time for the fleet."""
    from schedir.engines.vllm.scheduler import Scheduler

    class FleetScheduler(Scheduler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            seen["scheduler"] = self

        def schedule(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            so = super().schedule(*args, **kwargs)
            out = self._in_flight.get(id(so))
            if out is not None:
                seen["out"] = (list(out.req_ids), out.num_tokens.copy(), out.computed.copy(), out.sampled.copy(),
                               out.kind.copy(), dict(out.rejected), sorted(out.preempted_req_ids))
            seen["sched_s"] = seen.get("sched_s", 0.0) + time.perf_counter() - t0
            return so

        def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
            t0 = time.perf_counter()
            result = super().update_from_output(scheduler_output, model_runner_output)
            seen["sched_s"] = seen.get("sched_s", 0.0) + time.perf_counter() - t0
            return result

    return FleetScheduler
