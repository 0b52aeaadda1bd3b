"""prefix-cache-aware: the seed's PrefixCacheAware — longest cached prefix first, sharers together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np

from schedir.ir.array_step import ArrayStep
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import RankColumn, WindowContext
from schedir.lowering.steady_layout import WINDOW_NOBODY, window_steady_lowered
from schedir.passes.ordering import ARRIVAL_BITS


@numba.njit(cache=True, nogil=True, inline="always")
def _hit_blocks(hit: int, block_size: int, min_tokens: int) -> int:
    """A hit in whole blocks as this order counts it: under `min_tokens`, none."""
    return hit // block_size if hit >= min_tokens else 0


@numba.njit(cache=True, nogil=True)
def hit_then_arrival_keys(hit: np.ndarray, waiting: np.ndarray, arrival_of: np.ndarray, block_size: int,
                          min_tokens: int) -> tuple[bool, np.ndarray]:
    """`then_arrival_keys(-hit blocks, arrival)` of the waiting requests in two passes and no
    temporaries: hits under `min_tokens` count as none; (False, ...) where the keys do not fit
    (hit blocks spanning 2**15 or more, an arrival outside 47 bits)."""
    n = waiting.size
    keys = np.empty(n, dtype=np.int64)
    most, least = 0, 1 << 62
    for i in range(n):
        b = _hit_blocks(hit[i], block_size, min_tokens)
        keys[i] = b
        most = max(most, b)
        least = min(least, b)
    if most - least >= 1 << 15:
        return False, keys
    for i in range(n):
        a = arrival_of[waiting[i]]
        if a < 0 or a >= 1 << ARRIVAL_BITS:
            return False, keys
        keys[i] = ((most - keys[i]) << ARRIVAL_BITS) | a
    return True, keys


@numba.njit(cache=True, nogil=True)
def hit_blocks_below_most(hit: np.ndarray, block_size: int, min_tokens: int) -> tuple[np.ndarray, int]:
    """Each hit in whole blocks (under `min_tokens`, none) as its distance below the most any
    has, and that most: the rank column of an order by hit blocks, longest first, in two passes
    (four numpy passes and their temporaries over a queue of thousands before)."""
    n = hit.size
    out = np.empty(n, dtype=np.int64)
    most = 0
    for i in range(n):
        b = _hit_blocks(hit[i], block_size, min_tokens)
        out[i] = b
        most = max(most, b)
    for i in range(n):
        out[i] = most - out[i]
    return out, most


@dataclass(frozen=True)
class PrefixCacheAware(StepPass):
    """Order the waiting set by its prefix-cache hit (`mem.match`), longest first, then arrival.

    The seed's PrefixCacheAware rule: requests whose prompt is already in the KV cache cost the
    least to admit, and requests that hit the same cached prefix share its blocks, so serving
    them back to back keeps that prefix resident. Hits are whole cached blocks from the step's
    real prefix cache (the builder's `mem.match`); requests with an equal hit form one group
    (in practice they share the prefix) ordered by arrival. Hits under `min_blocks` blocks count
    as none, so a one-block coincidence does not jump the queue. Without a `mem.match` (prefix
    caching off) every hit is 0 and the order is FCFS.
    """

    name: ClassVar[str] = "prefix-cache-aware"
    # steady decode steps: over the waiting queue: a steady step's is empty
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting"}
    provides: ClassVar[frozenset[str]] = frozenset({"order"})

    min_blocks: int = 1
    queue: str = "waiting"

    # its default steady answer lowered: its window is nobody
    steady_lowered = staticmethod(window_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (WINDOW_NOBODY,)

    def waiting_window(self, ctx: WindowContext) -> np.ndarray:
        """Nobody of its own: it orders what the step holds by the hits the runtime matched (admission declares what it picks from)."""
        return ctx.NONE

    def waiting_rank(self, ctx: WindowContext) -> tuple[np.ndarray, np.ndarray] | None:
        """(hit blocks, longest first; arrival) as one key, as `run` sorts the waiting queue, from
        the hits the step will match (`WindowContext.prefix_hit`): a ranked window for admission's
        walk (`schedir.ir.window`). None where the pool finds hits inside the passes, a swapped
        queue waits (this order does not rank it) or the keys do not fit."""
        if self.queue != "waiting" or ctx.column_of is None or ctx.prefix_hit is None or ctx.swapped.size:
            return None
        return ctx.shared(("prefix-hit-rank", self), lambda: self._rank(ctx))  # type: ignore[return-value]

    def _rank(self, ctx: WindowContext) -> tuple[np.ndarray, np.ndarray] | None:
        ok, keys = hit_then_arrival_keys(ctx.prefix_hit(ctx.waiting), ctx.waiting, ctx.column_of("arrival"),  # type: ignore[misc]
                                         ctx.block_size, self.min_blocks * ctx.block_size)
        return (keys, np.zeros(0, dtype=np.int64)) if ok else None

    def rank_columns(self, ctx: WindowContext) -> list[RankColumn] | None:
        """(hit blocks below the queue's most, arrival's dense rank): the key's columns where
        another order pass follows (the seed's `with-all-passes`), from the hits the step will
        match; None where the pool finds hits inside the passes."""
        arrival = ctx.arrival_rank() if self.queue == "waiting" and ctx.prefix_hit is not None else None
        if arrival is None:
            return None
        below, most = hit_blocks_below_most(ctx.prefix_hit(ctx.waiting), ctx.block_size,  # type: ignore[misc]
                                            self.min_blocks * ctx.block_size)
        return [RankColumn(f"{self.name}-{self.min_blocks}", below, most + 1), arrival]

    def _counted(self, hit: np.ndarray, block_size: int) -> np.ndarray:
        """Hit tokens as this order counts them: under `min_blocks` blocks, none."""
        return np.where(hit >= self.min_blocks * block_size, hit, 0)

    array_step_when: ClassVar[dict[str, str]] = {}  # `run_arrays`: any options

    def run_arrays(self, step: ArrayStep) -> None:
        """`run` over an array step (`schedir.ir.array_step`)."""
        pending = step.pending(self.queue)
        if pending is None:
            return
        rows = pending.pending
        hit = self._counted(step.prefix_hits(pending)[0], step.facts.block_size)
        step.sort(pending, np.lexsort((step.column("arrival")[rows], -hit)))

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        hit = self._counted(step.prefix_hits(pending)[0], step.facts.block_size)
        arrival = step.column(pending, "arrival")
        ids = step.ids(pending)
        order = np.lexsort((arrival, -hit)) if ids.size else np.zeros(0, dtype=np.int64)
        step.sort(pending, ("prefix_hit desc", "arrival"), ids[order], picked=order)
