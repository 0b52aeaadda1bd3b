"""admit-greedy: the seed's admission — walk the waiting queue in order, take what fits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.mem import AllocOp, ShareOp
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.passes.kernels import greedy_fit


@dataclass(frozen=True)
class AdmitGreedy(StepPass):
    """Admit waiting requests in order while the token budget, max sequences and free blocks allow.

    Prefix-cache hits (`mem.match`) count as computed tokens: their blocks are
    shared (`mem.share`), and hit blocks that sat in the free queue are charged
    against free blocks. A full-prompt hit still recomputes the last token. A
    request that does not fit is deferred with its reason and the walk goes on
    (greedy); with `stop-at-first` the first misfit blocks everyone behind it.
    With `chunk`, a prompt larger than the remaining budget gets a partial chunk.
    """

    name: ClassVar[str] = "admit-greedy"
    requires: ClassVar[frozenset[str]] = frozenset({"order", "running-scheduled"})
    provides: ClassVar[frozenset[str]] = frozenset({"waiting-scheduled"})

    chunk: bool = False
    stop_at_first: bool = False
    queue: str = "waiting"

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        ids = step.ids(pending)
        if ids.size == 0:
            return
        facts, used = step.facts, step.usage()
        bs = facts.block_size
        computed, total, held = step.columns(pending, ("computed", "total", "blocks"))
        hit, cached_free = step.prefix_hits(ids)
        usable_hit = np.minimum(hit, np.maximum(total - 1, 0)) // bs * bs
        start = np.maximum(computed, usable_hit)
        shared = np.maximum(usable_hit // bs - held, 0)
        revived = np.minimum(cached_free, shared)
        tokens, new_blocks, reason, *_ = greedy_fit(
            total - start, start, held + shared, revived,
            facts.token_budget - used.tokens, facts.max_seqs - used.seqs, used.free_left(facts),
            bs, self.chunk, self.stop_at_first,
        )
        run = tokens > 0
        if run.any():
            scheduled = step.schedule(pending, "prefill", ids[run], tokens[run])
            shares = run & (shared > 0)
            step.blocks(ShareOp, scheduled, ids[shares], shared[shares], revived=revived[shares])
            grows = run & (new_blocks > 0)
            step.blocks(AllocOp, scheduled, ids[grows], new_blocks[grows])
        step.defer(pending, ids[~run], reason[~run])
