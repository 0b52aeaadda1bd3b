"""The state of the Virtual Token Counter (VTC), shared by `vtc-order` and `vtc-account`.

Sheng et al., "Fairness in Serving Large Language Models", OSDI '24, §4: a counter per client
(tenant) of the service it received, weighted per input and output token; the scheduler serves
the backlogged client with the smallest counter. schedir keeps the counters as scheduler state
(one vector, shown in every step's `sched.state`) and each request's tenant as request state.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from schedir.ir.state import RequestState, SchedulerState

MAX_TENANTS = 64
TENANT = RequestState("tenant", default=0, doc=f"the client this request is served for (0..{MAX_TENANTS - 1})",
                      bounds=(0, MAX_TENANTS - 1))
COUNTERS = SchedulerState("vtc_counter", default=0.0, size=MAX_TENANTS,
                          doc="weighted tokens each tenant has been served (VTC)")


def counters_in(state: Mapping[str, float | np.ndarray]) -> np.ndarray:
    """The counters as `state` holds them (float64), their initial value where it holds none:
    read before every steady step, so the default is built only when it is needed."""
    held = state.get(COUNTERS.name)
    if type(held) is np.ndarray and held.dtype == np.float64:
        return held
    return np.asarray(COUNTERS.initial() if held is None else held, dtype=np.float64)
