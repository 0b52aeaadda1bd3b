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
from schedir.passes.vtc_state import COUNTERS, MAX_TENANTS, TENANT, Lift, lift_to_floor


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


_OUT_OF_RANGE, _UNCHANGED, _LIFTED = range(3)


@numba.njit(cache=True, nogil=True)
def lift_sets(tenant: np.ndarray, waiting: np.ndarray, running: np.ndarray, tenants: int):
    """The lift's tenant sets, `waiting` and `running` positions in `tenant` (request ids, for a
    steady step): (_LIFTED, back, served) when some tenant waits with none of its requests
    running (`back`; `served`: the tenants running), (_UNCHANGED, ...) when none does,
    (_OUT_OF_RANGE, ...) when a waiting request's tenant has no counter."""
    back = np.zeros(tenants, dtype=np.bool_)
    served = np.zeros(tenants, dtype=np.bool_)
    for i in range(waiting.size):
        t = tenant[waiting[i]]
        if t < 0 or t >= tenants:
            return _OUT_OF_RANGE, back, served
        back[t] = True
    for i in range(running.size):
        t = tenant[running[i]]
        if 0 <= t < tenants:  # (checked at arrival: `TENANT`'s bounds)
            back[t] = False
            served[t] = True
    for t in range(tenants):
        if back[t] and running.size:
            return _LIFTED, back, served
    return _UNCHANGED, back, served


@numba.njit(cache=True, nogil=True)
def lift(counters: np.ndarray, tenant: np.ndarray, waiting: np.ndarray, served: np.ndarray) -> np.ndarray:
    """VTC's counter lift: a tenant with requests `waiting` and none among those `served` (both
    positions in `tenant`, checked in range) comes back no lower than the least counter of the
    tenants being served (`vtc_state.lift_to_floor`)."""
    _, back, serving = lift_sets(tenant, waiting, served, counters.size)
    return lift_to_floor(counters, back, serving)


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
    # its steady answer is a transition (the lift, whatever the counters are): held while the
    # queues and the tenants are the same
    steady_reads: ClassVar[frozenset[str]] = frozenset()

    def steady_state(self, ctx: WindowContext) -> dict[str, Lift] | None:
        """A steady step sorts nobody admission could reach (its own window's rule) and lifts the
        counters as `run` does: a `Lift` of the tenants waiting and not served to the least
        counter of those served, or nothing when every waiting tenant is served; a tenant out of
        range takes the IR (and its error)."""
        if not ctx.waiting.size:
            return {}
        if ctx.state_of is None:
            return None
        tenant = ctx.state_of(TENANT.name)
        # the lift reads which tenants wait: one waiting request per tenant, held while the queue
        # stays as it is (`WindowContext.queued`), so the step does not grow with the queue
        waiting = ctx.queued("vtc-one-per-tenant", lambda: ctx.waiting[np.unique(tenant[ctx.waiting],
                                                                                 return_index=True)[1]])
        outcome, back, served = lift_sets(tenant, waiting, ctx.running, COUNTERS.size)
        if outcome == _OUT_OF_RANGE:
            return None
        return {COUNTERS.name: Lift(back, served)} if outcome == _LIFTED else {}

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
        both = np.concatenate([tenant, served_now])  # lift reads positions into one tenant column
        lifted = lift(counters, both, np.arange(tenant.size), np.arange(tenant.size, both.size))
        if not np.array_equal(lifted, counters):
            step.set_state(vtc_counter=lifted)
        arrival, computed, total = step.columns(pending, ("arrival", "computed", "total"))
        fcfs = np.argsort(arrival, kind="stable")
        picked = fcfs[vtc_pick_order(tenant[fcfs], (total - computed)[fcfs], lifted, float(self.w_in))]
        step.sort(pending, ("vtc-counter", "arrival"), ids[picked], picked=picked)
