"""order-decodes-first: Sarathi-Serve's stall-free order of the running batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step


@dataclass(frozen=True)
class OrderDecodesFirst(StepPass):
    """Order running requests so that decodes come before prefills still in progress.

    Sarathi-Serve (OSDI '24, §4.2, stall-free batching) fills each iteration with the ongoing
    decodes first, then the partial prefills, then new prefills, so a long prompt's chunks never
    take the budget a decode needed: decodes never stall. vLLM's running loop takes requests in
    arrival order, so an earlier request's prefill chunk may use the budget first. Order within
    each group is kept (FCFS); the admission pass adds new prefills after both.
    """

    name: ClassVar[str] = "order-decodes-first"
    # steady decode steps: nothing to move: a steady step's running requests all decode
    steady_when: ClassVar[dict[str, str]] = {}
    provides: ClassVar[frozenset[str]] = frozenset({"decodes-first"})

    queue: str = "running"

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        prompt, computed = step.columns(pending, ("prompt", "computed"))
        prefilling = (computed < prompt).astype(np.int64)
        if not prefilling.any() or prefilling.all():
            return
        order = np.argsort(prefilling, kind="stable")
        step.sort(pending, ("prefilling", "queue"), step.ids(pending)[order], picked=order)
