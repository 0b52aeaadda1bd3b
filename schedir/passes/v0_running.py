"""v0-running: vLLM v0's `_schedule_running` (chunked prefill off), preemption by recompute or swap."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numba as nb
import numpy as np

from schedir.dialects.mem import AllocOp, FreeOp, SwapOutOp
from schedir.dialects.req import ScheduleOp
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step, pool_of, root_queue
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import ANSWERED, ASK_IR, SC_FREE_BLOCKS
from schedir.passes import v0_kernels as K
from schedir.passes.v0_state import PREEMPTION_UNDER_PRIORITY

_MODES = ("auto", "swap", "recompute")
_NO_HOST = (np.zeros(1, dtype=np.int32), np.zeros(2, dtype=np.int64), np.zeros((1, 1), dtype=np.int32),
            np.zeros(1, dtype=np.int32), np.zeros((3, 1), dtype=np.int64))


_UNLIMITED = 1 << 62  # v0 does not cut decodes to a budget without chunked prefill


def run_kernel(pool, ids: np.ndarray, computed: np.ndarray, total: np.ndarray, prefill_end: np.ndarray,  # noqa: ANN001
               budget: int, slot: int, swap: bool) -> tuple[np.ndarray, int]:
    """`v0_kernels.v0_running` over the step's pool (and its host tier, when there is one)."""
    host = pool.host
    h = _NO_HOST if host is None else (host.hfree, host.hmeta, host.htable, host.hnblk, host.log)
    return K.v0_running(ids, computed, total, prefill_end, budget, slot, swap and host is not None,
                        pool.ref, pool.bhash, pool.dup_next, pool.nxt, pool.prv, pool.meta, pool.cache, pool.table,
                        pool.nblk, pool.ncached, pool.v0_access, pool.rhash, pool.nhash, *h)


def emit_preemptions(step: Step, pending, ids: np.ndarray, out: np.ndarray) -> None:  # noqa: ANN001
    """`req.preempt` with `mem.free` (recompute) or `mem.swap_out` (swap), in preemption order."""
    gone = np.flatnonzero(out[K.V0_SEQ] >= 0)
    gone = gone[np.argsort(out[K.V0_SEQ, gone])]
    swap = out[K.V0_MODE, gone] == K.MODE_SWAP
    for mode, effect, pick in (("recompute", FreeOp, ~swap), ("swap", SwapOutOp, swap)):
        if pick.any():
            victims = step.preempt(pending, mode, ids[gone[pick]])
            step.blocks(effect, victims, ids[gone[pick]], out[K.V0_MOVED, gone[pick]])


def scheduled_from(step: Step, queue: str) -> bool:
    """Whether an earlier pass of this step scheduled a request of `queue`."""
    for op in step.ops_of(ScheduleOp):
        if len(op) and root_queue(op.operands[0]).properties["queue"].data == queue:  # type: ignore[union-attr]
            return True
    return False


@nb.njit(cache=True, nogil=True)
def running_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, order, rows, w, m, over) -> int:  # noqa: ANN001
    """`V0Running.steady_state` in the steady program: as many free blocks as decodes."""
    return ANSWERED if sc[SC_FREE_BLOCKS] >= running.size else ASK_IR


@dataclass(frozen=True)
class V0Running(StepPass):
    """Decode every running request one token, preempting from the back when blocks run out.

    vLLM v0 (vllm/core/scheduler.py:700, 0.8.5) schedules decodes only in a step that
    scheduled no prefill (`_schedule_default`: a step is all-prefill or all-decode). Each
    decode needs one free block (`can_append_slots` assumes the worst case); while none is
    free, the last running request not yet scheduled is preempted, or the request itself
    when it is the last. `preemption`: `auto` is v0's choice for a single-sequence request,
    recompute (0.8.5's `_preempt`: swap only for groups of several sequences, which 0.8.5's
    engine never builds); `swap` moves the victim's blocks to the host tier (the runtime's
    `num_cpu_blocks`) and queues it in `swapped`; `recompute` frees them and puts it at the
    front of the waiting queue. Where v0 raises "Aborted due to the lack of CPU swap space",
    schedir preempts by recompute instead (the request is not lost; see docs/policies.md).
    """

    name: ClassVar[str] = "v0-running"
    requires: ClassVar[frozenset[str]] = frozenset({"kv-pool", "waiting-scheduled"})
    provides: ClassVar[frozenset[str]] = frozenset({"running-scheduled"})
    stops_past_max_model_len: ClassVar[bool] = True  # v0's StopChecker: len > max_model_len
    v0_prefix_cache: ClassVar[bool] = True  # (a decode's blocks: the pool registers them v0's way)
    policies: ClassVar[tuple[str, ...]] = ("fcfs", "priority")
    # v0's priority policy: its deque order and its priority preemption (the vllm-v0-priority preset)
    policy_requires: ClassVar[Mapping[str, frozenset[str]]] = PREEMPTION_UNDER_PRIORITY
    # steady decode steps: over the running queue, when no request can run short of a free block
    steady_when: ClassVar[dict[str, str]] = {"queue": "running"}

    preemption: str = "auto"
    queue: str = "running"
    steady_lowered = staticmethod(running_steady_lowered)
    prefix_cache_refusal: ClassVar[str] = ("v0's swap of prefix-cached blocks to its CPU prefix-caching allocator "
                                           "is not reproduced yet; vllm-v0, which preempts by recompute, caches")

    @property
    def no_prefix_cache(self) -> bool:  # type: ignore[override]
        """With preemption by swap: v0's swap of prefix-cached blocks is not reproduced."""
        return self.preemption == "swap"

    def steady_state(self, ctx: WindowContext) -> dict[str, float] | None:
        """Nothing written, when no decode can find the free blocks short: v0 asks one free block
        per decode (`can_append_slots`' worst case) before each, and the i-th finds at least
        free - i, so as many free blocks as running requests preempt nobody. Else None (a
        steady step's rule, the blocks its tokens need, would not see v0's preemption)."""
        return {} if ctx.free_blocks >= ctx.running.size else None

    def __post_init__(self) -> None:
        if self.preemption not in _MODES:
            raise ValueError(f"preemption must be one of {', '.join(_MODES)}, got '{self.preemption}'")

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """Nobody: it schedules the running queue (its victims go back to waiting through the runtime)."""
        return ctx.NONE if self.queue != "waiting" else None

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None or scheduled_from(step, "waiting"):
            return  # "Don't schedule decodes if prefills are scheduled."
        pool = pool_of(step)
        ids = step.ids(pending)
        computed, total = step.columns(pending, ("computed", "total"))
        out, preempted = run_kernel(pool, ids, computed, total, np.full(ids.size, -1, dtype=np.int64), _UNLIMITED,
                                    _UNLIMITED, self.preemption == "swap")
        take = out[K.V0_TOKENS] > 0
        if take.any():
            scheduled = step.schedule(pending, "decode", ids[take], out[K.V0_TOKENS][take])
            got = out[K.V0_ALLOC] > 0
            step.blocks(AllocOp, scheduled, ids[got], out[K.V0_ALLOC][got])
        if preempted:
            emit_preemptions(step, pending, ids, out)
