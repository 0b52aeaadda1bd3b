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

    steady_when: ClassVar[dict[str, str]] = {}

    def steady_state(self, ctx: WindowContext) -> dict[str, np.ndarray]:
        """A steady step charges one output token per running request (after vtc-order's lift,
        which `ctx.scheduler_state` already holds)."""
        counters = np.array(ctx.scheduler_state.get(COUNTERS.name, COUNTERS.initial()), dtype=np.float64)
        tenant = ctx.request_state(TENANT.name, ctx.running)
        return {COUNTERS.name: counters + self._charges(tenant, np.zeros(tenant.size, dtype=np.int64),
                                                        np.ones(tenant.size, dtype=np.int64), counters.size)}

    def _charges(self, tenant: np.ndarray, prefill: np.ndarray, decode: np.ndarray, size: int) -> np.ndarray:
        """Each tenant's charge for the tokens served: per tenant, in one pass (np.add.at's
        unbuffered loop costs ~10 µs here); token counts are integers, so the float sums are
        exact and the order of the additions does not matter."""
        return np.bincount(tenant, weights=self.w_in * prefill + self.w_out * decode, minlength=size)[:size]

    def waiting_window(self, ctx: WindowContext) -> np.ndarray:
        """Nobody of its own: it charges what the other passes scheduled."""
        return ctx.NONE

    def run(self, step: Step) -> None:
        counters = np.array(step.state(COUNTERS.name, COUNTERS.initial()), dtype=np.float64)
        charged = False
        for got in step.served():
            tenant = step.state_column(got.queue, TENANT.name, TENANT.default)[got.at]
            counters += self._charges(tenant, got.prefill, got.decode, counters.size)
            charged = True
        if charged:
            step.set_state(vtc_counter=counters)
