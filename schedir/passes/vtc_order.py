"""vtc-order: serve first the backlogged tenant with the least weighted service (VTC)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np

from schedir.ir.errors import PassFailure
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.passes.vtc_state import COUNTERS, MAX_TENANTS, TENANT


@numba.njit(cache=True, nogil=True)
def vtc_pick_order(tenant: np.ndarray, need: np.ndarray, counters: np.ndarray, w_in: float) -> np.ndarray:
    """The order VTC would admit these waiting requests (given in arrival order): again and again
    the next request of the tenant whose counter, charged for what it was given so far, is
    smallest (ties: the lower tenant id); each pick charges `w_in` per prompt token to compute."""
    n = tenant.size
    c = counters.copy()
    nxt = np.full(c.size, -1, dtype=np.int64)  # each tenant's next waiting request (linked by arrival)
    link = np.full(n, -1, dtype=np.int64)
    last = np.full(c.size, -1, dtype=np.int64)
    for i in range(n):
        t = tenant[i]
        if last[t] < 0:
            nxt[t] = i
        else:
            link[last[t]] = i
        last[t] = i
    order = np.empty(n, dtype=np.int64)
    for k in range(n):
        best = -1
        for t in range(c.size):
            if nxt[t] >= 0 and (best < 0 or c[t] < c[best]):
                best = t
        i = nxt[best]
        order[k] = i
        c[best] += w_in * need[i]
        nxt[best] = link[i]
    return order


def lift(counters: np.ndarray, waiting: np.ndarray, served: np.ndarray) -> np.ndarray:
    """VTC's counter lift: a tenant with requests `waiting` and none among those `served` (their
    tenants) comes back no lower than the least counter of the tenants being served."""
    lifted = counters.copy()
    if served.size:
        floor = counters[served].min()
        back = np.zeros(counters.size, dtype=np.bool_)
        back[waiting] = True  # tenants waiting ...
        back[served] = False  # ... and not being served
        lifted[back] = np.maximum(lifted[back], floor)
    return lifted


@dataclass(frozen=True)
class VtcOrder(StepPass):
    """Order the waiting queue by Virtual Token Counter: fair service across tenants.

    VTC (Sheng et al., OSDI '24, §4, Algorithm 2) keeps a counter of the weighted tokens each
    tenant received and serves the backlogged tenant whose counter is smallest, so a tenant
    that floods the queue cannot starve the others, and an idle tenant cannot bank credit: a
    tenant whose counter fell below the least counter among tenants being served is lifted to
    it when it comes back (the paper's counter lift, here at each step). The order is the one
    VTC's admission loop would follow, charging `w-in` per prompt token for each pick; the
    `vtc-account` pass charges what was actually served. A request's tenant is its `tenant`
    request state (`Request(state={"tenant": 3})`, 0 by default).
    """

    name: ClassVar[str] = "vtc-order"
    requires: ClassVar[frozenset[str]] = frozenset({"admissible"})
    provides: ClassVar[frozenset[str]] = frozenset({"order"})
    request_state = (TENANT,)
    scheduler_state = (COUNTERS,)

    w_in: int = 1
    queue: str = "waiting"
    running: str = "running"

    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting", "running": "running"}

    def steady_state(self, ctx: WindowContext) -> dict[str, np.ndarray] | None:
        """A steady step sorts nobody admission could reach (its own window's rule) and writes the
        counter lift, as `run` does; a tenant out of range takes the IR (and its error)."""
        if not ctx.waiting.size:
            return {}
        counters = np.asarray(ctx.scheduler_state.get(COUNTERS.name, COUNTERS.initial()), dtype=np.float64)
        tenant = ctx.request_state(TENANT.name, ctx.waiting)
        if tenant.min() < 0 or tenant.max() >= counters.size:
            return None
        lifted = lift(counters, tenant, ctx.request_state(TENANT.name, ctx.running))
        return {} if np.array_equal(lifted, counters) else {COUNTERS.name: lifted}

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """One waiting request per tenant: the counter lift reads which tenants wait, not how many
        of each (the order itself matters only to admission, which declares its own window)."""
        if (self.queue, self.running) != ("waiting", "running"):
            return None
        return np.unique(ctx.request_state(TENANT.name, ctx.waiting), return_index=True)[1]

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        counters = np.asarray(step.state(COUNTERS.name, COUNTERS.initial()), dtype=np.float64)
        tenant = step.state_column(pending, TENANT.name, TENANT.default)
        ids = step.ids(pending)
        bad = (tenant < 0) | (tenant >= counters.size)
        if bad.any():
            raise PassFailure(self.name, f"request {int(ids[bad][0])} has tenant {int(tenant[bad][0])}; tenants "
                              f"are 0..{MAX_TENANTS - 1}")
        running = step.queue(self.running)
        served_now = np.zeros(0, dtype=np.int64)
        if running is not None and len(running):
            served_now = step.state_column(running.result, TENANT.name, TENANT.default)
        lifted = lift(counters, tenant, served_now)
        if not np.array_equal(lifted, counters):
            step.set_state(vtc_counter=lifted)
        arrival, computed, total = step.columns(pending, ("arrival", "computed", "total"))
        fcfs = np.argsort(arrival, kind="stable")
        picked = fcfs[vtc_pick_order(tenant[fcfs], (total - computed)[fcfs], lifted, float(self.w_in))]
        step.sort(pending, ("vtc-counter", "arrival"), ids[picked], picked=picked)
