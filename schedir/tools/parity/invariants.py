"""Invariant fuzzing: every preset, the fuzzer's cases, checked after every step.

Why: a preset without a reference implementation (`base`, `base-priority`, a new one) can
still be wrong in ways no comparison is needed to see: a block held twice or lost, a ref
count that disagrees with the block tables, a budget overrun, a request scheduled twice in
one step, a step that schedules nothing while a request could run, blocks left behind
after the last request finished, or decisions that change between two runs of one trace.
`check_case` drives one preset through schedir's runtime over a `FuzzCase` trace (the
differential fuzzer's generator) with the parity harness's loop and fake model, and checks
all of these from the KV pool's arrays after every step.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from schedir.lowering.kv_pool import CACHED_FREE, NUM_FREE, count_cached_free, free_queue_order
from schedir.runtime import table as T
from schedir.tools.parity.fuzz import CI_SIZE, FuzzCase, FuzzSize, draw_case
from schedir.tools.parity.harness import (
    Chunk,
    EngineStalled,
    SchedirEngine,
    StepRecord,
    TraceRequest,
    loop_depth,
    run_engine,
)


class InvariantViolation(AssertionError):
    """A preset broke an invariant: the message names the preset, the step and what is wrong."""


def preset_names() -> list[str]:
    """Every step preset `schedir passes` lists (router presets run on a cluster.route_step)."""
    from schedir.passes.presets import PRESETS
    from schedir.passes.route_presets import ROUTER_PRESETS

    return sorted(set(PRESETS) - set(ROUTER_PRESETS))


def config_for(case: FuzzCase, preset: str) -> Any:
    """The case's config for `preset`: only a pipeline with a long-prefill option (the `vllm`
    preset) honours long_prefill_token_threshold; others refuse it (see `pipeline_spec`), so
    it is dropped for them. Likewise async scheduling for presets that cannot overlap decodes,
    and a budget below max_model_len for presets that run prompts whole (orca)."""
    from schedir.passes.presets import PRESETS
    from schedir.runtime.config import SchedulerConfig
    from schedir.runtime.scheduler import pipeline_spec

    cfg = case.config
    if cfg.long_prefill_token_threshold and preset in PRESETS:
        try:
            pipeline_spec(SchedulerConfig(pipeline=preset, long_prefill_token_threshold=1))
        except ValueError:
            cfg = attrs.evolve(cfg, long_prefill_token_threshold=0)
    if preset in PRESETS:
        from schedir.ir.pipeline import PassManager, policy_refusal

        passes = PassManager.parse(PRESETS[preset]).passes
        if cfg.async_scheduling and not any("decode-overlap" in p.provides for p in passes):
            cfg = attrs.evolve(cfg, async_scheduling=False)  # the preset has no async mode (it would refuse it)
        if any(getattr(p, "runs_prompts_whole", False) for p in passes):  # no chunking: the budget must hold a prompt
            cfg = attrs.evolve(cfg, max_num_batched_tokens=max(cfg.max_num_batched_tokens, cfg.max_model_len))
        if any(p.no_prefix_cache or p.v0_prefix_cache for p in passes):
            # vLLM v0's presets: the case's prefix caching where the preset reproduces v0's, its policy
            # where the preset reproduces it (else FCFS), a host tier for those that swap
            cfg = attrs.evolve(cfg, prefix_caching=cfg.prefix_caching and not any(p.no_prefix_cache for p in passes),
                               policy=cfg.policy if policy_refusal(passes, cfg.policy) is None else "fcfs",
                               num_cpu_blocks=cfg.num_blocks if any("swapped-queue" in p.requires for p in passes)
                               else 0)
        elif any(getattr(p, "preemption", "") == "swap" for p in passes):  # fastserve: a host tier half the
            cfg = attrs.evolve(cfg, num_cpu_blocks=max(cfg.num_blocks // 2, 1))  # device's, so it fills up too
        if any("radix-pool" in p.requires for p in passes):  # SGLang's memory is its prefix cache; no priority order
            cfg = attrs.evolve(cfg, prefix_caching=True, policy="fcfs",  # chunks are whole pages in SGLang
                               max_num_batched_tokens=max(cfg.max_num_batched_tokens, cfg.block_size))
    return cfg


def check_pool(pool: Any, where: str) -> None:
    """Blocks conserved (free + held = usable, the free queue's count and its cached-free
    count match the counters), every ref count equal to the block-table references, no
    block both held and free, the null block never handed out."""
    if getattr(pool, "kind", "blocks") == "radix":
        try:
            pool.check()
        except AssertionError as exc:
            raise InvariantViolation(f"{where}: {exc}") from None
        return
    n = pool.num_blocks
    free = free_queue_order(pool.nxt, n, n)
    if free.size != int(pool.meta[NUM_FREE]):
        raise InvariantViolation(f"{where}: the free queue holds {free.size} blocks, the counter says "
                                 f"{int(pool.meta[NUM_FREE])}")
    if free.size and (np.unique(free).size != free.size or free.min() < 1):
        raise InvariantViolation(f"{where}: the free queue repeats a block or holds the null block 0")
    in_table = np.arange(pool.width)[None, :] < pool.nblk[:, None]  # each row's first nblk entries
    held_ids = pool.table[in_table].astype(np.int64)
    refs = np.bincount(held_ids, minlength=n)
    if held_ids.size and held_ids.min() < 1:
        rows = np.flatnonzero((pool.table == 0) & in_table)
        raise InvariantViolation(f"{where}: a block table holds the null block 0 (rows {rows.tolist()[:8]})")
    if not np.array_equal(refs, pool.ref.astype(np.int64)):
        bad = np.flatnonzero(refs != pool.ref)[:8]
        raise InvariantViolation(f"{where}: ref counts disagree with the block tables at blocks {bad.tolist()}: "
                                 f"ref {pool.ref[bad].tolist()}, table references {refs[bad].tolist()}")
    held = np.count_nonzero(pool.ref)
    in_free = np.zeros(n, dtype=bool)
    in_free[free] = True
    both = np.flatnonzero(in_free & (pool.ref > 0))
    if both.size:
        raise InvariantViolation(f"{where}: blocks {both[:8].tolist()} are both held and in the free queue")
    cached_free = int(count_cached_free(pool.nxt, pool.bhash, n))
    if cached_free != int(pool.meta[CACHED_FREE]):
        raise InvariantViolation(f"{where}: {cached_free} free blocks hold a cached hash, the counter says "
                                 f"{int(pool.meta[CACHED_FREE])}")
    if held + free.size != n - 1:
        raise InvariantViolation(f"{where}: blocks not conserved: {held} held + {free.size} free "
                                 f"({cached_free} of them cached) != {n - 1} usable")
    if pool.host is not None:  # the host tier (swap): conserved, and no row on both tiers
        try:
            pool.host.check()
        except AssertionError as exc:
            raise InvariantViolation(f"{where}: {exc}") from None
        both = np.flatnonzero((pool.host.hnblk > 0) & (pool.nblk > 0))
        if both.size:
            raise InvariantViolation(f"{where}: rows {both[:8].tolist()} hold blocks on the device and the host")


@attrs.frozen
class CaseResult:
    steps: int
    decision_hash: str


class CheckedEngine:
    """schedir's runtime under `preset`, checked after every `schedule()` and `update()`."""

    def __init__(self, case: FuzzCase, preset: str) -> None:
        self.case = case
        self.preset = preset
        self.cfg = config_for(case, preset)
        self.inner = SchedirEngine(self.cfg, pipeline=preset)
        self.finished: dict[str, int] = {}
        self.step = -1

    def _where(self) -> str:
        return f"preset {self.preset}, case {self.case.name or '?'}, step {self.step}"

    def add(self, req: TraceRequest) -> None:
        self.inner.add(req)

    def abort(self, req_ids: Sequence[str]) -> None:
        self.inner.abort(req_ids)
        check_pool(self.inner.scheduler.pool, self._where() + " (after aborts)")

    def has_requests(self) -> bool:
        return self.inner.has_requests()

    def schedule(self, step: int) -> tuple[StepRecord, list[Chunk]]:
        self.step = step
        sched = self.inner.scheduler
        had_work = sched.has_unfinished_requests() and not self.inner.steps_in_flight
        record, chunks = self.inner.schedule(step)
        out = self.inner.last_output
        where = self._where()
        cfg = self.cfg
        for rid in record.finished:
            if rid in self.finished:
                raise InvariantViolation(f"{where}: '{rid}' reported finished again (first at step "
                                         f"{self.finished[rid]})")
            self.finished[rid] = step
        rows = np.asarray(out.rows)
        tokens = np.asarray(out.num_tokens)
        if np.unique(rows).size != rows.size:
            twice = sorted({n for n in out.req_ids if out.req_ids.count(n) > 1})
            raise InvariantViolation(f"{where}: scheduled twice in one step: {twice}")
        if tokens.size and tokens.min() < 1:
            raise InvariantViolation(f"{where}: a scheduled request got {int(tokens.min())} tokens")
        if int(tokens.sum()) > cfg.max_num_batched_tokens:
            raise InvariantViolation(f"{where}: {int(tokens.sum())} tokens scheduled, budget "
                                     f"{cfg.max_num_batched_tokens}")
        if sched.running.size > cfg.max_num_seqs:
            raise InvariantViolation(f"{where}: {sched.running.size} requests running, max_num_seqs "
                                     f"{cfg.max_num_seqs}")
        pool = sched.pool
        d = sched.table.data
        end = np.minimum(np.asarray(out.computed) + tokens, cfg.max_model_len)
        short = np.flatnonzero(pool.nblk[rows].astype(np.int64) * cfg.block_size < end)
        if short.size:
            i = int(short[0])
            raise InvariantViolation(f"{where}: '{out.req_ids[i]}' scheduled up to token {int(end[i])} "
                                     f"but holds {int(pool.nblk[rows[i]])} blocks of {cfg.block_size}")
        waiting = sched.waiting
        holding = waiting[pool.nblk[waiting] > 0]
        if holding.size:
            raise InvariantViolation(f"{where}: waiting or preempted requests hold blocks: "
                                     f"{[sched.table.names[r] for r in holding.tolist()]}")
        swapped = sched.swapped
        if swapped.size and (pool.nblk[swapped] > 0).any():
            raise InvariantViolation(f"{where}: swapped-out requests hold device blocks")
        if swapped.size and (d[T.STATUS, swapped] != T.SWAPPED).any():
            raise InvariantViolation(f"{where}: rows {swapped.tolist()[:8]} in the swapped queue are not swapped")
        bad_status = sched.running[d[T.STATUS, sched.running] != T.RUNNING]
        if bad_status.size:
            raise InvariantViolation(f"{where}: rows {bad_status.tolist()} in the running queue are not running")
        # No progress: nothing scheduled, preempted or rejected while requests wait and no step is in
        # flight (with one in flight, a request whose steps already reach max_tokens waits). (A count-level
        # preset such as `base` may spend a step preempting and schedule the request next step: that
        # frees blocks, so it is progress; a step that changes nothing would repeat forever.)
        if (had_work and not rows.size and sched.has_unfinished_requests() and not out.rejected
                and not out.preempted_req_ids and not out.swapped_out_req_ids):
            raise InvariantViolation(
                f"{where}: stalled: nothing scheduled, preempted or rejected with {sched.running.size} running and "
                f"{waiting.size} waiting ({pool.num_free} free blocks of {pool.usable_blocks}), though every request "
                "fits the cache alone")
        check_pool(pool, where)
        return record, chunks

    def update(self, sampled: dict[str, list[int]]) -> None:
        self.inner.update(sampled)
        check_pool(self.inner.scheduler.pool, self._where() + " (after update)")

    def check_drained(self, trace: Sequence[TraceRequest]) -> None:
        where = f"preset {self.preset}, case {self.case.name or '?'}, after the last step"
        sched = self.inner.scheduler
        pool = sched.pool
        if sched.has_unfinished_requests():
            raise InvariantViolation(f"{where}: {sched.get_num_unfinished_requests()} requests never finished")
        held = getattr(pool, "ref", pool.nblk)
        host = getattr(pool, "host", None)
        if host is not None and host.num_free != host.num_blocks:
            raise InvariantViolation(f"{where}: drained, yet {host.num_blocks - host.num_free} host blocks are held")
        if pool.num_free != pool.usable_blocks or np.count_nonzero(held) or np.count_nonzero(pool.nblk):
            raise InvariantViolation(f"{where}: drained, yet {pool.usable_blocks - pool.num_free} blocks are not "
                                     f"free (held: {np.flatnonzero(held).tolist()[:8]})")
        missing = sorted({r.req_id for r in trace} - set(self.finished))
        if missing:
            raise InvariantViolation(f"{where}: never reported finished: {missing[:8]}")


def decision_hash(records: Sequence[StepRecord]) -> str:
    """A digest of every step's decisions and block ids (two runs of one trace must agree)."""
    h = hashlib.sha256()
    for r in records:
        h.update(repr((r.decisions(), r.new_block_ids, r.cached_new_block_ids)).encode())
    return h.hexdigest()[:16]


def check_case(case: FuzzCase, preset: str, *, twice: bool = True) -> CaseResult:
    """Drive `preset` over `case` with every check; with `twice`, run it again and compare
    decision hashes. Raises InvariantViolation naming the preset, case, step and rule."""
    trace = case.trace()
    engine = CheckedEngine(case, preset)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EngineStalled)
        try:
            records = run_engine(engine, trace, stall_limit=50, depth=loop_depth(engine.cfg))
        except EngineStalled as exc:
            raise InvariantViolation(f"preset {preset}, case {case.name or '?'}: {exc}") from exc
    engine.check_drained(trace)
    hashes = [decision_hash(records)]
    if twice:  # the second run only has to reproduce the first one's decisions: no checks
        hashes.append(decision_hash(run_engine(SchedirEngine(engine.cfg, pipeline=preset), trace, stall_limit=50,
                                               depth=loop_depth(engine.cfg))))
    if len(set(hashes)) > 1:
        raise InvariantViolation(f"preset {preset}, case {case.name or '?'}: not deterministic, two runs of one "
                                 f"trace give decision hashes {hashes[0]} and {hashes[1]}")
    return CaseResult(steps=len(records), decision_hash=hashes[0])


@attrs.define
class PresetTally:
    preset: str
    cases: int = 0
    steps: int = 0
    seconds: float = 0.0
    violations: list[tuple[int, str]] = attrs.Factory(list)

    @property
    def cases_per_s(self) -> float:
        return self.cases / self.seconds if self.seconds else 0.0


def fuzz_invariants(seeds: Sequence[int], presets: Sequence[str] | None = None, *, size: FuzzSize = CI_SIZE,
                    twice: bool = True, on_case: Callable[[str, int, str | None], None] | None = None,
                    ) -> dict[str, PresetTally]:
    """Every seed's case through every preset; violations are collected, not raised."""
    tallies: dict[str, PresetTally] = {}
    cases = [draw_case(s, size) for s in seeds]
    for preset in presets or preset_names():
        tally = tallies[preset] = PresetTally(preset)
        start = time.perf_counter()
        for seed, case in zip(seeds, cases, strict=True):
            why = None
            try:
                tally.steps += check_case(case, preset, twice=twice).steps
            except InvariantViolation as exc:
                why = str(exc)
                tally.violations.append((seed, why))
            tally.cases += 1
            if on_case is not None:
                on_case(preset, seed, why)
        tally.seconds = time.perf_counter() - start
    return tallies
