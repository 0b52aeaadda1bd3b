"""sglang-order: SGLang's waiting-queue policies (`SchedulePolicy.calc_priority`)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np

from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step, pool_of
from schedir.lowering.radix_cache import CHILD, ROOT, SIBLING, RadixCache
from schedir.ir.state import SchedulerState
from schedir.ir.window import WindowContext
from schedir.passes.sglang_admit import admission_gate, skips_admission, steady_gate
from schedir.passes.sglang_state import BATCH_FULL, BATCH_SIZE, CHUNKED, NEXT_POS, POS

POLICIES = ("lpm", "dfs-weight", "fcfs", "lof", "random")
REFRESH_CALLS = SchedulerState("sglang_refresh_calls", default=0.0,
                               doc="cache-agnostic orderings so far (every 32nd touches the queue's prefixes)")
WAITING_PREFIX_REFRESH_INTERVAL = 32  # schedule_policy.py
RANDOM_STATE = SchedulerState("sglang_random_draws", default=0.0,
                              doc="32-bit words the `random` policy's generator (seeded with `seed`) has drawn")


class _CountingRandom(random.Random):
    """Python's Mersenne Twister, counting the 32-bit words `shuffle` draws (one per
    `getrandbits(k)` call with k <= 32), so its whole state is (seed, draws)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.draws = 0

    def getrandbits(self, k: int) -> int:
        self.draws += (k + 31) // 32
        return super().getrandbits(k)


_GENERATORS: dict[int, _CountingRandom] = {}
"""The live generator per seed: the next step continues it; a replayed step (another count)
rebuilds one from the seed and skips to its count."""


def _generator(seed: int, draws: int) -> _CountingRandom:
    rng = _GENERATORS.get(seed)
    if rng is None or rng.draws != draws:
        rng = _CountingRandom(seed)
        for _ in range(draws):
            rng.getrandbits(32)
        _GENERATORS[seed] = rng
    return rng
LPM_QUEUE_LIMIT = 128  # schedule_policy.py: WAITING_QUEUE_PREFIX_MATCH_MAX (LPM turns into FCFS above it)
IN_BATCH_CHECK = 32  # IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD
IN_BATCH_DEPRIORITIZE = 32  # IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD


def waiting_list(ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Positions into `ids` in SGLang's list order: placed requests by place, then the rest
    (new arrivals) in the order the queue holds them."""
    placed = np.flatnonzero(pos >= 0)
    fresh = np.flatnonzero(pos < 0)
    return np.concatenate([placed[np.argsort(pos[placed], kind="stable")], fresh])


def dfs_weight_order(nodes: np.ndarray, last: np.ndarray) -> np.ndarray:
    """`base_prefix_cache.py:_dfs_weight_order`: visit the tree depth first, heavier subtrees
    (more waiting requests ending in them) first, ties in child insertion order; a node's own
    requests come after its subtree's."""
    at: dict[int, list[int]] = {}
    for i, n in enumerate(last.tolist()):
        at.setdefault(n, []).append(i)

    def children(n: int) -> list[int]:
        out = []
        c = int(nodes[CHILD, n])
        while c >= 0:
            out.append(c)
            c = int(nodes[SIBLING, c])
        return out[::-1]  # the arrays push new children in front: reverse for insertion order

    weight: dict[int, int] = {n: len(v) for n, v in at.items()}
    stack: list[tuple[int, bool]] = [(ROOT, False)]
    while stack:
        n, seen = stack.pop()
        if seen:
            weight[n] = weight.get(n, 0) + sum(weight.get(c, 0) for c in children(n))
            continue
        stack.append((n, True))
        stack.extend((c, False) for c in reversed(children(n)))
    order: list[int] = []
    stack = [(ROOT, False)]
    while stack:
        n, seen = stack.pop()
        if seen:
            order.extend(at.get(n, ()))
            continue
        kids = sorted(children(n), key=lambda c: -weight.get(c, 0))
        stack.append((n, True))
        stack.extend((c, False) for c in reversed(kids))
    return np.asarray(order, dtype=np.int64)


@numba.njit(cache=True)
def any_unplaced(pos: np.ndarray, waiting: np.ndarray) -> bool:
    """Whether a waiting request has no place in SGLang's list yet (arrived since the last step)."""
    for i in range(waiting.size):
        if pos[waiting[i]] < 0:
            return True
    return False


@numba.njit(cache=True, nogil=True)
def list_keys(waiting: np.ndarray, pos_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The waiting requests' places in SGLang's list as rank keys: their `sglang_pos` (`pos_of`,
    by row), the new arrivals (-1: not placed yet) after every placed one in queue order, as
    `run` places them; and the new arrivals' positions. Two passes (a gather, a max, a where and
    a flatnonzero over the queue before)."""
    n = waiting.size
    keys = np.empty(n, dtype=np.int64)
    most = -1
    fresh = 0
    for i in range(n):
        p = pos_of[waiting[i]]
        keys[i] = p
        if p > most:
            most = p
        if p < 0:
            fresh += 1
    at = np.empty(fresh, dtype=np.int64)
    c = 0
    for i in range(n):
        if keys[i] < 0:
            keys[i] = most + 1 + i
            at[c] = i
            c += 1
    return keys, at


@dataclass(frozen=True)
class SglangOrder(StepPass):
    """Order the waiting list as SGLang's `SchedulePolicy.calc_priority` does.

    - `lpm`: longest cached prefix first (a stable sort of the persisting list); above 128
      waiting requests it is FCFS (`_determine_active_policy`). A request whose own cached
      prefix is short (<= 32 tokens) but which shares >= 32 tokens with a request earlier in the
      list goes last this step (in-batch prefix de-duplication, `_compute_prefix_matches`): one
      of them computes the prefix, the others hit it next step.
    - `dfs-weight`: depth first over the radix tree, heavier subtrees first (`_sort_by_dfs_weight`).
    - `fcfs`: the list as it is; `lof`: longest `max_new_tokens` first; `random`: shuffled
      with a seeded generator whose state is scheduler state (`_sort_randomly`).

    Cache-aware policies match every waiting request against the radix tree (touching it, as
    SGLang's `match_prefix` does); the others do not match here.
    """

    name: ClassVar[str] = "sglang-order"
    requires: ClassVar[frozenset[str]] = frozenset({"radix-pool"})
    provides: ClassVar[frozenset[str]] = frozenset({"order"})
    request_state = (POS,)
    scheduler_state = (NEXT_POS, RANDOM_STATE, REFRESH_CALLS)

    policy: str = "config"
    seed: int = 0
    queue: str = "waiting"
    running: str = "running"

    def __post_init__(self) -> None:
        if self.policy not in (*POLICIES, "config"):
            raise ValueError(f"policy must be one of {', '.join(POLICIES)} or config (the scheduler's "
                             f"policy), got '{self.policy}'")

    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting", "running": "running"}
    steady_reads: ClassVar[frozenset[str]] = frozenset({CHUNKED.name, BATCH_FULL.name, BATCH_SIZE.name})  # the gate's

    def steady_state(self, ctx: WindowContext) -> dict[str, float] | None:
        """Nothing written when the step skips admission and nobody arrived since the last step."""
        if not steady_gate(ctx).skip or ctx.state_of is None:
            return None
        if ctx.waiting.size and any_unplaced(ctx.state_of(POS.name), ctx.waiting):
            return None
        return {}

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """When the step skips admission SGLang does not sort the list: it only places new
        arrivals at its end (`sglang_pos` still -1). Under `fcfs` the list stays as it is, so
        the new arrivals and, on every 32nd ordering, the first 128 it touches
        (`_touch_waiting_prefixes`); admission names the head it walks. So under `lpm` above 128
        waiting requests, which is FCFS (`_as_fcfs`). Else the whole list."""
        if (self.queue, self.running) != ("waiting", "running"):
            return None
        fresh = self._list(ctx)[1]
        if skips_admission(ctx):
            return fresh
        rank = self.waiting_rank(ctx)
        if rank is None:
            return None
        calls = int(ctx.scheduler_state.get(REFRESH_CALLS.name, REFRESH_CALLS.default))
        if calls % WAITING_PREFIX_REFRESH_INTERVAL:
            return fresh
        refused = np.zeros(ctx.waiting.size, dtype=np.bool_)
        refused[ctx.oversized] = True  # gone before this pass: the first 128 of the others
        return np.union1d(fresh, ctx.reach(refused, LPM_QUEUE_LIMIT, rank[0]))  # type: ignore[arg-type]

    def waiting_rank(self, ctx: WindowContext) -> tuple[np.ndarray, np.ndarray] | None:
        """Under `fcfs` (or `lpm` above 128 waiting, which is FCFS: `_as_fcfs`), the list's order
        as `run` leaves it: placed requests by `sglang_pos`, then new arrivals in queue order
        (`waiting_list`); a step over the head counts the whole list from its `waiting_count`
        fact. None under the other policies (they sort by what the step matches)."""
        if not self._as_fcfs(ctx) or (self.queue, self.running) != ("waiting", "running"):
            return None

        return ctx.shared(("sglang-list-rank", self),  # type: ignore[return-value]
                          lambda: (self._list(ctx)[0], np.zeros(ctx.swapped.size, dtype=np.int64)))

    @staticmethod
    def _list(ctx: WindowContext) -> tuple[np.ndarray, np.ndarray]:
        """`list_keys` of the waiting queue, once per step: each request's place in the list (its
        `sglang_pos`; new arrivals after the placed ones, in queue order) and the positions of
        the new arrivals (`sglang_pos` still -1)."""
        def places() -> tuple[np.ndarray, np.ndarray]:
            if ctx.state_of is not None:
                return list_keys(ctx.waiting, ctx.state_of(POS.name))
            pos = ctx.request_state(POS.name, ctx.waiting)  # (outside a runtime: by ids)
            return list_keys(np.arange(pos.size), pos)

        return ctx.shared("sglang-list", places)  # type: ignore[return-value]

    def _as_fcfs(self, ctx: WindowContext) -> bool:
        """Whether the list is ordered first come first served: `fcfs`, or `lpm` over more than
        128 waiting requests (counted past those reject-oversized refuses, as `run` counts the
        list from the step's `waiting_count` fact)."""
        policy = self._policy(ctx.policy)
        return policy == "fcfs" or (policy == "lpm" and ctx.waiting.size - ctx.oversized.size > LPM_QUEUE_LIMIT)

    def _policy(self, configured: str) -> str:
        """The policy this pass orders by: its option, or the scheduler's (`config`)."""
        return configured if self.policy == "config" else self.policy

    def run(self, step: Step) -> None:
        pending = step.pending(self.queue)
        if pending is None:
            return
        st = step.states()
        pos = step.state_column(pending, POS.name, POS.default)
        if admission_gate(step, step.pending(self.running), pending, step.facts.max_seqs, st).skip:
            # SGLang orders the queue only when it tries a prefill batch; arrivals still join the
            # list's end now (`_add_request_to_queue`), ahead of requests retracted later
            if not pos.size or pos.min() >= 0:  # none arrived since the last step
                return
            fresh = np.flatnonzero(pos < 0)
            base = int(st.get(NEXT_POS.name, NEXT_POS.default))
            step.set_state(**{NEXT_POS.name: float(base + fresh.size)})
            step.set_request_state(pending, step.ids(pending)[fresh], **{POS.name: np.arange(base, base + fresh.size)})
            return
        ids = step.ids(pending)
        writes: dict[str, float] = {}
        at = waiting_list(ids, pos)
        policy = self._policy(step.facts.policy)
        if policy not in POLICIES:
            raise ValueError(f"SGLang has no '{policy}' waiting-queue policy here (one of {', '.join(POLICIES)})")
        listed = at.size  # SGLang's list: a step over a window of it says how long it is
        if step.facts.waiting_count >= 0:
            listed += step.facts.waiting_count - len(step.queue(self.queue))  # type: ignore[arg-type]
        if policy == "lpm" and listed > LPM_QUEUE_LIMIT:
            policy = "fcfs"
        if policy in ("lpm", "dfs-weight"):
            pool = pool_of(step)
            lists = ids[at]
            hit = np.zeros(at.size, dtype=np.int64)
            last = np.zeros(at.size, dtype=np.int64)
            late = np.zeros(at.size, dtype=bool)
            seen = RadixCache(page_size=1)
            for i, row in enumerate(lists.tolist()):
                toks = pool.tokens(row)
                matched, node = pool.match_tokens(toks)
                hit[i] = min(matched, max(toks.size - 1, 0))
                last[i] = node
                if policy == "lpm" and matched <= IN_BATCH_CHECK:
                    shared, _ = seen.match_prefix(toks)
                    if shared >= IN_BATCH_DEPRIORITIZE:
                        late[i] = True
                    else:
                        seen.insert(toks)
            if policy == "lpm":
                key = np.where(late, np.iinfo(np.int64).max, -hit)
                order = np.argsort(key, kind="stable")
            else:
                order = dfs_weight_order(pool.radix.nodes, last)
            step.match(pending, lists, hit)
            at = at[order]
        elif policy == "lof":
            max_new = step.column(pending, "max_tokens")[at]
            at = at[np.argsort(-max_new, kind="stable")]
        elif policy == "random":
            at = self._shuffled(step, at, st, writes)
        if policy not in ("lpm", "dfs-weight"):
            self._refresh(step, ids[at], st, writes)
        base = int(st.get(NEXT_POS.name, NEXT_POS.default))
        new_ids = ids[at]
        # the list's new order as places: under fcfs the list stays as it is and only new arrivals
        # take places at its end (so a step over its head writes what the whole list's would)
        placing = at[pos[at] < 0] if policy == "fcfs" else at
        writes[NEXT_POS.name] = float(base + placing.size)
        step.set_state(**writes)
        if placing.size:
            step.set_request_state(pending, ids[placing],
                                   **{POS.name: np.arange(base, base + placing.size, dtype=np.int64)})
        step.sort(pending, ("sglang_pos",), new_ids, picked=at)

    def _refresh(self, step: Step, ordered: np.ndarray, st: dict, writes: dict) -> None:
        """`SchedulePolicy._touch_waiting_prefixes` (SGLANG_ENABLE_WAITING_PREFIX_REFRESH, on by
        default): after a cache-agnostic ordering, every 32nd time, the cached prefixes of the first
        128 waiting requests are touched, the head last, so LRU eviction spares them in that order."""
        calls = int(st.get(REFRESH_CALLS.name, REFRESH_CALLS.default))
        writes[REFRESH_CALLS.name] = float(calls + 1)
        if calls % WAITING_PREFIX_REFRESH_INTERVAL or not ordered.size:
            return
        pool = pool_of(step)
        for row in ordered[:LPM_QUEUE_LIMIT][::-1].tolist():
            pool.match_tokens(pool.tokens(row))

    def _shuffled(self, step: Step, at: np.ndarray, st: dict, writes: dict) -> np.ndarray:
        """`random.shuffle` of the list with a generator seeded once (`seed`), continued across
        steps (its draws so far are scheduler state)."""
        rng = _generator(self.seed, int(st.get(RANDOM_STATE.name, RANDOM_STATE.default)))
        items = at.tolist()
        rng.shuffle(items)
        writes[RANDOM_STATE.name] = float(rng.draws)
        return np.asarray(items, dtype=np.int64)
