"""Parity harness: one trace, one fake model runner, any scheduler, compared step by step.

Why: schedir's `vllm` pipeline claims to make vLLM's scheduling decisions. The only
convincing check is to run vLLM's own v1 `Scheduler` and schedir on the same arrivals,
feed both the same sampled tokens, record every engine step in one canonical form
(`StepRecord`) and diff the two histories. This module holds everything that does not
depend on vLLM: the config, the synthetic trace, the record, the engine loop, the fake
model runner, schedir's side and the comparison. `vllm_driver` plays vLLM's side.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, Literal, Protocol

import attrs
import numpy as np

Policy = Literal["fcfs", "priority"]
NewEntry = tuple[str, int, int]
"""(req_id, scheduled tokens, prefix-hit tokens at admission)."""
CachedEntry = tuple[str, int, bool, int]
"""(req_id, scheduled tokens, resumed, computed tokens at resume if resumed else 0)."""
BlockEntry = tuple[str, tuple[int, ...]]
"""(req_id, block ids handed to the model runner this step)."""

DECISION_FIELDS: tuple[str, ...] = ("step", "new", "cached", "preempted", "finished")
"""What two schedulers must agree on; block ids are compared separately (allocators may differ)."""

VOCAB_LO, VOCAB_HI = 3, 32000
"""Trace token range: above BOS/EOS (1, 2) of the tiny Llama vLLM is configured with."""


@attrs.frozen
class ParityConfig:
    """One parity scenario: the scheduler's limits and the synthetic trace's shape.

    `arrival_rate` is requests per engine step (Poisson); 0 puts every request at step 0.
    """

    block_size: int = 16
    num_blocks: int = 2000
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 8192
    long_prefill_token_threshold: int = 0
    policy: Policy = attrs.field(default="fcfs", validator=attrs.validators.in_(("fcfs", "priority")))
    prefix_caching: bool = True
    num_requests: int = 200
    arrival_rate: float = 1.0
    prompt_min: int = 32
    prompt_max: int = 2048
    output_min: int = 16
    output_max: int = 512
    num_shared_prefixes: int = 4
    share_prob: float = 0.5
    seed: int = 0
    name: str = ""
    async_scheduling: bool = False
    """vLLM's async scheduling: the engine loop keeps two steps in flight (`run_engine`) and the
    schedulers are vLLM's AsyncScheduler and schedir with output placeholders."""
    num_cpu_blocks: int = 0
    """Host blocks for preemption by swap (schedir's vllm-v0 presets; vLLM v1 has none)."""

    @property
    def label(self) -> str:
        """`name`, or a name derived from the fields that usually tell scenarios apart."""
        if self.name:
            return self.name
        return (
            f"{self.policy}-b{self.max_num_batched_tokens}-kv{self.num_blocks}"
            f"-lp{self.long_prefill_token_threshold}-share{self.share_prob:g}"
            + ("-async" if self.async_scheduling else "")
        )


@attrs.frozen
class TraceRequest:
    """One request of a trace: it is added to the engine at the start of `arrival_step`."""

    req_id: str
    arrival_step: int
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    priority: int = 0
    abort_step: int | None = None
    """Abort the request at the start of this engine step (before scheduling), wherever it is:
    waiting, mid-prefill, decoding or preempted; ignored once it has finished. A step the loop
    skips as idle aborts at the next step it runs. None: never aborted."""


def make_trace(cfg: ParityConfig) -> list[TraceRequest]:
    """A deterministic synthetic trace (same seed, same trace, on any machine).

    A share of the prompts start with one of a few shared random prefixes (128-1024
    tokens, cut to the prompt's length), so prefix caching changes decisions. Request
    ids are zero-padded so string order (vLLM's priority tie-break) is arrival order.
    """
    rng = np.random.default_rng(cfg.seed)
    lo = min(128, cfg.prompt_max)
    hi = max(lo, min(1024, cfg.prompt_max))
    shared = [
        rng.integers(VOCAB_LO, VOCAB_HI, size=int(rng.integers(lo, hi + 1))) for _ in range(cfg.num_shared_prefixes)
    ]
    width = len(str(max(cfg.num_requests - 1, 0)))
    trace: list[TraceRequest] = []
    clock = 0.0
    for i in range(cfg.num_requests):
        if cfg.arrival_rate > 0 and i > 0:
            clock += float(rng.exponential(1.0 / cfg.arrival_rate))
        prompt_len = int(rng.integers(cfg.prompt_min, cfg.prompt_max + 1))
        max_tokens = int(rng.integers(cfg.output_min, cfg.output_max + 1))
        prefix = np.empty(0, dtype=np.int64)
        if shared and rng.random() < cfg.share_prob:
            prefix = shared[int(rng.integers(len(shared)))][:prompt_len]
        tail = rng.integers(VOCAB_LO, VOCAB_HI, size=prompt_len - len(prefix))
        priority = int(rng.integers(0, 4)) if cfg.policy == "priority" else 0
        trace.append(
            TraceRequest(
                req_id=f"r{i:0{width}d}",
                arrival_step=int(clock),
                prompt_token_ids=tuple(np.concatenate([prefix, tail]).tolist()),
                max_tokens=max_tokens,
                priority=priority,
            )
        )
    return trace


@attrs.frozen
class StepRecord:
    """What one engine step decided, in a form both engines can be reduced to.

    `new` and `cached` keep the engine's output order (it is the batch order the model
    runner sees), so they are tuples and compared as such.
    """

    step: int
    new: tuple[NewEntry, ...] = ()
    cached: tuple[CachedEntry, ...] = ()
    preempted: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    finished: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    new_block_ids: tuple[BlockEntry, ...] = ()
    cached_new_block_ids: tuple[BlockEntry, ...] = ()

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(e[1] for e in self.new) + sum(e[1] for e in self.cached)

    def decisions(self) -> tuple[object, ...]:
        return tuple(getattr(self, f) for f in DECISION_FIELDS)


@attrs.frozen
class Chunk:
    """One scheduled request as the fake model runner sees it."""

    req_id: str
    computed_after: int
    """Tokens computed once this step's chunk has run."""
    samples: bool
    """The chunk reaches the end of the request's known tokens, so a token is sampled."""


def fake_token(computed_after: int) -> int:
    """The token the fake model samples: a function of the position only, never EOS (2)."""
    return 1000 + (computed_after * 7919) % 30000


def fake_model_runner(chunks: Iterable[Chunk]) -> dict[str, list[int]]:
    """One sampled token per chunk that completes its request's known tokens; none for a partial prefill."""
    return {c.req_id: [fake_token(c.computed_after)] for c in chunks if c.samples}


class Engine(Protocol):
    """A scheduler under test, reduced to what the shared loop needs."""

    def add(self, req: TraceRequest) -> None: ...

    def has_requests(self) -> bool:
        """Anything to schedule, or finished requests not yet reported (vLLM runs one more step for those)."""
        ...

    def schedule(self, step: int) -> tuple[StepRecord, list[Chunk]]: ...

    def update(self, sampled: dict[str, list[int]]) -> None:
        """Feed the model runner's output for the step just scheduled."""
        ...

    def abort(self, req_ids: Sequence[str]) -> None:
        """Abort these requests (a client went away); finished or unknown ids are ignored.
        Optional: `run_engine` calls it only for traces with an `abort_step`."""
        ...


class EngineStalled(RuntimeWarning):
    """The loop stopped early: the engine kept scheduling nothing, or ran past `max_steps`."""


def run_engine(
    engine: Engine,
    trace: Sequence[TraceRequest],
    max_steps: int = 1_000_000,
    stall_limit: int = 1000,
    depth: int = 1,
) -> list[StepRecord]:
    """The engine loop both sides share: sync like vLLM's `EngineCore.step` (`depth` 1), or
    with `depth` steps in flight like `EngineCore.step_with_batch_queue` (async scheduling: 2).

    Each step: add the requests that have arrived, schedule, run the fake model, update. With
    `depth` > 1 a scheduled step joins a queue and the engine schedules again while the queue
    has room (and the step scheduled something, or more is waiting); otherwise the oldest step
    in flight is run and updated.
    A step with nothing queued is idle and skipped (no record), as vLLM's busy loop does.
    A stuck engine ends the loop with a warning rather than an exception, so the records
    so far can still be compared. Aborts (`TraceRequest.abort_step`) are applied after the
    step's arrivals and before its `schedule()`, in (step, request id) order.
    """
    pending = deque(sorted(trace, key=lambda r: r.arrival_step))
    aborts = sorted((r.abort_step, r.req_id) for r in trace if r.abort_step is not None)
    added: set[str] = set()
    records: list[StepRecord] = []
    in_flight: deque[list[Chunk]] = deque()
    step = 0
    empty_run = 0
    while pending or engine.has_requests() or in_flight:
        while pending and pending[0].arrival_step <= step:
            req = pending.popleft()
            engine.add(req)
            added.add(req.req_id)
        if aborts and aborts[0][0] <= step:  # an abort before its request arrives waits for it
            due = [rid for at, rid in aborts if at <= step and rid in added]
            if due:
                engine.abort(due)
                gone = set(due)
                aborts = [a for a in aborts if a[1] not in gone]
        if not engine.has_requests() and not in_flight:
            if not pending:
                break
            step = pending[0].arrival_step
            continue
        if engine.has_requests():
            record, chunks = engine.schedule(step)
            records.append(record)
            in_flight.appendleft(chunks)
            empty_run = 0 if chunks else empty_run + 1
            if len(in_flight) < depth and (chunks or engine.has_requests()):
                step += 1
                continue
        engine.update(fake_model_runner(in_flight.pop()))
        if empty_run >= stall_limit or step >= max_steps:
            why = f"{empty_run} steps in a row scheduled nothing" if empty_run >= stall_limit else "max_steps reached"
            warnings.warn(f"engine loop stopped at step {step}: {why}", EngineStalled, stacklevel=2)
            break
        step += 1
    return records


class SchedirEngine:
    """schedir's runtime (`schedir.Scheduler`, pipeline `vllm`) behind the `Engine` protocol."""

    def __init__(self, cfg: ParityConfig, pipeline: str = "vllm") -> None:
        """`pipeline`: the preset or pass list to run (the invariant fuzzer drives every preset)."""
        from schedir import Request, Scheduler, SchedulerConfig

        self._request_cls = Request
        # a deterministic clock for clock-reading passes (order-slo): one second per schedule()
        # call, never behind the latest arrival (arrival_time is the trace's step)
        self._now = 0.0
        self._sched = Scheduler(
            SchedulerConfig(
                num_blocks=cfg.num_blocks,
                block_size=cfg.block_size,
                max_num_batched_tokens=cfg.max_num_batched_tokens,
                max_num_seqs=cfg.max_num_seqs,
                max_model_len=cfg.max_model_len,
                enable_prefix_caching=cfg.prefix_caching,
                pipeline=pipeline,
                policy=cfg.policy,
                long_prefill_token_threshold=cfg.long_prefill_token_threshold,
                async_scheduling=cfg.async_scheduling,
                num_cpu_blocks=cfg.num_cpu_blocks,
            ),
            clock=self._clock,
        )
        self._out: object = None
        self._in_flight: deque[Any] = deque()  # outputs scheduled and not yet updated, oldest first
        self._tokens_left: dict[str, int] = {}
        self._finish_unreported = False

    def _clock(self) -> float:
        return self._now

    def add(self, req: TraceRequest) -> None:
        self._now = max(self._now, float(req.arrival_step))
        self._tokens_left[req.req_id] = req.max_tokens
        self._sched.add_request(
            self._request_cls(
                req.req_id,
                prompt_token_ids=list(req.prompt_token_ids),
                max_tokens=req.max_tokens,
                priority=req.priority,
                arrival_time=float(req.arrival_step),
                ignore_eos=True,
            )
        )

    @property
    def scheduler(self) -> Any:
        """The `schedir.Scheduler` under test (its pool and table, for invariant checks)."""
        return self._sched

    @property
    def steps_in_flight(self) -> int:
        """Outputs scheduled whose update has not come yet."""
        return len(self._in_flight)

    @property
    def last_output(self) -> Any:
        """The `SchedulerOutput` of the last `schedule()`."""
        return self._out

    def has_requests(self) -> bool:
        # Prefer the runtime's own answer; else: unfinished requests, or a finish the
        # harness saw (max_tokens reached) that no schedule() has reported yet.
        own = getattr(self._sched, "has_requests", None)
        if own is not None:
            return bool(own())
        return bool(self._sched.has_unfinished_requests()) or self._finish_unreported

    def schedule(self, step: int) -> tuple[StepRecord, list[Chunk]]:
        self._now = max(self._now, float(step))
        out = self._sched.schedule()
        self._out = out
        self._in_flight.append(out)
        self._finish_unreported = False
        nst = out.num_scheduled_tokens
        record = StepRecord(
            step=step,
            new=tuple((r.req_id, int(nst[r.req_id]), int(r.num_computed_tokens)) for r in out.new_reqs),
            cached=tuple(
                (r.req_id, int(nst[r.req_id]), bool(r.resumed), int(r.num_computed_tokens) if r.resumed else 0)
                for r in out.cached_reqs
            ),
            preempted=out.preempted_req_ids or frozenset(),
            finished=out.finished_req_ids or frozenset(),
            new_block_ids=tuple((r.req_id, _ints(r.block_ids)) for r in out.new_reqs),
            cached_new_block_ids=tuple((r.req_id, _ints(r.new_block_ids)) for r in out.cached_reqs),
        )
        after = (np.asarray(out.computed, dtype=np.int64) + np.asarray(out.num_tokens, dtype=np.int64)).tolist()
        samples = np.asarray(out.sampled, dtype=bool).tolist()
        chunks = [Chunk(rid, c, s) for rid, c, s in zip(out.req_ids, after, samples, strict=True)]
        return record, chunks

    def abort(self, req_ids: Sequence[str]) -> None:
        self._sched.finish_requests(list(req_ids))

    def update(self, sampled: dict[str, list[int]]) -> None:
        finished = self._sched.update(self._in_flight.popleft(), sampled)
        if finished is not None:  # the runtime names what finished (stops at max_tokens or max_model_len)
            self._finish_unreported |= bool(finished)
            return
        for rid, toks in sampled.items():
            left = self._tokens_left.get(rid, 0) - len(toks)
            self._tokens_left[rid] = left
            if left <= 0:
                self._finish_unreported = True


def _ints(ids: object) -> tuple[int, ...]:
    if ids is None:
        return ()
    return tuple(int(b) for b in np.asarray(ids).ravel().tolist())


def drive_schedir(cfg: ParityConfig, trace: Sequence[TraceRequest]) -> list[StepRecord]:
    """Run schedir's runtime over `trace` with the fake model runner; one record per engine step."""
    return run_engine(SchedirEngine(cfg), trace, depth=loop_depth(cfg))


def loop_depth(cfg: ParityConfig) -> int:
    """Steps the engine loop keeps in flight: 2 with async scheduling (vLLM's batch queue)."""
    return 2 if cfg.async_scheduling else 1


@attrs.frozen
class RunStats:
    """Totals of one engine's run, for tables."""

    steps: int
    scheduled_tokens: int
    preemptions: int
    prefix_hit_tokens: int
    resumed: int
    finished: int

    @classmethod
    def of(cls, records: Sequence[StepRecord]) -> RunStats:
        return cls(
            steps=len(records),
            scheduled_tokens=sum(r.num_scheduled_tokens for r in records),
            preemptions=sum(len(r.preempted) for r in records),
            prefix_hit_tokens=sum(e[2] for r in records for e in r.new),
            resumed=sum(1 for r in records for e in r.cached if e[2]),
            finished=sum(len(r.finished) for r in records),
        )


@attrs.frozen
class ParityReport:
    """How two step histories compare: decisions first, block ids on their own."""

    names: tuple[str, str]
    steps: tuple[int, int]
    """Records on each side."""
    steps_compared: int
    identical_steps: int
    """Compared steps whose decisions are equal (a later step may agree again after a divergence)."""
    agreeing_prefix: int
    """Steps before the first divergence."""
    decisions_identical: bool
    first_divergence: str | None
    first_divergence_step: int | None
    block_entries: int
    """Request-steps (over steps with identical decisions) where either side handed out block ids."""
    block_matches: int
    first_block_divergence: str | None

    @property
    def block_agreement(self) -> float:
        return self.block_matches / self.block_entries if self.block_entries else 1.0


def compare(
    a: Sequence[StepRecord], b: Sequence[StepRecord], names: tuple[str, str] = ("vllm", "schedir")
) -> ParityReport:
    """Compare two step histories record by record.

    Decisions (`DECISION_FIELDS`) decide parity; block-id agreement is counted only over
    steps whose decisions agree, since after a divergence the allocations mean nothing.
    """
    n = min(len(a), len(b))
    identical = 0
    first: str | None = None
    first_step: int | None = None
    prefix = n
    block_entries = block_matches = 0
    first_block: str | None = None
    for i in range(n):
        ra, rb = a[i], b[i]
        if ra.decisions() == rb.decisions():
            identical += 1
            e, m, text = _compare_blocks(ra, rb, names)
            block_entries += e
            block_matches += m
            if first_block is None and text is not None:
                first_block = text
        elif first is None:
            first, first_step, prefix = _describe(i, ra, rb, names), min(ra.step, rb.step), i
    if first is None and len(a) != len(b):
        longer, name, other = (a, names[0], names[1]) if len(a) > len(b) else (b, names[1], names[0])
        nxt = longer[n]
        first_step = nxt.step
        first = (
            f"step {nxt.step} (record {n}): `length` differs: {names[0]} ran {len(a)} steps, {names[1]} {len(b)}\n"
            f"  {name} goes on: {_summary(nxt)}\n"
            f"  {other} stopped after step {longer[n - 1].step if n else '-'}"
        )
    return ParityReport(
        names=names,
        steps=(len(a), len(b)),
        steps_compared=n,
        identical_steps=identical,
        agreeing_prefix=prefix,
        decisions_identical=first is None,
        first_divergence=first,
        first_divergence_step=first_step,
        block_entries=block_entries,
        block_matches=block_matches,
        first_block_divergence=first_block,
    )


def _compare_blocks(ra: StepRecord, rb: StepRecord, names: tuple[str, str]) -> tuple[int, int, str | None]:
    ma = dict(ra.new_block_ids + ra.cached_new_block_ids)
    mb = dict(rb.new_block_ids + rb.cached_new_block_ids)
    entries = matches = 0
    text: str | None = None
    for rid in sorted(ma.keys() | mb.keys()):
        ba, bb = ma.get(rid, ()), mb.get(rid, ())
        if not ba and not bb:
            continue
        entries += 1
        if ba == bb:
            matches += 1
        elif text is None:
            text = (
                f"step {ra.step}: block ids of {rid} differ\n  {names[0]}: {_fmt_seq(ba)}\n  {names[1]}: {_fmt_seq(bb)}"
            )
    return entries, matches, text


def _describe(i: int, ra: StepRecord, rb: StepRecord, names: tuple[str, str]) -> str:
    field = next(f for f in DECISION_FIELDS if getattr(ra, f) != getattr(rb, f))
    va, vb = getattr(ra, field), getattr(rb, field)
    lines = [f"step {ra.step} (record {i}): `{field}` differs"]
    if isinstance(va, frozenset):
        lines.append(f"  only in {names[0]}: {sorted(va - vb)}")
        lines.append(f"  only in {names[1]}: {sorted(vb - va)}")
    elif isinstance(va, tuple):
        k = next((j for j, (x, y) in enumerate(zip(va, vb)) if x != y), min(len(va), len(vb)))
        lines.append(f"  first difference at {field}[{k}] (lengths {len(va)} vs {len(vb)}):")
        lines.append(f"    {names[0]}: {va[k] if k < len(va) else '<none>'}")
        lines.append(f"    {names[1]}: {vb[k] if k < len(vb) else '<none>'}")
        lo = max(0, k - 2)
        lines.append(f"  {names[0]} {field}[{lo}:]: {_fmt_seq(va[lo:])}")
        lines.append(f"  {names[1]} {field}[{lo}:]: {_fmt_seq(vb[lo:])}")
    else:
        lines.append(f"  {names[0]}: {va}\n  {names[1]}: {vb}")
    lines.append(f"  {names[0]} step: {_summary(ra)}")
    lines.append(f"  {names[1]} step: {_summary(rb)}")
    return "\n".join(lines)


def _summary(r: StepRecord) -> str:
    resumed = sum(1 for e in r.cached if e[2])
    return (
        f"step {r.step}, {len(r.new)} new + {len(r.cached)} cached ({resumed} resumed) reqs, "
        f"{r.num_scheduled_tokens} tokens, preempted {sorted(r.preempted)}, finished {sorted(r.finished)}"
    )


def _fmt_seq(seq: Sequence[object], limit: int = 6) -> str:
    items = ", ".join(str(x) for x in seq[:limit])
    more = f", ... (+{len(seq) - limit} more)" if len(seq) > limit else ""
    return f"[{items}{more}]"


def standard_matrix(num_requests: int | None = None) -> list[ParityConfig]:
    """The scenarios parity is checked on (tests and `benchmarks/vllm_parity.py`).

    FCFS and priority; budgets 2048 and 8192 (the 8192 ones with a KV cache and an
    arrival rate large enough for the budget, not the cache, to bind); a long-prefill
    threshold; shared prefixes at the default and a high share; small KV caches where
    vLLM preempts every ~20 steps (FCFS and priority pick different victims); a burst;
    a max_num_seqs cap; prefix caching off; a 512-token budget (every prompt chunked);
    max_model_len cutting generations short. The default 2000-block cache already
    preempts now and then. `num_requests` overrides every scenario's request count.
    """
    base = ParityConfig(num_requests=120)
    roomy = {"num_blocks": 8000, "arrival_rate": 4.0}
    tight = {"prompt_max": 512, "output_min": 128}
    matrix = [
        attrs.evolve(base, name="fcfs-2048"),
        attrs.evolve(base, name="fcfs-8192", max_num_batched_tokens=8192, **roomy),
        attrs.evolve(base, name="priority-2048", policy="priority"),
        attrs.evolve(base, name="priority-8192", policy="priority", max_num_batched_tokens=8192, **roomy),
        attrs.evolve(base, name="fcfs-long-prefill-256", long_prefill_token_threshold=256),
        attrs.evolve(base, name="fcfs-share-0.9", share_prob=0.9, num_shared_prefixes=2),
        attrs.evolve(base, name="fcfs-preempt-kv300", num_blocks=300, **tight),
        attrs.evolve(base, name="priority-preempt-kv400", policy="priority", num_blocks=400, **tight),
        attrs.evolve(base, name="fcfs-burst-kv600", arrival_rate=0.0, num_blocks=600, num_requests=80),
        attrs.evolve(base, name="fcfs-seqs32", max_num_seqs=32, **roomy),
        attrs.evolve(base, name="fcfs-no-prefix-cache", prefix_caching=False),
        attrs.evolve(base, name="fcfs-budget-512", max_num_batched_tokens=512, arrival_rate=0.25),
        attrs.evolve(base, name="priority-model-len-1024", policy="priority", max_model_len=1024, prompt_max=1000),
    ]
    if num_requests is not None:
        matrix = [attrs.evolve(c, num_requests=num_requests) for c in matrix]
    return matrix
