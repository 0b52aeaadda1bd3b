"""vtc-account: charge each tenant's Virtual Token Counter for this step's service."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.passes.vtc_state import COUNTERS, TENANT


@dataclass(frozen=True)
class VtcAccount(StepPass):
    """Add `w-in` per prompt token and `w-out` per generated token scheduled this step to the
    counter of the request's tenant (VTC, OSDI '24 §4: the paper's weights are 1 and 2, an
    output token costing about twice an input one). Runs after every scheduling pass."""

    name: ClassVar[str] = "vtc-account"
    requires: ClassVar[frozenset[str]] = frozenset({"running-scheduled", "waiting-scheduled"})
    request_state = (TENANT,)
    scheduler_state = (COUNTERS,)

    w_in: int = 1
    w_out: int = 2

    def waiting_window(self, ctx: WindowContext) -> np.ndarray:
        """Nobody of its own: it charges what the other passes scheduled."""
        return ctx.NONE

    def run(self, step: Step) -> None:
        counters = np.array(step.state(COUNTERS.name, COUNTERS.initial()), dtype=np.float64)
        charged = False
        for got in step.served():
            tenant = step.state_column(got.queue, TENANT.name, TENANT.default)[got.at]
            # per tenant, in one pass (np.add.at's unbuffered loop costs ~10 µs here); token counts
            # are integers, so the float sums are exact and the order of the additions does not matter
            counters += np.bincount(tenant, weights=self.w_in * got.prefill + self.w_out * got.decode,
                                    minlength=counters.size)[: counters.size]
            charged = True
        if charged:
            step.set_state(vtc_counter=counters)
