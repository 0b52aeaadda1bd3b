"""verify-step: a step is legal — the checks every pipeline's result must pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.mem import AllocOp, ShareOp, SwapInOp
from schedir.dialects.req import OUTCOMES, ScheduleOp
from schedir.ir.errors import PassFailure
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.passes.kernels import decision_gaps

_NO_IDS = np.zeros(0, dtype=np.int64)


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
    provides: ClassVar[frozenset[str]] = frozenset({"budget-legal"})

    complete: bool = True

    def run(self, step: Step) -> None:
        problems = self.problems(step)
        if problems:
            raise PassFailure(self.name, f"step {step.facts.step} is illegal: " + "; ".join(problems))

    def problems(self, step: Step) -> list[str]:
        facts, used = step.facts, step.usage()
        out: list[str] = []
        if used.tokens > facts.token_budget:
            out.append(f"{used.tokens} tokens scheduled, token budget is {facts.token_budget}")
        if used.seqs > facts.max_seqs:
            out.append(f"{used.seqs} requests scheduled, max_seqs is {facts.max_seqs}")
        twice, _ = decision_gaps(_NO_IDS, used.scheduled_ids)
        if twice.size:
            out.append(f"request(s) {_listed(twice)} scheduled more than once")
        if used.free_left(facts) < 0:
            out.append(
                f"{used.blocks_taken} blocks taken, but only {facts.free_blocks} free "
                f"+ {used.blocks_given} given back this step"
            )
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
        out: list[str] = []
        bs = step.facts.block_size
        for op in step.ops_of(ScheduleOp):
            assert isinstance(op, ScheduleOp)
            if not len(op):
                continue
            ids, tokens = op.ids, op.col("tokens")
            computed, total, held = step.columns(op.result, ("computed", "total", "blocks"))
            if step.root(op.result).queue.data == "swapped":  # their `blocks` are on the host tier
                held = np.zeros_like(held)
            hit, _ = step.prefix_hits(op.result)
            shared = step.decision_column(ShareOp, "blocks", ids)
            # Prefix hits count as computed only for a request that shares the cached blocks.
            usable = np.minimum(hit, np.maximum(total - 1, 0)) // bs * bs
            start = np.where(shared > 0, np.maximum(computed, usable), computed)
            over = tokens > total - start
            if over.any():
                out.append(f"request(s) {_listed(ids[over])} scheduled more tokens than they have left to compute")
            have = held.copy()
            for kind in (AllocOp, ShareOp, SwapInOp):
                have += step.decision_column(kind, "blocks", ids)
            short = have < (start + tokens + bs - 1) // bs
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
            got = (parts[0] if len(parts) == 1 else np.concatenate(parts)) if parts else _NO_IDS
            twice, undecided = decision_gaps(members, got)
            if twice.size:
                out.append(f"request(s) {_listed(twice)} of queue '{name}' have more than one decision")
            if undecided.size:
                out.append(
                    f"request(s) {_listed(undecided)} of queue '{name}' have no decision "
                    "(schedule, defer, reject or preempt)"
                )
        return out
