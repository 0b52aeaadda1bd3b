"""sglang-decode: SGLang's decode step with retraction, and the new_token_ratio tracker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np

from schedir.dialects.codes import Reason
from schedir.ir.pass_base import StepPass
from schedir.ir.state import Decay
from schedir.ir.step import Step, pool_of
from schedir.ir.window import WindowContext
from schedir.passes.sglang_state import (
    BATCH_FULL, BATCH_SIZE, CHUNKED, JOIN, NEXT_JOIN, NEXT_POS, POS, RATIO, SCHEDULER_STATE,
)


@numba.njit(cache=True)
def join_order(join: np.ndarray, running: np.ndarray) -> np.ndarray:
    """Positions of `running` sorted by their `join` place (stable), or an empty array when the
    queue is in that order already (the usual case: no retraction since they joined)."""
    n = running.size
    for i in range(1, n):
        if join[running[i]] < join[running[i - 1]]:
            keys = np.empty(n, dtype=np.int64)
            for k in range(n):
                keys[k] = join[running[k]]
            return np.argsort(keys, kind="mergesort")
    return np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class SglangDecode(StepPass):
    """When no prefill batch was admitted, decode the whole running batch, retracting requests
    first if their next tokens do not fit (`scheduler.py:Scheduler.update_running_batch`).

    - `ScheduleBatch.check_decode_mem`: evict unlocked cache for the decode's new pages, then
      check they are free.
    - `ScheduleBatch.retract_decode`: requests sorted by (output tokens, -prompt tokens), the
      fewest outputs (then the longest prompt) retracted first, one at a time until the rest
      fit, keeping at least one; each frees its KV without inserting it into the tree and evicts
      `retract-steps` tokens per request left. Retracted requests go to the back of the waiting
      list (their outputs are kept: they prefill prompt and outputs again). If the last request
      cannot decode either, it is aborted (rejected, reason `memory`).
    - `new_token_ratio` (`NewTokenRatioTracker`): after a retraction it becomes
      `min(1, (decoded + retract-steps * n) / (sum max_new_tokens + 1))` over the requests that
      stay; after a plain decode it decays by `(init - init * min-factor) / decay-steps`, down to
      `init * min-factor`; an idle scheduler (nothing running, waiting or chunked, and no batch
      last step) resets it to `init-ratio` (`Scheduler.on_idle`).
    """

    name: ClassVar[str] = "sglang-decode"
    requires: ClassVar[frozenset[str]] = frozenset({"radix-pool", "waiting-scheduled"})
    provides: ClassVar[frozenset[str]] = frozenset({"running-scheduled"})
    request_state = (POS, JOIN)
    scheduler_state = SCHEDULER_STATE

    init_ratio: float = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO * schedule_conservativeness
    min_factor: float = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
    decay_steps: int = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
    retract_steps: int = 20  # SGLANG_RETRACT_DECODE_STEPS
    queue: str = "running"
    waiting: str = "waiting"

    steady_when: ClassVar[dict[str, str]] = {"queue": "running", "waiting": "waiting"}
    steady_reads: ClassVar[frozenset[str]] = frozenset({CHUNKED.name, BATCH_FULL.name, BATCH_SIZE.name})

    def steady_state(self, ctx: WindowContext) -> dict[str, float | Decay] | None:
        """A plain decode of the whole running batch (no chunked request in it) writes the decayed
        ratio (as a `Decay`: the step's transition, whatever the ratio is) and the batch's size, as
        `run` does when its pages are free (the runtime's radix steady step checks that; a
        retraction or an eviction takes the IR)."""
        st = ctx.scheduler_state
        n = ctx.running.size
        chunked = int(st.get(CHUNKED.name, CHUNKED.default))
        if n == 0 or (chunked >= 0 and bool((ctx.running == chunked).any())):
            return None
        full = st.get(BATCH_FULL.name, 0.0) > 0 and not n < st.get(BATCH_SIZE.name, 0.0)
        return {RATIO.name: self._decay(), BATCH_SIZE.name: float(n), BATCH_FULL.name: float(full)}

    def steady_order(self, ctx: WindowContext) -> np.ndarray | None:
        """The running batch's join order (`running_batch.reqs`); None when the running queue is in it."""
        if ctx.state_of is None:
            return np.argsort(ctx.request_state(JOIN.name, ctx.running), kind="stable")
        order = join_order(ctx.state_of(JOIN.name), ctx.running)
        return order if order.size else None

    def _decay(self) -> Decay:
        """`NewTokenRatioTracker` after a plain decode step: down by a step of the decay, to the floor
        (`init-ratio x min-factor`); an unset ratio starts at `init-ratio`."""
        floor = self.init_ratio * self.min_factor
        return Decay((self.init_ratio - floor) / self.decay_steps, floor, self.init_ratio)

    def _decayed(self, ratio: float) -> float:
        return self._decay().apply(ratio)

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """Nobody while a running batch decodes (retracted requests are placed by state, not by
        reading the list); only an empty batch asks whether anybody waits (the idle reset)."""
        if (self.queue, self.waiting) != ("running", "waiting"):
            return None
        chunked = int(ctx.scheduler_state.get(CHUNKED.name, CHUNKED.default))
        batch = ctx.running.size - (1 if chunked >= 0 and chunked in ctx.running else 0)
        return ctx.NONE if batch else None

    def run(self, step: Step) -> None:
        pool = pool_of(step)
        st = step.states()
        ratio = float(st.get(RATIO.name, RATIO.default))
        if ratio < 0:
            ratio = self.init_ratio
        if step.usage().seqs:  # prefill first: this step runs the prefill batch only
            return
        running = step.pending(self.queue)
        ids = step.ids(running) if running is not None else np.zeros(0, dtype=np.int64)
        chunked = int(st.get(CHUNKED.name, CHUNKED.default))
        join = step.state_column(running, JOIN.name, JOIN.default) if running is not None else ids
        order = np.argsort(join, kind="stable")  # running_batch.reqs order
        ids, join = ids[order], join[order]
        batch = ids[ids != chunked] if chunked >= 0 else ids
        if batch.size == 0:
            waiting = step.pending(self.waiting)
            # Scheduler.is_fully_idle: nothing running, chunked or waiting (the last batch, filtered
            # of its finished requests at this step's start, is then empty too)
            idle = ids.size == 0 and (waiting is None or len(step.ids(waiting)) == 0)
            pool.idle()
            step.set_state(**{RATIO.name: self.init_ratio if idle else ratio,
                              BATCH_SIZE.name: 0.0, BATCH_FULL.name: 0.0})
            return
        full = st.get(BATCH_FULL.name, 0.0) > 0
        if batch.size < st.get(BATCH_SIZE.name, 0.0):
            full = False
        writes: dict[str, float] = {}
        fast = pool.decode_if_free(batch)  # the usual step: pages free for every row, decoded already
        if not fast and not pool.decode_fits(batch):
            in_batch = ids != chunked
            total, prompt, max_new = (c[order][in_batch]
                                      for c in step.columns(running, ("total", "prompt", "max_tokens")))
            outputs = total - prompt
            # ScheduleBatch._get_decode_retraction_order: keep most-output, shortest-prompt first
            keep = sorted(range(batch.size), key=lambda i: (int(outputs[i]), -int(prompt[i])), reverse=True)
            retracted: list[int] = []
            first = True
            while first or not pool.decode_fits(batch[keep]):
                if len(keep) == 1:
                    break
                first = False
                i = keep.pop()
                row = int(batch[i])
                pool.release(row, insert=False)
                pool.evict_for(len(keep) * self.retract_steps)  # release_req: evict_to_free_tokens
                retracted.append(row)
            aborted = np.zeros(0, dtype=np.int64)
            if len(keep) <= 1 and not pool.decode_fits(batch[keep]):
                last = keep.pop()
                pool.release(int(batch[last]), insert=False)
                aborted = batch[[last]]
            kept = np.asarray(keep, dtype=np.int64)  # filter_batch(keep_indices=...) keeps this order
            decoded = int(outputs[kept].sum()) if kept.size else 0
            ratio = min(1.0, (decoded + self.retract_steps * kept.size) / (int(max_new[kept].sum()) + 1))
            gone = np.asarray(retracted, dtype=np.int64)
            if gone.size:
                step.preempt(running, "recompute", gone)
                base = int(st.get(NEXT_POS.name, NEXT_POS.default))  # appended to the waiting list
                writes[NEXT_POS.name] = float(base + gone.size)
                step.set_request_state(running, gone, **{POS.name: np.arange(base, base + gone.size)})
            if aborted.size:
                step.reject(running, aborted, np.full(aborted.size, int(Reason.MEMORY), dtype=np.int64))
            batch = batch[kept]
            full = False
            if batch.size:
                base = int(st.get(NEXT_JOIN.name, NEXT_JOIN.default))
                writes[NEXT_JOIN.name] = float(base + batch.size)
                step.set_request_state(running, batch, **{JOIN.name: np.arange(base, base + batch.size)})
        else:
            ratio = self._decayed(ratio)
        if batch.size:
            if not fast:
                pool.decode(batch)
            step.schedule(running, "decode", batch, np.ones(batch.size, dtype=np.int64))
        else:
            pool.idle()
        writes.update({RATIO.name: ratio, BATCH_SIZE.name: float(batch.size),
                       BATCH_FULL.name: float(full)})
        changed = {k: v for k, v in writes.items() if st.get(k) != v}
        if changed:
            step.set_state(**changed)
