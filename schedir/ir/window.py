"""What a pass can act on in the next step: the waiting requests a runtime must put in it.

A runtime holding thousands of waiting requests need not put them all in every step: most
steps can only act on a few (none while the running batch is full). Each pass may declare,
with `StepPass.waiting_window(ctx)`, which waiting requests it could act on in a step built
from the runtime's state now: their positions in `ctx.waiting` (an int64 array, in any order),
or None (every one, the default). The runtime puts the union in the step, in queue order, and
the whole queue when any pass of the pipeline declares nothing; the decisions must be those of the whole queue (each
declaring pass tests that), only the IR is smaller. State a pass keeps is read here as the
step would show it (`scheduler_state`, `request_state`).

**Ranked windows.** A walk that admits greedily (it skips a request that does not fit and goes
on) can reach any request of the queue, so its exact window is the whole queue. Where an order
pass ranks the queue by a key (`StepPass.waiting_rank`: FastServe's (level, arrival)) and the
walkers declare that they act in that order only while sequence slots and token budget last
(`StepPass.walks_ranked`: admit-greedy, mlfq-swap-in), the runtime builds the step over the head
of that order (`first_by_rank`: the seats the walks can fill + 16 requests, `seats_to_fill`: the
free seats and those the passes free, every seat where blocks run short) plus what the other
passes name, and
checks the step after the pipeline ran (`Scheduler._ranked_window_held`): the walkers took nobody
past the head and ran out of slots or budget within it, and a swapped request ranked past a
request left out was not reached (deferred for slots or budget). Where the check fails the step
is built again over the whole queue, so the decisions are always the whole queue's. A pass that
frees slots by its own rule (`mlfq-order` displacing running jobs) says so, and how many at most
(`frees_seats`: the running jobs of a level below the queue's best), so admission does not
answer "nobody" from `seats_stay_taken` and its head is no longer than those seats need. A
long swapped queue gets the same treatment (`StepPass.swapped_window`): the step holds the
first `seats_to_fill` + 16 swapped requests by rank plus what the passes name (the jobs
`mlfq-levels` moves), since a walk that resumes a swapped request only into a free seat stops
within the first `seats_to_fill` + 1.

**Composed ranks.** Several order passes in a row (the seed's `with-all-passes`: prefix hits,
then length groups, then priority) sort the step's order stably one after the other, so the
last one's key ranks first and each earlier one breaks the ties left (equal priority and
arrival). Each declares its key as dense columns (`StepPass.rank_columns`: small integers, the
queue's dense arrival rank among them) and `WindowContext.composed_rank` packs them, the last
pass's first, into one int64 key (None where a pass declares none or they do not fit). A pass
whose key reads the step's queue as a whole (batching-efficiency's group leads: each group's
oldest member) names what keeps it whole in its own window.

**Partial ranks.** A rank whose head alone is cheap (VTC's picks: the first k read only each
tenant's first k requests) may place only its head: keys from `UNRANKED` up mean "after every
placed one, in no known order", and the pass says how many it placed (`partial_rank`). A head
asked of it (`first_by_rank`, `reach`) that would reach past the placed ones is None, the
whole queue, so a window never rests on an order nobody computed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar

import attrs
import numba
import numpy as np


_SEATS_FREED = "seats-freed-by-policy"  # WindowContext.frees_seats
# waiting requests beyond max_num_seqs that still enter a step over a window: the runtime's heads
# (a ranked head, the vllm window) are max_num_seqs + WINDOW_SLACK long at most
WINDOW_SLACK = 16
_NO_CAP = 1 << 62  # (`WindowContext.running_growth` without a cap: every known token counts)
UNRANKED = 1 << 60  # a rank key from here up: after every placed request, in no known order (partial ranks)


@numba.njit(cache=True, nogil=True)
def _before(key_a: int, pos_a: int, key_b: int, pos_b: int) -> bool:
    """(key, position) order: the rank's order, equal keys by position."""
    return key_a < key_b or (key_a == key_b and pos_a < pos_b)


@numba.njit(cache=True, nogil=True)
def _sift_down(hk: np.ndarray, hp: np.ndarray, size: int, key: int, pos: int) -> None:
    """Put (key, pos) at the root of the max-heap (hk, hp)[:size] and sift it down."""
    j = 0
    while True:
        child = 2 * j + 1
        if child >= size:
            break
        if child + 1 < size and _before(hk[child], hp[child], hk[child + 1], hp[child + 1]):
            child += 1
        if not _before(key, pos, hk[child], hp[child]):
            break
        hk[j], hp[j] = hk[child], hp[child]
        j = child
    hk[j], hp[j] = key, pos


@numba.njit(cache=True, nogil=True)
def _offer(hk: np.ndarray, hp: np.ndarray, size: int, k: int, key: int, pos: int) -> int:
    """Offer (key, pos) to the max-heap (hk, hp)[:size] of the first `k` seen: pushed while it
    holds fewer, sifting up past smaller parents; else in place of its last when ahead of it
    (an equal key comes later by position). Returns the heap's new size."""
    if size < k:
        j = size
        while j > 0:
            parent = (j - 1) // 2
            if not _before(hk[parent], hp[parent], key, pos):
                break
            hk[j], hp[j] = hk[parent], hp[parent]
            j = parent
        hk[j], hp[j] = key, pos
        return size + 1
    if size > 0 and key < hk[0]:  # (a heap of none, k = 0, takes nobody)
        _sift_down(hk, hp, size, key, pos)
    return size


@numba.njit(cache=True, nogil=True)
def running_block_need(running: np.ndarray, total_of: np.ndarray, placeholders_of: np.ndarray, blocks_of: np.ndarray,
                       block_size: int, cap: int, extra: int) -> int:
    """The blocks the running requests need beyond those they hold, summed over them: each one's
    known tokens (`total`, plus its `placeholders` where that column is given, not empty), at
    most `cap`, in blocks, + `extra`, less its held blocks, at least 0; one pass over ids into
    the table's columns and the pool's block counts (eight numpy calls and their gathers before)."""
    need = 0
    with_placeholders = placeholders_of.size > 0
    for i in range(running.size):
        r = running[i]
        known = total_of[r] + placeholders_of[r] if with_placeholders else total_of[r]
        blocks = -(-min(known, cap) // block_size) + extra - blocks_of[r]
        if blocks > 0:
            need += blocks
    return need


@numba.njit(cache=True, nogil=True)
def head_in_rank_order(keys: np.ndarray, k: int) -> np.ndarray:
    """Positions of the first `k` of `keys` by (key, position), in that order: one pass keeping
    them in a max-heap (O(n log k), no temporaries over the whole queue), then the heap drained."""
    n = keys.size
    k = min(k, n)
    hk = np.empty(k, dtype=np.int64)
    hp = np.empty(k, dtype=np.int64)
    size = 0
    for i in range(n):
        size = _offer(hk, hp, size, k, keys[i], i)
    out = np.empty(size, dtype=np.int64)
    while size > 0:  # drain the largest first, filling from the end
        size -= 1
        out[size] = hp[0]
        if size > 0:
            _sift_down(hk, hp, size, hk[size], hp[size])
    return out


@numba.njit(cache=True, nogil=True)
def reach_positions(keys: np.ndarray, skipped: np.ndarray, k: int) -> np.ndarray:
    """Ascending positions of every `skipped` one (a mask) and of the first `k` of the others by
    (key, position): `WindowContext.reach` in one pass over the queue (a max-heap of the k first,
    as `head_in_rank_order`), without the whole-queue temporaries a masked rank costs."""
    n = keys.size
    hk = np.empty(max(k, 1), dtype=np.int64)
    hp = np.empty(max(k, 1), dtype=np.int64)
    size = 0
    inside = np.zeros(n, dtype=np.bool_)
    for i in range(n):
        if skipped[i]:
            inside[i] = True
            continue
        size = _offer(hk, hp, size, k, keys[i], i)
    for j in range(size):
        inside[hp[j]] = True
    return np.flatnonzero(inside)


def rank_head(keys: np.ndarray, k: int) -> np.ndarray:
    """Positions of the first `k` of `keys` by (key, position), in that order: the heap's pass
    for a short head (admission's free seats), one partition and a sort of the head for a long
    one (max_num_seqs + 16: the heap's log k then costs more), where key * n fits."""
    n = keys.size
    if n <= k:
        return np.argsort(keys, kind="stable")
    if 8 * k <= n or keys.min() < 0 or int(keys.max()) >= (1 << 62) // n:
        return head_in_rank_order(keys, k)
    head = np.argpartition(keys * n + np.arange(n), k - 1)[:k]
    return head[np.lexsort((head, keys[head]))]


def first_by_rank(keys: np.ndarray, k: int) -> np.ndarray:
    """Positions of the first `k` of `keys` in a stable sort's order (equal keys in position
    order, as a pass's stable sort of the step's queue leaves them), ascending: a ranked
    window's head (`StepPass.waiting_rank`)."""
    if keys.size <= k:
        return np.arange(keys.size)
    return np.sort(rank_head(keys, k))


@attrs.frozen(eq=False)
class RankColumn:
    """One column of an order pass's sort key (`StepPass.rank_columns`): small non-negative
    integers below `bound`, one per waiting request, ascending first. Columns of one `name`
    hold the same values (the queue's arrival rank): a repeat after the first adds no order."""

    name: str
    values: np.ndarray
    bound: int


@numba.njit(cache=True, nogil=True)
def dense_arrival_rank(arrival_of: np.ndarray, waiting: np.ndarray) -> tuple[bool, np.ndarray]:
    """Each waiting request's arrival as its rank among the queue's distinct arrivals (equal
    arrivals equal ranks), in one pass where the queue is in arrival order (the runtime's usual
    queue); (False, ...) where it is not (the caller sorts)."""
    n = waiting.size
    out = np.empty(n, dtype=np.int64)
    r = 0
    for i in range(n):
        if i:
            d = arrival_of[waiting[i]] - arrival_of[waiting[i - 1]]
            if d < 0:
                return False, out
            if d > 0:
                r += 1
        out[i] = r
    return True, out


def arrival_rank_column(arrival: np.ndarray, waiting: np.ndarray) -> RankColumn:
    """The waiting requests' dense arrival rank (`dense_arrival_rank`; a sort where the queue is
    out of arrival order) as the rank column "arrival" every FCFS tie-break shares."""
    ok, ranks = dense_arrival_rank(arrival, waiting)
    if not ok:
        values = arrival[waiting]
        distinct = np.unique(values)
        ranks = np.searchsorted(distinct, values).astype(np.int64)
    return RankColumn("arrival", ranks, int(ranks.max()) + 1 if ranks.size else 1)


@numba.njit(cache=True, nogil=True)
def ranked_window_marks(n: int, named: np.ndarray, head: np.ndarray,
                        keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """A ranked window over a queue of `n`: the ascending positions of the union of `named` (what
    the passes name) and `head` (the rank's head), those of the union outside the head (what the
    walkers must not take), and the least key of the positions left out (int64 max: none), in
    two passes (seven numpy passes over the queue and their temporaries before)."""
    mark = np.zeros(n, dtype=np.int8)  # 1: named, 2: in the head
    for p in named:
        mark[p] = 1
    for p in head:
        mark[p] = 2
    count = 0
    beyond_count = 0
    least = np.iinfo(np.int64).max
    for i in range(n):
        if mark[i]:
            count += 1
            if mark[i] == 1:
                beyond_count += 1
        elif keys[i] < least:
            least = keys[i]
    at = np.empty(count, dtype=np.int64)
    beyond = np.empty(beyond_count, dtype=np.int64)
    a = b = 0
    for i in range(n):
        if mark[i]:
            at[a] = i
            a += 1
            if mark[i] == 1:
                beyond[b] = i
                b += 1
    return at, beyond, least


@numba.njit(cache=True, nogil=True)
def above_least(column: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, int]:
    """`column[rows]` less its least value, and the span (most - least + 1; 1 when empty): a rank
    column from a per-request number, in two passes (a gather and three numpy passes before)."""
    n = rows.size
    out = np.empty(n, dtype=np.int64)
    least, most = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    for i in range(n):
        v = column[rows[i]]
        out[i] = v
        least = min(least, v)
        most = max(most, v)
    if n == 0:
        return out, 1
    for i in range(n):
        out[i] -= least
    return out, most - least + 1


@numba.njit(cache=True, nogil=True)
def pack_column_into(keys: np.ndarray, values: np.ndarray, bound: int) -> None:
    """keys = keys * bound + values, in place, in one pass (no temporaries over the queue)."""
    for i in range(keys.size):
        keys[i] = keys[i] * bound + values[i]


def pack_rank_columns(columns: list[RankColumn]) -> np.ndarray | None:
    """One int64 key per waiting request ordering as the columns do (the first most significant):
    their mixed-radix number, a column of a name already packed skipped (it only repeats what the
    earlier one ordered). None when the bounds' product does not fit 63 bits."""
    keys: np.ndarray | None = None
    seen: set[str] = set()
    span = 1
    for col in columns:
        if col.name in seen:
            continue
        seen.add(col.name)
        span *= max(col.bound, 1)
        if span >= 1 << 63:
            return None
        if keys is None:
            keys = col.values.astype(np.int64)  # (a copy: the columns are shared)
        else:
            pack_column_into(keys, col.values.astype(np.int64, copy=False), col.bound)
    return keys


@attrs.define(eq=False)
class WindowContext:
    """The runtime's state before it builds a step, as `waiting_window` reads it (built once per
    step and read only: not frozen, whose checked writes cost microseconds a step)."""

    running: np.ndarray  # ids (table rows) of the running queue, in its order
    waiting: np.ndarray  # ids of the waiting queue, in its order
    max_seqs: int
    free_blocks: int  # the KV pool's free blocks (the step's `free_blocks` fact)
    total_blocks: int  # the pool's usable blocks (`total_blocks`)
    token_budget: int
    block_size: int
    max_model_len: int
    oversized: np.ndarray  # positions in `waiting` of the requests reject-oversized's rule refuses
    scheduler_state: Mapping[str, float | np.ndarray]
    request_state: Callable[[str, np.ndarray], np.ndarray]  # (declared name, ids) -> values
    column: Callable[[str, np.ndarray], np.ndarray]  # (queue column name, ids) -> values, as the step shows them
    memo: dict = attrs.field(factory=dict)  # answers the passes share (one pipeline asks them all)
    # the runtime found the running requests steady (`StepPass.decodes_steadily`): each decodes
    # one token, none is in flight, and the free blocks cover every block they need
    steady: bool = False
    # (declared name) -> that request state for every request id, a read-only view indexed by
    # id: for a pass's Numba kernel (`request_state` gathers a copy, a few µs a call)
    state_of: Callable[[str], np.ndarray] | None = None
    # (queue column name) -> that column of the request table for every id, read-only, as
    # `state_of` (not "blocks", which the KV pool holds); None outside the runtime
    column_of: Callable[[str], np.ndarray] | None = None
    # the step's clock (its `now_us` fact) for a pipeline that reads it (`StepPass.reads_clock`),
    # else -1; set for steady steps (`StepPass.steady_state`)
    now_us: int = -1
    # the number of the step being decided (its `step` fact); set for steady steps
    step: int = 0
    # ids of the swapped queue (requests preempted by swap), in its order; set for steady steps
    swapped: np.ndarray = attrs.field(factory=lambda: np.zeros(0, dtype=np.int64))
    # the host tier's free blocks (the step's `host_free_blocks` fact: -1 without a swapped queue
    # or a host tier); set for steady steps
    host_free_blocks: int = -1
    # answers computed from the queued requests alone, held by the runtime across steps (`queued`);
    # None outside a runtime that holds them
    queued_memo: dict | None = None
    # request state of the running requests (aligned with `running`) that the passes asked before
    # this one answered for a steady step (`StepPass.steady_state`): what the IR would show the
    # passes after a state write (`mlfq-levels`' demotions, read by `mlfq-order`)
    batch_state: dict = attrs.field(factory=dict)
    # how many of the rank's first the runtime's ranked window takes (`first_by_rank`; 0: none)
    head_size: int = 0
    # the rank keys (waiting, swapped) of the order the passes asked so far leave the queue in
    # (`StepPass.waiting_rank` of the first pass that orders it; None: an order of no declared key,
    # a second order, whose ties follow the first's, or none yet): a pass after them that walks
    # that order may name a head of it (`orca-admit`, `vllm-admit`)
    rank: tuple[np.ndarray, np.ndarray] | None = None
    # (ids) -> the prefix-hit tokens each would show in the step (its `mem.match`: a count-level
    # pipeline's, zeros without prefix caching); None where the passes find hits in the pool
    # themselves (pool-level pipelines) or outside a runtime
    prefix_hit: Callable[[np.ndarray], np.ndarray] | None = None
    policy: str = "fcfs"  # the configuration's queue policy (the step's `policy` fact)
    # the KV pool's held-block count of every request id, read-only (`column("blocks", ids)` of
    # all of them, for a kernel: `running_growth`); None outside a runtime
    blocks_of: np.ndarray | None = None

    NONE: ClassVar[np.ndarray] = np.zeros(0, dtype=np.int64)  # nobody

    def seats_stay_taken(self) -> bool:
        """Every sequence slot is taken and stays taken this step: max_seqs requests run, and every
        token they know (placeholders included) fits in the free blocks together, so a pass that
        preempts for want of blocks has no cause to, and nobody else frees a slot (a pass that
        preempts for other reasons declares no window)."""
        if self.running.size < self.max_seqs or self.memo.get(_SEATS_FREED):
            return False
        return self.running_fits()

    def running_fits(self) -> bool:
        """Every token the running requests know (placeholders included) fits in the free blocks
        together: nobody is preempted for want of blocks this step."""
        if self.steady:  # their known tokens are `total` (one past `computed`), and their blocks fit
            return True

        return bool(self.shared("running-fits", lambda: self.running_growth(True, self.max_model_len)
                                <= self.free_blocks))

    def running_growth(self, placeholders: bool, cap: int | None = None, extra: int = 0) -> int:
        """The blocks the running requests need beyond those they hold: each one's known tokens
        (`total`, + its `placeholders` with `placeholders`) up to `cap` (None: all of them), in
        blocks, + `extra`, less its held blocks, at least 0, summed (`running_block_need`, one
        kernel pass in a runtime, which gives the pool's block counts as `blocks_of`)."""
        running = self.running
        cap = _NO_CAP if cap is None else cap
        if self.column_of is not None and self.blocks_of is not None:
            placeholders_of = self.column_of("placeholders") if placeholders else self.NONE
            return running_block_need(running, self.column_of("total"), placeholders_of, self.blocks_of,
                                      self.block_size, cap, extra)
        known = self.column("total", running)
        if placeholders:
            known = known + self.column("placeholders", running)
        need = -(-np.minimum(known, cap) // self.block_size) + extra - self.column("blocks", running)
        return int(np.maximum(need, 0).sum())

    def nobody_while_seats_stay_taken(self, queue: str, running: str) -> np.ndarray | None:
        """An admission pass's answer when it can admit only into a free sequence slot
        (`admit-greedy`, `orca-admit`): nobody while `seats_stay_taken`, else the whole queue;
        the whole queue too for a pass reading other queues than waiting / running."""
        if (queue, running) == ("waiting", "running") and self.seats_stay_taken():
            return self.NONE
        return None

    def frees_seats(self, at_most: int | None = None) -> None:
        """Said by a pass, in its `waiting_window`, that may preempt running requests for waiting
        ones by its own rule (FastServe's `mlfq-order`): the passes asked after it then do not
        count on `seats_stay_taken` (admission takes what it frees: a ranked window instead).
        `at_most`: how many seats it frees at most this step (None: any number), which bounds the
        walks' heads (`seats_to_fill`); 0 frees none."""
        freed = self.max_seqs if at_most is None else max(at_most, 0)
        if freed:
            self.memo[_SEATS_FREED] = min(self.memo.get(_SEATS_FREED, 0) + freed, self.max_seqs)

    def seats_to_fill(self) -> int:
        """The most sequence slots a walk into free seats can fill this step: the free ones and
        those the passes said they free (`frees_seats`), where nobody is preempted for want of
        blocks (`running_fits`); else every slot. A walk that admits or resumes only into a free
        seat stops within its first `seats_to_fill() + 1` candidates."""
        if not self.running_fits():
            return self.max_seqs
        free = max(self.max_seqs - self.running.size, 0)
        return min(free + int(self.memo.get(_SEATS_FREED, 0)), self.max_seqs)

    def shared(self, key: object, compute: Callable[[], object]) -> object:
        """`compute()` once per context: a rule several passes ask (SGLang's admission gate)."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def first_by_rank(self, keys: np.ndarray, k: int) -> np.ndarray | None:
        """`first_by_rank(keys, k)` for rank keys this context's passes share (`waiting_rank`):
        the order pass's window and the runtime's ranked head both ask it of the same thousands of
        keys, so their head in rank order is found once, at least `head_size` long, and sliced.
        None (the whole queue) where a partial rank (`partial_rank`) placed fewer than k."""
        placed = self.placed(keys)
        if placed is not None and placed < min(k, keys.size):
            return None
        key = ("first-by-rank", id(keys))
        held = self.memo.get(key)
        if held is None or held[0] is not keys or held[1].size < min(k, keys.size):
            held = self.memo[key] = (keys, rank_head(keys, max(k, self.head_size)))
        return np.sort(held[1][:k])

    def partial_rank(self, keys: np.ndarray, placed: int) -> np.ndarray:
        """Said by an order pass of the rank keys it returns (`waiting_rank`): only `placed` of
        them are places (0..placed-1), the rest `UNRANKED` or more; returns `keys`."""
        self.memo[("placed", id(keys))] = (keys, placed)
        return keys

    def placed(self, keys: np.ndarray) -> int | None:
        """How many of `keys` a partial rank placed (`partial_rank`); None: every one."""
        held = self.memo.get(("placed", id(keys)))
        return held[1] if held is not None and held[0] is keys else None

    def reach(self, skipped: np.ndarray | None, k: int, keys: np.ndarray | None = None) -> np.ndarray | None:
        """Positions in `waiting` a walk of `ctx.rank`'s order (or of `keys`) that stops at its
        first misfit can reach: every request it passes over by a rule known before the step
        (`skipped`, a mask over `waiting`, or None: none) and the first `k` others (it admits at
        most k - 1 and stops at the first that does not fit). None (the whole queue) without a
        rank, or where a partial rank placed too few to know the first k others."""
        if keys is None:
            if self.rank is None:
                return None
            keys = self.rank[0]
        if skipped is None:
            return self.first_by_rank(keys, k)
        placed = self.placed(keys)
        if placed is not None and placed < keys.size and placed < k + int(np.count_nonzero(skipped)):
            return None  # (skipped ones among the placed could push the walk past them)
        return reach_positions(keys, skipped, k)

    def arrival_rank(self) -> RankColumn | None:
        """The waiting requests' dense arrival rank (`arrival_rank_column`), shared by the order
        passes' rank columns (their FCFS tie-breaks); None outside a runtime."""
        if self.column_of is None:
            return None
        return self.shared("arrival-rank", lambda: arrival_rank_column(  # type: ignore[return-value]
            self.column_of("arrival"), self.waiting))  # type: ignore[misc]

    def composed_rank(self, orders: list) -> tuple[np.ndarray, np.ndarray] | None:
        """The rank keys (waiting, swapped) of the order several order passes leave the queue in:
        each sorts the step's order stably, so the last pass's key ranks first, the earlier ones
        break its ties in turn and queue order the rest: their `rank_columns`, the last pass's
        first, packed into one key. A key with the arrival rank among its columns orders every
        request when no two arrived together (the usual queue: arrivals in µs), so the earlier
        passes are not asked then. None where a pass asked names no columns, requests are swapped
        (the columns rank the waiting queue only) or the key does not fit 63 bits."""
        if self.swapped.size:
            return None
        columns: list[RankColumn] = []
        for p in reversed(orders):
            cols = p.rank_columns(self)
            if cols is None:
                return None
            columns.extend(cols)
            if any(c.name == "arrival" and c.bound >= self.waiting.size for c in cols):
                break  # every arrival distinct: this key orders every request, the earlier ones break no tie
        keys = pack_rank_columns(columns)
        return None if keys is None else (keys, self.NONE)

    def queued(self, key: object, compute: Callable[[], object]) -> object:
        """`compute()` when it reads only the queued requests (`waiting`, `swapped`: their columns
        and declared state) and the configuration's limits: the runtime holds it across steps
        while the queue arrays are the same ones and no queued request's state or columns were
        written (a steady step writes only its batch's rows), so a steady step's cost does not
        grow with the queue (v0's ignore rule over 5,000 waiting requests: ~20 µs a step)."""
        held = self.queued_memo
        if held is None:
            return self.shared(key, compute)
        if key not in held:
            held[key] = compute()
        return held[key]
