"""v0-chunked-running: vLLM v0's `_schedule_running` with chunked prefill on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba as nb
import numpy as np

from schedir.dialects.mem import AllocOp
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step, pool_of
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import ASK_IR, SC_FREE_BLOCKS, SC_TOKEN_BUDGET, WROTE
from schedir.passes import v0_kernels as K
from schedir.passes.ordering import sort_by_columns
from schedir.passes.v0_chunked import long_threshold, slot_budget
from schedir.passes.v0_running import _MODES, emit_preemptions, run_kernel
from schedir.passes.v0_state import BAND, NEXT_RUN_POS, PREFILL_END, RUN_BANDS, RUN_POS


@nb.njit(cache=True, nogil=True)
def chunked_running_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, order, rows, w, m,  # noqa: ANN001
                                   over) -> int:
    """`V0ChunkedRunning.steady_state` in the steady program: the step's bands taken in the
    running queue's next place (its slot of `SS`), the decodes' places into `rows[w]`."""
    if sc[SC_FREE_BLOCKS] < running.size or o[0] > sc[SC_TOKEN_BUDGET]:
        return ASK_IR
    if not K.steady_run_order(running, ST[int(o[1])], D[int(o[2])], ST[int(o[3])]):
        return ASK_IR
    slot = int(o[4])
    base = int(SS[slot])
    SS[slot] = float(base + RUN_BANDS * BAND)
    for i in range(running.size):
        rows[w, i] = base + 2 * BAND + i
    return WROTE


@dataclass(frozen=True)
class V0ChunkedRunning(StepPass):
    """Running requests first, in v0's running order: decodes one token, prefills a chunk.

    vLLM v0 with chunked prefill (`_schedule_chunked_prefill`, vllm/core/scheduler.py:1324,
    0.8.5) schedules the running queue before anything else (then swapped requests, then new
    prefills, passes v0-swapped and v0-chunked-prefills). A request still in its prefill asks
    for its remaining tokens, cut to the budget left and to one prefill slot's share
    (budget / the prefills that may run this step, with `partial` of them at most); a decode
    asks for one; the first request that gets nothing ends the loop. Preemption as in
    v0-running (victims from the back, by `preemption`). The running queue's order is v0's
    (`v0_run_pos`): requests not reached keep their places, then come those swapped in, the
    decodes, the prefills this step finishes, the other prefills and the new ones.
    """

    name: ClassVar[str] = "v0-chunked-running"
    requires: ClassVar[frozenset[str]] = frozenset({"kv-pool"})
    provides: ClassVar[frozenset[str]] = frozenset({"running-scheduled"})
    request_state: ClassVar[tuple] = (PREFILL_END, RUN_POS)
    scheduler_state: ClassVar[tuple] = (NEXT_RUN_POS,)
    stops_past_max_model_len: ClassVar[bool] = True  # v0's StopChecker: len > max_model_len
    no_prefix_cache: ClassVar[bool] = True
    prefix_cache_refusal: ClassVar[str] = ("v0's prefix caching with chunked prefill is not reproduced "
                                           "yet; vllm-v0, chunking off, caches")
    policies: ClassVar[tuple[str, ...]] = ("fcfs",)  # v0's _schedule_priority_preemption is not reproduced yet

    preemption: str = "auto"
    partial: int = 1
    long_threshold: int = 0
    max_long: int = 1
    queue: str = "running"
    # steady decode steps: over the running queue in v0's order, when no decode can find the free
    # blocks short; it writes the step's places (`steady_state`)
    steady_when: ClassVar[dict[str, str]] = {"queue": "running"}
    steady_lowered = staticmethod(chunked_running_steady_lowered)
    steady_lowered_writes = (RUN_POS.name,)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (self.partial, layout.state(RUN_POS.name), layout.column("computed"), layout.state(PREFILL_END.name),
                layout.scalar(NEXT_RUN_POS.name))

    def steady_state(self, ctx: WindowContext) -> dict[str, float | np.ndarray] | None:
        """What a steady step writes: the step's bands of places taken (`v0_next_run_pos`) and the
        decodes' places in the decode band, in running order; when the running queue is in v0's
        order already (`v0_run_pos`), each decode gets its token (a prefill slot's share is at
        least budget // partial), none is in its prefill (`v0_prefill_end`), and the free blocks
        cover v0's worst case (one per decode, v0-running's rule). Else None: the IR decides."""
        running = ctx.running
        if ctx.free_blocks < running.size or self.partial > ctx.token_budget:
            return None
        # in v0's order, and none in its prefill: a recomputed request's last prompt token is a
        # prefill chunk to v0 (another band), not a decode
        if not K.steady_run_order(running, ctx.state_of(RUN_POS.name), ctx.column_of("computed"),
                                  ctx.state_of(PREFILL_END.name)):
            return None
        base = int(ctx.scheduler_state.get(NEXT_RUN_POS.name, 0.0))
        return {NEXT_RUN_POS.name: float(base + RUN_BANDS * BAND),
                RUN_POS.name: base + 2 * BAND + np.arange(running.size, dtype=np.int64)}

    def __post_init__(self) -> None:
        if self.preemption not in _MODES:
            raise ValueError(f"preemption must be one of {', '.join(_MODES)}, got '{self.preemption}'")
        if self.partial < 1 or self.max_long < 1 or self.long_threshold < 0:
            raise ValueError("partial and max-long must be >= 1, long-threshold >= 0")

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """Nobody: it schedules the running queue (its victims go back to waiting through the runtime)."""
        return ctx.NONE if self.queue != "waiting" else None

    def run(self, step: Step) -> None:
        base = int(step.state(NEXT_RUN_POS.name, 0.0))
        step.set_state(**{NEXT_RUN_POS.name: float(base + RUN_BANDS * BAND)})  # this step's bands, taken
        pending = step.pending(self.queue)
        if pending is None:
            return
        pool = pool_of(step)
        facts = step.facts
        threshold = long_threshold(self.partial, self.long_threshold, facts.max_model_len)
        slot, _ = slot_budget(step, self.partial, threshold, self.max_long)
        pending = sort_by_columns(step, pending, (RUN_POS.name,)) or pending
        ids = step.ids(pending)
        computed, total = step.columns(pending, ("computed", "total"))
        prefill_end = step.state_column(pending, PREFILL_END.name, PREFILL_END.default)
        out, preempted = run_kernel(pool, ids, computed, total, prefill_end, facts.token_budget, slot,
                                    self.preemption == "swap")
        take = out[K.V0_TOKENS] > 0
        if take.any():
            tokens = out[K.V0_TOKENS][take]
            prefill = out[K.V0_PHASE][take] == 1
            finishing = prefill & (computed[take] + tokens >= total[take])
            band = np.where(prefill, np.where(finishing, 3, 4), 2)
            order = np.lexsort((np.arange(band.size), band))
            places = np.empty(band.size, dtype=np.int64)
            places[order] = base + band[order] * BAND + np.arange(band.size)
            step.set_request_state(pending, ids[take], **{RUN_POS.name: places})
            scheduled = step.schedule(pending, "mixed" if prefill.any() else "decode", ids[take], tokens)
            got = out[K.V0_ALLOC] > 0
            step.blocks(AllocOp, scheduled, ids[got], out[K.V0_ALLOC][got])
        if preempted:
            emit_preemptions(step, pending, ids, out)
        rest = out[K.V0_REASON] > 0
        if rest.any():
            step.defer(pending, ids[rest], out[K.V0_REASON][rest])
