"""The state SGLang's scheduler keeps between steps, shared by the `sglang-*` passes.

SGLang's `Scheduler` carries, from one `get_next_batch_to_run` to the next
(`sglang/srt/managers/scheduler.py`, 0.5.23):

- `waiting_queue` as a list whose order persists: the policy sorts it in place (a stable
  sort), new and retracted requests are appended. schedir keeps each waiting request's place
  in that list as request state (`sglang_pos`); a request not yet placed (-1) is appended in
  arrival order.
- `new_token_ratio` (`NewTokenRatioTracker`): the share of their remaining `max_new_tokens`
  that admission reserves for running requests; it decays after every decode step, jumps after
  a retraction and resets when the scheduler is idle.
- `chunked_req`: the one request whose prefill is split over steps; it is not part of the
  running batch until its last chunk.
- `running_batch.batch_is_full`: set when admission ran out of tokens or request slots, so
  later steps skip admission until the running batch shrinks.
- `running_batch.reqs` in order: a prefill batch is appended when it joins; a retraction
  reorders it (`filter_batch` keeps the retraction order). Kept as request state (`sglang_join`).

All of it is declared here (`schedir.ir.state`), so every step's IR shows it and a dumped step
replays alone.
"""

from __future__ import annotations

from schedir.ir.state import RequestState, SchedulerState

POS = RequestState("sglang_pos", default=-1, doc="place in SGLang's waiting list (-1: not placed yet)")
JOIN = RequestState("sglang_join", default=-1,
                    doc="place in SGLang's running batch (requests join it when their prefill completes)")
NEXT_JOIN = SchedulerState("sglang_next_join", default=0.0, doc="the next free place in the running batch")
NEXT_POS = SchedulerState("sglang_next_pos", default=0.0, doc="the next free place in the waiting list")
RATIO = SchedulerState("new_token_ratio", default=-1.0,
                       doc="SGLang's new_token_ratio (-1: the initial value, before the first step)")
CHUNKED = SchedulerState("sglang_chunked", default=-1.0, doc="id of the request whose prefill is chunked, -1: none")
BATCH_FULL = SchedulerState("sglang_batch_full", default=0.0, doc="running_batch.batch_is_full (1: skip admission)")
BATCH_SIZE = SchedulerState("sglang_batch_size", default=0.0,
                            doc="requests in the running batch after the last step (a smaller one clears batch_full)")

SCHEDULER_STATE = (NEXT_POS, NEXT_JOIN, RATIO, CHUNKED, BATCH_FULL, BATCH_SIZE)
