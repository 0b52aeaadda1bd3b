"""vtc-order: serve first the backlogged tenant with the least weighted service (VTC)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np

from schedir.ir.errors import PassFailure
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import UNRANKED, WINDOW_SLACK, WindowContext
from schedir.passes.order_slo import first_come
from schedir.passes.vtc_state import COUNTERS, MAX_TENANTS, TENANT, Lift, lift_to_floor


@numba.njit(cache=True, nogil=True, inline="always")
def _least_served(c: np.ndarray, active: np.ndarray, m: int) -> int:
    """The place in `active[:m]` (backlogged tenants, in id order) of the tenant whose counter is
    least, the lower id on ties: VTC's next pick."""
    at = 0
    for j in range(1, m):
        if c[active[j]] < c[active[at]]:
            at = j
    return at


@numba.njit(cache=True, nogil=True, inline="always")
def _drop_backlogged(active: np.ndarray, at: int, m: int) -> int:
    """`active[:m]` without its place `at` (a tenant whose last waiting request was picked)."""
    for j in range(at, m - 1):
        active[j] = active[j + 1]
    return m - 1


@numba.njit(cache=True, nogil=True)
def vtc_pick_order(tenant: np.ndarray, need: np.ndarray, counters: np.ndarray, w_in: float) -> np.ndarray:
    """The order VTC would admit these waiting requests (given in arrival order): again and again
    the next request of the tenant whose counter, charged for what it was given so far, is
    smallest (ties: the lower tenant id); each pick charges `w_in` per prompt token to compute.
    Each pick scans the backlogged tenants only (kept in id order), not every counter."""
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
    active = np.empty(c.size, dtype=np.int64)  # the backlogged tenants, in id order
    m = 0
    for t in range(c.size):
        if nxt[t] >= 0:
            active[m] = t
            m += 1
    order = np.empty(n, dtype=np.int64)
    for k in range(n):
        at = _least_served(c, active, m)
        best = active[at]
        i = nxt[best]
        order[k] = i
        c[best] += w_in * need[i]
        nxt[best] = link[i]
        if nxt[best] < 0:  # its last request: no longer backlogged
            m = _drop_backlogged(active, at, m)
    return order


@numba.njit(cache=True, nogil=True)
def first_per_tenant(tenant: np.ndarray, waiting: np.ndarray, tenants: int) -> np.ndarray:
    """Positions in `waiting` (ids into `tenant`) of each tenant's first request there, and of
    every request whose tenant is out of 0..tenants-1 (the step refuses those): one pass, where
    np.unique sorts the whole queue."""
    seen = np.zeros(tenants, dtype=np.bool_)
    out = np.empty(waiting.size, dtype=np.int64)
    m = 0
    for i in range(waiting.size):
        t = tenant[waiting[i]]
        if t < 0 or t >= tenants:
            out[m] = i
            m += 1
        elif not seen[t]:
            seen[t] = True
            out[m] = i
            m += 1
    return out[:m].copy()


@numba.njit(cache=True, nogil=True)
def lifted_past_running(counters: np.ndarray, back: np.ndarray, running: np.ndarray,
                        tenant_of: np.ndarray) -> np.ndarray:
    """The counters lifted (`lift_to_floor`) for the tenants waiting (`back`, a mask it clears
    for them) with none of `running`'s (ids into `tenant_of`) among their requests."""
    served = np.zeros(counters.size, dtype=np.bool_)
    for i in range(running.size):
        t = tenant_of[running[i]]
        if 0 <= t < counters.size:
            back[t] = False
            served[t] = True
    return lift_to_floor(counters, back, served)


@numba.njit(cache=True, nogil=True)
def vtc_rank_keys(waiting: np.ndarray, refused: np.ndarray, running: np.ndarray, tenant_of: np.ndarray,
                  arrival_of: np.ndarray, total_of: np.ndarray, computed_of: np.ndarray, counters: np.ndarray,
                  w_in: float) -> tuple[bool, np.ndarray, np.ndarray]:
    """VTC's order of `waiting` (ids into the columns) as rank keys, in one pass and no temporaries
    over the queue: each gets its place in VTC's pick order (`vtc_pick_order`, in arrival order)
    over the counters lifted (tenants waiting and not among `running`'s raised to the least
    counter served), the `refused` positions (a mask) n + their position, after all; and the
    lifted counters. `run` orders its step by it and `waiting_rank` ranks the runtime's queue by
    it: one rule. (False, ...) when a kept request's tenant has no counter."""
    n = waiting.size
    tenants = counters.size
    keys = np.empty(n, dtype=np.int64)
    kept = np.empty(n, dtype=np.int64)  # positions in `waiting` of the requests ranked by VTC
    back = np.zeros(tenants, dtype=np.bool_)
    m = 0
    for i in range(n):
        if refused[i]:
            keys[i] = n + i
            continue
        t = tenant_of[waiting[i]]
        if t < 0 or t >= tenants:
            return False, keys, counters
        back[t] = True
        kept[m] = i
        m += 1
    lifted = lifted_past_running(counters, back, running, tenant_of)
    arrival = np.empty(m, dtype=np.int64)
    for j in range(m):
        arrival[j] = arrival_of[waiting[kept[j]]]
    fcfs = first_come(arrival)
    tenant = np.empty(m, dtype=np.int64)
    need = np.empty(m, dtype=np.int64)
    for j in range(m):
        r = waiting[kept[fcfs[j]]]
        tenant[j] = tenant_of[r]
        need[j] = total_of[r] - computed_of[r]
    picks = vtc_pick_order(tenant, need, lifted, w_in)
    for place in range(m):
        keys[kept[fcfs[picks[place]]]] = place
    return True, keys, lifted


_IN_ORDER, _OUT_OF_ARRIVAL_ORDER = 1, 2  # vtc_head_keys' outcomes (0: a tenant out of range)


@numba.njit(cache=True, nogil=True)
def vtc_head_keys(waiting: np.ndarray, refused: np.ndarray, running: np.ndarray, tenant_of: np.ndarray,
                  arrival_of: np.ndarray, total_of: np.ndarray, computed_of: np.ndarray, counters: np.ndarray,
                  w_in: float, k: int) -> tuple[int, np.ndarray, int]:
    """`vtc_rank_keys`' first `k` places only, for a queue in arrival order: each pick takes its
    tenant's next request in arrival order, so k picks read at most each tenant's first k
    requests, and the pick loop runs k times, not once per waiting request. Returns (outcome,
    keys, placed): the first `placed` picks keyed 0..placed-1, the others `UNRANKED` and up in
    queue order (every one placed, the refused after all as `vtc_rank_keys` keys them, where k
    picks take every kept request); outcome 0 where a kept request's tenant has no counter,
    `_OUT_OF_ARRIVAL_ORDER` where the queue is not in arrival order (`vtc_rank_keys` sorts it)."""
    n = waiting.size
    tenants = counters.size
    keys = np.empty(n, dtype=np.int64)
    count = np.zeros(tenants, dtype=np.int64)
    first = np.empty(tenants * k, dtype=np.int64)  # each tenant's first k kept positions, in queue order
    back = np.zeros(tenants, dtype=np.bool_)
    m = 0
    last = np.iinfo(np.int64).min
    for i in range(n):
        if refused[i]:
            continue
        r = waiting[i]
        t = tenant_of[r]
        if t < 0 or t >= tenants:
            return 0, keys, 0
        if arrival_of[r] < last:
            return _OUT_OF_ARRIVAL_ORDER, keys, 0
        last = arrival_of[r]
        back[t] = True
        if count[t] < k:
            first[t * k + count[t]] = i
        count[t] += 1
        m += 1
    complete = m <= k
    for i in range(n):  # the unplaced: after every placed one (the refused after all, as vtc_rank_keys)
        keys[i] = (n + i if complete else UNRANKED + n + i) if refused[i] else UNRANKED + i
    c = lifted_past_running(counters, back, running, tenant_of)
    active = np.empty(tenants, dtype=np.int64)  # the backlogged tenants, in id order (vtc_pick_order's)
    cursor = np.zeros(tenants, dtype=np.int64)
    a = 0
    for t in range(tenants):
        if count[t] > 0:
            active[a] = t
            a += 1
    placed = min(k, m)
    for place in range(placed):
        at = _least_served(c, active, a)
        best = active[at]
        i = first[best * k + cursor[best]]
        keys[i] = place
        r = waiting[i]
        c[best] += w_in * (total_of[r] - computed_of[r])
        cursor[best] += 1
        if cursor[best] == count[best]:  # its last request: no longer backlogged
            a = _drop_backlogged(active, at, a)
    return _IN_ORDER, keys, n if complete else placed


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
        waiting = ctx.waiting[self._one_per_tenant(ctx)]
        outcome, back, served = lift_sets(tenant, waiting, ctx.running, COUNTERS.size)
        if outcome == _OUT_OF_RANGE:
            return None
        return {COUNTERS.name: Lift(back, served)} if outcome == _LIFTED else {}

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """One waiting request per tenant: the counter lift reads which tenants wait, not how many
        of each (the order itself matters only to admission, which declares its own window)."""
        if (self.queue, self.running) != ("waiting", "running"):
            return None
        return self._one_per_tenant(ctx)

    @staticmethod
    def _one_per_tenant(ctx: WindowContext) -> np.ndarray:
        """Positions in `ctx.waiting` of one waiting request per tenant (`first_per_tenant`), held
        while the queue stays as it is (`WindowContext.queued`): the steady step and the window
        both ask it."""
        def first() -> np.ndarray:
            tenant = ctx.state_of(TENANT.name) if ctx.state_of is not None else None
            if tenant is None:  # outside a runtime: gather the queue's
                return first_per_tenant(ctx.request_state(TENANT.name, ctx.waiting), np.arange(ctx.waiting.size),
                                        COUNTERS.size)
            return first_per_tenant(tenant, ctx.waiting, COUNTERS.size)

        return ctx.queued("vtc-one-per-tenant", first)  # type: ignore[return-value]

    def waiting_rank(self, ctx: WindowContext) -> tuple[np.ndarray, np.ndarray] | None:
        """Each waiting request's place in the order `run` gives the queue (`vtc_pick_order` over
        the lifted counters, as `run` lifts them), the requests reject-oversized refuses ranked
        after all (they are gone when this pass runs): the head of this order is what admission
        walks first (`vllm-admit` names it as its window, `schedir.ir.window`). None (no ranked
        window) where a tenant is out of range: the IR step raises its error."""
        if (self.queue, self.running) != ("waiting", "running") or ctx.state_of is None or ctx.column_of is None:
            return None
        return ctx.shared(("vtc-rank", self), lambda: self._rank(ctx))  # type: ignore[return-value]

    def _rank(self, ctx: WindowContext) -> tuple[np.ndarray, np.ndarray] | None:
        refused = np.zeros(ctx.waiting.size, dtype=np.bool_)
        refused[ctx.oversized] = True
        counters = ctx.scheduler_state.get(COUNTERS.name)
        counters = np.asarray(COUNTERS.initial() if counters is None else counters, dtype=np.float64)
        column = ctx.column_of
        # a head asked of the rank is at most max_seqs + WINDOW_SLACK long (the runtime's ranked
        # head, or admission's reach into free seats): place that many, not the whole queue (a
        # partial rank)
        k = max(ctx.head_size, ctx.max_seqs + WINDOW_SLACK)
        if ctx.waiting.size > 2 * k:
            outcome, keys, placed = vtc_head_keys(
                ctx.waiting, refused, ctx.running, ctx.state_of(TENANT.name), column("arrival"),  # type: ignore[misc]
                column("total"), column("computed"), counters, float(self.w_in), k)  # type: ignore[misc]
            if outcome == 0:
                return None
            if outcome == _IN_ORDER:
                if placed < keys.size:
                    ctx.partial_rank(keys, placed)
                return keys, np.zeros(ctx.swapped.size, dtype=np.int64)
        ok, keys, _ = vtc_rank_keys(ctx.waiting, refused, ctx.running, ctx.state_of(TENANT.name),  # type: ignore[misc]
                                 column("arrival"), column("total"), column("computed"),  # type: ignore[misc]
                                 counters, float(self.w_in))
        return (keys, np.zeros(ctx.swapped.size, dtype=np.int64)) if ok else None

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
        arrival, computed, total = step.columns(pending, ("arrival", "computed", "total"))
        n = ids.size  # the kernel reads the pending requests' columns by position, tenants of both queues
        _, keys, lifted = vtc_rank_keys(np.arange(n), np.zeros(n, dtype=np.bool_), np.arange(n, n + served_now.size),
                                        np.concatenate([tenant, served_now]).astype(np.int64), arrival, total,
                                        computed, counters, float(self.w_in))
        picked = np.empty(n, dtype=np.int64)
        picked[keys] = np.arange(n)
        if not np.array_equal(lifted, counters):
            step.set_state(vtc_counter=lifted)
        step.sort(pending, ("vtc-counter", "arrival"), ids[picked], picked=picked)
