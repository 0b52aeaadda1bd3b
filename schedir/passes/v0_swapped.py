"""v0-swapped: vLLM v0's `_schedule_swapped`, swapped requests back before new ones."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.codes import Reason
from schedir.dialects.mem import AllocOp, SwapInOp
from schedir.dialects.req import PreemptOp
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step, pool_of
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import WINDOW_NOBODY, window_steady_lowered
from schedir.passes import v0_kernels as K
from schedir.passes.v0_running import scheduled_from
from schedir.passes.v0_state import (
    BAND,
    NEXT_RUN_POS,
    PREEMPTION_UNDER_PRIORITY,
    PREFILL_END,
    RUN_BANDS,
    RUN_POS,
)


@dataclass(frozen=True)
class V0Swapped(StepPass):
    """Swap requests back in, in swap-out order, in a decode step that preempted nobody.

    vLLM v0 (vllm/core/scheduler.py:821, 0.8.5; `_schedule_default` calls it only when
    `_schedule_running` preempted nobody, since a preemption means there is no room): a
    request whose full blocks plus one exceed the whole pool can never come back and is
    ignored (`req.reject` exceeds-cache); one that does not fit above the watermark stops
    the loop, as do the token budget and max_seqs. Its blocks are copied back from the host
    tier (`mem.swap_in`, listed in the output's `blocks_to_swap_in`) and it decodes one
    token; it joins the back of the running queue. Needs the runtime's `num_cpu_blocks`.
    With chunked prefill, a request swapped out mid-prefill comes back with all its remaining
    tokens (v0 does not chunk here), and the requests swapped in take the first places of v0's
    rebuilt running queue (`v0_run_pos`, decodes before prefills).
    """

    name: ClassVar[str] = "v0-swapped"
    queue_options: ClassVar[tuple[str, ...]] = ("queue", "running")
    requires: ClassVar[frozenset[str]] = frozenset({"kv-pool", "swapped-queue", "running-scheduled"})
    provides: ClassVar[frozenset[str]] = frozenset({"swapped-scheduled"})
    # reads and writes v0-chunked-running's state when it runs (chunked prefill); declares none, so
    # the default path's steps carry no request state (it made their queues ~60 µs slower to build)
    stops_past_max_model_len: ClassVar[bool] = True  # v0's StopChecker: len > max_model_len
    v0_prefix_cache: ClassVar[bool] = True  # (nothing is swapped out with prefix caching on: v0-running refuses swap)
    policies: ClassVar[tuple[str, ...]] = ("fcfs", "priority")
    # v0's priority policy: its deque order and its priority preemption (the vllm-v0-priority preset)
    policy_requires: ClassVar[Mapping[str, frozenset[str]]] = PREEMPTION_UNDER_PRIORITY
    # steady decode steps: over the swapped queue, empty in a steady step
    steady_when: ClassVar[dict[str, str]] = {"queue": "swapped", "running": "running"}

    queue: str = "swapped"
    running: str = "running"
    # its default steady answer lowered: its window is nobody
    steady_lowered = staticmethod(window_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (WINDOW_NOBODY,)

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """Nobody: it brings back the swapped queue."""
        return ctx.NONE if self.queue != "waiting" else None

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None or scheduled_from(step, "waiting") or step.ops_of(PreemptOp):
            return
        pool = pool_of(step)
        host = pool.host
        if host is None:
            raise ValueError("v0-swapped: the step's pool has no host tier, but requests are swapped out")
        facts = step.facts
        usage = step.usage()  # what the running pass scheduled: its tokens and requests
        ids = step.ids(pending)
        computed, total = step.columns(pending, ("computed", "total"))
        prefill_end = step.state_column(pending, PREFILL_END.name, PREFILL_END.default)
        out, count = K.v0_swapped(ids, computed, total, prefill_end, facts.token_budget - usage.tokens, usage.seqs,
                                  facts.max_seqs, pool.usable_blocks, pool.ref, pool.bhash, pool.dup_next, pool.nxt,
                                  pool.prv, pool.meta, pool.cache, pool.table, pool.nblk,
                                  host.hfree, host.hmeta, host.htable, host.hnblk, host.log)
        reasons = out[K.V0_REASON]
        never = reasons == int(Reason.EXCEEDS_CACHE)
        if never.any():
            step.reject(pending, ids[never], reasons[never])
        if count:
            take = out[K.V0_TOKENS] > 0
            phase = out[K.V0_PHASE][take]
            next_pos = int(step.state(NEXT_RUN_POS.name, 0.0))
            if next_pos:  # chunked prefill: v0-chunked-running took this step's bands of places
                places = next_pos - RUN_BANDS * BAND + phase * BAND + np.arange(int(take.sum()), dtype=np.int64)
                step.set_request_state(pending, ids[take], **{RUN_POS.name: places})
            scheduled = step.schedule(pending, "decode" if not phase.any() else "mixed", ids[take],
                                      out[K.V0_TOKENS][take])
            step.blocks(SwapInOp, scheduled, ids[take], out[K.V0_MOVED][take])
            got = out[K.V0_ALLOC] > 0
            step.blocks(AllocOp, scheduled, ids[got], out[K.V0_ALLOC][got])
        rest = (reasons > 0) & ~never
        if rest.any():
            step.defer(pending, ids[rest], reasons[rest])
