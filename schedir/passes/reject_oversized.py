"""reject-oversized: refuse requests that can never run, so they never stall the queue."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.codes import Reason
from schedir.ir.array_step import ArrayStep
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import WINDOW_OVERSIZED, window_steady_lowered


def oversized(total: np.ndarray, prompt: np.ndarray, max_tokens: np.ndarray, max_model_len: int,
              total_blocks: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(too long for the model, too big for the whole cache) per request.

    Too long: `total` known tokens >= max_model_len, no room for a single new token (vLLM's
    input processor refuses such a prompt; admitted, a chunked one would stall one token short
    of sampling). Too big: the KV the request holds at its last step, min(prompt + max_tokens,
    max_model_len) - 1 tokens (the last sampled token is never computed), needs more blocks
    than the whole cache. Checking the prompt alone let such a request run, deliver tokens,
    preempt itself when the cache filled and be rejected only then (vLLM livelocks there);
    it is refused up front instead. The runtime's admission window uses the same rule, so a
    request that will be rejected always enters the step that rejects it.
    """
    too_long = total >= max_model_len
    peak = np.maximum(np.minimum(prompt + max_tokens, max_model_len) - 1, total)
    too_big = (peak + block_size - 1) // block_size > total_blocks
    return too_long, too_big


def refused_rows(facts, total: np.ndarray,  # noqa: ANN001 (StepFacts)
                 prompt_and_max_tokens: Callable[[], tuple[np.ndarray, np.ndarray]]
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """(refused, reasons) of the requests whose known tokens are `total`, or None when nobody is
    refused; their prompts and max_tokens are read only when the fast path cannot tell."""
    if total.size == 0:
        return None
    mml, cache = facts.max_model_len, facts.total_blocks * facts.block_size
    # Fast path: nothing reaches the model length, and the longest generation fits the cache
    # (always, when the cache holds max_model_len tokens: then only `total` is read).
    longest = int(total.max())
    fits = longest < mml and longest <= cache
    if fits and mml - 1 <= cache:
        return None
    prompt, max_tokens = prompt_and_max_tokens()
    if fits and int((prompt + max_tokens).max()) - 1 <= cache:
        return None
    too_long, too_big = oversized(total, prompt, max_tokens, mml, facts.total_blocks, facts.block_size)
    bad = too_long | too_big
    if not bad.any():
        return None
    return bad, np.where(too_long, int(Reason.TOO_LONG), int(Reason.EXCEEDS_CACHE))


@dataclass(frozen=True)
class RejectOversized(StepPass):
    """Reject requests longer than the model or larger than the whole KV cache.

    A request whose known tokens reach `max_model_len` (no room to generate one
    token), or whose generation would need more blocks than the pool holds (prompt
    + max_tokens, capped by the model length), can never be served; leaving it at
    the head of the queue would stall everything behind it.
    """

    name: ClassVar[str] = "reject-oversized"
    # steady decode steps: over the waiting queue (over running it could refuse one)
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting"}
    # its steady answer reads the waiting queue and the oversized flags only (its window's rule)
    steady_reads: ClassVar[frozenset[str]] = frozenset()
    steady_swapped: ClassVar[bool] = True  # it decides nothing about the swapped queue
    # its default steady answer lowered: the waiting requests flagged oversized
    steady_lowered = staticmethod(window_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (WINDOW_OVERSIZED,)
    # running steps: an empty waiting queue leaves it nothing to refuse
    running_step_when: ClassVar[dict[str, str]] = {"queue": "waiting"}
    provides: ClassVar[frozenset[str]] = frozenset({"admissible"})

    queue: str = "waiting"

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """The waiting requests its rule refuses (the runtime flags them at arrival with `oversized`)."""
        return ctx.oversized if self.queue == "waiting" else ctx.NONE

    def swapped_window(self, ctx: WindowContext) -> np.ndarray | None:
        """Nobody swapped (it judges its own queue), unless its queue is the swapped one."""
        return ctx.NONE if self.queue != "swapped" else None

    array_step_when: ClassVar[dict[str, str]] = {}  # `run_arrays`: any queue

    def run_arrays(self, step: ArrayStep) -> None:
        """`run` over an array step (`schedir.ir.array_step`)."""
        pending = step.pending(self.queue)
        if pending is None:
            return
        rows = pending.pending
        refused = refused_rows(step.facts, step.column("total")[rows],
                               lambda: (step.column("prompt")[rows], step.column("max_tokens")[rows]))
        if refused is not None:
            bad, reasons = refused
            step.reject(pending, rows[bad], reasons[bad])
            step.keep(pending, np.flatnonzero(~bad))

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        refused = refused_rows(step.facts, step.column(pending, "total"),
                               lambda: step.columns(pending, ("prompt", "max_tokens")))
        if refused is not None:
            bad, reasons = refused
            ids = step.ids(pending)
            step.reject(pending, ids[bad], reasons[bad])
            step.keep(pending, ids[~bad], picked=np.flatnonzero(~bad))
