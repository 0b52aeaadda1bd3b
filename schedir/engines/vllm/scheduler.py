"""`Scheduler`: vLLM 0.32's `SchedulerInterface` on top of `schedir.Scheduler`.

vLLM's engine core constructs the class named by `scheduler_cls` and calls it every
step: `add_request`, `schedule()`, `update_from_output()`, `finish_requests()`, the
counters and `make_stats()`. This adapter keeps schedir's runtime as the one source of
scheduling state (request table, queues, KV pool, pass pipeline) and converts at the
edges only:

- ADD: a vLLM `Request` becomes a schedir `Request` (prompt ids, max_tokens, priority,
  arrival, EOS / ignore_eos, stop ids); the vLLM object is kept for what only the engine
  needs (sampling params, client index, token history for the model runner);
- SCHEDULE: schedir's `SchedulerOutput` (arrays in batch order) becomes vLLM's
  (`NewRequestData` / `CachedRequestData` with block ids in the one-group form,
  `num_scheduled_tokens`, finished and preempted ids);
- UPDATE: the model runner's sampled tokens go to schedir as one int array (its fast
  path: stop checks in a Numba kernel), and vLLM's `EngineCoreOutputs` are built for the
  requests that produced tokens or finished.

The vLLM `Request` objects the engine holds move as vLLM's do: every scheduled one gets
its `num_computed_tokens` and `is_prefill_chunk` at `schedule()`, admitted ones RUNNING,
preempted ones PREEMPTED; the `running` / `waiting` / `requests` views re-read the
table when they are read.

`AsyncScheduler` is vLLM's async scheduling on the same runtime (`async_scheduling=True`):
a step's sampled tokens are output placeholders until they come back, so a decode runs in
consecutive steps; outputs of a request preempted meanwhile are stale (delivered, or dropped
after a prefix-cache reset that resumes it at once). `Scheduler` builds it by itself when
the engine has async scheduling on, as vLLM builds its own AsyncScheduler.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from schedir.engines.vllm.config import schedir_config
from schedir.runtime import table as T
from schedir.runtime.config import Request as SchedirRequest
from schedir.runtime.kernels import DROPPED, STOPPED
from schedir.runtime.scheduler import Scheduler as Runtime

from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.v1.core.sched.interface import PauseState, SchedulerInterface
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.engine import EngineCoreEventType, EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats
from vllm.v1.request import Request, RequestStatus

# a child of vLLM's logger: vLLM configures only `vllm`, so the engine core prints these
# with its format and level (a `schedir.*` logger's INFO lines were dropped there)
logger = logging.getLogger("vllm.schedir")

_EMPTY = np.zeros(0, dtype=np.int64)
_STATUS = {T.WAITING: RequestStatus.WAITING, T.RUNNING: RequestStatus.RUNNING,
           T.PREEMPTED: RequestStatus.PREEMPTED}


class Scheduler(SchedulerInterface):
    """vLLM's scheduler interface, decided by a schedir pipeline (`vllm` preset by default).

    Load it with `LLM(..., scheduler_cls="schedir.engines.vllm.Scheduler")` or
    `--scheduler-cls schedir.engines.vllm.Scheduler`; choose another pipeline with
    `additional_config={"schedir_pipeline": "..."}` or $SCHEDIR_PIPELINE. With async
    scheduling on, the engine gets an `AsyncScheduler`.
    """

    async_scheduling = False  # decodes overlap their previous step (output placeholders)

    def __new__(cls, vllm_config: Any = None, *args: Any, **kwargs: Any) -> Scheduler:
        if cls is Scheduler and getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", False):
            cls = AsyncScheduler  # vLLM's engine builds AsyncScheduler when async scheduling is on
        return super().__new__(cls)

    def __init__(self, vllm_config: Any, kv_cache_config: Any, structured_output_manager: Any,
                 block_size: int, hash_block_size: int | None = None, mm_registry: Any = MULTIMODAL_REGISTRY,
                 include_finished_set: bool = False, log_stats: bool = False) -> None:
        self.vllm_config = vllm_config
        self.scheduler_config = vllm_config.scheduler_config
        self.cache_config = vllm_config.cache_config
        self.kv_cache_config = kv_cache_config
        self.structured_output_manager = structured_output_manager
        self.log_stats = log_stats
        self.block_size = block_size
        self.max_model_len = vllm_config.model_config.max_model_len
        self.config = schedir_config(vllm_config, kv_cache_config, block_size, self.async_scheduling)
        self.runtime = Runtime(self.config)
        if self.scheduler_config.async_scheduling and not self.async_scheduling:
            logger.warning("schedir: async scheduling is on but %s schedules a request only once its previous "
                           "step's tokens are back (no output placeholders): correct, without overlap",
                           type(self).__name__)
        # The engine core reads these two directly, outside the interface.
        self.connector = None
        self.ec_connector = None
        self.use_v2_model_runner = bool(getattr(vllm_config, "use_v2_model_runner", False))
        self._requests: dict[str, Request] = {}
        self._pause_state = PauseState.UNPAUSED
        self.finished_req_ids_dict: dict[int, set[str]] | None = defaultdict(set) if include_finished_set else None
        self._refused: list[tuple[Request, str]] = []  # added, refused, not yet reported
        self._rejected: list[tuple[str, str]] = []  # rejected by the pipeline, not yet reported
        self._in_flight: dict[int, Any] = {}  # id of each vLLM output not yet updated -> schedir's output
        self._prev_step = np.full(64, -2, dtype=np.int64)  # per table row: the last step that scheduled it
        self._chunk = np.zeros(64, dtype=np.bool_)  # per table row: its last scheduled chunk samples nothing
        self._prefix_stats = PrefixCacheStats()
        self._reset_reported = False
        self._reset_preempted: set[str] = set()  # preempted by a prefix-cache reset, not yet in an output
        logger.info("schedir scheduler: pipeline '%s', %d KV blocks of %d tokens", self.runtime.spec,
                    self.config.num_blocks, block_size)

    # ------------------------------------------------------------ ADD
    def add_request(self, request: Request) -> None:
        """Queue a request; one schedir cannot serve is finished with an error (logged by name)."""
        why = _unsupported(request)
        name = request.request_id
        if why is None and name in self._requests:
            why = "its request id is already in use"
        if why is not None:
            logger.error("schedir: request %s refused: %s", name, why)
            request.status = RequestStatus.FINISHED_ERROR
            self._refused.append((request, why))
            return
        sp = request.sampling_params
        self.runtime.add_request(SchedirRequest(
            name, prompt_token_ids=request.prompt_token_ids, max_tokens=request.max_tokens,
            priority=request.priority, arrival_time=request.arrival_time,
            eos_token_id=sp.eos_token_id, ignore_eos=bool(sp.ignore_eos),
            stop_token_ids=tuple(sp.stop_token_ids or ()),
        ))
        self._requests[name] = request
        row = self.runtime.table.row_of[name]
        if row >= self._prev_step.size:
            self._grow_rows(row + 1)
        self._prev_step[row] = -2  # a recycled row: nothing of its last occupant carries over
        self._chunk[row] = False
        if self.log_stats:
            request.record_event(EngineCoreEventType.QUEUED)

    # ------------------------------------------------------------ SCHEDULE
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        """One step decided by the schedir pipeline, in vLLM's output form."""
        rt = self.runtime
        if throttle_prefills and rt.running.size and not self._chunk[rt.running].all():
            # vLLM would defer prefills behind the decoding requests here (DP prefill balancing);
            # with nothing decoding it defers nothing, and neither does this step
            raise RuntimeError("schedir's vLLM scheduler does not do data-parallel prefill balancing "
                               "(throttle_prefills); data parallelism is refused at start-up")
        if self._pause_state == PauseState.PAUSED_ALL:
            return self._empty_output()
        if self._pause_state == PauseState.PAUSED_NEW:
            hidden, rt.waiting = rt.waiting, _EMPTY
            try:
                out = rt.schedule()
            finally:
                rt.waiting = np.concatenate([rt.waiting, hidden])
        else:
            out = rt.schedule()
        step = out.step
        requests = self._requests
        names = out.req_ids
        rows = out.rows
        if rows.size and int(rows.max()) >= self._prev_step.size:
            self._grow_rows(int(rows.max()) + 1)
        kind = out.kind
        table = out.block_table
        computed, before, after = out.computed, out.nblk_before, out.nblk_after
        new_reqs: list[NewRequestData] = []
        # Most of a step is running requests: their fields are gathered as arrays; only new,
        # resumed, block-growing and (for the model runner) not-scheduled-last-step requests
        # take a Python path.
        cached = kind != 1
        if cached.all():
            at = None
            c_names, c_rows = names, rows
        else:
            v2 = self.use_v2_model_runner  # it takes every token id with the new request
            for i in np.flatnonzero(~cached).tolist():  # new: the prompt and every block, once
                req = requests[names[i]]
                hit = int(computed[i])
                req.num_computed_tokens = hit
                new_reqs.append(NewRequestData.from_request(req, (table[i, : after[i]].tolist(),),
                                                            req._all_token_ids if v2 else None))
                self._on_admitted(req, hit, first=True)
            at = np.flatnonzero(cached)
            c_names, c_rows = out.names[at].tolist(), rows[at]
        resumed: set[str] = set()
        if rows.size and kind.max() == 2:
            for i in np.flatnonzero(kind == 2).tolist():
                resumed.add(names[i])
                self._on_admitted(requests[names[i]], int(computed[i]), first=False)
            if self.use_v2_model_runner:  # vLLM sends resumed requests whole to the V2 runner, after the new ones
                for i in np.flatnonzero(kind == 2).tolist():
                    req = requests[names[i]]
                    req.num_computed_tokens = int(computed[i])
                    new_reqs.append(NewRequestData.from_request(req, (table[i, : after[i]].tolist(),),
                                                                req._all_token_ids))
                keep = np.flatnonzero(kind == 0)
                at = keep
                c_names, c_rows = out.names[keep].tolist(), rows[keep]
                resumed = set()
        c_before = before if at is None else before[at]
        c_after = after if at is None else after[at]
        new_block_ids: list[tuple[list[int], ...] | None] = [None] * len(c_names)
        for j in np.flatnonzero(c_after > c_before).tolist():
            i = j if at is None else int(at[j])
            new_block_ids[j] = (table[i, before[i]: after[i]].tolist(),)
        all_token_ids: dict[str, list[int]] = {}
        if not self.use_v2_model_runner and c_rows.size:
            for j in np.flatnonzero(self._prev_step[c_rows] != step - 1).tolist():
                all_token_ids[c_names[j]] = requests[c_names[j]]._all_token_ids.copy()
        cached_computed = (computed if at is None else computed[at]).tolist()
        d = rt.table.data
        if self.async_scheduling:  # vLLM counts the placeholders before this step's
            c_sampled = out.sampled if at is None else out.sampled[at]
            output_counts = (d[T.OUTPUTS, c_rows] + d[T.PLACEHOLDERS, c_rows] - c_sampled).tolist()
        else:
            output_counts = d[T.OUTPUTS, c_rows].tolist()  # tokens generated so far
        if rows.size:
            self._prev_step[rows] = step
            chunk = ~out.sampled  # vLLM's is_prefill_chunk, set at schedule time
            self._chunk[rows] = chunk
            # vLLM mutates the Request objects the engine holds as it schedules: do the same for
            # the fields that move every step (~0.15 µs a request)
            for name, done, flag in zip(names, (computed + out.num_tokens).tolist(), chunk.tolist(), strict=True):
                req = requests[name]
                req.num_computed_tokens = done
                req.is_prefill_chunk = flag
            if self.async_scheduling:
                for name, ph in zip(names, d[T.PLACEHOLDERS, rows].tolist(), strict=True):
                    requests[name].num_output_placeholders = ph
            if not cached.all() or resumed:
                for i in np.flatnonzero(kind != 0).tolist():
                    requests[names[i]].status = RequestStatus.RUNNING
        for name in out.preempted_req_ids:
            req = requests[name]
            req.status = RequestStatus.PREEMPTED
            req.num_computed_tokens = 0
            req.num_output_placeholders = 0
            req.num_preemptions += 1
        finished = set(out.finished_req_ids)
        for name, why in out.rejected.items():
            self._rejected.append((name, why))
        so = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=CachedRequestData(
                req_ids=c_names, resumed_req_ids=resumed, new_token_ids=[], all_token_ids=all_token_ids,
                new_block_ids=new_block_ids, num_computed_tokens=cached_computed, num_output_tokens=output_counts),
            num_scheduled_tokens=out.num_scheduled_tokens,
            total_num_scheduled_tokens=out.total_num_scheduled_tokens,
            scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={},
            finished_req_ids=finished,
            free_encoder_mm_hashes=[],
            preempted_req_ids=self._take_reset_preempted() | out.preempted_req_ids,
            num_common_prefix_blocks=[0],
        )
        self._in_flight[id(so)] = out
        return so

    def _take_reset_preempted(self) -> set[str]:
        """Requests a prefix-cache reset preempted since the last output: vLLM names them in the
        next output's preempted ids (the model runner drops their state)."""
        taken, self._reset_preempted = self._reset_preempted, set()
        return taken

    def _grow_rows(self, rows: int) -> None:
        size = max(self._prev_step.size * 2, rows)
        prev = np.full(size, -2, dtype=np.int64)
        prev[: self._prev_step.size] = self._prev_step
        chunk = np.zeros(size, dtype=np.bool_)
        chunk[: self._chunk.size] = self._chunk
        self._prev_step, self._chunk = prev, chunk

    def _on_admitted(self, req: Request, hit_tokens: int, first: bool) -> None:
        """Prefix-cache statistics and events of a request that enters the running batch."""
        self._prefix_stats.record(num_tokens=req.num_tokens, num_hits=hit_tokens, preempted=not first)
        if first and req.prefill_stats is not None and req.num_preemptions <= 0:
            req.prefill_stats.set(num_prompt_tokens=req.num_prompt_tokens,
                                  num_local_cached_tokens=min(hit_tokens, req.num_prompt_tokens),
                                  num_external_cached_tokens=0)
        if self.log_stats:
            req.record_event(EngineCoreEventType.SCHEDULED)

    def _empty_output(self) -> SchedulerOutput:
        out = SchedulerOutput.make_empty()
        out.finished_req_ids = self._take_finished()
        return out

    def _take_finished(self) -> set[str]:
        """Requests that finished since the last output (the model runner frees their state)."""
        taken = set(self.runtime._finished)
        self.runtime._finished.clear()
        return taken

    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> None:
        return None  # structured output is refused at add_request

    # ------------------------------------------------------------ UPDATE
    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> dict[int, EngineCoreOutputs]:
        """Apply the sampled tokens; vLLM's per-client outputs for requests with news."""
        out = self._in_flight.pop(id(scheduler_output), None)
        outputs: dict[int, list[EngineCoreOutput]] = defaultdict(list)
        if out is not None and len(out):
            names = out.req_ids
            sampled = model_runner_output.sampled_token_ids
            index = model_runner_output.req_id_to_index
            if model_runner_output.req_ids == names:
                picks = sampled
            else:
                picks = [sampled[index[n]] if n in index else () for n in names]
            toks = np.fromiter((s[0] if s else -1 for s in picks), dtype=np.int64, count=len(names))
            self.runtime.update(out, toks)
            codes = self.runtime.last_update_codes
            if (codes == DROPPED).any():  # stale outputs of requests resumed since: not delivered
                toks[codes == DROPPED] = -1
            kinds = self.runtime.last_finish_kinds
            requests = self._requests
            logprobs = model_runner_output.logprobs
            prompt_logprobs = model_runner_output.prompt_logprobs_dict
            log_stats = self.log_stats
            want_logprobs = logprobs is not None
            for name, tok in zip(names, toks.tolist(), strict=True):
                if tok < 0:  # a partial prefill chunk: nothing sampled (maybe prompt logprobs)
                    if prompt_logprobs and name in prompt_logprobs and name in requests:
                        outputs[requests[name].client_index].append(EngineCoreOutput(
                            request_id=name, new_token_ids=[], new_prompt_logprobs_tensors=prompt_logprobs[name]))
                    continue
                req = requests.get(name)
                if req is None:  # aborted while its step was in flight
                    continue
                req._output_token_ids.append(tok)
                req._all_token_ids.append(tok)
                eco = EngineCoreOutput(request_id=name, new_token_ids=[tok])
                why = kinds.get(name) if kinds else None
                if why is not None:
                    eco.finish_reason = self._finish_reason(req, tok, why)
                    eco.stop_reason = req.stop_reason
                if want_logprobs and req.sampling_params.logprobs is not None:
                    eco.new_logprobs = logprobs.slice_request(index[name], 1)
                if prompt_logprobs and name in prompt_logprobs:
                    eco.new_prompt_logprobs_tensors = prompt_logprobs[name]
                if req.prefill_stats is not None:  # the first token: prompt and prefix-hit counts
                    stats, req.prefill_stats = req.prefill_stats, None
                    stats.finalize(self._cached_tokens(req))
                    eco.prefill_stats = stats
                if log_stats and req.events:
                    eco.events = req.take_events()
                if req.trace_headers is not None:
                    eco.trace_headers = req.trace_headers
                outputs[req.client_index].append(eco)
                if why is not None:
                    self._retire(req)
        self._report_ended(outputs)
        result = {client: EngineCoreOutputs(outputs=outs) for client, outs in outputs.items()}
        if self.finished_req_ids_dict:
            for client, done in self.finished_req_ids_dict.items():
                if client in result:
                    result[client].finished_requests = done
                else:
                    result[client] = EngineCoreOutputs(finished_requests=done)
            self.finished_req_ids_dict.clear()
        stats = self.make_stats()
        if stats is not None:
            eco = next(iter(result.values()), None)
            if eco is None:
                result[0] = eco = EngineCoreOutputs()
            eco.scheduler_stats = stats
        return result

    def _finish_reason(self, req: Request, tok: int, why: int) -> FinishReason:
        if why == STOPPED:
            req.status = RequestStatus.FINISHED_STOPPED
            if tok != req.sampling_params.eos_token_id or req.sampling_params.ignore_eos:
                req.stop_reason = tok  # a stop token id (vLLM reports which)
            return FinishReason.STOP
        req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return FinishReason.LENGTH

    def _cached_tokens(self, req: Request) -> int:
        """Prompt tokens now in full cached blocks (vLLM's estimate for prefill statistics)."""
        if not self.config.enable_prefix_caching:
            return 0
        return req.num_prompt_tokens // self.block_size * self.block_size

    def _retire(self, req: Request) -> None:
        self._requests.pop(req.request_id, None)
        if self.finished_req_ids_dict is not None:
            self.finished_req_ids_dict[req.client_index].add(req.request_id)

    def _report_ended(self, outputs: dict[int, list[EngineCoreOutput]]) -> None:
        """Outputs for requests that ended without running: refused at add, rejected by the pipeline."""
        for req, _why in self._refused:
            outputs[req.client_index].append(EngineCoreOutput(
                request_id=req.request_id, new_token_ids=[], finish_reason=FinishReason.ERROR,
                events=req.take_events() if self.log_stats else None, trace_headers=req.trace_headers))
            if self.finished_req_ids_dict is not None:
                self.finished_req_ids_dict[req.client_index].add(req.request_id)
        self._refused.clear()
        for name, why in self._rejected:
            req = self._requests.get(name)
            if req is None:
                continue
            logger.warning("schedir: request %s rejected (%s): it can never be scheduled", name, why)
            req.status = RequestStatus.FINISHED_IGNORED
            outputs[req.client_index].append(EngineCoreOutput(
                request_id=name, new_token_ids=[], finish_reason=FinishReason.LENGTH,
                events=req.take_events() if self.log_stats else None, trace_headers=req.trace_headers))
            self._retire(req)
        self._rejected.clear()

    def update_draft_token_ids(self, draft_token_ids: Any) -> None:
        raise RuntimeError("schedir's vLLM scheduler got draft tokens, but speculative decoding is refused "
                           "at start-up: this engine configuration should not have started")

    def update_draft_token_ids_in_output(self, draft_token_ids: Any, scheduler_output: Any) -> None:
        self.update_draft_token_ids(draft_token_ids)

    # ------------------------------------------------------------ FINISH
    def finish_requests(self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus) -> list[Request]:
        """Abort (or stop) requests wherever they are; their blocks are freed now."""
        if not RequestStatus.is_finished(finished_status):
            raise ValueError(f"finish_requests needs a finished status, got {finished_status}")
        if request_ids is None:
            request_ids = list(self._requests)
        elif isinstance(request_ids, str):
            request_ids = (request_ids,)
        found = [self._requests[n] for n in dict.fromkeys(request_ids) if n in self._requests]
        if not found:
            return []
        self.runtime.finish_requests([r.request_id for r in found])
        for req in found:
            req.status = finished_status
            self._retire(req)
        return found

    # ------------------------------------------------------------ counters and views
    def get_request_counts(self) -> tuple[int, int]:
        return int(self.runtime.running.size), int(self.runtime.waiting.size)

    def get_num_unfinished_requests(self) -> int:
        if self._pause_state == PauseState.PAUSED_ALL:
            return 0
        running, waiting = self.get_request_counts()
        return running + (0 if self._pause_state == PauseState.PAUSED_NEW else waiting)

    def has_finished_requests(self) -> bool:
        return bool(self.runtime._finished) or bool(self._refused) or bool(self._rejected)

    def get_kv_cache_usage(self) -> float:
        pool = self.runtime.pool
        return 1.0 - pool.num_free / pool.usable_blocks

    @property
    def pause_state(self) -> PauseState:
        return self._pause_state

    def set_pause_state(self, pause_state: PauseState) -> None:
        self._pause_state = pause_state

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        if reset_running_requests:
            for name in self.runtime.preempt_running():
                req = self._requests[name]
                req.num_preemptions += 1
                req.num_output_placeholders = 0
                self._reset_preempted.add(name)
                if self.log_stats:
                    req.record_event(EngineCoreEventType.PREEMPTED)
            self._prev_step[:] = -2  # the model runner flushes them: send their whole token history again
        ok = self.runtime.reset_prefix_cache()
        if reset_running_requests and not ok:
            raise RuntimeError("schedir: the prefix cache could not be reset after preempting every running request")
        if ok:
            self._prefix_stats.reset = True
        return ok

    def reset_encoder_cache(self) -> None:
        return None  # no encoder inputs (refused at start-up)

    def make_stats(self, *args: Any, **kwargs: Any) -> SchedulerStats | None:
        """Queue sizes, KV usage and prefix-cache hits for vLLM's logging and Prometheus metrics."""
        if not self.log_stats:
            return None
        running, waiting = self.get_request_counts()
        stats, self._prefix_stats = self._prefix_stats, PrefixCacheStats()
        return SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting,
                              kv_cache_usage=self.get_kv_cache_usage(), prefix_cache_stats=stats)

    def shutdown(self) -> None:
        return None

    @property
    def requests(self) -> dict[str, Request]:
        """Live requests as vLLM `Request` objects (status and computed tokens synchronised now)."""
        d = self.runtime.table.data
        row_of = self.runtime.table.row_of
        for name, req in self._requests.items():
            row = row_of.get(name)
            if row is None or req.is_finished():
                continue
            status = _STATUS.get(int(d[T.STATUS, row]))
            if status is not None:
                req.status = status
            req.num_computed_tokens = int(d[T.COMPUTED, row])
            req.num_preemptions = int(d[T.PREEMPTIONS, row])
            req.num_output_placeholders = int(d[T.PLACEHOLDERS, row])
            req.is_prefill_chunk = bool(self._chunk[row])
        return self._requests

    @property
    def running(self) -> list[Request]:
        requests = self.requests
        return [requests[n] for n in self.runtime.table.names[self.runtime.running].tolist()]

    @property
    def waiting(self) -> list[Request]:
        """Waiting and preempted requests in the order the pipeline would consider them."""
        rt = self.runtime
        requests = self.requests
        d = rt.table.data
        rows = rt.waiting
        if self.config.policy == "priority":
            order = np.lexsort((d[T.RANK, rows], d[T.ARRIVAL, rows], d[T.PRIORITY, rows]))
        else:
            order = np.argsort(d[T.QUEUED, rows], kind="stable")
        return [requests[n] for n in rt.table.names[rows[order]].tolist()]


def _unsupported(request: Request) -> str | None:
    """Why schedir cannot serve this request (a feature it does not schedule), or None."""
    if request.pooling_params is not None:
        return "pooling requests are not supported"
    sp = request.sampling_params
    if sp is None:
        return "a request without sampling parameters is not supported"
    if request.mm_features:
        return "encoder (multimodal) inputs are not supported"
    if request.prompt_embeds is not None or request.prompt_token_ids is None:
        return "prompt embeddings are not supported (send token ids)"
    if request.use_structured_output:
        return "structured output (guided decoding) is not supported"
    if getattr(sp, "repetition_detection", None) is not None:
        return "repetition detection is not supported"
    if request.resumable:
        return "streaming-input (resumable) sessions are not supported"
    if request.kv_transfer_params is not None:
        return "KV transfer parameters are not supported (no KV connector)"
    if request.lora_request is not None:
        return "LoRA adapters are not supported"
    return None


class AsyncScheduler(Scheduler):
    """vLLM's `AsyncScheduler` on schedir: step N+1 is scheduled before step N's tokens are back.

    Each step's sampling requests hold an output placeholder until their token returns, so a
    decode is scheduled in consecutive steps; a request whose steps in flight already reach
    max_tokens sits out; a running request's filled blocks are registered in the prefix cache
    when its token comes back. The runtime does all of it (`SchedulerConfig.async_scheduling`);
    this class only switches it on.
    """

    async_scheduling = True
