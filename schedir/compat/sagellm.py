"""The seed project's scheduler API (`SchedulerIR`, `ScheduleRequest`, ...) over schedir's step IR.

Why: code written against the seed's API should run unchanged while every call goes through the
same step IR, pass manager and dumps as schedir's own scheduler. Each `schedule()` call builds a
fresh runtime `Scheduler` whose KV pool holds `available_memory` free blocks (the unit is KV
blocks of `block_size` tokens, not bytes) plus the blocks the running requests already hold;
running requests are placed first (one prefill step, not reported), then the pending requests are
scheduled by the pipeline. `last_ir` is the text of that step's IR; `dump_dir` writes it after
every pass.
"""

from __future__ import annotations

import contextlib
import enum
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs
import numpy as np

from schedir.dialects.codes import Reason
from schedir.dialects.req import DeferOp
from schedir.ir.step import steps_of
from schedir.passes.seed import OptimizationPass, RequestInfo, as_step_pass
from schedir.runtime import Request, Scheduler, SchedulerConfig

__all__ = ["BaseSchedulerIR", "OptimizationPass", "RequestInfo", "RequestPhase", "ScheduleMetrics",
           "ScheduleRequest", "ScheduleResult", "SchedulerIR"]


class RequestPhase(enum.Enum):
    """Where a request is in its life (the seed's phases)."""

    PREFILL = "prefill"
    DECODE = "decode"
    WAITING = "waiting"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@attrs.define
class ScheduleRequest:
    """One request as the seed passes it: prompt tokens, limits, priority (lower value first)."""

    request_id: str
    token_ids: list[int] = attrs.field(factory=list)
    max_tokens: int = 16
    priority: int = 0
    arrival_time: float = attrs.field(factory=time.monotonic)
    phase: RequestPhase = RequestPhase.WAITING
    generated_tokens: int = 0


@attrs.define
class ScheduleResult:
    """One call's decisions; requests left out carry a reason (`budget`, `memory`, `too_long`, ...)."""

    scheduled_requests: list[ScheduleRequest] = attrs.field(factory=list)
    preempted_requests: list[ScheduleRequest] = attrs.field(factory=list)
    deferred_requests: dict[str, str] = attrs.field(factory=dict)
    rejected_requests: dict[str, str] = attrs.field(factory=dict)
    num_scheduled_tokens: dict[str, int] = attrs.field(factory=dict)
    batch_size: int = 0
    batch_tokens: int = 0
    schedule_time: float = 0.0


@attrs.define
class ScheduleMetrics:
    """Totals over every `schedule()` call of one scheduler (latency is the call's own time, s)."""

    total_requests: int = 0
    avg_latency: float = 0.0
    p99_latency: float = 0.0
    throughput: float = 0.0  # scheduled tokens per second of scheduling time
    batch_efficiency: float = 0.0  # scheduled tokens / token budget, averaged over calls
    memory_utilization: float = 0.0  # blocks in use / blocks, averaged over calls


class SchedulerIR(ABC):
    """The seed's abstract scheduler."""

    @abstractmethod
    def schedule(self, pending_requests: Sequence[ScheduleRequest], running_requests: Sequence[ScheduleRequest],
                 available_memory: int) -> ScheduleResult: ...

    @abstractmethod
    def add_optimization_pass(self, opt: OptimizationPass) -> None: ...

    @abstractmethod
    def remove_optimization_pass(self, name: str) -> bool: ...

    @abstractmethod
    def get_metrics(self) -> ScheduleMetrics: ...


@contextlib.contextmanager
def _registered(classes: list) -> Iterator[None]:
    """One scheduler object's seed passes in the pass table for the length of one call: a
    process-wide entry would outlive the object and clash with another object's pass of the
    same name (and the table is what `schedir passes` lists)."""
    from schedir import passes as registry

    saved = {c.name: registry.PASSES.get(c.name) for c in classes}
    for c in classes:
        registry.PASSES[c.name] = c
    try:
        yield
    finally:
        for name, previous in saved.items():
            if previous is None:
                registry.PASSES.pop(name, None)
            else:
                registry.PASSES[name] = previous


class BaseSchedulerIR(SchedulerIR):
    """The seed's base scheduler: a schedir pipeline (`base` by default) run over one step per call."""

    def __init__(self, pipeline: str = "base", *, block_size: int = 16, max_num_batched_tokens: int = 8192,
                 max_num_seqs: int = 256, max_model_len: int = 8192, dump_dir: str | Path | None = None) -> None:
        self.pipeline = pipeline
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.passes: list[OptimizationPass] = []
        self._wrapped: dict[int, type] = {}  # id(seed pass) -> its StepPass class
        self.last_ir: str = ""
        self._latencies: list[float] = []
        self._tokens = 0
        self._requests = 0
        self._efficiency: list[float] = []
        self._memory: list[float] = []

    def add_optimization_pass(self, opt: OptimizationPass) -> None:
        """Run `opt` (a seed pass, wrapped by `as_step_pass`) after the pipeline's order pass."""
        if not opt.name:
            raise ValueError("an OptimizationPass needs a name")
        if any(p.name == opt.name for p in self.passes):
            raise ValueError(f"an optimization pass named '{opt.name}' is already added")
        self.passes.append(opt)

    def remove_optimization_pass(self, name: str) -> bool:
        before = len(self.passes)
        self.passes = [p for p in self.passes if p.name != name]
        return len(self.passes) != before

    def _pipeline(self) -> tuple[str, list]:
        """The preset with the seed passes spliced in before `schedule-running` (after the order),
        and the pass classes wrapping them (in the pass table only while a call runs: see
        `_registered`)."""
        from schedir.passes.presets import PRESETS

        spec = PRESETS.get(self.pipeline, self.pipeline)
        if not self.passes:
            return spec, []
        classes = []
        for opt in self.passes:
            cls = self._wrapped.get(id(opt))
            if cls is None or cls._seed is not opt:  # type: ignore[attr-defined]
                cls = as_step_pass(opt, name=f"seed-{opt.name}")
                cls._seed = opt  # type: ignore[attr-defined]
                self._wrapped[id(opt)] = cls
            classes.append(cls)
        items = spec.split(",")
        at = next((i for i, p in enumerate(items) if p.startswith("schedule-running")), len(items))
        return ",".join(items[:at] + [c.name for c in classes] + items[at:]), classes

    def schedule(self, pending_requests: Sequence[ScheduleRequest], running_requests: Sequence[ScheduleRequest],
                 available_memory: int) -> ScheduleResult:
        """Schedule one step; `available_memory` is the number of free KV blocks."""
        _check(pending_requests, running_requests, available_memory)
        start = time.perf_counter()
        held = sum(-(-(len(r.token_ids) + r.generated_tokens + 1) // self.block_size) for r in running_requests)
        spec, seed_classes = self._pipeline()
        with _registered(seed_classes):
            return self._schedule(spec, pending_requests, running_requests, available_memory, held, start)

    def _schedule(self, spec: str, pending_requests: Sequence[ScheduleRequest],
                  running_requests: Sequence[ScheduleRequest], available_memory: int, held: int,
                  start: float) -> ScheduleResult:
        cfg = SchedulerConfig(num_blocks=max(int(available_memory) + held + 1, 2), block_size=self.block_size,
                              max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=self.max_num_seqs,
                              max_model_len=self.max_model_len, pipeline=spec, enable_prefix_caching=True,
                              dump_dir=self.dump_dir, dump_steps="all" if self.dump_dir else None)
        sched = Scheduler(cfg)
        by_id = {r.request_id: r for r in [*running_requests, *pending_requests]}
        if running_requests:  # place the running requests: their prefill is the state they are in
            for r in running_requests:
                sched.add_request(_request(r))
            warm = sched.schedule()
            sched.update(warm, {n: [0] for n in warm.req_ids})
        for r in pending_requests:
            sched.add_request(_request(r))
        sched.keep_ir = True
        out = sched.schedule()
        self.last_ir = str(sched.last_module) if sched.last_module is not None else ""
        result = self._result(sched, out, by_id, pending_requests)
        result.schedule_time = time.perf_counter() - start
        self._record(result, sched)
        return result

    def _result(self, sched: Scheduler, out, by_id: dict[str, ScheduleRequest],
                pending: Sequence[ScheduleRequest]) -> ScheduleResult:
        tokens = out.num_scheduled_tokens
        scheduled = [by_id[n] for n in out.req_ids]
        for r in scheduled:
            r.phase = RequestPhase.PREFILL if r in pending else RequestPhase.DECODE
        preempted = [by_id[n] for n in sorted(out.preempted_req_ids)]
        for r in preempted:
            r.phase = RequestPhase.PREEMPTED
        rejected = {n: str(reason) for n, reason in out.rejected.items()}
        deferred = _defer_reasons(sched)
        for r in pending:
            n = r.request_id
            if n not in tokens and n not in rejected:
                deferred.setdefault(n, "budget")
        deferred = {n: why for n, why in deferred.items() if n not in tokens and n in by_id}
        return ScheduleResult(scheduled_requests=scheduled, preempted_requests=preempted, deferred_requests=deferred,
                              rejected_requests=rejected, num_scheduled_tokens=dict(tokens), batch_size=len(scheduled),
                              batch_tokens=int(out.total_num_scheduled_tokens))

    def _record(self, result: ScheduleResult, sched: Scheduler) -> None:
        self._latencies.append(result.schedule_time)
        self._tokens += result.batch_tokens
        self._requests += result.batch_size
        self._efficiency.append(result.batch_tokens / self.max_num_batched_tokens)
        pool = sched.pool
        self._memory.append(1.0 - pool.num_free / pool.usable_blocks)

    def get_metrics(self) -> ScheduleMetrics:
        if not self._latencies:
            return ScheduleMetrics()
        lat = np.asarray(self._latencies)
        return ScheduleMetrics(total_requests=self._requests, avg_latency=float(lat.mean()),
                               p99_latency=float(np.percentile(lat, 99)),
                               throughput=self._tokens / float(lat.sum()) if lat.sum() > 0 else 0.0,
                               batch_efficiency=float(np.mean(self._efficiency)),
                               memory_utilization=float(np.mean(self._memory)))


def _request(r: ScheduleRequest) -> Request:
    return Request(r.request_id, prompt_token_ids=list(r.token_ids), max_tokens=r.max_tokens + r.generated_tokens + 1,
                   priority=r.priority, arrival_time=r.arrival_time, ignore_eos=True)


def _defer_reasons(sched: Scheduler) -> dict[str, str]:
    """Reasons of the step's `req.defer` ops, by request name (the IR's ids are runtime rows)."""
    if sched.last_module is None:
        return {}
    name_of = {row: name for name, row in sched.table.row_of.items()}
    out: dict[str, str] = {}
    for step in steps_of(sched.last_module):
        for op in step.body.block.ops:
            if isinstance(op, DeferOp) and len(op):
                for row, code in zip(op.ids.tolist(), op.col("reason").tolist(), strict=True):
                    if row in name_of:
                        out[name_of[row]] = Reason(code).name.lower()
    return out


def _check(pending: Sequence[ScheduleRequest], running: Sequence[ScheduleRequest], memory: int) -> None:
    """Refuse bad input with an error that names the request."""
    if not isinstance(memory, (int, np.integer)) or memory < 0:
        raise ValueError(f"available_memory must be a non-negative number of KV blocks, got {memory!r}")
    seen: set[str] = set()
    for r in [*running, *pending]:
        if not isinstance(r, ScheduleRequest):
            raise ValueError(f"expected ScheduleRequest, got {type(r).__name__}")
        if r.request_id in seen:
            raise ValueError(f"request '{r.request_id}' appears twice (ids must be unique across both lists)")
        seen.add(r.request_id)
        if len(r.token_ids) == 0:
            raise ValueError(f"request '{r.request_id}' has empty token_ids")
        if r.max_tokens < 1:
            raise ValueError(f"request '{r.request_id}' has max_tokens {r.max_tokens}, must be >= 1")
