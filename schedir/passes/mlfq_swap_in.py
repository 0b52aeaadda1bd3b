"""mlfq-swap-in: FastServe's swap-in — swapped jobs come back in their MLFQ turn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np

from schedir.dialects.codes import Reason
from schedir.dialects.mem import AllocOp, SwapInOp
from schedir.ir.array_step import ArrayStep
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import ANSWERED, ASK_IR, SC_MAX_SEQS
from schedir.passes.admit_greedy import running_not_scheduled
from schedir.passes.mlfq_state import LEVEL, MLFQ_STATE

# rows of `mlfq_resume`'s result
RESUME_TOKENS, RESUME_ALLOC, RESUME_REASON = 0, 1, 2
_MAX_SEQS, _BUDGET, _MEMORY, _BLOCKED = int(Reason.MAX_SEQS), int(Reason.BUDGET), int(Reason.MEMORY), int(Reason.BLOCKED)


@numba.njit(cache=True, nogil=True)
def mlfq_resume(is_swapped: np.ndarray, computed: np.ndarray, total: np.ndarray, blocks: np.ndarray, seats: int,
                tokens: int, free_blocks: int, block_size: int) -> np.ndarray:
    """Tokens, extra device blocks (beyond the host blocks copied back) and, for a job that
    stays, the reason, walking the swapped and waiting jobs in one (level, arrival) order, as
    int64[3, n] (0 tokens: stays; reasons are `Reason` codes, set for swapped jobs).

    A waiting job ahead of a swapped one keeps its seat, its blocks (a whole prompt's, without
    prefix hits: what admission may need at most) and its tokens for admission, when they fit;
    one that does not fit keeps nothing (admission is greedy). A swapped job resumes with its
    remaining tokens (one for a decode; the rest of its prompt, cut to the budget, if it was
    swapped mid-prefill) when a seat, the tokens and its blocks fit; the first that does not
    stops the walk (the jobs behind it wait, BLOCKED), so swapped jobs come back in order."""
    n = is_swapped.size
    out = np.zeros((3, n), dtype=np.int64)
    stopped = 0  # why the walk stopped (a reason), 0 while it goes on
    for i in range(n):
        if stopped == 0:
            if seats <= 0:
                stopped = _MAX_SEQS
            elif tokens <= 0:
                stopped = _BUDGET
        if stopped:
            out[RESUME_REASON, i] = stopped if stopped != _MEMORY else _BLOCKED
            continue
        want = max(total[i] - computed[i], 1)
        take = min(want, tokens)
        if is_swapped[i]:
            extra = max(-(-(computed[i] + take) // block_size) - blocks[i], 0)
            if blocks[i] + extra > free_blocks:
                out[RESUME_REASON, i] = _MEMORY
                stopped = _MEMORY
                continue
            out[RESUME_TOKENS, i] = take
            out[RESUME_ALLOC, i] = extra
            free_blocks -= blocks[i] + extra
        else:
            need = -(-total[i] // block_size)
            if need > free_blocks:
                continue
            free_blocks -= need
        seats -= 1
        tokens -= take
    return out


@numba.njit(cache=True, nogil=True)
def swap_in_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, order, rows, w, m, over) -> int:  # noqa: ANN001
    """`MlfqSwapIn.steady_state` in the steady program."""
    return ANSWERED if swapped.size == 0 or running.size >= sc[SC_MAX_SEQS] else ASK_IR


@dataclass(frozen=True)
class MlfqSwapIn(StepPass):
    """Bring swapped jobs back in their MLFQ turn, ahead of the waiting jobs they outrank.

    FastServe's KV cache manager (§4.3) swaps a job's KV back before the job runs again; here a
    swapped job (preempted by `mlfq-order{preemption=swap}`) resumes when, walking swapped and
    waiting jobs together in (level, arrival) order, a seat, the token budget and the device
    blocks for its KV are left after the jobs ranked ahead of it. Its blocks are copied back
    (`mem.swap_in`, listed in the output's `blocks_to_swap_in`) and it continues where it
    stopped: it runs again from the running queue next step. Runs after the running jobs are
    scheduled and before admission (`admit-greedy` admits the waiting jobs with what is left).
    """

    name: ClassVar[str] = "mlfq-swap-in"
    queue_options: ClassVar[tuple[str, ...]] = ("queue", "running", "swapped")
    requires: ClassVar[frozenset[str]] = frozenset({"mlfq-levels", "order", "running-scheduled", "swapped-queue"})
    provides: ClassVar[frozenset[str]] = frozenset({"swapped-scheduled"})
    request_state = MLFQ_STATE

    queue: str = "waiting"
    running: str = "running"
    swapped: str = "swapped"

    # steady decode steps: nothing is swapped out then, so it brings nobody back
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting", "running": "running", "swapped": "swapped"}
    steady_swapped: ClassVar[bool] = True  # its answer judges the swapped jobs

    steady_lowered = staticmethod(swap_in_steady_lowered)
    walks_ranked: ClassVar[bool] = True  # swapped and waiting jobs in rank order, while seats and tokens last

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """Nobody while nobody is swapped out (it acts on swapped jobs only); else the whole
        queue (its walk reserves for the waiting jobs ranked ahead: a ranked window)."""
        return ctx.NONE if self.queue == "waiting" and not ctx.swapped.size else None

    def steady_state(self, ctx: WindowContext) -> dict[str, float] | None:
        """Nothing written, when it brings nobody back: nobody is swapped out, or every seat is
        taken by the running jobs (all scheduled in a steady step: the walk stops at once).
        Else None: the IR decides."""
        return {} if not ctx.swapped.size or ctx.running.size >= ctx.max_seqs else None

    array_step_when: ClassVar[dict[str, str]] = {}  # `run_arrays`: any options

    def run_arrays(self, step: ArrayStep) -> None:
        """`run` over an array step (`schedir.ir.array_step`), rule for rule."""
        swapped = step.pending(self.swapped)
        if swapped is None:
            return
        facts = step.facts
        seats = facts.max_seqs - step.seqs - step.running_not_scheduled(self.running)
        level_of, arrival_of = step.state(LEVEL.name), step.column("arrival")
        if seats <= 0:  # mlfq_resume's first check stops the walk at once: every swapped job stays
            rows = swapped.pending
            order = np.lexsort((arrival_of[rows], level_of[rows]))
            step.defer(swapped, rows[order], np.full(rows.size, _MAX_SEQS, dtype=np.int64))
            step.decided(swapped)
            return
        waiting = step.pending(self.queue)
        n_swapped = swapped.pending.size
        rows = swapped.pending if waiting is None else np.concatenate([swapped.pending, waiting.pending])
        order = np.lexsort((arrival_of[rows], level_of[rows]))
        walked = rows[order]
        computed, total = step.column("computed")[walked], step.column("total")[walked]
        blocks = step.column("blocks")[walked]
        is_swapped = order < n_swapped
        out = mlfq_resume(is_swapped, computed, total, blocks, seats, facts.token_budget - step.tokens,
                          step.free_left(), facts.block_size)
        back = np.flatnonzero(is_swapped & (out[RESUME_TOKENS] > 0))
        if back.size:
            resumed = walked[back]
            step.schedule(swapped, resumed, out[RESUME_TOKENS, back])
            step.alloc(resumed, blocks[back])  # the host blocks copied back (`mem.swap_in`)
            extra = out[RESUME_ALLOC, back]
            step.alloc(resumed[extra > 0], extra[extra > 0])
        stay = is_swapped & (out[RESUME_TOKENS] == 0)
        step.defer(swapped, walked[stay], out[RESUME_REASON, stay])
        step.decided(swapped)

    def run(self, step: Step) -> None:
        swapped = step.pending(self.swapped)
        if swapped is None:
            return
        facts = step.facts
        used = step.usage()
        seats = facts.max_seqs - used.seqs - running_not_scheduled(step, used, self.running)
        if seats <= 0:  # mlfq_resume's first check stops the walk at once: every swapped job stays
            ids = step.ids(swapped)
            order = np.lexsort((step.column(swapped, "arrival"), step.state_column(swapped, LEVEL.name, LEVEL.default)))
            step.defer(swapped, ids[order], np.full(ids.size, _MAX_SEQS, dtype=np.int64))
            return
        waiting = step.pending(self.queue)
        parts = [swapped] if waiting is None else [swapped, waiting]
        level = np.concatenate([step.state_column(v, LEVEL.name, LEVEL.default) for v in parts])
        arrival = np.concatenate([step.column(v, "arrival") for v in parts])
        order = np.lexsort((arrival, level))
        computed, total, blocks = (np.concatenate([step.column(v, c) for v in parts])[order]
                                   for c in ("computed", "total", "blocks"))
        ids = step.ids(swapped)
        is_swapped = order < ids.size
        out = mlfq_resume(is_swapped, computed, total, blocks, seats, facts.token_budget - used.tokens,
                          used.free_left(facts), facts.block_size)
        back = np.flatnonzero(is_swapped & (out[RESUME_TOKENS] > 0))
        if back.size:
            at = order[back]  # positions in the swapped set, in resume order
            resumed = ids[at]
            tokens = out[RESUME_TOKENS, back]
            prefill = computed[back] + tokens <= step.column(swapped, "prompt")[at]
            scheduled = step.schedule(swapped, "prefill" if prefill.all() else "decode" if not prefill.any()
                                      else "mixed", resumed, tokens)
            step.blocks(SwapInOp, scheduled, resumed, blocks[back])
            extra = out[RESUME_ALLOC, back]
            step.blocks(AllocOp, scheduled, resumed[extra > 0], extra[extra > 0])
        stay = is_swapped & (out[RESUME_TOKENS] == 0)
        step.defer(swapped, ids[order[stay]], out[RESUME_REASON, stay])
