"""`Scheduler`: the runtime an engine calls — ADD, SCHEDULE, UPDATE, FINISH.

Every `schedule()` builds one step IR from the request table (columns), runs the
pass pipeline over it, reads the decisions back and lowers them to a
`SchedulerOutput` (incremental request data, batch plan, block table). The
state between steps is arrays: the request table, the running and waiting
queues (row numbers), and the KV pool with its prefix cache. A steady decode step
(every running request decodes one token and nothing else can happen), for a
pipeline whose passes all declare what they do then (`StepPass.decodes_steadily`),
is lowered straight from the tables without its IR: the same decisions, tested.

Several `schedule()` calls may be in flight before their `update()` (`in_flight`
column): a request waiting on a sampled token is not scheduled again until it is back.
The `vllm` preset follows vLLM beyond that: a prefill's next chunk may go out while the
previous one is in flight, an in-flight request may be preempted, and its token still
counts when it returns. The base passes wait for every in-flight request.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs
import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block

from schedir.dialects.codes import Reason
from schedir.dialects.columns import ColumnsAttr, joined_columns
from schedir.dialects.mem import MatchOp
from schedir.dialects.req import DeferOp, PreemptOp, RejectOp, ScheduleOp
from schedir.dialects.req import SetStateOp as ReqSetStateOp
from schedir.dialects.sched import SetStateOp as SchedSetStateOp
from schedir.dialects.sched import StepFacts, decoded_state_values
from schedir.ir.array_step import ArrayQueue, ArrayStep
from schedir.ir.builder import RecycledStep, build_step
from schedir.ir.errors import PassFailure, PipelineError
from schedir.ir.fastop import dispose
from schedir.ir.pass_base import StepPass
from schedir.ir.pipeline import Instrumentation, PassManager, policy_refusal
from schedir.ir.running_step import RunningStep
from schedir.ir.state import RequestState
from schedir.ir.step import Step, root_queue, steps_of
from schedir.ir.window import WINDOW_SLACK, WindowContext, ranked_window_marks
from schedir.lowering.hashing import extend_hashes
from schedir.lowering.held_hits import HeldHits
from schedir.lowering.kv_pool import CACHE_V0, CACHE_V1, KVPool, commit, match_rows
from schedir.lowering.host_pool import swap_rows
from schedir.lowering.radix_pool import KIND as RADIX_KIND
from schedir.lowering.radix_pool import RadixKVPool
from schedir.passes.admit_greedy import running_not_scheduled
from schedir.passes.kernels import count_members, members_deferred_for
from schedir.passes.reject_oversized import oversized
from schedir.runtime import table as T
from schedir.runtime.config import SGLANG_POLICIES, Request, SchedulerConfig
from schedir.runtime.kernels import (
    SCHED_COMPUTED,
    SCHED_TOTAL,
    STALE,
    STEP_KIND,
    apply_samples,
    queue_columns,
    queue_columns_with_state,
    radix_steady_settle,
    read_scheduled,
    settle_step,
    steady_decode,
    steady_settle,
    write_state_row,
)
from schedir.runtime.metrics import RuntimeMetrics
from schedir.runtime.output import SchedulerOutput
from schedir.lowering.steady_layout import (
    SC_ASYNC,
    SC_BLOCK_SIZE,
    SC_FRONT,
    SC_HOST_FREE,
    SC_MAX_MODEL_LEN,
    SC_MAX_SEQS,
    SC_NOW_US,
    SC_OVERSIZED,
    SC_PLAN,
    SC_SIZE,
    SC_STEADY_BUDGET,
    SC_STEP,
    SC_TOKEN_BUDGET,
    SC_TOTAL_BLOCKS,
    SteadyLayout,
    windows_empty,
)
from schedir.lowering.steady_program import SteadyProgram
from schedir.runtime.steady_kernel import TAKEN, program_steady_settle
from schedir.runtime.steady_answers import _NO_CONSTANTS, SteadyAnswers
from schedir.runtime.window import admissible_bound, fcfs_head, vllm_passes

_EMPTY = np.zeros(0, dtype=np.int64)
_NO_PAIRS = np.zeros((0, 2), dtype=np.int64)
_NO_PAIRS.flags.writeable = False
_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_ROWS.flags.writeable = False
_NO_SCALARS = np.zeros(0, dtype=np.float64)  # SS of a program over no scheduler state (writable: one kernel type)
_NO_IDS: frozenset[str] = frozenset()


_QUEUE_NAMES = T.COLUMNS[: T.QUEUE_COLUMN_COUNT]
_COLUMN_INDEX = {name: i for i, name in enumerate(_QUEUE_NAMES)}
_REASON_NAMES = {int(r): r.name.lower().replace("_", "-") for r in Reason}
_INT32_MAX = 2**31 - 1
_NO_REQUESTS = ColumnsAttr.of_matrix(_QUEUE_NAMES, np.zeros((len(_QUEUE_NAMES), 0), dtype=np.int64))  # an empty queue
_WALK_STOPPED = np.array([int(Reason.MAX_SEQS), int(Reason.BUDGET)])  # a walk out of seats or tokens


def pipeline_spec(config: SchedulerConfig) -> str:
    """The pass list a config runs: `long_prefill_token_threshold` becomes the `long-prefill`
    option of every pass that takes one (and has none set); a pipeline without such a pass
    cannot honour the threshold and is refused."""
    t = config.long_prefill_token_threshold
    if t <= 0:
        return config.pipeline
    passes = PassManager.parse(config.pipeline).passes
    takes = [any(f.name == "long_prefill" for f in dataclasses.fields(p)) for p in passes]
    if not any(takes):
        raise ValueError(f"long_prefill_token_threshold={t}: no pass of pipeline '{config.pipeline}' takes a "
                         "long-prefill option (the vllm preset's vllm-schedule-running and vllm-admit do)")
    return ",".join(str((dataclasses.replace(p, long_prefill=t) if take and not p.long_prefill else p).spec())
                    for p, take in zip(passes, takes, strict=True))


class Scheduler:
    """One engine's scheduler: request table, queues, KV pool, and the pass pipeline."""

    def __init__(self, config: SchedulerConfig | None = None, *, clock: Callable[[], float] | None = None) -> None:
        """`clock` (seconds) times arrivals and finishes for latency and throughput metrics:
        `time.monotonic` by default, the simulated clock in the simulator."""
        self.config = cfg = config or SchedulerConfig()
        self.clock = clock or time.monotonic
        width = -(-cfg.max_model_len // cfg.block_size) + 1
        self.table = T.RequestTable(64, cfg.block_size)
        self.pool: KVPool | RadixKVPool = KVPool.create(cfg.num_blocks, cfg.block_size, width,
                                                        rows=self.table.capacity,
                                                        enable_caching=cfg.enable_prefix_caching,
                                                        host_blocks=cfg.num_cpu_blocks)
        self.metrics = RuntimeMetrics()  # its denominators are set by _install_pipeline
        # IR steps over arrays where the pipeline declares them (off: every IR step builds its IR,
        # the tests' reference for `schedir.ir.array_step`)
        self._arrays_allowed = True
        self._install_pipeline(cfg)
        # Rows reject-oversized will refuse (decided at arrival: a waiting request's length and
        # peak never change), so the window includes them without checking every row each step.
        self._oversized = np.zeros(64, dtype=np.bool_)
        self._oversized_waiting = 0
        self.running = _EMPTY
        self.waiting = _EMPTY
        self.swapped = _EMPTY  # preempted by swap, KV on the host tier, in swap-out order (vLLM v0)
        self._step = 0
        self._front = 0  # FCFS key of the next request put back at the front (preempted)
        self._request_state_writes = 0  # bumped by every write of declared request state (SteadyAnswers)
        # ... but a steady step's to its batch's rows, and every IR step: what holds the answers
        # computed from the queued requests alone (SteadyProgram.buffers_for's memo, WindowContext.queued)
        self._queued_state_writes = 0
        self._queued_memo: tuple = (None, None, -1, {})  # (waiting, swapped, writes, answers)
        self._held_hits = HeldHits()  # waiting requests' zero prefix hits, held across steps (`_match`)
        # (head, the rest of the step's waiting, swapped behind, swapped in step): _waiting_window
        self._ranked_prefix: tuple | None = None
        self._ranked_backoff = 0  # window asks to skip after the next ranked window that does not hold
        self._ranked_wait = 0  # ... left to skip now
        self._back = 0  # FCFS key of the next arrival
        self._finished: list[str] = []
        self._stop_rows = _EMPTY
        self._stop_ids = _EMPTY
        # why each request of the last update() finished: STOPPED (EOS or a stop id) or LENGTH
        self.last_finish_kinds: dict[str, int] = {}
        # per request of the last update()'s output: NOT_DONE, STOPPED, LENGTH, STALE (row recycled)
        # or DROPPED (a stale output of a request preempted and resumed meanwhile: not applied)
        self.last_update_codes = np.zeros(0, dtype=np.int8)
        self.last_module: ModuleOp | None = None  # the last step's IR (kept only with keep_ir)
        self.keep_ir = False

    def _install_pipeline(self, cfg: SchedulerConfig) -> None:
        """Check `cfg`'s pipeline and make it the one `schedule()` runs (nothing changes if the
        check fails)."""
        spec = pipeline_spec(cfg)
        manager = PassManager.parse(spec, verify_each=cfg.verify_each)
        routing = [p.name for p in manager.passes if getattr(p, "over", "") == "cluster.route_step"]
        if routing:
            raise PipelineError(f"pipeline '{cfg.pipeline}' routes requests over a fleet ({', '.join(routing)}): an "
                                "engine's scheduler runs step passes; use it as a router (schedir sim --instances N "
                                f"--router {cfg.pipeline})")
        if not any("admissible" in p.provides for p in manager.passes):
            raise PipelineError(f"pipeline '{spec}' has no pass that rejects requests longer than the model or "
                                "the whole KV cache (reject-oversized provides 'admissible'): such a request would be "
                                "scheduled past its blocks; put reject-oversized first")
        if cfg.async_scheduling and not any("decode-overlap" in p.provides for p in manager.passes):
            raise PipelineError(f"async_scheduling: pipeline '{spec}' has no pass that schedules a decode ahead "
                                "of its sampled token (vllm-schedule-running provides 'decode-overlap'); run it "
                                "without async scheduling or with the vllm preset")
        whole = [p.name for p in manager.passes if getattr(p, "runs_prompts_whole", False)]
        if whole and cfg.max_num_batched_tokens < cfg.max_model_len:  # said now, not at the first step
            raise PipelineError(f"pass '{whole[0]}' runs every prompt whole, so max_num_batched_tokens "
                                f"{cfg.max_num_batched_tokens} is below max_model_len {cfg.max_model_len}: the "
                                "longest prompt could never run; raise the token budget or lower max_model_len "
                                "(schedir sim / bench: orca@max_model_len=8192)")
        radix = any("radix-pool" in p.requires for p in manager.passes)
        if radix and any("kv-pool" in p.requires for p in manager.passes):
            raise PipelineError(f"pipeline '{spec}' mixes passes over vLLM's block pool (kv-pool) with passes "
                                "over SGLang's radix pool (radix-pool): one step has one KV pool")
        if radix and not cfg.enable_prefix_caching:
            raise PipelineError(f"pipeline '{spec}' decides against SGLang's radix cache: run it with prefix "
                                "caching on (enable_prefix_caching=True)")
        sglang_order = any(p.name == "sglang-order" and getattr(p, "policy", "") == "config" for p in manager.passes)
        if cfg.policy in SGLANG_POLICIES and not sglang_order:
            raise PipelineError(f"policy '{cfg.policy}' is SGLang's: it needs a pipeline with sglang-order (the "
                                f"sglang preset); pipeline '{spec}' takes fcfs or priority")
        if sglang_order and cfg.policy == "priority":
            raise PipelineError("policy 'priority': SGLang's priority scheduling is not reproduced by the sglang "
                                f"preset; use one of fcfs, {', '.join(SGLANG_POLICIES)}")
        refusal = policy_refusal(manager.passes, cfg.policy)
        if refusal:
            raise PipelineError(f"{refusal}; pipeline '{spec}'")
        for p in manager.passes:
            if p.no_prefix_cache and cfg.enable_prefix_caching:
                raise PipelineError(f"pass '{p.name}' decides without the prefix cache ({p.prefix_cache_refusal}): "
                                    "run it with prefix caching off (enable_prefix_caching=False)")
        # vLLM v0's passes decide against v0's prefix-caching allocator: the pool runs its rules
        v0_cache = cfg.enable_prefix_caching and not radix and any(p.v0_prefix_cache for p in manager.passes)
        others = [p.name for p in manager.passes if "kv-pool" in p.requires and not p.v0_prefix_cache]
        if v0_cache and others:
            raise PipelineError(f"pipeline '{spec}' mixes passes that decide against vLLM v0's prefix-caching "
                                f"allocator with '{others[0]}', which decides against vLLM v1's block pool: one step "
                                "has one prefix cache")
        kind = RADIX_KIND if radix else ("v0-blocks" if v0_cache else "blocks")
        current = getattr(getattr(self, "pool", None), "kind", "blocks")
        if current != kind and getattr(self, "table", None) is not None and len(self.table):
            raise PipelineError(f"pipeline '{spec}' needs a {kind} KV pool and the scheduler has a {current} one "
                                "holding requests: switch pipelines between these kinds only when no request is live")
        # a third queue, of requests preempted by swap (vLLM v0), for pipelines that schedule from it
        swap_queue = any("swapped-queue" in p.requires for p in manager.passes)
        if not swap_queue and getattr(self, "swapped", _EMPTY).size:
            raise PipelineError(f"pipeline '{spec}' has no pass that schedules swapped requests (one that requires "
                                f"'swapped-queue'), and {self.swapped.size} request(s) are swapped out: switch to it "
                                "once they are back")
        swappers = [p.name for p in manager.passes if getattr(p, "preemption", "") == "swap"]
        if swappers and not swap_queue:
            raise PipelineError(f"pass '{swappers[0]}' preempts by swap, but no pass of pipeline '{spec}' brings "
                                "swapped requests back (one that requires 'swapped-queue', e.g. mlfq-swap-in or "
                                "v0-swapped)")
        # checked: install it
        self.config, self.spec, self.manager = cfg, spec, manager
        if current != kind:
            width = -(-cfg.max_model_len // cfg.block_size) + 1
            rows = self.table.capacity
            self.pool = (RadixKVPool(cfg.num_blocks, cfg.block_size, width, rows=rows) if radix
                         else KVPool.create(cfg.num_blocks, cfg.block_size, width, rows=rows,
                                            enable_caching=cfg.enable_prefix_caching,
                                            host_blocks=cfg.num_cpu_blocks,
                                            cache_kind=CACHE_V0 if v0_cache else CACHE_V1))
        self.radix = radix
        self._v0_pool = v0_cache
        self._v0_head: tuple[np.ndarray | None, int] = (None, -1)  # (waiting array, its v0 deque head row)
        self.metrics.token_budget, self.metrics.usable_blocks = cfg.max_num_batched_tokens, self.pool.usable_blocks
        self._install_state(manager)
        self.pool_level = any("kv-pool" in p.requires or "radix-pool" in p.requires for p in manager.passes)
        self._reads_clock = any(p.reads_clock for p in manager.passes)  # the step records now_us then
        self._clock_read: tuple[int, int] = (-1, -1)  # (step, now_us): see _now_us
        # the length at which update() stops a request: max_model_len tokens (vLLM v1), or one more (v0)
        self._stop_len = cfg.max_model_len + int(any(p.stops_past_max_model_len for p in manager.passes))
        self._initial_facts = (("radix-pool",) if radix else ("kv-pool",)) if self.pool_level else ()
        self.swap_queue = swap_queue
        if swap_queue:
            self._initial_facts += ("swapped-queue",)
        self._recycled: RecycledStep | None = None  # the step skeleton: the pipeline's shape (mem.pool or not)
        # vLLM's AsyncScheduler registers a running request's newly filled blocks when its token returns
        self._register_on_update = cfg.async_scheduling and cfg.enable_prefix_caching
        # vLLM's order is known here, so a long waiting queue enters the step as its head only
        # (see `_admission_window`); a pipeline with another order sees the whole queue.
        # (a rule of vllm-admit's: the window is its admission's reach, so other admissions see all)
        self.window = (cfg.max_num_seqs + WINDOW_SLACK
                       if any(p.name == "order-vllm" for p in manager.passes)
                       and any(p.name == "vllm-admit" for p in manager.passes) else 0)
        # ... and while max_num_seqs requests run, as the requests it rejects only (see `_rejectable`),
        # unless a long-prefill cap is set: whether it applies depends on how many requests wait
        self.window_full = bool(self.window) and not any(getattr(p, "long_prefill", 0) for p in manager.passes)
        # With a window and FCFS, `waiting` is kept in `queued` order (preempted rows in front),
        # so the window is its head: no sort over thousands of waiting requests per step.
        self._fcfs_window = bool(self.window) and cfg.policy == "fcfs"
        # ... else the waiting requests every pass declares it could act on (see `_waiting_window`)
        self._declared_window = not self.window and all(
            type(p).waiting_window is not StepPass.waiting_window for p in manager.passes)
        # steady decode steps skip the IR when every pass decides them as `decodes_steadily` says
        # (none while a request is swapped out; not while verify_each asks for every step's IR to
        # be verified); from the pipeline's first IR step on, which checks it against the step's facts
        self._steady_pipeline = not cfg.verify_each and all(p.decodes_steadily() for p in manager.passes)
        # ... asking each pass what it writes then (see StepPass.steady_state) when one keeps state
        # or orders the batch; the radix pool's steady steps are always asked so
        declared = self._steady_pipeline and (radix or any(
            type(p).steady_state is not StepPass.steady_state or type(p).steady_order is not StepPass.steady_order
            for p in manager.passes))
        self._steady_declared = tuple(manager.passes) if declared else ()
        # ... with requests swapped out too when every pass's answers judge them (StepPass.steady_swapped)
        self._steady_swapped = bool(declared) and all(p.steady_swapped for p in manager.passes)
        self._steady_orderers = tuple(p for p in self._steady_declared
                                      if type(p).steady_order is not StepPass.steady_order)
        # ... holding their answers over a run of steps when they declare what they read (StepPass.steady_reads)
        reuse = getattr(self, "_answers", None) is None or self._answers.reuse
        lowered = getattr(self, "_answers", None) is None or self._answers.lowered
        # the scheduler state a lowered answer reads and writes: the numbers (a slot each in `SS`)
        scalars = {n: i for i, n in enumerate(n for n in self._state_names
                                              if not isinstance(self.scheduler_state[n], np.ndarray))}
        layout = SteadyLayout(_COLUMN_INDEX, dict(self.table.state_index), scalars, cfg.policy)
        program = SteadyProgram.lower(self._steady_declared, layout) if self._steady_declared and not radix else None
        # ... and a pipeline of default answers only (no pass writes or orders: `base`, `orca`), every
        # pass naming its window's rule (`steady_layout.window_steady_lowered`), answers a steady
        # step's windows with requests waiting by those rules alone (`windows_empty`), not by asking
        # each pass's window in Python (`_waiting_window`, ~5 µs a step)
        window_only = (SteadyProgram.lower(manager.passes, layout) if self._steady_pipeline and not declared
                       and not radix and self._declared_window else None)
        self._window_rules = (frozenset(int(rule) for rule in window_only.options[:, 0])
                              if window_only is not None and not window_only.asked else None)
        self._answers = SteadyAnswers(self._steady_declared, self._steady_orderers, self.scheduler_state,
                                      manager.state.request_names, program)
        self._answers.reuse = reuse
        self._answers.lowered = lowered
        self._steady_pipeline = self._steady_pipeline and (not radix or declared)
        # running steps (nobody admissible waiting) are decided by the one pass that decides them
        # alone when every other pass declares it decides nothing then (StepPass.decides_running_steps);
        # on the block pool, no declared request state (the decider reads the queue columns only)
        deciders = [p for p in manager.passes if type(p).decide_running is not StepPass.decide_running]
        self._running_decider = (deciders[0] if not swap_queue and not cfg.verify_each and not radix
                                 and len(deciders) == 1 and not manager.state.requests
                                 and all(p.decides_running_steps() for p in manager.passes) else None)
        # IR steps over arrays (`schedir.ir.array_step`) when every pass decides them as its IR run,
        # on the count-level pool; after one IR step (the pipeline's checks) and never when asked for the IR
        self._array_pipeline = (not self.pool_level and not cfg.verify_each
                                and all(p.decides_array_steps() for p in manager.passes))
        self._arrays_ready = False
        self._steady_budget = cfg.max_num_batched_tokens
        for p in manager.passes:
            self._steady_budget = p.steady_token_budget(self._steady_budget)
        self._steady = False
        self._ctx: WindowContext | None = None  # the passes' view before a step (`_window_context`), per pipeline
        self._row_views: dict[int, tuple[np.ndarray, dict[int, np.ndarray]]] = {}  # see `_row_view`
        self._ones = _NO_ROWS  # one token per running request: a steady step's num_tokens (see _steady_step)
        # the lowered answers' step facts (`steady_layout.SC_*`): the fixed ones now, the others each step
        self._steady_facts = np.zeros(SC_SIZE, dtype=np.int64)
        self._steady_facts[[SC_MAX_SEQS, SC_BLOCK_SIZE, SC_TOKEN_BUDGET, SC_MAX_MODEL_LEN, SC_TOTAL_BLOCKS]] = (
            cfg.max_num_seqs, cfg.block_size, cfg.max_num_batched_tokens, cfg.max_model_len, self.pool.usable_blocks)
        self._steady_facts[[SC_HOST_FREE, SC_STEADY_BUDGET, SC_ASYNC, SC_PLAN]] = (
            -1, self._steady_budget, cfg.async_scheduling, cfg.batch_plan)

    def _install_state(self, manager: PassManager) -> None:
        """Carry the state the pipeline's passes declare (`schedir.ir.state`): request state as
        table rows that every `req.queue` of the step shows after the runtime's columns,
        scheduler state as values the step's `sched.state` lists. State a previous pipeline
        declared is kept (switching back finds it); new state starts at its default."""
        declared = manager.state
        self.declared_state = declared
        table = self.table
        self._state_rows = np.array([table.declare_state(s.name, s.default) for s in declared.requests],
                                    dtype=np.int64)
        self._queue_names = _QUEUE_NAMES + declared.request_names
        self._no_requests = _NO_REQUESTS if not declared.requests else ColumnsAttr.of_matrix(
            self._queue_names, np.zeros((len(self._queue_names), 0), dtype=np.int64))
        values = getattr(self, "scheduler_state", {})
        for s in declared.scheduler:
            values.setdefault(s.name, s.initial())
        self.scheduler_state: dict[str, float | np.ndarray] = values
        self._state_names = declared.scheduler_names

    def _queue_attr(self, rows: np.ndarray, running: bool, blocks: np.ndarray | None = None) -> ColumnsAttr:
        """A queue's columns for the step IR: the runtime's, then the declared request state.
        `blocks`: per-row block counts to show (the swapped queue's are its host blocks)."""
        if not rows.size:
            return self._no_requests
        matrix = queue_columns_with_state(self.table.data, rows, self.pool.nblk if blocks is None else blocks,
                                          running or blocks is not None, self.table.state, self._state_rows)
        return ColumnsAttr.of_matrix(self._queue_names, matrix, copy=False)

    def set_pipeline(self, pipeline: str) -> None:
        """Run another pipeline (preset or pass list) from the next step on, keeping every
        request, queue, block and step in flight: a policy switch at run time. A pipeline that
        is refused (unknown pass, missing reject-oversized, ...) raises and changes nothing."""
        self._install_pipeline(attrs.evolve(self.config, pipeline=pipeline))
        self._queued_memo = (None, None, -1, {})  # the new passes' answers are their own
        if self._fcfs_window and self.waiting.size > 1:  # the window reads waiting's head in queued order
            self.waiting = self.waiting[np.argsort(self.table.data[T.QUEUED, self.waiting], kind="stable")]

    # ------------------------------------------------------------ ADD
    def add_request(self, request: Request) -> None:
        """Queue a request (refused with a clear error if its id is live or its fields are bad)."""
        name = request.request_id
        if not isinstance(name, str) or not name:
            raise ValueError(f"request_id must be a non-empty string, got {name!r}")
        if name in self.table.row_of:
            raise ValueError(f"request '{name}' is already queued or running")
        given = request.prompt_token_ids
        # An int32 array (the simulator's) is kept as given, not copied to int64: at 10k-token
        # prompts the copies cost ~60 µs each in fresh pages (and 1 GB over the Mooncake hour).
        is32 = isinstance(given, np.ndarray) and given.dtype == np.int32
        prompt = given if is32 else np.asarray(given, dtype=np.int64)
        if prompt.ndim != 1 or prompt.size == 0:
            raise ValueError(f"request '{name}': prompt_token_ids must be a non-empty list of token ids")
        if prompt.min() < 0 or prompt.max() > _INT32_MAX:
            raise ValueError(f"request '{name}': token ids must lie in 0..{_INT32_MAX}")
        if request.max_tokens < 1:
            raise ValueError(f"request '{name}': max_tokens must be >= 1, got {request.max_tokens}")
        arrival = request.arrival(self.clock)
        if arrival < 0:
            raise ValueError(f"request '{name}': arrival_time must be >= 0, got {arrival}")
        initial = self._initial_state(name, request.state) if request.state else ()
        table = self.table
        row = table.take_row(name)
        self._request_state_writes += 1  # the row's request state starts again (see _declared_steady_step)
        self._queued_state_writes += 1
        for index, value in initial:
            table.state[index, row] = value
        if table.capacity > self.pool.rows:
            self.pool.grow_rows(table.capacity)
        # a request longer than max_model_len that a pipeline may still run (vLLM v0 chunked: until
        # it holds one token past the limit) needs a wider block table than max_model_len gives
        if self._stop_len > self.config.max_model_len and prompt.size >= self.config.max_model_len:
            self.pool.grow_width(-(-(prompt.size + 1) // self.config.block_size) + 1)
        cfg = self.config
        d = table.data
        n = prompt.size
        d[T.PROMPT, row] = n
        d[T.COMPUTED, row] = 0
        d[T.TOTAL, row] = n
        d[T.MAX_TOKENS, row] = request.max_tokens
        d[T.PRIORITY, row] = request.priority
        d[T.ARRIVAL, row] = round(arrival * 1e6)
        d[T.STATUS, row] = T.WAITING
        d[T.BLOCKS, row] = 0
        d[T.IN_FLIGHT, row] = 0
        d[T.PLACEHOLDERS, row] = 0
        d[T.STALE_OUTPUTS, row] = 0
        d[T.QUEUED, row] = self._back
        self._back += 1
        d[T.EOS, row] = -1 if request.eos_token_id is None else request.eos_token_id
        d[T.IGNORE_EOS, row] = int(request.ignore_eos)
        d[T.PREEMPTIONS, row] = 0
        d[T.OUTPUTS, row] = 0
        d[T.SERIAL, row] = table.serial
        stops = frozenset(int(t) for t in request.stop_token_ids)
        d[T.HAS_STOP, row] = int(bool(stops))
        if stops:
            table.stop_ids[row] = stops
            self._refresh_stops()
        if cfg.policy == "priority":
            table.assign_rank(row, name)
        else:
            d[T.RANK, row] = 0
        table.prompts[row] = prompt
        self.pool.nblk[row] = 0
        self.pool.ncached[row] = 0
        self.pool.nhash[row] = 0
        prompt32 = prompt if is32 else prompt.astype(np.int32)
        if self.radix:  # SGLang's tree is keyed by tokens: the pool keeps the row's stream
            self.pool.add_row(row, prompt, request.max_tokens)
        elif cfg.enable_prefix_caching:  # a too-long prompt is hashed up to max_model_len, rejected at its first step
            self._held_hits.forget(row)
            self.pool.v0_noted[row] = -1  # (v0's allocator: no hit noted, never scheduled)
            self.pool.v0_access[row] = 0
            self.pool.nhash[row] = extend_hashes(prompt32, min(n, cfg.max_model_len), self.pool.rhash[row], 0,
                                                 cfg.block_size)
        partial = n % cfg.block_size  # the unfinished last block: generated tokens complete it
        table.tail[row, :partial] = prompt32[n - partial:]
        if row >= self._oversized.size:
            grown = np.zeros(max(2 * self._oversized.size, row + 1), dtype=np.bool_)
            grown[: self._oversized.size] = self._oversized
            self._oversized = grown
        too_long, too_big = oversized(n, n, request.max_tokens, cfg.max_model_len, self.pool.usable_blocks,
                                      cfg.block_size)  # on scalars: ~1 µs, not ~15 on 1-element arrays
        self._oversized[row] = bool(too_long or too_big)
        self._oversized_waiting += int(self._oversized[row])
        self.waiting = np.append(self.waiting, row)
        self.metrics.record_arrival(arrival)

    def _initial_state(self, name: str, given: Mapping[str, int]) -> list[tuple[int, int]]:
        """(state row, value) for each entry of a request's `state`. A name this pipeline does not
        declare is kept if some known pass declares it (an engine may tag every request, e.g. with
        a TTFT target, whichever pipeline runs: a later `set_pipeline` finds the values); a name
        no pass declares is refused (a typo would otherwise be ignored)."""
        out = []
        table = self.table
        declared = {st.name: st for st in self.declared_state.requests}
        for key, value in given.items():
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"request '{name}': state '{key}' must be an integer, got {value!r}")
            spec = declared.get(key)
            if spec is None:
                known = _known_request_state()
                spec = known.get(key)
                if spec is None:
                    raise ValueError(f"request '{name}': state '{key}' is declared by no pass (this pipeline's "
                                     f"request state: {', '.join(declared) or 'none'}; every pass's: "
                                     f"{', '.join(sorted(known)) or 'none'})")
            why = spec.check(int(value))
            if why:
                raise ValueError(f"request '{name}': state '{key}' {why}")
            out.append((key, spec.default, int(value)))
        return [(table.declare_state(key, default), value) for key, default, value in out]

    def _refresh_stops(self) -> None:
        pairs = [(r, t) for r, ids in self.table.stop_ids.items() for t in sorted(ids)]
        self._stop_rows = np.array([p[0] for p in pairs], dtype=np.int64)
        self._stop_ids = np.array([p[1] for p in pairs], dtype=np.int64)

    # ------------------------------------------------------------ SCHEDULE
    def schedule(self) -> SchedulerOutput:
        """Decide one step: build its IR, run the pipeline, lower the decisions."""
        start = time.perf_counter()
        self._step += 1
        step = self._step
        if self._v0_pool:  # v0's allocator: what its blocks' computed flags and last accesses read
            return self._v0_step(start, step)
        return self._decide_step(start, step)

    def _v0_step(self, start: float, step: int) -> SchedulerOutput:
        """`_decide_step` on vLLM v0's prefix-caching allocator: the pool's clock set, the rows
        scheduled noted (their blocks' last access when freed). v0's prefill pass looks up the
        waiting head's prefix hit in every step it runs, even with every seat taken, and keeps the
        first one it finds (`ComputedBlocksTracker`): while the head has none noted, the step runs
        its passes (`v0_kernels.v0_prefills` notes it), not a steady step, which would not."""
        pool = self.pool
        pool.v0_step(step)
        waiting = self.waiting
        if self._v0_head[0] is not waiting:  # v0's deque head: the first by FCFS place (`queued`), held
            # while the queue array is the same one (a preempted request is last in the array, first in v0's deque)
            self._v0_head = (waiting, int(waiting[np.argmin(self.table.data[T.QUEUED, waiting])]) if waiting.size
                             else -1)
        head = self._v0_head[1]
        out = self._decide_step(start, step, steady_allowed=head < 0 or pool.v0_noted[head] >= 0)
        pool.v0_scheduled(out.rows, step)
        return out

    def _decide_step(self, start: float, step: int, steady_allowed: bool = True) -> SchedulerOutput:
        """`schedule()`'s step, numbered `step` (timed from `start`); `steady_allowed` false: run
        the passes even where a steady step would do."""
        self._ranked_prefix = None  # set by _waiting_window when it gives a ranked window
        steady_ok = self._steady and steady_allowed
        tried = steady_ok and not self.keep_ir and self.config.dump_dir is None and (
            bool(self._steady_declared) or not self.waiting.size or (
                self._window_rules is not None and self._answers.lowered  # (off: the tests' reference)
                and windows_empty(self._window_rules, self.running.size, self.config.max_num_seqs,
                                  self._oversized_waiting)))
        if tried:
            # the common busy step, first: no window to ask (or every window empty by its rule)
            out = self._declared_steady_step(step) if self._steady_declared else self._steady_step(step, _EMPTY)
            if out is not None:
                self.metrics.record_step(time.perf_counter() - start, out.total_num_scheduled_tokens, 0,
                                         self.pool.num_free, True)
                return out
        cfg = self.config
        pool = self.pool
        running, waiting = self.running, self.waiting
        if self.radix and pool.stash:
            pool.stash_chunked()
        if self.window and waiting.size:
            if running.size >= cfg.max_num_seqs and self.window_full:  # nothing can be admitted: see _rejectable
                waiting = self._rejectable(waiting)
            elif waiting.size > self.window:
                waiting = self._admission_window(waiting)
        elif self._declared_window and waiting.size:
            # asking costs ~20-80 µs: worth it for a long queue, or when an empty answer makes the step steady
            steady = steady_ok and not self._steady_declared and self._steady_running()
            if steady or waiting.size > cfg.max_num_seqs + WINDOW_SLACK:
                waiting = self._waiting_window(waiting, steady)
        dumping = cfg.dumps(step)
        if steady_ok and not tried and not self._steady_declared and not dumping and not self.keep_ir:
            out = self._steady_step(step, waiting)
            if out is not None:
                self.metrics.record_step(time.perf_counter() - start, out.total_num_scheduled_tokens, 0,
                                         pool.num_free, True)
                return out
        if (self._running_decider is not None and steady_ok and not waiting.size and running.size
                and not dumping and not self.keep_ir and not self.swapped.size):
            out = self._running_step(step)
            if out is not None:
                self.metrics.record_step(time.perf_counter() - start, out.total_num_scheduled_tokens, 0,
                                         pool.num_free, True)
                return out
        if self._ranked_prefix is not None:
            self.metrics.ranked_steps += 1
        if self._arrays_ready and not dumping and not self.keep_ir:
            out, hit_tokens = self._array_step(step, waiting)
            self.metrics.record_step(time.perf_counter() - start, out.total_num_scheduled_tokens, hit_tokens,
                                     self.pool.num_free)
            return out
        while True:
            out = self._build_and_run(step, waiting, dumping)
            if out is not None:
                break
            self.metrics.ranked_rebuilt += 1  # the ranked window did not hold: the whole queue
            waiting = self.waiting
            self._ranked_prefix = None
            # a pool too tight for the head to fill the seats stays so for a while: back off (up to
            # 32 window asks) rather than build each step twice
            self._ranked_backoff = min(2 * self._ranked_backoff + 1, 32)
            self._ranked_wait = self._ranked_backoff
        module, recycled = out
        if self._ranked_prefix is not None:
            self._ranked_backoff = 0
        out, hit_tokens = self._lower(self._recycled.block if recycled else steps_of(module)[0].body.block, step)
        self._queued_state_writes += 1  # an IR step may change what the queued requests' answers read
        if self.keep_ir:
            self.last_module = module
        elif not recycled:
            dispose(module)  # freed now by refcounting, not by the cyclic GC (see `dispose`)
        self.metrics.record_step(time.perf_counter() - start, out.total_num_scheduled_tokens, hit_tokens,
                                 self.pool.num_free)
        return out

    def _build_and_run(self, step: int, waiting: np.ndarray, dumping: bool) -> tuple[ModuleOp, bool] | None:
        """Build the step's IR over `waiting` and run the pipeline on it: (module, recycled), or
        None when it ran over a ranked window that did not hold (`_ranked_window_held`)."""
        cfg = self.config
        pool = self.pool
        d = self.table.data
        running = self.running
        # a ranked window's swapped queue may be its head too (`_swapped_window`)
        swapped = self.swapped if self._ranked_prefix is None else self._ranked_prefix[3]
        work_pool = pool.copy() if dumping and self.pool_level else pool
        facts = self._step_facts(step, waiting)
        # a swapped request holds no device blocks: its `blocks` column counts those on the host tier
        host_blocks = pool.host.hnblk if self.swap_queue and pool.host is not None else None
        if self._state_rows.size:
            queues = {"running": self._queue_attr(running, True), "waiting": self._queue_attr(waiting, False)}
            if self.swap_queue:
                queues["swapped"] = self._queue_attr(swapped, False, host_blocks)
            state = {n: self.scheduler_state[n] for n in self._state_names} if self._state_names else None
        else:  # the common case, inline: no declared request state
            queues = {"running": ColumnsAttr.of_matrix(_QUEUE_NAMES, queue_columns(d, running, pool.nblk, True),
                                                       copy=False) if running.size else _NO_REQUESTS,
                      "waiting": ColumnsAttr.of_matrix(_QUEUE_NAMES, queue_columns(d, waiting, pool.nblk, False),
                                                       copy=False) if waiting.size else _NO_REQUESTS}
            if self.swap_queue:
                queues["swapped"] = (ColumnsAttr.of_matrix(
                    _QUEUE_NAMES, queue_columns(d, swapped, pool.nblk if host_blocks is None else host_blocks,
                                                host_blocks is not None),
                    copy=False) if swapped.size else _NO_REQUESTS)
            state = {n: self.scheduler_state[n] for n in self._state_names} if self._state_names else None
        hits = None
        if not self.pool_level and cfg.enable_prefix_caching and waiting.size:
            hit, cached_free = self._match(waiting)
            hits = {"waiting": {"id": waiting, "hit": hit, "cached_free": cached_free}}
        step_pool = work_pool if self.pool_level else None
        recycled = not dumping and not self.keep_ir
        if recycled:  # the usual step: refill last step's skeleton (see RecycledStep)
            module = (self._recycled.refill(facts, queues, step_pool, state, hits) if self._recycled is not None
                      else None)
            if module is None:
                self._recycled = RecycledStep(facts, queues, step_pool, state, hits)
                module = self._recycled.module
        else:
            module = build_step(facts, queues, hits, pool=step_pool, state=state)
        if dumping:
            self._run_dumped(module, step)
            self.pool = work_pool
        else:
            self.manager.run(module, complete_state=True)  # the queues and sched.state carry every declared state
            self._steady = self._steady_pipeline  # checked by a first run: steady steps may skip the IR now
            self._arrays_ready = self._array_pipeline and self._arrays_allowed  # ... and IR steps may be arrays
            if self._ranked_prefix is not None and not self._ranked_window_held(module, facts):
                if not recycled:
                    dispose(module)
                return None
        return module, recycled

    def _now_us(self) -> int:
        """The step's clock in µs (its `now_us` fact; -1 where no pass reads it), read once per
        step: the window, the steady answers and the step's IR see the same instant, so a pass's
        window (order-slo's rank) and its run agree even on a wall clock."""
        if not self._reads_clock:
            return -1
        step, now = self._clock_read
        if step != self._step:
            now = max(round(self.clock() * 1e6), 0)
            self._clock_read = (self._step, now)
        return now

    def _step_facts(self, step: int, waiting: np.ndarray) -> StepFacts:
        """The step's `sched.step` facts, as its IR (or its array step) sees them; `waiting`: the
        waiting requests the step holds (fewer than the queue's: `waiting_count` says how many wait)."""
        cfg = self.config
        pool = self.pool
        return StepFacts(step=step, token_budget=cfg.max_num_batched_tokens, max_seqs=cfg.max_num_seqs,
                         block_size=cfg.block_size, free_blocks=pool.num_free,
                         cached_free_blocks=pool.num_cached_free() if cfg.enable_prefix_caching else 0,
                         total_blocks=pool.usable_blocks, max_model_len=cfg.max_model_len, policy=cfg.policy,
                         facts=self._initial_facts,
                         now_us=self._now_us(),
                         host_free_blocks=self._host_free(),
                         waiting_count=self.waiting.size if waiting.size < self.waiting.size else -1)

    def _array_step(self, step: int, waiting: np.ndarray) -> tuple[SchedulerOutput, int]:
        """An IR step decided over arrays (`schedir.ir.array_step`): every pass's `run_arrays` over
        the queues `waiting` leaves, a ranked window checked as the IR's is (and the step decided
        again over the whole queue where it did not hold), the decisions lowered as `_lower`
        lowers the IR's. Returns the output and the admitted requests' prefix-hit tokens."""
        while True:
            arrays = self._decide_arrays(step, waiting)
            if self._ranked_prefix is None or self._ranked_arrays_held(arrays):
                break
            arrays.undo_state()  # decided again from the state as the step found it
            self.metrics.ranked_rebuilt += 1  # as the IR path: the whole queue, and back off a while
            waiting = self.waiting
            self._ranked_prefix = None
            self._ranked_backoff = min(2 * self._ranked_backoff + 1, 32)
            self._ranked_wait = self._ranked_backoff
        if self._ranked_prefix is not None:
            self._ranked_backoff = 0
        self.metrics.array_steps += 1
        out = self._lower_arrays(arrays, step)
        self._queued_state_writes += 1  # an IR step may change what the queued requests' answers read
        return out

    def _decide_arrays(self, step: int, waiting: np.ndarray) -> ArrayStep:
        """The step's queues as `_build_and_run` would build them, decided by every pass's `run_arrays`."""
        cfg = self.config
        pool = self.pool
        d = self.table.data
        running = self.running
        swapped = self.swapped if self._ranked_prefix is None else self._ranked_prefix[3]
        d[T.BLOCKS, running] = pool.nblk[running]  # the step's columns show the blocks held now
        queues = {"running": ArrayQueue("running", running, running, np.arange(running.size)),
                  "waiting": ArrayQueue("waiting", waiting, waiting, np.arange(waiting.size))}
        if self.swap_queue:
            if pool.host is not None and swapped.size:  # a swapped request's are its host blocks
                d[T.BLOCKS, swapped] = pool.host.hnblk[swapped]
            queues["swapped"] = ArrayQueue("swapped", swapped, swapped, np.arange(swapped.size))
        hit = cached_free = look_up = None
        if cfg.enable_prefix_caching and waiting.size:  # looked up as the passes read them
            hit, cached_free, look_up = np.full(waiting.size, -1, dtype=np.int64), np.zeros_like(waiting), self._match
        data = d.view()
        data.flags.writeable = False  # read-only, as the IR's columns: the kernels see one signature
        table = self.table
        arrays = ArrayStep(self._step_facts(step, waiting), data, _COLUMN_INDEX, table.state, table.state_index, queues,
                           hit, cached_free, look_up)
        try:
            for p in self.manager.passes:
                p.run_arrays(arrays)
        except BaseException:
            arrays.undo_state()  # a failed step leaves the table's request state as it found it
            raise
        return arrays

    def _ranked_arrays_held(self, arrays: ArrayStep) -> bool:
        """`_ranked_window_held` for an array step: the same checks over its decisions."""
        return self._ranked_held(arrays.facts, arrays.tokens, arrays.seqs + arrays.running_not_scheduled(),
                                 ((d.rows, d.values) for d in arrays.of_kind("defer")), arrays.scheduled_rows())

    def _lower_arrays(self, arrays: ArrayStep, step: int) -> tuple[SchedulerOutput, int]:
        """`_lower` for an array step: its decisions, in the order the passes took them."""
        parts, part_tokens, admitted, swapped_in, preempted, swapped_out, rejected = [], [], [], [], [], [], []
        for decision in arrays.decisions:
            kind = decision.kind
            if kind == "schedule":
                parts.append(decision.rows)
                part_tokens.append(decision.values)
                if decision.queue == "swapped":
                    swapped_in.append(decision.rows)
                elif decision.queue != "running":
                    admitted.append(decision.rows)
            elif kind == "preempt":
                (swapped_out if decision.mode == "swap" else preempted).append(decision.rows)
            elif kind == "reject":
                rejected.append((decision.rows, decision.values))
        if arrays.wrote_state():
            self._request_state_writes += 1
            self._queued_state_writes += 1
        new_rows = joined_columns(admitted)
        new_computed: np.ndarray | int = 0
        if new_rows.size and arrays.hit is not None:  # admitted requests start from their prefix hit
            new_computed = arrays.waiting_hits(new_rows)
        return self._apply_decisions(step, joined_columns(parts), joined_columns(part_tokens), new_rows,
                                     new_computed, joined_columns(preempted), swapped_in, swapped_out, rejected)

    def _steady_step(self, step: int, waiting: np.ndarray, rows: np.ndarray | None = None) -> SchedulerOutput | None:
        """A steady decode step (see `StepPass.decodes_steadily`) lowered straight from the
        tables, or None (nothing changed) when this step is not one: every running request
        decodes one token and gets its blocks, as the pipeline's IR would decide, without the
        IR's fixed cost (building, running and reading ~10 ops is most of a light step's time).
        `waiting` is the step's waiting queue after the admission window: empty when every pass's
        declared window answered nobody (`StepPass.waiting_window`, asked before the step when the
        running requests are steady); a non-empty one is still steady for the vllm preset when
        `admissible_bound` proves nobody can be admitted (the vllm window's own rule, tested
        against the whole queue) and nobody is to be rejected. Nobody is swapped out, unless the
        passes' steady answers judge the swapped queue (`StepPass.steady_swapped`).
        `rows`: the batch's order when a pass declares one (`steady_order`), else running order."""
        cfg = self.config
        pool = self.pool
        d = self.table.data
        running = self.running
        if waiting.size:
            if self._oversized_waiting or not self._vllm_rules() or self._admissible(waiting, True):
                return None
        if self.swapped.size and not self._steady_swapped:
            return None
        tokens = self._one_token_each(running.size)
        rows = running if rows is None else rows
        settled = steady_settle(rows, running, d, self._steady_budget, cfg.max_model_len, pool.ref, pool.bhash,
                                pool.dup_next, pool.nxt, pool.prv, pool.meta, pool.cache, pool.table, pool.nblk,
                                pool.ncached, pool.rhash, pool.nhash, tokens, self._front, self.waiting, cfg.block_size,
                                cfg.async_scheduling, cfg.batch_plan)
        if not settled[0]:
            return None
        # the queues stay as they are: every running request keeps running, nobody waiting moves
        return self._output(step, rows, tokens, settled[1:], _NO_ROWS, _NO_ROWS, {}, _NO_PAIRS, _NO_PAIRS)

    def _one_token_each(self, n: int) -> np.ndarray:
        """A steady step's num_tokens, one per request of the batch: a copy of a slice of ones kept
        for it (a third of np.ones' cost)."""
        if self._ones.size < n:
            self._ones = np.ones(2 * n, dtype=np.int64)
        return self._ones[:n].copy()

    def _running_step(self, step: int) -> SchedulerOutput | None:
        """A running step (see `schedir.ir.running_step`) decided by the pipeline's running-step
        pass from the running queue's columns, then settled as the IR path settles its decisions;
        None (nothing changed) when the pass leaves the step to its IR."""
        cfg = self.config
        pool = self.pool
        running = self.running
        columns = queue_columns(self.table.data, running, pool.nblk, True)
        columns.flags.writeable = False  # as the step's columns are: the kernels compile once
        decision = self._running_decider.decide_running(RunningStep(
            columns, _QUEUE_NAMES, cfg.max_num_batched_tokens, cfg.max_model_len, cfg.policy, pool))
        if decision is None:
            return None
        self.metrics.running_steps += 1
        rows, tokens, gone = decision.rows, decision.tokens, decision.preempted
        for column in (rows, tokens, gone):  # as the IR's columns are: settle_step compiles once
            column.flags.writeable = False
        return self._settle(step, rows, tokens, _NO_ROWS, gone, _NO_ROWS, _NO_ROWS, {})

    def _steady_running(self) -> bool:
        """Whether the running requests make a steady decode step (`steady_decode`'s test, within
        the budget the passes leave it); nothing is decided."""
        cfg = self.config
        pool = self.pool
        return steady_decode(self.running, self.table.data, self._steady_budget, cfg.max_model_len, pool.ref,
                             pool.bhash, pool.dup_next, pool.nxt, pool.prv, pool.meta, pool.cache, pool.table,
                             pool.nblk, pool.ncached, pool.rhash, pool.nhash, False)

    def _admissible(self, waiting: np.ndarray, vllm_rules: bool) -> int:
        """`admissible_bound` over the runtime's state: at most how many of `waiting` this step
        can admit (the FCFS queue walk only when `waiting` is kept in queued order)."""
        cfg = self.config
        pool = self.pool
        return admissible_bound(self.table.data, self.running, waiting if self._fcfs_window else _EMPTY,
                                self._oversized, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len,
                                vllm_rules, pool.num_free, cfg.enable_prefix_caching, pool.rhash, pool.nhash,
                                pool.nblk, pool.ncached, pool.cache, cfg.block_size)

    def _admission_window(self, waiting: np.ndarray) -> np.ndarray:
        """The head of the waiting queue in vLLM's order that this step can admit from, plus
        every request that reject-oversized will refuse (unsorted: order-vllm sorts them).

        One step admits at most `admissible_bound` requests (max_num_seqs; for the vllm preset
        the free sequence slots and what the token budget the running requests leave reaches,
        or none when the queue's head cannot fit in the free blocks) and stops at the first
        that does not fit, so it looks at no more than that many + 1 requests of the head
        (oversized ones aside, which are all included): leaving the rest out of the step keeps
        its cost flat when thousands wait (an overloaded simulation), with the same decisions
        (tested). A step that can admit nobody gets only the rejectable requests (see
        `_rejectable`). Only the IR differs: requests outside the window get no `req.defer`
        this step. Preempted requests whose stale outputs are still in flight are skipped by
        admission, so the window reaches past them. Under FCFS `waiting` is already in
        `queued` order. O(running + window) per step, not O(waiting), unless some waiting
        request is oversized or the order is by priority.
        """
        d = self.table.data
        bound = self._admissible(waiting, self._vllm_rules())
        if bound == 0 and self.window_full:
            return self._rejectable(waiting)
        w = min(self.window, bound + WINDOW_SLACK)  # never 1 or less: a long-prefill cap sees the same queue length
        if self._fcfs_window:
            head = waiting[: fcfs_head(d, waiting, self._oversized, w)]
        else:
            w = min(w + int(np.count_nonzero(d[T.STALE_OUTPUTS, waiting] > 0)), waiting.size)
            order = np.lexsort((d[T.RANK, waiting], d[T.ARRIVAL, waiting], d[T.PRIORITY, waiting]))
            head = waiting[order[:w]]
        if self._oversized_waiting:
            bad = waiting[self._oversized[waiting]]
            if bad.size:
                head = np.union1d(head, bad)
        return head

    def _waiting_window(self, waiting: np.ndarray, steady: bool = False) -> np.ndarray:
        """The waiting requests the step needs: the union of what each pass declares it could act
        on (`StepPass.waiting_window`, see `schedir.ir.window`), or all of them when one pass
        declares nothing. The sglang passes, say, leave the list out while the running batch is
        full (SGLang does not look at it then) but for new arrivals and requests to reject.
        Decisions are those of the whole queue (tested per pass); only the IR is smaller. Asked
        only when more wait than max_num_seqs + 16 (as the vllm window): the passes' answers cost
        tens of µs, more than a short queue costs the step."""
        self._ranked_prefix = None
        # see _ranked_window_held; after windows that did not hold, the whole queue for a while
        ranked_ok = not self.pool_level and not self.config.dumps(self._step) and self._ranked_wait <= 0
        self._ranked_wait -= 1
        now_us = self._now_us()
        ctx = self._window_context(waiting, steady, self.scheduler_state, now_us, self._step)
        parts = []
        walkers = False
        rank = None
        orders: list = []
        passes = self.manager.passes
        for i, p in enumerate(passes):  # (ctx.rank starts at None: _window_context)
            at = p.waiting_window(ctx)
            if "order" in p.provides:
                # every order is a stable sort of the step's current order: one order pass ranks
                # the queue by its key (`waiting_rank`); after several, the last one's key ranks
                # first and each earlier one breaks the ties left, so their ranks compose
                # (`WindowContext.composed_rank`, from their `rank_columns`; None where one
                # declares none), asked after the last of a run of order passes
                orders.append(p)
                if i + 1 < len(passes) and "order" in passes[i + 1].provides:
                    rank = None
                else:
                    rank = p.waiting_rank(ctx) if len(orders) == 1 else ctx.composed_rank(orders)
            ctx.rank = rank
            if at is None:
                if not (p.walks_ranked and ranked_ok):
                    return waiting
                walkers = True
                continue
            if at.size:
                parts.append(at)
        if walkers:  # a ranked window: the head of the step's order, checked after the step
            prefix = self._ranked_head(ctx, rank)
            if prefix is None:
                return waiting
            parts.append(prefix)
        if not parts:
            return _EMPTY
        if walkers:  # the union, its part past the head and the least key left out, in one pass
            keys, swapped_keys = rank  # type: ignore[misc]
            named = parts[0] if len(parts) == 2 else joined_columns(parts[:-1]) if len(parts) > 2 else _NO_ROWS
            at, beyond, least_left_out = ranked_window_marks(waiting.size, named, prefix, keys)
        elif len(parts) > 1:  # the union, marked (np.unique's sort costs ~50 µs over thousands)
            inside = np.zeros(waiting.size, dtype=np.bool_)
            for part in parts:
                inside[part] = True
            at = np.flatnonzero(inside)
        else:
            at = np.sort(parts[0])
        window = waiting[at]
        if walkers and window.size < waiting.size:
            swapped_at = self._swapped_window(ctx, swapped_keys)
            behind = _NO_ROWS
            if swapped_keys.size:
                # swapped requests ranked after a waiting one left out (equal keys: swapped first, as
                # the passes' stable sort of both): a walk that reached them would have passed it
                late = swapped_keys > least_left_out
                if swapped_at is not None:  # of those in the step (the rest rank behind them all)
                    in_step = np.zeros(swapped_keys.size, dtype=np.bool_)
                    in_step[swapped_at] = True
                    late &= in_step
                if late.any():
                    behind = self.swapped[late]
                    if (keys[beyond] < swapped_keys[late].max()).any():
                        return waiting  # requests outside the head ranked among them: no ranked window
            self._ranked_prefix = (waiting[prefix], waiting[beyond], behind,
                                   self.swapped if swapped_at is None else self.swapped[swapped_at])
        return window

    def _swapped_window(self, ctx: WindowContext, swapped_keys: np.ndarray) -> np.ndarray | None:
        """Positions in the swapped queue that a step over a ranked window needs: the first
        `seats_to_fill` + 16 by the order pass's rank (at most max_num_seqs + 16) and what each
        pass names (`StepPass.swapped_window`); None (all of them) for a short queue, or where a
        pass names none and walks no ranked order. Swapped requests left out rank behind that
        head; the walk that could resume them resumes one only into a free seat, so it has
        stopped (or filled every seat it could) within the head's first `seats_to_fill` + 1:
        they stay swapped, as the whole queue would decide (`_ranked_window_held` checks the
        rest)."""
        k = ctx.seats_to_fill() + WINDOW_SLACK  # (at most max_num_seqs + 16)
        if swapped_keys.size <= k or swapped_keys.size != self.swapped.size:
            return None
        head = ctx.first_by_rank(swapped_keys, k)
        if head is None:  # (a partial rank placed fewer)
            return None
        inside = np.zeros(swapped_keys.size, dtype=np.bool_)
        inside[head] = True
        for p in self.manager.passes:
            at = p.swapped_window(ctx)
            if at is None:
                if not p.walks_ranked:
                    return None
            elif at.size:
                inside[at] = True
        return np.flatnonzero(inside)

    def _ranked_head(self, ctx: WindowContext, rank: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray | None:
        """Positions in the waiting queue of a ranked window's head: the first `seats_to_fill` + 16
        waiting requests by the order pass's rank (`StepPass.waiting_rank`; equal keys in queue
        order): the free seats and those the passes free (`frees_seats`; every seat where blocks
        run short), + 16, at most max_num_seqs + 16 (a full batch whose seats stay taken makes
        the head 16 long, not 272); None (the whole queue) without a rank."""
        if rank is None:
            return None
        keys, swapped_keys = rank
        # the walkers fill at most the free seats and those the passes free (`seats_to_fill`): their
        # head, checked after the step as any
        k = ctx.seats_to_fill() + WINDOW_SLACK  # (at most max_num_seqs + 16)
        if keys.size <= k:
            return None
        return ctx.first_by_rank(keys, k)

    def _ranked_window_held(self, module: ModuleOp, facts: StepFacts) -> bool:
        """Whether a step built over a ranked window (`_waiting_window`) decided as over the whole
        queue would: the passes before the walkers act only on requests their own windows name,
        and the walkers (`StepPass.walks_ranked`) took nobody ranked after the head and ran out of
        sequence slots or token budget within it, so nobody left out could have been taken.
        Otherwise the runtime builds the step again over the whole queue."""
        step = Step(steps_of(module)[0])
        used = step.usage()
        return self._ranked_held(facts, used.tokens, used.seqs + running_not_scheduled(step, used),
                                 ((op.ids, op.col("reason")) for op in step.ops_of(DeferOp)),  # type: ignore[attr-defined]
                                 used.scheduled_ids)

    def _ranked_held(self, facts: StepFacts, tokens: int, seats: int,
                     defers: Iterable[tuple[np.ndarray, np.ndarray]], scheduled: np.ndarray) -> bool:
        """The checks of `_ranked_window_held` over a step's decisions, however they are held: the
        tokens scheduled, the seats taken (scheduled or kept by running requests left out), every
        deferral's (ids, reasons) and the ids scheduled."""
        _, beyond, behind, _ = self._ranked_prefix
        if tokens < facts.token_budget and seats < facts.max_seqs:
            return False
        if behind.size:  # swapped requests ranked past a request left out: the walk must have stopped
            stopped = 0  # for want of seats or tokens, before the head's end (nothing is walked between)
            for ids, reasons in defers:
                found = members_deferred_for(ids, reasons, behind, _WALK_STOPPED)
                if found < 0:
                    return False
                stopped += found
            if stopped < behind.size:  # one of them resumed
                return False
        return not beyond.size or count_members(scheduled, beyond) == 0

    def _window_context(self, waiting: np.ndarray, steady: bool,
                        scheduler_state: Mapping[str, float | np.ndarray], now_us: int = -1,
                        step: int = 0) -> WindowContext:
        """The runtime's state as `waiting_window` and `steady_state` read it (see `schedir.ir.window`)."""
        pool = self.pool
        oversized = np.flatnonzero(self._oversized[waiting]) if self._oversized_waiting else WindowContext.NONE
        ctx = self._ctx
        if ctx is None:  # one per pipeline, refilled per step (building its 16 fields cost ~4 µs a step)
            cfg = self.config
            ctx = self._ctx = WindowContext(
                self.running, waiting, cfg.max_num_seqs, pool.num_free, pool.usable_blocks,
                cfg.max_num_batched_tokens, cfg.block_size, cfg.max_model_len, oversized, scheduler_state,
                self._request_state_of, self._column_of, {}, steady, self._state_of, self._table_column, now_us,
                step, head_size=cfg.max_num_seqs + WINDOW_SLACK if any(p.walks_ranked for p in self.manager.passes)
                else 0,  # (no walker: the passes' own heads only, often a few seats long)
                prefix_hit=None if self.pool_level else self._window_prefix_hit, policy=cfg.policy)
        ctx.running = self.running
        ctx.waiting = waiting
        ctx.free_blocks = pool.num_free
        ctx.total_blocks = pool.usable_blocks
        ctx.oversized = oversized
        ctx.blocks_of = pool.nblk
        ctx.scheduler_state = scheduler_state
        ctx.memo = {}
        ctx.batch_state = {}
        ctx.steady = steady
        ctx.now_us = now_us
        ctx.step = step
        ctx.swapped = self.swapped
        ctx.host_free_blocks = self._host_free()
        ctx.queued_memo = self._queued_answers(waiting)
        ctx.rank = None
        return ctx

    def _queued_answers(self, waiting: np.ndarray) -> dict:
        """The answers held over the queued requests (`WindowContext.queued`, the steady program's
        memo): kept while `waiting` and the swapped queue are the same arrays (the runtime replaces
        a queue array when the queue changes) and no queued request's state was written."""
        held = self._queued_memo
        if held[0] is not waiting or held[1] is not self.swapped or held[2] != self._queued_state_writes:
            held = self._queued_memo = (waiting, self.swapped, self._queued_state_writes, {})
        return held[3]

    def _host_free(self) -> int:
        """The host tier's free blocks as the step's `host_free_blocks` fact shows them (-1: no
        swapped queue or no host tier)."""
        host = self.pool.host if self.swap_queue else None
        return host.num_free if host is not None else -1

    def _window_prefix_hit(self, ids: np.ndarray) -> np.ndarray:
        """The prefix-hit tokens of waiting `ids` as the step's `mem.match` will show them
        (`WindowContext.prefix_hit`): the pool does not change between the window and the step."""
        if not self.config.enable_prefix_caching:
            return np.zeros(ids.size, dtype=np.int64)
        return self._match(ids)[0]

    def _match(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`match_rows` over the pool as it stands: the prefix-hit tokens of `rows` and how many of
        their hit blocks sit in the free queue (a count-level step's `mem.match`); a block pool's
        zero hits held across steps (`HeldHits`: an order over the whole queue asks them all)."""
        pool = self.pool
        total = self.table.data[T.TOTAL, rows]
        if isinstance(pool, KVPool):
            return self._held_hits.match(pool, rows, total)
        return match_rows(rows, total, self.config.block_size, pool.ref, pool.rhash, pool.nhash, pool.cache)

    def _table_column(self, name: str) -> np.ndarray:
        """A queue column of every row, read-only (`WindowContext.column_of`)."""
        return self._row_view(self.table.data, _COLUMN_INDEX[name])

    def _column_of(self, name: str, rows: np.ndarray) -> np.ndarray:
        """A queue column of `rows` as the step would show it (`WindowContext.column`)."""
        return self.pool.nblk[rows].astype(np.int64) if name == "blocks" else self.table.data[_COLUMN_INDEX[name], rows]

    def _state_of(self, name: str) -> np.ndarray:
        """Declared request state of every row, read-only (`WindowContext.state_of`)."""
        table = self.table
        return self._row_view(table.state, table.state_index[name])

    def _row_view(self, matrix: np.ndarray, index: int) -> np.ndarray:
        """A read-only view of one row of the table's `data` or `state` matrix, made once per matrix
        (the table replaces a matrix when it grows; a steady step asks ~10 of them, ~1 µs each)."""
        views = self._row_views.get(id(matrix))
        if views is None or views[0] is not matrix:
            views = self._row_views[id(matrix)] = (matrix, {})
            if len(self._row_views) > 4:  # matrices the table replaced
                self._row_views = {id(matrix): views}
        row = views[1].get(index)
        if row is None:
            row = views[1][index] = matrix[index]
            row.flags.writeable = False  # a view: the flag is the view's own
        return row

    def _request_state_of(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Declared request state of `rows` (`WindowContext.request_state`)."""
        table = self.table
        return table.state[table.state_index[name], rows]

    def _declared_steady_step(self, step: int) -> SchedulerOutput | None:
        """A steady decode step of a pipeline whose passes keep state (`StepPass.steady_state`):
        every pass answers what it writes in such a step, reading the whole waiting queue and the
        values the passes before it write, the batch goes in the order a pass declares
        (`StepPass.steady_order`), and the kernel finds the running requests decoding one token
        each (`steady_rows`) with their KV from the free pool alone: the block pool's steady
        kernel, or the radix pool's (`decode_if_free`'s rule). Else None, nothing changed (the
        passes' answers are pure: asked first, written only once the kernel took the step). Passes
        that declare what they read are asked again only when it changed (`SteadyAnswers`)."""
        running = self.running
        if not running.size or (self.swapped.size and not self._steady_swapped):
            return None
        answers = self._answers
        if (answers.program is not None and answers.lowered  # (a radix pool's pipeline has no program)
                and answers.holding(running, self.waiting, self._request_state_writes, self.scheduler_state) is None):
            return self._program_step(step, answers.program)
        answer = answers.answer(running, self.waiting, self._request_state_writes, self.scheduler_state,
                                self._steady_context)
        if answer is None:
            return None
        order = answer[2]
        if not self.radix:
            out = self._steady_step(step, _EMPTY, None if order is None else running[order])
        else:
            out = self._steady_radix(step, running if order is None else running[order])
        if out is not None:
            SteadyAnswers.write(self.scheduler_state, answer)
            if answer[3]:  # request state of the batch's rows
                table = self.table
                for name, values in answer[3]:
                    write_state_row(table.state, table.state_index[name], running, values)
                self._request_state_writes += 1
        return out

    def _steady_context(self, state: dict) -> WindowContext:
        """The passes' view before a steady step, over `state` (`SteadyAnswers.answer`)."""
        # the clock as the step's now_us fact would read it (a simulator's: the same instant)
        now_us = self._now_us()
        return self._window_context(self.waiting, True, state, now_us, self._step)

    def _program_step(self, step: int, program: SteadyProgram) -> SchedulerOutput | None:
        """`_declared_steady_step` for a pipeline whose answers are lowered (`SteadyProgram`): the
        passes that keep the default answer asked in Python (only while requests wait), then one
        kernel call asks the lowered answers and settles the step in their order
        (`schedir.runtime.steady_kernel`); the kernel writes the rows' request state they wrote
        once the step was taken, the runtime the scheduler state. None, nothing changed, when an
        answer or the running requests leave the step to the IR."""
        answers = self._answers
        answers.asked += 1
        running, waiting = self.running, self.waiting
        if waiting.size and program.asked:
            ctx = self._steady_context(dict(self.scheduler_state))
            for p in program.asked:
                if p.steady_state(ctx) is None:
                    return None
        pool = self.pool
        table = self.table
        now_us = self._now_us()
        sc = self._steady_facts  # (the free blocks: the kernel reads the pool's own count)
        sc[SC_STEP] = self._step
        sc[SC_NOW_US] = now_us
        sc[SC_OVERSIZED] = self._oversized_waiting
        sc[SC_FRONT] = self._front
        if self.swap_queue:
            sc[SC_HOST_FREE] = self._host_free()
        memo, plan, marks, work = program.buffers_for(self._queued_answers(waiting), table.state, running.size)
        scalars = program.scalars
        SS = program.scalars_from(self.scheduler_state) if scalars else _NO_SCALARS
        tokens = self._one_token_each(running.size)
        code, *settled = program_steady_settle(
            plan, program.options, table.state, self.swapped, sc, SS, memo, marks, work, running, table.data, pool.ref,
            pool.bhash, pool.dup_next, pool.nxt, pool.prv, pool.meta, pool.cache, pool.table, pool.nblk, pool.ncached,
            pool.rhash, pool.nhash, tokens, waiting)
        if code != TAKEN:
            return None
        batch = running if not marks[1] else running[work[0]]  # the order the answers gave, if any (flags[1])
        out = self._output(step, batch, tokens, settled, _NO_ROWS, _NO_ROWS, {}, _NO_PAIRS, _NO_PAIRS)
        if scalars:  # the scheduler state they wrote (v0's delay clock, its running queue's next place)
            program.write_scalars(self.scheduler_state)
        if marks[0] == 2:  # request state of the batch's rows, written by the kernel
            self._request_state_writes += 1
        elif not scalars and answers.holds:  # (an answer that writes scheduler state is asked again)
            answers.hold(running, waiting, self._request_state_writes, self.scheduler_state,
                         (_NO_CONSTANTS, (), program.ordered(), ()))
        return out

    def _steady_radix(self, step: int, rows: np.ndarray) -> SchedulerOutput | None:
        """`_steady_step` on the radix pool: each of `rows` (the batch, in its order) gets one more
        token of KV from the free pages (`RadixKVPool.decode_if_free`'s rule; None, nothing
        changed, when the free pages alone do not cover them or a chunked prefill waits to be
        stashed), then the step settles as the IR path's lowering settles it; one kernel."""
        cfg = self.config
        pool = self.pool
        if pool.stash:
            return None
        tokens = self._one_token_each(rows.size)
        taken, *settled = radix_steady_settle(rows, self.table.data, self._steady_budget, cfg.max_model_len,
                                              pool.kv_len, pool.table, pool.nblk, pool.free, pool.head, pool.nfree,
                                              cfg.block_size, tokens, self._front, self.running, self.waiting,
                                              cfg.async_scheduling, cfg.batch_plan)
        if taken < 0:  # NOT_FREE, or a row outgrew its page table: the IR path reports that
            return None
        pool.took_pages(taken)
        pool.idle()  # no extend batch this step (decode_if_free's bookkeeping)
        return self._output(step, rows, tokens, settled, _NO_ROWS, _NO_ROWS, {}, _NO_PAIRS, _NO_PAIRS)

    def _vllm_rules(self) -> bool:
        """Whether the window may bound admission by the token budget and the free blocks (see
        `admissible_bound`): the vllm preset's passes on vLLM's block pool, with no long-prefill
        cap. Worked out once per pipeline."""
        manager = self.manager
        if getattr(self, "_vllm_rules_of", (None,))[0] is not manager:
            rules = self.window_full and not self.radix and tuple(manager.passes) == vllm_passes()
            self._vllm_rules_of = (manager, rules)
        return self._vllm_rules_of[1]

    def _forget_oversized(self, row: int) -> None:
        if self._oversized[row]:
            self._oversized[row] = False
            self._oversized_waiting -= 1

    def _rejectable(self, waiting: np.ndarray) -> np.ndarray:
        """The waiting requests reject-oversized will refuse: all a vllm step decides about the
        waiting queue while max_num_seqs requests run (vLLM's waiting loop stops at once then).
        Leaving the others out (the window's rule, see `_admission_window`) spares the order and
        admission passes a queue they can only defer; an empty one makes them skip at once."""
        if not self._oversized_waiting:  # flagged at arrival (see `_forget_oversized`): nobody is refused
            return _EMPTY
        return waiting[self._oversized[waiting]]

    @staticmethod
    def _prefix_hits_of(matches: Sequence[MatchOp], rows: np.ndarray) -> np.ndarray:
        """Each of `rows`' prefix hit in the step's `mem.match` ops (the last match of a request
        wins), 0 where none matched it: arrays, not a dict over the admitted requests."""
        ids = joined_columns([m.ids for m in matches])  # type: ignore[attr-defined]
        hits = joined_columns([m.col("hit") for m in matches])  # type: ignore[attr-defined]
        if not ids.size:
            return np.zeros(rows.size, dtype=np.int64)
        order = np.argsort(ids, kind="stable")  # equal ids in op order: the last of them is the last match
        sorted_ids = ids[order]
        at = np.searchsorted(sorted_ids, rows, side="right") - 1
        found = (at >= 0) & (sorted_ids[np.maximum(at, 0)] == rows)
        return np.where(found, hits[order[np.maximum(at, 0)]], 0)

    def _swap_rows(self, out_rows: np.ndarray, in_rows: np.ndarray, step: int) -> None:
        """Move the KV of requests a count-level pass preempted by swap to the host tier, then
        that of the requests it swapped back in to the device (before the step's allocations:
        their blocks are what `commit` extends). A pool-level pass swaps inside its kernel."""
        pool = self.pool
        host = pool.host
        names = self.table.names
        if host is None:
            raise PassFailure(self.spec, f"step {step} swapped request(s) but the scheduler has no host tier "
                              "(num_cpu_blocks = 0)")
        side, at = swap_rows(out_rows, in_rows, pool.ref, pool.bhash, pool.dup_next, pool.nxt, pool.prv, pool.meta,
                             pool.cache, pool.table, pool.nblk, pool.ncached, host.hfree, host.hmeta, host.htable,
                             host.hnblk, host.log)
        if at >= 0 and side == 0:
            r = int(out_rows[at])
            raise PassFailure(self.spec, f"step {step} swapped out request '{names[r]}' but its "
                              f"{int(pool.nblk[r])} KV blocks do not fit in the host tier's "
                              f"{host.num_free} free blocks")
        if at >= 0:
            r = int(in_rows[at])
            raise PassFailure(self.spec, f"step {step} swapped in request '{names[r]}' but its "
                              f"{int(host.hnblk[r])} host blocks do not fit in the device pool's "
                              f"{pool.num_free} free blocks")

    def _run_dumped(self, module: ModuleOp, step: int) -> None:
        cfg = self.config
        assert cfg.dump_dir is not None
        instrument = Instrumentation(dump_dir=cfg.dump_dir, dot_dir=cfg.dump_dir if cfg.dump_dot else None,
                                     prefix=f"step-{step:05d}-")
        PassManager.parse(self.spec, verify_each=True, instrument=instrument).run(module)

    def _lower(self, block: Block, step: int) -> tuple[SchedulerOutput, int]:
        """Read the decisions back from the step's body and apply them: queues, pool, output.
        Also returns the prefix-hit tokens the admitted (new or resumed) requests start from."""
        parts: list[np.ndarray] = []
        part_tokens: list[np.ndarray] = []
        admitted: list[np.ndarray] = []
        preempted: list[np.ndarray] = []
        swapped_in: list[np.ndarray] = []
        swapped_out: list[np.ndarray] = []
        rejected: list[tuple[np.ndarray, np.ndarray]] = []
        matches: list[MatchOp] = []
        state_writes: list = []
        op = block.first_op
        while op is not None:
            kind = type(op)
            if kind is ScheduleOp:
                ids = op.ids  # type: ignore[attr-defined]
                parts.append(ids)
                part_tokens.append(op.col("tokens"))  # type: ignore[attr-defined]
                queue = _root_queue(op)
                if queue == "swapped":
                    swapped_in.append(ids)
                elif queue != "running":
                    admitted.append(ids)
            elif kind is PreemptOp:
                (swapped_out if op.mode.data == "swap" else preempted).append(op.ids)  # type: ignore[attr-defined]
            elif kind is RejectOp:
                rejected.append((op.ids, op.col("reason")))  # type: ignore[attr-defined]
            elif kind is MatchOp:
                matches.append(op)  # type: ignore[arg-type]
            elif kind is ReqSetStateOp or kind is SchedSetStateOp:
                state_writes.append(op)
            op = op._next_op
        if state_writes:
            self._apply_state(state_writes)
        new_rows = joined_columns(admitted)
        new_computed = self._prefix_hits_of(matches, new_rows) if new_rows.size and matches else 0
        return self._apply_decisions(step, joined_columns(parts), joined_columns(part_tokens), new_rows, new_computed,
                                     joined_columns(preempted), swapped_in, swapped_out, rejected)

    def _apply_decisions(self, step: int, rows: np.ndarray, tokens: np.ndarray, new_rows: np.ndarray,
                         new_computed: np.ndarray | int, gone: np.ndarray, swapped_in: list[np.ndarray],
                         swapped_out: list[np.ndarray], rejected: list[tuple[np.ndarray, np.ndarray]],
                         ) -> tuple[SchedulerOutput, int]:
        """Apply a step's decisions, read from its IR or its array step: `rows` scheduled for
        `tokens` (batch order), `new_rows` admitted (starting from `new_computed` tokens, their
        prefix hits), `gone` preempted by recompute, the rows swapped in and out (one array per
        decision), `rejected` with their reasons; the pool, the queues, the output."""
        cfg = self.config
        pool = self.pool
        table = self.table
        d = table.data
        if swapped_out or swapped_in:  # vLLM v0's swap: rows move between running and the swapped queue
            resumed = joined_columns(swapped_in)
            out_rows = joined_columns(swapped_out)
            d[T.STATUS, out_rows] = T.SWAPPED  # before settle_step: it keeps RUNNING rows in running
            d[T.BLOCKS, out_rows] = 0
            d[T.PREEMPTIONS, out_rows] += 1
        else:
            resumed = out_rows = _NO_ROWS

        # Admitted requests start from their prefix hit.
        if new_rows.size:
            d[T.COMPUTED, new_rows] = new_computed
        if self._v0_pool and gone.size:  # freed by recompute: the hits v0 noted for them go
            pool.v0_forget(gone)
        if not self.pool_level:
            if out_rows.size or resumed.size:  # a count-level pass swapped: the copies happen here
                self._swap_rows(out_rows, resumed, step)
            before = read_scheduled(rows, d)  # computed and total as decided, for the block commit
            failed = commit(gone, new_rows, d[T.COMPUTED, new_rows], rows, tokens, before[SCHED_COMPUTED],
                            before[SCHED_TOTAL], cfg.max_model_len, pool.ref, pool.bhash, pool.dup_next, pool.nxt,
                            pool.prv, pool.meta, pool.cache, pool.table, pool.nblk, pool.ncached, pool.rhash,
                            pool.nhash)
            if failed >= 0:
                raise PassFailure(self.spec, f"step {step} scheduled request '{table.names[rows[failed]]}' "
                                  "but its KV blocks do not fit in the free pool")

        # Rejections, then queues and lifecycle (one kernel) and the batch plan.
        rejected_out: dict[str, str] = {}
        for ids, reasons in rejected:
            for r, why in zip(ids.tolist(), reasons.tolist(), strict=True):
                name = table.names[r]
                rejected_out[name] = _REASON_NAMES.get(why, str(why))
                self._finished.append(name)  # an engine that saw it (scheduled, preempted) frees its state
                d[T.STATUS, r] = T.FINISHED
                self._forget_oversized(r)
                pool.free_request(r)
                pool.nhash[r] = 0
                self._release_row(r)
            self.metrics.rejected += ids.size
        out = self._settle(step, rows, tokens, new_rows, gone, resumed, out_rows, rejected_out)
        hit_tokens = int(out.computed[out.kind != 0].sum()) if new_rows.size else 0
        return out, hit_tokens

    def _settle(self, step: int, rows: np.ndarray, tokens: np.ndarray, new_rows: np.ndarray, gone: np.ndarray,
                resumed: np.ndarray, out_rows: np.ndarray, rejected_out: dict[str, str]) -> SchedulerOutput:
        """Apply a step's decisions to the queues and the request lifecycle (one kernel), then
        build its output: `rows` scheduled for `tokens`, `new_rows` admitted, `gone` preempted by
        recompute, `resumed` swapped in, `out_rows` swapped out (their blocks already moved)."""
        cfg = self.config
        pool = self.pool
        table = self.table
        d = table.data
        joining = joined_columns([new_rows, resumed]) if resumed.size else new_rows  # admitted, then swapped in
        self.running, self.waiting, *settled = settle_step(
            rows, tokens, joining, gone, self._front, d, self.running, self.waiting, pool.table, pool.nblk,
            cfg.block_size, cfg.async_scheduling, self._fcfs_window, bool(new_rows.size) or bool(rejected_out),
            cfg.batch_plan)
        if gone.size:
            self._front -= gone.size
            self.metrics.preemptions += gone.size
        swap_out_pairs = swap_in_pairs = _NO_PAIRS
        if self.swap_queue:
            kept = self.swapped[d[T.STATUS, self.swapped] == T.SWAPPED] if self.swapped.size else _EMPTY
            self.swapped = np.concatenate([kept, out_rows]) if out_rows.size else kept
            self.metrics.preemptions += out_rows.size
            if pool.host is not None:
                swap_out_pairs, swap_in_pairs = pool.host.take_log()
                if out_rows.size:  # a swapped request's `blocks` are its host blocks, as its queue shows them
                    d[T.BLOCKS, out_rows] = pool.host.hnblk[out_rows]
        return self._output(step, rows, tokens, settled, new_rows, gone, rejected_out, swap_out_pairs, swap_in_pairs,
                            out_rows)

    def _output(self, step: int, rows: np.ndarray, tokens: np.ndarray, settled: Sequence, new_rows: np.ndarray,
                gone: np.ndarray, rejected_out: dict[str, str], swap_out_pairs: np.ndarray, swap_in_pairs: np.ndarray,
                out_rows: np.ndarray = _NO_ROWS) -> SchedulerOutput:
        """The step's output from `settle_step`'s per-request results and batch plan (`settled`:
        per_request, sampled, tokens scheduled, query_start_loc, per_token, seq_lens, block_table)."""
        table = self.table
        per_request, sampled, scheduled, qsl, per_token, seq_lens, block_table = settled
        names = table.names
        out = SchedulerOutput(
            step, names[rows], rows, tokens, per_request, sampled, block_table,
            [table.prompts[r] for r in rows[per_request[STEP_KIND] == 1].tolist()] if new_rows.size else [],
            frozenset([names[r] for r in gone.tolist()]) if gone.size else _NO_IDS,
            frozenset(self._finished) if self._finished else _NO_IDS, rejected_out, scheduled, qsl, per_token,
            seq_lens)
        if out_rows.size or swap_out_pairs.size or swap_in_pairs.size:
            out.swapped_out_req_ids = frozenset([names[r] for r in out_rows.tolist()])
            out.blocks_to_swap_out, out.blocks_to_swap_in = swap_out_pairs, swap_in_pairs
        self._finished = []
        return out

    def _apply_state(self, writes: list) -> None:
        """Keep the state the step's passes wrote (`req.set_state`, `sched.set_state`), in op
        order: a later write of the same value wins."""
        table = self.table
        for op in writes:
            if type(op) is SchedSetStateOp:
                self.scheduler_state.update(decoded_state_values(op.properties["values"]))  # no FloatAttrs written
                continue
            cols = op.properties["columns"]
            rows = cols.get("id")
            self._request_state_writes += 1
            self._queued_state_writes += 1
            for name in cols.names:
                if name != "id":
                    table.state[table.state_index[name], rows] = cols.get(name)

    # ------------------------------------------------------------ UPDATE
    def update(self, output: SchedulerOutput, sampled: Mapping[str, Sequence[int]] | np.ndarray) -> list[str]:
        """Apply the engine's sampled tokens for `output`; returns the requests that finished.

        `sampled` maps request id -> new token ids (requests absent sampled nothing,
        e.g. a partial prefill chunk), or is an int array aligned with
        `output.req_ids` holding one token each (-1: none), the fast path.
        """
        if output.applied:
            raise ValueError(f"the output of step {output.step} was already applied (update() once per output)")
        if isinstance(sampled, np.ndarray) and sampled.shape != output.rows.shape:
            raise ValueError(f"sampled token array has shape {sampled.shape}; expected length "
                             f"{len(output.rows)}, one token per request of the output (-1: none)")
        output.applied = True
        table = self.table
        d = table.data
        rows = output.rows
        if rows.size == 0:
            return []
        one_each = isinstance(sampled, np.ndarray)  # one token per request (-1: none), else a dict of lists
        if one_each:
            toks = sampled if sampled.dtype == np.int64 else sampled.astype(np.int64)
            offsets = _EMPTY
        else:
            lists = [sampled.get(n, ()) for n in output.req_ids]
            counts = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
            offsets = np.zeros(rows.size + 1, dtype=np.int64)
            np.cumsum(counts, out=offsets[1:])
            toks = np.fromiter((t for x in lists for t in x), dtype=np.int64, count=int(offsets[-1]))
        pool = self.pool
        before_total = d[T.TOTAL, rows].copy() if self.radix else None
        done, attention = apply_samples(rows, output.generation, offsets, toks, one_each, d, table.tail,
                                        pool.rhash, pool.nhash, self.config.block_size,
                                        self._stop_len, self._stop_rows, self._stop_ids,
                                        self._register_on_update, pool.bhash, pool.dup_next, pool.cache, pool.meta,
                                        pool.table, pool.ncached)
        if self.radix:
            self._radix_update(rows, done, toks, None if one_each else offsets, before_total)
        return self._samples_applied(rows, done, attention)

    def _samples_applied(self, rows: np.ndarray, done: np.ndarray, attention: int) -> list[str]:
        """`update()` after `apply_samples`: retire the requests it finished and release the rows
        no output names any more; returns the finished requests."""
        d = self.table.data
        self.last_update_codes = done
        finished: list[str] = []
        if self.last_finish_kinds:
            self.last_finish_kinds = {}
        if attention:
            live = done != STALE
            ended = done > 0
            for r, why in zip(rows[ended].tolist(), done[ended].tolist(), strict=True):
                name = self._finish(r)
                finished.append(name)
                self.last_finish_kinds[name] = why
            if finished:
                self.running = self.running[d[T.STATUS, self.running] == T.RUNNING]
                st = d[T.STATUS, self.waiting]  # a request preempted with its step in flight may stop now
                self.waiting = self.waiting[(st == T.WAITING) | (st == T.PREEMPTED)]
            live_rows = rows[live]
            dangling = live_rows[(d[T.STATUS, live_rows] == T.FINISHED) & (d[T.IN_FLIGHT, live_rows] == 0)]
            for r in dangling.tolist():
                self._release_row(r)
        return finished

    # ------------------------------------------------------------ DECODE RUNS (simulators)
    def decode_run_args(self) -> tuple | None:
        """The runtime's side of a decode run (`schedir.sim.decode_run`): a simulator that knows
        no request arrives for a while runs consecutive steady decode steps in one kernel, each
        decided as `schedule()` decides a steady step (`_steady_step`, with the vllm window's
        admission bound when requests wait) and applied as `update()` applies one token per
        request. Returns that kernel's runtime arguments, in its order, or None when the next
        step cannot be run so here: steady steps off or declared per pass, SGLang's pool, async
        scheduling, dumps or kept IR, nothing running, something swapped, a finished request not
        yet reported, a waiting request reject-oversized will refuse, vLLM v0's prefix-caching
        pool (its blocks' last accesses are noted step by step), or requests waiting under a
        pipeline whose admission the window does not bound."""
        cfg = self.config
        if (not self._steady or self._steady_declared or self.radix or self._v0_pool or cfg.async_scheduling
                or self.keep_ir or cfg.dump_dir is not None or not self.running.size or self.swapped.size
                or self._finished or self._oversized_waiting or (self.waiting.size and not self._vllm_rules())):
            return None
        pool = self.pool
        return (self.running, self.waiting, self._fcfs_window, self.table.data, self._oversized, cfg.max_num_seqs,
                cfg.max_num_batched_tokens, self._steady_budget, cfg.max_model_len, cfg.enable_prefix_caching,
                cfg.block_size, pool.ref, pool.bhash, pool.dup_next, pool.nxt, pool.prv, pool.meta, pool.cache,
                pool.table, pool.nblk, pool.ncached, pool.rhash, pool.nhash, self._front, self.table.tail,
                self._stop_len, self._stop_rows, self._stop_ids, self._register_on_update)

    def decode_run_applied(self, steps: int, seconds: float, free_blocks: np.ndarray, done: np.ndarray,
                           attention: int) -> list[str]:
        """Account a decode run's `steps` steps (`seconds` of wall time in all; `free_blocks[k]`
        after step k) as `schedule()` and `update()` account each, and finish what its last
        step's samples ended (`done`, `attention`: `apply_samples`' answer); returns those
        requests, as `update()` would."""
        self._step += steps
        tokens = self.running.size  # one each: the running set holds through a run
        each = seconds / steps
        for k in range(steps):
            self.metrics.record_step(each, tokens, 0, int(free_blocks[k]), True)
        return self._samples_applied(self.running, done, attention)

    def _release_row(self, row: int) -> None:
        """Give a request's table row back (and, on SGLang's pool, its token stream)."""
        self.table.release(row)
        if self.radix:
            self.pool.forget_row(row)

    def _radix_update(self, rows: np.ndarray, done: np.ndarray, toks: np.ndarray, offsets: np.ndarray | None,
                      before_total: np.ndarray) -> None:
        """SGLang's `process_batch_result_{prefill,decode}` on the radix pool, in batch order: the
        sampled tokens join the rows' streams; a finished request's KV goes into the tree
        (`release_kv_cache`), a request whose prefill completed is checkpointed
        (`checkpoint_kv_cache`); a request still mid-prefill is checkpointed last, as SGLang
        stashes its chunked request at the next step's start."""
        pool = self.pool
        d = self.table.data
        grew = d[T.TOTAL, rows] > before_total  # the runtime took a token for these rows
        if offsets is None:
            sampled = np.where(grew, toks, -1)
        else:  # lists: the last token of each (a sync engine samples one per step)
            last = np.maximum(offsets[1:] - 1, 0)
            sampled = np.where(grew, toks[last] if toks.size else -1, -1)
        pool.append_tokens(rows, sampled)
        middle: list[tuple[int, int]] = []
        act = done > 0  # a decode step's unfinished rows: nothing to do
        if pool.extend_rows.size:  # a prefill step (np.isin costs ~10 µs even on an empty array)
            extend = dict(zip(pool.extend_rows.tolist(), pool.extend_ends.tolist(), strict=True))
            act |= np.isin(rows, pool.extend_rows)
        else:
            extend = {}
        for r, code, took in zip(rows[act].tolist(), done[act].tolist(), grew[act].tolist(), strict=True):
            if code > 0:
                pool.release(r, insert=True)
            elif r in extend:
                if took:
                    pool.checkpoint(r, extend[r])
                else:
                    middle.append((r, extend[r]))
        pool.idle()
        pool.stash = middle  # SGLang stashes a chunked request at the next step's start

    def _finish(self, row: int, completed: bool = True) -> str:
        """Free a request's blocks and retire it (its row is released once no output names it).

        `completed`: it stopped by itself (counted in latency and throughput), not aborted."""
        table = self.table
        name = table.names[row]
        if completed:
            self.metrics.record_finish(table.data[T.ARRIVAL, row] / 1e6, self.clock(), int(table.data[T.OUTPUTS, row]))
        else:
            self.metrics.aborted += 1
        table.data[T.STATUS, row] = T.FINISHED
        self._forget_oversized(row)
        self.pool.free_request(row)
        self.pool.nhash[row] = 0
        self._finished.append(name)
        if table.data[T.IN_FLIGHT, row] == 0:
            self._release_row(row)
        return name

    # ------------------------------------------------------------ FINISH (abort)
    def finish_requests(self, request_ids: str | Iterable[str], reason: str = "abort") -> list[str]:
        """Abort requests (unknown or already finished ids are ignored); returns those aborted."""
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        d = self.table.data
        done = []
        for name in request_ids:
            row = self.table.row_of.get(name)
            if row is None or d[T.STATUS, row] == T.FINISHED:
                continue
            done.append(self._finish(row, completed=False))
        if done:
            self.running = self.running[d[T.STATUS, self.running] == T.RUNNING]
            st = d[T.STATUS, self.waiting]
            self.waiting = self.waiting[(st == T.WAITING) | (st == T.PREEMPTED)]
            if self.swapped.size:
                self.swapped = self.swapped[d[T.STATUS, self.swapped] == T.SWAPPED]
            if self.table.stop_ids:
                self._refresh_stops()
        return done

    # ------------------------------------------------------------ cache resets
    def preempt_running(self) -> list[str]:
        """Preempt every running request (recompute): free its blocks and put it back at the
        front of the waiting queue in running order, as vLLM's `reset_prefix_cache(
        reset_running_requests=True)` does. Outputs still in flight for these requests are
        dropped when they come back (`stale` < 0, vLLM's drop_stale_output): the requests may
        resume at once and recompute those positions."""
        d = self.table.data
        rows = self.running
        names: list[str] = []
        for k, r in enumerate(rows.tolist()):
            if self.radix:
                self.pool.free_request(r, insert=False)  # SGLang frees a retracted request's KV uninserted
            else:
                self.pool.free_request(r)
            d[T.STATUS, r] = T.PREEMPTED
            d[T.COMPUTED, r] = 0
            d[T.BLOCKS, r] = 0
            d[T.PREEMPTIONS, r] += 1
            d[T.PLACEHOLDERS, r] = 0
            d[T.STALE_OUTPUTS, r] = -d[T.IN_FLIGHT, r]
            d[T.QUEUED, r] = self._front - rows.size + k
            names.append(self.table.names[r])
        self._front -= rows.size
        self.metrics.preemptions += rows.size
        self.waiting = np.concatenate([rows, self.waiting])
        self.running = _EMPTY
        return names

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; refused (False) while any request holds blocks, as
        vLLM's `BlockPool.reset_prefix_cache` does (a held block's KV is still in use)."""
        return self.pool.reset_prefix_cache()

    # ------------------------------------------------------------ state
    def has_unfinished_requests(self) -> bool:
        return bool(self.running.size or self.waiting.size or self.swapped.size)

    def has_finished_requests(self) -> bool:
        """Finished (or rejected, aborted) requests that no output has reported yet."""
        return bool(self._finished)

    def has_requests(self) -> bool:
        """Anything to schedule or to report: an engine loop runs while this holds (vLLM's check),
        so the last finishes reach `finished_req_ids` in one more schedule()."""
        return self.has_unfinished_requests() or self.has_finished_requests()

    def get_num_unfinished_requests(self) -> int:
        return int(self.running.size + self.waiting.size + self.swapped.size)

    def get_metrics(self) -> dict[str, float]:
        return self.metrics.summary()

    def request_state(self, request_id: str) -> dict[str, int]:
        """One request's columns (debugging and tests)."""
        row = self.table.row_of[request_id]
        out = {name: int(self.table.data[i, row]) for i, name in enumerate(T.COLUMNS)}
        for name, index in self.table.state_index.items():
            out[name] = int(self.table.state[index, row])
        return out


def _known_request_state() -> dict[str, RequestState]:
    """Every registered pass's request state, by name."""
    from schedir.ir.pipeline import default_registry

    return {st.name: st for cls in default_registry().values() for st in cls.request_state}


def _root_queue(op: ScheduleOp) -> str:
    return root_queue(tuple.__getitem__(op._operands, 0)).properties["queue"].data  # type: ignore[union-attr]
