"""verify-step: a step is legal — the checks every pipeline's result must pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np

from schedir.dialects.columns import joined_columns
from schedir.dialects.mem import AllocOp, MatchOp, ShareOp, SwapInOp
from schedir.dialects.req import OUTCOMES, ScheduleOp
from schedir.ir.array_step import ArrayStep, read_only_view
from schedir.ir.errors import PassFailure
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import WINDOW_NOBODY, window_steady_lowered
from schedir.passes.kernels import decision_gaps

_NO_IDS = np.zeros(0, dtype=np.int64)
_NO_IDS.flags.writeable = False  # as the ops' columns are: the kernels compile one signature


@numba.njit(cache=True, nogil=True)
def token_and_block_gaps(ids, tokens, computed, total, held, hit, match_ids, match_hit, effect_ids, effect_blocks,
                         effect_shared, block_size):
    """(over, short) per scheduled request: more tokens than it has left to compute, or fewer
    blocks (held + allocated + shared + swapped in, summed over the step's effects on its id)
    than its tokens need. Prefix hits count as computed only for a request that shares the
    cached blocks (`mem.share`), and never the last token. A request's hit is `hit[i]` when
    `hit` has one per request, else its last `mem.match` entry (`match_ids`, `match_hit`, in op
    order: a later match answers over an earlier one, as in `Step.prefix_hits`), else 0."""
    order = np.argsort(effect_ids, kind="mergesort")
    sorted_ids = effect_ids[order]
    m_order = np.argsort(match_ids, kind="mergesort")  # stable: equal ids stay in op order
    m_sorted = match_ids[m_order]
    n = ids.size
    direct = hit.size == n
    over = np.zeros(n, dtype=np.bool_)
    short = np.zeros(n, dtype=np.bool_)
    for i in range(n):
        have = held[i]
        shared = 0
        at = np.searchsorted(sorted_ids, ids[i])
        while at < sorted_ids.size and sorted_ids[at] == ids[i]:
            have += effect_blocks[order[at]]
            shared += effect_shared[order[at]]
            at += 1
        start = computed[i]
        if shared > 0:
            h = 0
            if direct:
                h = hit[i]
            else:
                j = np.searchsorted(m_sorted, ids[i], side="right") - 1
                if j >= 0 and m_sorted[j] == ids[i]:
                    h = match_hit[m_order[j]]
            usable = min(h, max(total[i] - 1, 0)) // block_size * block_size
            start = max(start, usable)
        over[i] = tokens[i] > total[i] - start
        short[i] = have < (start + tokens[i] + block_size - 1) // block_size
    return over, short


@numba.njit(cache=True, nogil=True)
def each_once(members: np.ndarray, decided: np.ndarray) -> bool:
    """Whether `decided` holds each of `members` (distinct row ids) exactly once and nothing else:
    marks over the members' span, no sort (the common case of the completeness check)."""
    if members.size != decided.size:
        return False
    if members.size == 0:
        return True
    low, high = members.min(), members.max()
    seen = np.zeros(high - low + 1, dtype=np.int8)
    for r in members:
        seen[r - low] = 1
    for r in decided:
        if r < low or r > high or seen[r - low] != 1:
            return False
        seen[r - low] = 2
    return True


def _gaps(*args):  # noqa: ANN002, ANN202
    """`token_and_block_gaps` with every array read-only, as the IR's columns are: the IR step and
    the array step pass the kernel one array type, so it compiles once (mixed flags compiled it
    five times, some of them mid-run)."""
    return token_and_block_gaps(*(read_only_view(a) if isinstance(a, np.ndarray) else a for a in args))


def _budget_problems(facts, tokens: int, seqs: int, scheduled: np.ndarray, taken: int,  # noqa: ANN001
                     given: int) -> list[str]:
    """The budget checks of a step, from its IR or its array step: tokens, sequences, nobody
    scheduled twice, blocks taken within the free ones and those given back."""
    out: list[str] = []
    if tokens > facts.token_budget:
        out.append(f"{tokens} tokens scheduled, token budget is {facts.token_budget}")
    if seqs > facts.max_seqs:
        out.append(f"{seqs} requests scheduled, max_seqs is {facts.max_seqs}")
    twice, _ = decision_gaps(_NO_IDS, scheduled)
    if twice.size:
        out.append(f"request(s) {_listed(twice)} scheduled more than once")
    if facts.free_blocks + given - taken < 0:
        out.append(f"{taken} blocks taken, but only {facts.free_blocks} free + {given} given back this step")
    return out


def _listed(ids: np.ndarray, limit: int = 10) -> str:
    shown = ids[:limit].tolist()
    more = f" (+{ids.size - limit} more)" if ids.size > limit else ""
    return f"{shown}{more}"


@dataclass(frozen=True)
class VerifyStep(StepPass):
    """Check the step is legal: budgets respected, nobody scheduled twice, blocks allocated <= free.

    Also: nobody is scheduled more tokens than it has left to compute, every
    scheduled request holds enough blocks for its tokens, evictions stay within
    the cached-free blocks, and (with `complete`) every request of every queue
    has exactly one decision: scheduled, deferred, rejected or preempted.
    """

    name: ClassVar[str] = "verify-step"
    # steady decode steps: it decides nothing; a steady step's decisions hold by construction
    steady_when: ClassVar[dict[str, str]] = {}
    steady_swapped: ClassVar[bool] = True  # it decides nothing about the swapped queue
    # its default steady answer lowered: its window is nobody
    steady_lowered = staticmethod(window_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (WINDOW_NOBODY,)
    provides: ClassVar[frozenset[str]] = frozenset({"budget-legal"})

    complete: bool = True

    def waiting_window(self, ctx: WindowContext) -> np.ndarray:
        """Nobody of its own: it checks the decisions on whatever the step holds."""
        return ctx.NONE

    swapped_window = waiting_window

    def run(self, step: Step) -> None:
        problems = self.problems(step)
        if problems:
            raise PassFailure(self.name, f"step {step.facts.step} is illegal: " + "; ".join(problems))

    array_step_when: ClassVar[dict[str, str]] = {}  # `run_arrays`: any options

    def run_arrays(self, step: ArrayStep) -> None:
        """`run` over an array step (`schedir.ir.array_step`): the same checks, the same message."""
        problems = self.array_problems(step)
        if problems:
            raise PassFailure(self.name, f"step {step.facts.step} is illegal: " + "; ".join(problems))

    def array_problems(self, step: ArrayStep) -> list[str]:
        """`problems` of an array step (the IR's batch check aside: its decisions are the batch)."""
        facts = step.facts
        scheduled = step.scheduled_rows()
        out = _budget_problems(facts, step.tokens, step.seqs, scheduled, step.blocks_taken, step.blocks_given)
        parts = step.of_kind("schedule")
        if parts:
            blocks = step.column("blocks")
            held = joined_columns([np.zeros(d.rows.size, dtype=np.int64) if d.queue == "swapped" else blocks[d.rows]
                                   for d in parts])
            tokens = joined_columns([d.values for d in parts])
            # the scheduled requests' own hits (the step looks hits up as its passes read them)
            match_ids = joined_columns([d.rows for d in parts if d.queue == "waiting"]) if step.hit is not None \
                else _NO_IDS
            over, short = _gaps(
                scheduled, tokens, step.column("computed")[scheduled], step.column("total")[scheduled], held, _NO_IDS,
                match_ids, step.waiting_hits(match_ids) if match_ids.size else _NO_IDS,
                joined_columns([e[0] for e in step.effects]), joined_columns([e[1] for e in step.effects]),
                joined_columns([e[2] for e in step.effects]), facts.block_size)
            if over.any():
                out.append(f"request(s) {_listed(scheduled[over])} scheduled more tokens than they have left to "
                           "compute")
            if short.any():
                out.append(f"request(s) {_listed(scheduled[short])} hold too few blocks for the tokens scheduled")
        if self.complete:
            for name, q in step.queues.items():
                got = joined_columns([d.rows for d in step.decisions if d.queue == name])
                if each_once(q.rows, got):
                    continue  # the common case, in one marking pass
                twice, undecided = decision_gaps(q.rows, got)
                if twice.size:
                    out.append(f"request(s) {_listed(twice)} of queue '{name}' have more than one decision")
                if undecided.size:
                    out.append(f"request(s) {_listed(undecided)} of queue '{name}' have no decision "
                               "(schedule, defer, reject or preempt)")
        return out

    def problems(self, step: Step) -> list[str]:
        facts, used = step.facts, step.usage()
        out = _budget_problems(facts, used.tokens, used.seqs, used.scheduled_ids, used.blocks_taken, used.blocks_given)
        # Revived shares are not capped by cached_free_blocks here: two requests with one
        # prefix count the same cached-free blocks each (admission charges them twice: safe).
        if used.evicted > facts.cached_free_blocks:
            out.append(f"{used.evicted} blocks evicted, only {facts.cached_free_blocks} cached-free")
        out.extend(self._token_and_block_checks(step))
        batch = {id(v) for v in step.terminator.sets}
        unbatched = [op for op in step.ops_of(ScheduleOp) if id(op.results[0]) not in batch]
        if unbatched:
            ids = np.concatenate([op.ids for op in unbatched])  # type: ignore[attr-defined]
            out.append(f"request(s) {_listed(ids)} are scheduled but not in the batch (sched.yield)")
        if self.complete:
            out.extend(self._outcome_checks(step))
        return out

    @staticmethod
    def _token_and_block_checks(step: Step) -> list[str]:
        """Tokens within what is left to compute, and blocks held for them, for every scheduled
        request: one walk over the step's ops gathers the scheduled sets and the block effects
        (`mem.alloc`, `mem.share`, `mem.swap_in`), one kernel checks them all."""
        ids_parts, token_parts, computed_parts, total_parts, held_parts = [], [], [], [], []
        effect_ids, effect_blocks, effect_shared, match_ids, match_hit = [], [], [], [], []
        scheduled, any_share = [], False
        op = step.block.first_op
        while op is not None:
            kind = type(op)
            if kind is ScheduleOp:
                if len(op):  # type: ignore[arg-type]
                    result = op.results[0]
                    computed, total, held = step.columns(result, ("computed", "total", "blocks"))
                    if step.root(result).queue.data == "swapped":  # their `blocks` are on the host tier
                        held = np.zeros_like(held)
                    scheduled.append(result)
                    ids_parts.append(op.ids)  # type: ignore[attr-defined]
                    token_parts.append(op.col("tokens"))  # type: ignore[attr-defined]
                    computed_parts.append(read_only_view(computed))  # gathered copies or views
                    total_parts.append(read_only_view(total))
                    held_parts.append(read_only_view(held))
            elif kind is AllocOp or kind is ShareOp or kind is SwapInOp:
                if len(op):  # type: ignore[arg-type]
                    effect_ids.append(op.ids)  # type: ignore[attr-defined]
                    blocks = op.col("blocks")  # type: ignore[attr-defined]
                    effect_blocks.append(blocks)
                    if kind is ShareOp:
                        any_share = True
                        effect_shared.append(blocks)
                    else:
                        effect_shared.append(read_only_view(np.zeros(blocks.size, dtype=np.int64)))
            elif kind is MatchOp:
                if len(op):  # type: ignore[arg-type]
                    match_ids.append(op.ids)  # type: ignore[attr-defined]
                    match_hit.append(op.col("hit"))  # type: ignore[attr-defined]
            op = op._next_op
        if not ids_parts:
            return []
        ids = joined_columns(ids_parts)
        hit = _NO_IDS  # hits matter only to requests that share cached blocks
        if any_share and not match_ids:  # no mem.match: the step's KV pool answers (Step.prefix_hits)
            hit = joined_columns([step.prefix_hits(result)[0] for result in scheduled])
        over, short = _gaps(ids, joined_columns(token_parts), joined_columns(computed_parts), joined_columns(total_parts),
                            joined_columns(held_parts), hit, joined_columns(match_ids), joined_columns(match_hit),
                            joined_columns(effect_ids), joined_columns(effect_blocks), joined_columns(effect_shared),
                            step.facts.block_size)
        out: list[str] = []
        if over.any():
            out.append(f"request(s) {_listed(ids[over])} scheduled more tokens than they have left to compute")
        if short.any():
            out.append(f"request(s) {_listed(ids[short])} hold too few blocks for the tokens scheduled")
        return out

    @staticmethod
    def _outcome_checks(step: Step) -> list[str]:
        out: list[str] = []
        decided: dict[str, list[np.ndarray]] = {}
        for op in step.ops_of(*OUTCOMES):
            root = step.root(op.operands[0])
            decided.setdefault(root.queue.data, []).append(op.ids)  # type: ignore[attr-defined]
        for queue in step.queues():
            name = queue.queue.data
            members = queue.ids
            parts = decided.get(name)
            got = joined_columns(parts) if parts else _NO_IDS
            twice, undecided = decision_gaps(members, got)
            if twice.size:
                out.append(f"request(s) {_listed(twice)} of queue '{name}' have more than one decision")
            if undecided.size:
                out.append(
                    f"request(s) {_listed(undecided)} of queue '{name}' have no decision "
                    "(schedule, defer, reject or preempt)"
                )
        return out
