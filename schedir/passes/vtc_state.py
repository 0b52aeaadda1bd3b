"""The state of the Virtual Token Counter (VTC), shared by `vtc-order` and `vtc-account`.

Sheng et al., "Fairness in Serving Large Language Models", OSDI '24, §4: a counter per client
(tenant) of the service it received, weighted per input and output token; the scheduler serves
the backlogged client with the smallest counter. schedir keeps the counters as scheduler state
(one vector, shown in every step's `sched.state`) and each request's tenant as request state.
"""

from __future__ import annotations

import attrs
import numba
import numpy as np

from schedir.ir.state import RequestState, SchedulerState, Transition

MAX_TENANTS = 64
TENANT = RequestState("tenant", default=0, doc=f"the client this request is served for (0..{MAX_TENANTS - 1})",
                      bounds=(0, MAX_TENANTS - 1))
COUNTERS = SchedulerState("vtc_counter", default=0.0, size=MAX_TENANTS,
                          doc="weighted tokens each tenant has been served (VTC)")


@attrs.frozen(eq=False)
class Charge(Transition):
    """A steady step's charge (`vtc-account`): `charge[t]` more weighted tokens on tenant t's
    counter, whatever the counters are (the same requests decode one token each, every step)."""

    charge: np.ndarray  # float64[MAX_TENANTS]

    def apply(self, value: float | np.ndarray) -> np.ndarray:
        return np.asarray(value, dtype=np.float64) + self.charge


@attrs.frozen(eq=False)
class Lift(Transition):
    """VTC's counter lift as a steady step's transition (`vtc-order`): each tenant of `back`
    (waiting, none of its requests served) comes back no lower than the least counter of the
    tenants `served`, whatever the counters are (`lift_to_floor`, as `vtc_order.lift`)."""

    back: np.ndarray  # bool[MAX_TENANTS]
    served: np.ndarray  # bool[MAX_TENANTS]

    def apply(self, value: float | np.ndarray) -> np.ndarray:
        return lift_to_floor(np.asarray(value, dtype=np.float64), self.back, self.served)


@numba.njit(cache=True, nogil=True)
def lift_to_floor(counters: np.ndarray, back: np.ndarray, served: np.ndarray) -> np.ndarray:
    """VTC's counter lift (OSDI '24 §4): the counters with each tenant of `back` raised to the least
    counter of the tenants `served` (bool masks per tenant); unchanged when nobody is served."""
    lifted = counters.copy()
    floor = np.inf
    for t in range(counters.size):
        if served[t]:
            floor = min(floor, counters[t])
    if floor == np.inf:
        return lifted
    for t in range(counters.size):
        if back[t] and lifted[t] < floor:
            lifted[t] = floor
    return lifted
