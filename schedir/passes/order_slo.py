"""order-slo: serve first the waiting requests that can still meet their TTFT target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np

from schedir.dialects.codes import Reason
from schedir.ir.errors import PassFailure
from schedir.ir.pass_base import StepPass
from schedir.ir.state import RequestState
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import ANSWERED, ASK_IR, MEMO_SET, SC_NOW_US

TTFT_SLO = RequestState("ttft_slo_ms", default=0, doc="this request's TTFT target in ms; 0: the pass's ttft-slo-ms")
HOPELESS_MODES = ("last", "reject")
_SLO = int(Reason.SLO)


@numba.njit(cache=True, nogil=True)
def _meets(now_us: int, work: float, need: int, tokens_per_us: float, arrival_us: int, slo_us: int) -> bool:
    """The TTFT test: served after `work` tokens ahead of it, a request needing `need` has its first
    token within its target: `now + (work + need) / rate - arrival <= slo`."""
    return now_us + (work + need) / tokens_per_us - arrival_us <= slo_us


@numba.njit(cache=True, nogil=True)
def _target_us(slo_ms: float, default_slo_ms: int) -> int:
    """A request's TTFT target in µs: its own `ttft_slo_ms`, else the pass's."""
    return np.int64((slo_ms if slo_ms > 0 else default_slo_ms) * 1000)


@numba.njit(cache=True, nogil=True)
def feasible_first(arrival_us: np.ndarray, need: np.ndarray, slo_us: np.ndarray, now_us: int, backlog: int,
                   tokens_per_us: float) -> np.ndarray:
    """Walk the queue first come, first served, and keep a request when, served after the work
    already ahead of it (the backlog and the requests kept before it), its first token would
    come within its target: `now + (work + need) / rate - arrival <= slo`. A request that would
    miss adds no work: the requests behind it do not wait for it. Returns 1 (feasible) or 0."""
    n = arrival_us.size
    ok = np.zeros(n, dtype=np.int64)
    work = float(backlog)
    for i in range(n):
        if _meets(now_us, work, need[i], tokens_per_us, arrival_us[i], slo_us[i]):
            ok[i] = 1
            work += need[i]
    return ok


@numba.njit(cache=True, nogil=True)
def _targets(arrival: np.ndarray, computed: np.ndarray, total: np.ndarray, slo_ms: np.ndarray, waiting: np.ndarray,
             default_slo_ms: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`waiting`'s arrival (µs), tokens left, TTFT target (µs) and first-come order, gathered
    from the whole-table columns (ids into them)."""
    n = waiting.size
    arr = np.empty(n, dtype=np.int64)
    need = np.empty(n, dtype=np.int64)
    slo = np.empty(n, dtype=np.int64)
    for i in range(n):
        r = waiting[i]
        arr[i] = arrival[r]
        need[i] = total[r] - computed[r]
        slo[i] = _target_us(slo_ms[r], default_slo_ms)
    return arr, need, slo, first_come(arr)


@numba.njit(cache=True, nogil=True)
def first_come(arrival: np.ndarray) -> np.ndarray:
    """A stable sort's order of `arrival`: the identity, found in one pass, where the queue is
    already in arrival order (it is, but for preempted requests put back at its front)."""
    for i in range(1, arrival.size):
        if arrival[i] < arrival[i - 1]:
            return np.argsort(arrival, kind="mergesort")
    return np.arange(arrival.size)


@numba.njit(cache=True, nogil=True)
def all_feasible(arrival: np.ndarray, computed: np.ndarray, total: np.ndarray, slo_ms: np.ndarray,
                 waiting: np.ndarray, default_slo_ms: int, now_us: int, tokens_per_us: float) -> bool:
    """Whether every one of `waiting` (ids into the columns) would meet its target served now,
    first come first served, with nothing ahead of them (`feasible_first` with no backlog: every
    running request decodes)."""
    arr, need, slo, order = _targets(arrival, computed, total, slo_ms, waiting, default_slo_ms)
    n = waiting.size
    ok = feasible_first(arr[order], need[order], slo[order], now_us, 0, tokens_per_us)
    for i in range(n):
        if ok[i] == 0:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def _kept_in_arrival_order(arrival: np.ndarray, waiting: np.ndarray, refused: np.ndarray) -> bool:
    """Whether `waiting`'s requests not `refused` are in arrival order (`first_come`'s identity)."""
    last = np.iinfo(np.int64).min
    for i in range(waiting.size):
        if not refused[i]:
            a = arrival[waiting[i]]
            if a < last:
                return False
            last = a
    return True


@numba.njit(cache=True, nogil=True)
def slo_rank(arrival: np.ndarray, computed: np.ndarray, total: np.ndarray, slo_ms: np.ndarray, waiting: np.ndarray,
             refused: np.ndarray, default_slo_ms: int, now_us: int, backlog: int,
             tokens_per_us: float) -> tuple[np.ndarray, int]:
    """`OrderSlo`'s order of `waiting` (ids into the columns) as rank keys: each request's place in
    it (the feasible first come first served, then the hopeless), the `refused` positions
    (reject-oversized's) after all; and how many are feasible. `run` sorts its step by it and
    `waiting_rank` ranks the runtime's whole queue by it: one pass, no temporaries."""
    n = waiting.size
    if _kept_in_arrival_order(arrival, waiting, refused):  # the usual queue: one walk, no gathers
        keys = np.empty(n, dtype=np.int64)
        hopeless = np.zeros(n, dtype=np.bool_)
        work = float(backlog)
        place = 0
        for i in range(n):
            if refused[i]:
                keys[i] = n + i
                continue
            r = waiting[i]
            need = total[r] - computed[r]
            if _meets(now_us, work, need, tokens_per_us, arrival[r], _target_us(slo_ms[r], default_slo_ms)):
                keys[i] = place
                place += 1
                work += need
            else:
                hopeless[i] = True
        feasible = place
        for i in range(n):
            if hopeless[i]:
                keys[i] = place
                place += 1
        return keys, feasible
    keep = np.empty(n, dtype=np.int64)
    m = 0
    for i in range(n):
        if not refused[i]:
            keep[m] = i
            m += 1
    keep = keep[:m]
    arr, need, slo, order = _targets(arrival, computed, total, slo_ms, waiting[keep], default_slo_ms)
    ok = feasible_first(arr[order], need[order], slo[order], now_us, backlog, tokens_per_us)
    keys = np.arange(n, 2 * n)
    place = 0
    feasible = 0
    for want in (1, 0):
        for j in range(m):
            if ok[j] == want:
                keys[keep[order[j]]] = place
                place += 1
        if want == 1:
            feasible = place
    return keys, feasible


def prefill_backlog(prompt: np.ndarray, computed: np.ndarray) -> int:
    """The prompt tokens the running requests have yet to compute: work ahead of every waiting one."""
    return int(np.maximum(prompt - computed, 0).sum())


_FAR_US = 1 << 62  # beyond any clock: a request that always / never meets its target


@numba.njit(cache=True, nogil=True)
def last_feasible_us(arrival: np.ndarray, computed: np.ndarray, total: np.ndarray, slo_ms: np.ndarray,
                     waiting: np.ndarray, default_slo_ms: int, tokens_per_us: float) -> int:
    """The latest clock (µs) at which `all_feasible` holds for `waiting`: it holds exactly while
    now_us <= this (each request's test, with every one ahead of it kept, only fails later as
    the clock moves), so a steady step compares the clock with it, read once while the queue
    stays as it is, not the whole queue every step. Each bound is solved from `feasible_first`'s
    own arithmetic, then nudged to the exact integer where that arithmetic flips."""
    arr, need, slo, order = _targets(arrival, computed, total, slo_ms, waiting, default_slo_ms)
    n = waiting.size
    last = _FAR_US
    work = 0.0
    for k in range(n):
        i = order[k]
        late = (work + need[i]) / tokens_per_us
        bound = slo[i] + arr[i] - late
        if bound <= -_FAR_US:
            return -_FAR_US
        if bound < _FAR_US:
            t = int(np.floor(bound))
            while t + 1 + late - arr[i] <= slo[i]:  # `feasible_first`'s test at now = t + 1
                t += 1
            while not (t + late - arr[i] <= slo[i]):
                t -= 1
            last = min(last, t)
        work += need[i]
    return last


@numba.njit(cache=True, nogil=True)
def slo_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, order, rows, w, m, over) -> int:  # noqa: ANN001
    """`OrderSlo.steady_state` in the steady program: only ordering (`last`), nothing; rejecting the
    hopeless, the clock compared with the latest at which every waiting request stays feasible,
    kept in the memo while the queue stays (`m[1]`, as the Python answer keeps it with
    `WindowContext.queued`)."""
    if o[0] == 0 or waiting.size == 0:
        return ANSWERED
    now = sc[SC_NOW_US]
    if now < 0:
        return ASK_IR
    if m[MEMO_SET] == 0:
        m[1] = last_feasible_us(D[int(o[1])], D[int(o[2])], D[int(o[3])], ST[int(o[4])], waiting, int(o[5]), o[6])
        m[MEMO_SET] = 1
    return ANSWERED if now <= m[1] else ASK_IR


@dataclass(frozen=True)
class OrderSlo(StepPass):
    """Order the waiting queue so that requests that can still meet their TTFT target go first.

    Under overload, first-come-first-served makes every request late: the queue's head has
    waited longest and misses its target anyway, while it delays everyone behind it. This pass
    predicts each waiting request's first-token time if served now, in arrival order, from the
    prefill work ahead of it (running requests' unfinished prompts, then the requests kept
    before it) at `prefill-tokens-per-s` (schedir's cost model gives ~30k for Llama-3-8B on one
    H100; the default leaves room for the decodes sharing each step). Requests that would meet
    their target keep arrival order at the front; the others, `hopeless`, go behind them
    (`last`: they run when capacity is left, so nobody is dropped) or are rejected at once with
    reason `slo` (`reject`: the client learns now instead of after the timeout).

    A request's target is its `ttft_slo_ms` request state (given as
    `Request(state={"ttft_slo_ms": 500})`), else the `ttft-slo-ms` option. Needs the step's
    clock (`now_us`, which the runtime records for a pass that declares reads_clock). Deadline-aware admission is one
    of the policies vLLM users ask for and vLLM lacks (issue 15, item 7).
    """

    name: ClassVar[str] = "order-slo"
    # steady decode steps: over the waiting queue: a steady step's is empty
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting"}
    requires: ClassVar[frozenset[str]] = frozenset({"admissible"})
    provides: ClassVar[frozenset[str]] = frozenset({"order"})
    request_state = (TTFT_SLO,)
    reads_clock: ClassVar[bool] = True

    ttft_slo_ms: int = 2000
    prefill_tokens_per_s: int = 20000
    hopeless: str = "last"
    queue: str = "waiting"
    running: str = "running"

    def __post_init__(self) -> None:
        if self.ttft_slo_ms < 1 or self.prefill_tokens_per_s < 1:
            raise ValueError("ttft-slo-ms and prefill-tokens-per-s must be >= 1")
        if self.hopeless not in HOPELESS_MODES:
            raise ValueError(f"hopeless must be one of {', '.join(HOPELESS_MODES)}, got '{self.hopeless}'")

    steady_lowered = staticmethod(slo_steady_lowered)

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (float(self.hopeless != "last"), layout.column("arrival"), layout.column("computed"),
                layout.column("total"), layout.state(TTFT_SLO.name), self.ttft_slo_ms,
                self.prefill_tokens_per_s / 1e6)

    def steady_state(self, ctx: WindowContext) -> dict[str, float] | None:
        """Rejecting the hopeless, a step is steady only when no waiting request is hopeless now
        (then `run` only sorts); only ordering, its window's rule (nobody of its own)."""
        if self.hopeless == "last" or not ctx.waiting.size:
            return super().steady_state(ctx)
        if self.queue != "waiting" or ctx.now_us < 0 or ctx.column_of is None or ctx.state_of is None:
            return None
        # the clock up to which every waiting request stays feasible, held while the queue stays as
        # it is (`WindowContext.queued`): the step does not grow with the queue
        column_of, state_of = ctx.column_of, ctx.state_of
        last = ctx.queued(("order-slo-last-feasible", self.ttft_slo_ms, self.prefill_tokens_per_s),
                          lambda: last_feasible_us(column_of("arrival"), column_of("computed"), column_of("total"),
                                                   state_of(TTFT_SLO.name), ctx.waiting, self.ttft_slo_ms,
                                                   self.prefill_tokens_per_s / 1e6))
        return {} if ctx.now_us <= last else None

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """Nobody of its own when it only orders (`last`: admission picks from the order); every
        request when it rejects the hopeless (each is judged every step)."""
        return ctx.NONE if self.hopeless == "last" else None

    def waiting_rank(self, ctx: WindowContext) -> tuple[np.ndarray, np.ndarray] | None:
        """Each waiting request's place in the order `run` gives the queue (`last`: the feasible in
        arrival order, then the hopeless), the requests reject-oversized refuses after all (gone
        when this pass runs): admission (`vllm-admit`) names the head of it as its window. The
        head's feasibility is the whole queue's: a request's test reads only the feasible requests
        ahead of it, and the head holds all of those. None when it rejects (it judges every one)."""
        if (self.hopeless != "last" or (self.queue, self.running) != ("waiting", "running") or ctx.now_us < 0
                or ctx.column_of is None or ctx.state_of is None):
            return None
        return ctx.shared(("slo-rank", self), lambda: self._rank(ctx))  # type: ignore[return-value]

    def _rank(self, ctx: WindowContext) -> tuple[np.ndarray, np.ndarray]:
        refused = np.zeros(ctx.waiting.size, dtype=np.bool_)
        refused[ctx.oversized] = True
        column, computed = ctx.column_of, ctx.column_of("computed")  # type: ignore[misc]
        backlog = prefill_backlog(column("prompt")[ctx.running], computed[ctx.running])  # type: ignore[misc]
        keys, _ = slo_rank(column("arrival"), computed, column("total"), ctx.state_of(TTFT_SLO.name),  # type: ignore[misc]
                        ctx.waiting, refused, self.ttft_slo_ms, ctx.now_us, backlog, self.prefill_tokens_per_s / 1e6)
        return keys, np.zeros(ctx.swapped.size, dtype=np.int64)

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        now = step.facts.now_us
        if now < 0:
            raise PassFailure(self.name, "the step has no clock (now_us): it predicts time to first token from "
                              "now; give the step a now_us fact (the runtime records one for passes that declare reads_clock)")
        ids = step.ids(pending)
        arrival, computed, total = step.columns(pending, ("arrival", "computed", "total"))
        backlog = 0
        running = step.queue(self.running)
        if running is not None and len(running):
            backlog = prefill_backlog(running.columns.get("prompt"), running.columns.get("computed"))
        n = ids.size
        keys, feasible = slo_rank(arrival, computed, total, step.state_column(pending, TTFT_SLO.name, 0),
                                  np.arange(n), np.zeros(n, dtype=np.bool_), self.ttft_slo_ms, now, backlog,
                                  self.prefill_tokens_per_s / 1e6)
        order = np.empty(n, dtype=np.int64)
        order[keys] = np.arange(n)  # the feasible in arrival order, then the hopeless
        if self.hopeless == "reject" and feasible < n:
            bad = order[feasible:]
            step.reject(pending, ids[bad], np.full(bad.size, _SLO, dtype=np.int64))
            keep = order[:feasible]
            if keep.size:  # the rest, in arrival order
                step.keep(pending, ids[keep], picked=keep)
            return
        step.sort(pending, ("ttft-feasible desc", "arrival"), ids[order], picked=order)

