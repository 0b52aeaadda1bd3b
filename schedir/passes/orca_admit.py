"""orca-admit: Orca's admission — whole prompts, the whole KV reserved up front, never a preemption.

Orca (Yu et al., OSDI '22, §4.2 and Algorithm 1) schedules at iteration level and admits
requests in arrival order while the batch has room, reserving for each admitted request the
KV slots of its longest possible sequence (`n_rsrv += req.max_tokens`, stop when it would
exceed `n_slots`). Because every running request owns its future KV, decodes never run out of
memory and nothing is ever preempted. Prompts are not chunked: selective batching runs each
prompt whole in one iteration, up to the iteration's token cap (the step's token budget).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np

from schedir.dialects.codes import Reason
from schedir.dialects.mem import AllocOp, ShareOp
from schedir.ir.array_step import ArrayStep
from schedir.ir.errors import PassFailure
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import WINDOW_SEATS, window_steady_lowered

_BUDGET = int(Reason.BUDGET)
_MAX_SEQS = int(Reason.MAX_SEQS)
_MEMORY = int(Reason.MEMORY)
_BLOCKED = int(Reason.BLOCKED)


@numba.njit(cache=True, nogil=True)
def reserved_blocks(prompt: np.ndarray, max_tokens: np.ndarray, max_model_len: int, block_size: int) -> np.ndarray:
    """Blocks of each request's longest sequence: prompt + max_tokens, cut at max_model_len."""
    out = np.empty(prompt.size, dtype=np.int64)
    for i in range(prompt.size):
        out[i] = -(-min(prompt[i] + max_tokens[i], max_model_len) // block_size)
    return out


@numba.njit(cache=True, nogil=True)
def orca_fit(computed: np.ndarray, total: np.ndarray, hit: np.ndarray, cached_free: np.ndarray, reserve: np.ndarray,
             held: np.ndarray, headroom: int, budget: int, seats: int, block_size: int):
    """Algorithm 1's admission loop in arrival order: a request fits when its whole prompt fits the
    token cap left, a batch slot is free and its reservation fits the unreserved blocks; the
    first that does not fit stops admission (the ones behind it are blocked). A prefix-cache
    hit (`hit` tokens, full blocks, `cached_free` of them in the free queue) counts as computed:
    its blocks are shared, and only those sitting free come out of the free pool. Returns
    (tokens, shared blocks, blocks allocated now, reasons, admitted count)."""
    n = computed.size
    tokens = np.zeros(n, dtype=np.int64)
    shared = np.zeros(n, dtype=np.int64)
    alloc = np.zeros(n, dtype=np.int64)
    reasons = np.zeros(n, dtype=np.int64)
    admitted = 0
    stop = 0
    for i in range(n):
        done = computed[i]
        share = 0
        if done == 0 and hit.size and hit[i] > 0:
            done = hit[i]
            share = hit[i] // block_size
        want = total[i] - done
        # blocks this request takes from the free pool over its life: all but the shared ones
        # that other requests hold
        need = reserve[i] - held[i] - (share - (cached_free[i] if cached_free.size else 0))
        if seats <= 0:
            stop = _MAX_SEQS
        elif want > budget:
            stop = _BUDGET
        elif need > headroom:
            stop = _MEMORY
        if stop:
            reasons[i] = stop
            for j in range(i + 1, n):
                reasons[j] = _BLOCKED
            break
        tokens[i] = want
        shared[i] = share
        alloc[i] = max(-(-total[i] // block_size) - held[i] - share, 0)
        headroom -= need
        budget -= want
        seats -= 1
        admitted += 1
    return tokens, shared, alloc, reasons, admitted


@dataclass(frozen=True)
class OrcaAdmit(StepPass):
    """Admit waiting requests in order with their whole prompt and their whole KV reserved.

    Unreserved blocks are the free blocks minus what every running request may still need to
    reach its longest sequence (prompt + max_tokens, cut at max_model_len). A waiting request
    is admitted when its prompt fits the token budget left (no chunking), a sequence slot is
    free and its own reservation fits the unreserved blocks; the first one that does not fit
    stops admission. A step whose budget is below max_model_len is refused: a prompt that long
    could never run unchunked (vLLM's rule with chunked prefill off).
    """

    name: ClassVar[str] = "orca-admit"
    # steady decode steps: over the waiting queue: a steady step's is empty
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting", "running": "running"}
    runs_prompts_whole: ClassVar[bool] = True  # needs token_budget >= max_model_len
    requires: ClassVar[frozenset[str]] = frozenset({"order", "running-scheduled"})
    provides: ClassVar[frozenset[str]] = frozenset({"waiting-scheduled"})

    queue: str = "waiting"
    running: str = "running"
    # its default steady answer lowered: nobody while every slot is taken
    steady_lowered = staticmethod(window_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (WINDOW_SEATS,)

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """Nobody while every sequence slot is taken and stays taken this step (no block shortage
        to preempt for: `WindowContext.seats_stay_taken`). Else, where the order before it ranks
        the queue by a declared key (`ctx.rank`: order-fcfs, order-priority), the head of that
        order it can reach: it admits in order into the free slots and stops at the first request
        that does not fit, so the first free-slots + 1 of the order, and as many more as requests
        reject-oversized takes out ahead of it (the oversized ones); else the whole queue."""
        nobody = ctx.nobody_while_seats_stay_taken(self.queue, self.running)
        if nobody is not None or ctx.rank is None or (self.queue, self.running) != ("waiting", "running"):
            return nobody
        seats = max(ctx.max_seqs - ctx.running.size, 0)
        return ctx.first_by_rank(ctx.rank[0], seats + 1 + ctx.oversized.size)

    array_step_when: ClassVar[dict[str, str]] = {}  # `run_arrays`: any options

    def run_arrays(self, step: ArrayStep) -> None:
        """`run` over an array step (`schedir.ir.array_step`), rule for rule."""
        facts = step.facts
        self._check_budget(facts)
        pending = step.pending(self.queue)
        if pending is None:
            return
        running = step.queue(self.running)
        prompt_of, max_tokens_of, blocks_of = step.column("prompt"), step.column("max_tokens"), step.column("blocks")
        run = running.rows if running is not None else _NONE
        rows = pending.pending
        hit, cached_free = step.prefix_hits(pending)
        fit = self._fit(facts, (prompt_of[run], max_tokens_of[run], blocks_of[run]),
                        (step.column("computed")[rows], step.column("total")[rows], prompt_of[rows],
                         max_tokens_of[rows], blocks_of[rows]), hit, cached_free, step.tokens)
        tokens, shared, alloc, reasons, admitted = fit
        if admitted:
            take = rows[:admitted]
            step.schedule(pending, take, tokens[:admitted])
            sharing = shared[:admitted] > 0
            step.share(take[sharing], shared[:admitted][sharing], cached_free[:admitted][sharing])
            got = alloc[:admitted] > 0
            step.alloc(take[got], alloc[:admitted][got])
        step.defer(pending, rows[admitted:], reasons[admitted:])
        step.decided(pending)

    def _check_budget(self, facts) -> None:  # noqa: ANN001 (StepFacts)
        if facts.token_budget < facts.max_model_len:
            raise PassFailure(self.name, f"token_budget {facts.token_budget} is below max_model_len "
                              f"{facts.max_model_len}: Orca runs every prompt whole, so the longest could never run")

    @staticmethod
    def _fit(facts, running: tuple, pending: tuple, hit: np.ndarray, cached_free: np.ndarray,  # noqa: ANN001
             tokens_used: int) -> tuple:
        """`orca_fit` over the pending requests' (computed, total, prompt, max_tokens, blocks),
        against the blocks no running request has reserved (their (prompt, max_tokens, blocks))
        and the slots they leave."""
        bs, mml = facts.block_size, facts.max_model_len
        prompt, max_tokens, blocks = running
        headroom = facts.free_blocks - int(np.maximum(reserved_blocks(prompt, max_tokens, mml, bs) - blocks, 0).sum())
        computed, total, w_prompt, w_max_tokens, w_blocks = pending
        return orca_fit(computed, total, hit, cached_free, reserved_blocks(w_prompt, w_max_tokens, mml, bs), w_blocks,
                        headroom, facts.token_budget - tokens_used, facts.max_seqs - prompt.size, bs)

    def run(self, step: Step) -> None:
        facts = step.facts
        self._check_budget(facts)
        pending = step.pending(self.queue)
        if pending is None:
            return
        running = step.queue(self.running)
        reserving = (_NONE, _NONE, _NONE)
        if running is not None and len(running):
            cols = running.columns
            reserving = (cols.get("prompt"), cols.get("max_tokens"), cols.get("blocks"))
        cols, rows = step.source(pending)
        get = cols.get
        hit, cached_free = step.prefix_hits(pending)
        waiting = tuple(get(name)[rows] for name in ("computed", "total", "prompt", "max_tokens", "blocks"))
        tokens, shared, alloc, reasons, admitted = self._fit(facts, reserving, waiting, hit, cached_free,
                                                             step.usage().tokens)
        ids = step.ids(pending)
        if admitted:
            take = ids[:admitted]
            scheduled = step.schedule(pending, "prefill", take, tokens[:admitted])
            sharing = shared[:admitted] > 0
            if sharing.any():
                step.blocks(ShareOp, scheduled, take[sharing], shared[:admitted][sharing],
                            revived=cached_free[:admitted][sharing])
            got = alloc[:admitted] > 0
            step.blocks(AllocOp, scheduled, take[got], alloc[:admitted][got])
        if admitted < ids.size:
            step.defer(pending, ids[admitted:], reasons[admitted:])


_NONE = np.zeros(0, dtype=np.int64)
