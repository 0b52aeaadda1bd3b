"""vtc-account: charge each tenant's Virtual Token Counter for this step's service."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np

from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.passes.vtc_state import COUNTERS, TENANT, Charge


_NONE = np.zeros(0, dtype=np.int64)


@numba.njit(cache=True, nogil=True)
def charged(counters: np.ndarray, tenant: np.ndarray, at: np.ndarray, prefill: np.ndarray, decode: np.ndarray,
            w_in: float, w_out: float) -> np.ndarray:
    """`counters` plus what the requests at positions `at` of `tenant` were served: `w_in` per
    prefill token, `w_out` per decode token (empty `prefill` / `decode`: none / one each, a
    steady decode step). Token counts are integers, so the float sums are exact in any order."""
    out = counters.copy()
    for i in range(at.size):
        p = prefill[i] if prefill.size else 0
        d = decode[i] if decode.size else 1
        out[tenant[at[i]]] += w_in * p + w_out * d
    return out


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
    # its steady answer is a transition (the charge, whatever the counters are): held while the
    # batch and the tenants are the same
    steady_reads: ClassVar[frozenset[str]] = frozenset()

    def steady_state(self, ctx: WindowContext) -> dict[str, Charge] | None:
        """A steady step charges one output token per running request: `w-out` per request on its
        tenant's counter, as a `Charge` (applied after vtc-order's lift, in pipeline order)."""
        if ctx.state_of is None:
            return None
        nothing = np.zeros(COUNTERS.size, dtype=np.float64)
        return {COUNTERS.name: Charge(charged(nothing, ctx.state_of(TENANT.name), ctx.running, _NONE, _NONE,
                                              float(self.w_in), float(self.w_out)))}

    def waiting_window(self, ctx: WindowContext) -> np.ndarray:
        """Nobody of its own: it charges what the other passes scheduled."""
        return ctx.NONE

    def run(self, step: Step) -> None:
        counters = np.array(step.state(COUNTERS.name, COUNTERS.initial()), dtype=np.float64)
        served = False
        for got in step.served():
            tenant = step.state_column(got.queue, TENANT.name, TENANT.default)
            counters = charged(counters, tenant, got.at, got.prefill, got.decode, float(self.w_in), float(self.w_out))
            served = True
        if served:
            step.set_state(vtc_counter=counters)
