"""sglang-admit: SGLang's prefill admission (`PrefillAdder`), prefill-first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numba
import numpy as np

from schedir.dialects.codes import Reason
from schedir.ir.pass_base import StepPass
from schedir.ir.state import Decay
from schedir.ir.step import Step, pool_of
from schedir.ir.window import WindowContext
from schedir.passes.sglang_state import (
    BATCH_FULL, BATCH_SIZE, CHUNKED, JOIN, NEXT_JOIN, RATIO, SCHEDULER_STATE,
)

NO_TOKEN, OTHER, CONTINUE = 1, 2, 3  # schedule_policy.py: AddReqResult


class _Budget:
    """`PrefillAdder`'s budgets (`mem_cache/prefill_budget.py:PrefillBudget`): tokens the batch
    may still take (`rem_input_tokens`, `rem_chunk_tokens`) and the offsets reserved against
    free + evictable KV (`total_offset` includes future decode tokens at `new_token_ratio`)."""

    def __init__(self, pool, rem_input: int, rem_chunk: int | None, total_offset: float) -> None:
        self.pool = pool
        self.page = pool.block_size
        self.rem_input = rem_input
        self.rem_chunk = rem_chunk
        self.total_offset = total_offset
        self.current_offset = 0.0

    def free_and_evictable(self) -> int:
        return self.pool.available + self.pool.evictable

    def remaining_total(self) -> float:
        return self.free_and_evictable() - self.total_offset

    def remaining_current(self) -> float:
        return self.free_and_evictable() - self.current_offset

    def ceil(self, tokens: int) -> int:
        return -(-tokens // self.page) * self.page

    def state(self) -> int:
        """`PrefillAdder.budget_state`."""
        if not (self.remaining_total() > 0 and self.remaining_current() > 0):
            return NO_TOKEN
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return OTHER
        return CONTINUE

    def reserve(self, extend: int, max_new: int) -> None:
        """`PrefillAdder._update_prefill_budget` -> `PrefillBudget.reserve`: the page-ceiled
        extend plus one page now, plus `max_new` decode tokens later."""
        paged = self.ceil(extend)
        self.total_offset += paged + self.page + max_new
        self.current_offset += paged + self.page
        self.rem_input -= paged
        if self.rem_chunk is not None:
            self.rem_chunk -= paged


class Gate(NamedTuple):
    """Whether this step tries a prefill batch at all, and the state that decided it (a
    NamedTuple: built twice a step, where a frozen dataclass's __init__ costs microseconds)."""

    skip: bool
    full: bool  # running_batch.batch_is_full after the checks
    chunked: int  # the chunked request's id, -1: none
    batch_size: int  # requests in the running batch (the chunked one excluded)
    run_ids: np.ndarray


def admission_gate(step: Step, running, waiting, max_seqs: int, st: dict) -> Gate:  # noqa: ANN001
    """`_admission_gate`, asked once per edit of the step: the order pass and the admission pass
    both ask it of the same step (`st` is the step's own state, so the step's edits cover it)."""
    return step.analysis(("sglang-admission-gate", id(running), id(waiting), max_seqs),
                         lambda: _admission_gate(step, running, waiting, max_seqs, st))


def _admission_gate(step: Step, running, waiting, max_seqs: int, st: dict) -> Gate:  # noqa: ANN001
    """`gate_rule` over the step: its running set, whether anybody waits, its state."""
    run_ids = step.ids(running) if running is not None else np.zeros(0, dtype=np.int64)
    nothing = waiting is None or len(step.ids(waiting)) == 0
    return gate_rule(run_ids, nothing, max_seqs, int(st.get(CHUNKED.name, CHUNKED.default)),
                     float(st.get(BATCH_FULL.name, 0.0)), float(st.get(BATCH_SIZE.name, 0.0)))


def gate_rule(run_ids: np.ndarray, nothing_waits: bool, max_seqs: int, chunked: int, batch_full: float,
              last_batch_size: float) -> Gate:
    """The checks `Scheduler.get_next_batch_to_run` / `_get_new_batch_prefill_raw` make before
    ordering the queue: `batch_is_full` is cleared when the running batch shrank or is empty;
    no prefill while it is set or nothing waits (unless a chunked request continues), nor when
    no request slot is left (`get_num_allocatable_reqs`). The order pass asks too: SGLang does
    not sort (nor match, nor touch the tree) in a step that skips admission. The runtime asks
    it before building the step, from the same state (`skips_admission`, for `waiting_window`)."""
    if chunked >= 0 and chunked not in run_ids:
        chunked = -1  # it ended (an abort) since the last step
    batch_size = run_ids.size if chunked < 0 else int(np.count_nonzero(run_ids != chunked))
    full = batch_full > 0
    if batch_size < last_batch_size or batch_size == 0:
        full = False
    skip = False
    if (full or nothing_waits) and chunked < 0:
        skip = True
    elif max_seqs - batch_size <= 0 and chunked < 0:
        skip = full = True
    return Gate(skip, full, chunked, batch_size, run_ids)


def admission_state(st, full: bool, chunked: int, batch_size: int, ratio: float,  # noqa: ANN001
                    next_join: float | None = None) -> dict[str, float]:
    """The scheduler state an admission step leaves (`batch_is_full`, the chunked request, the
    running batch's size, new_token_ratio; the next join place when a prefill batch joined)."""
    return {NEXT_JOIN.name: st.get(NEXT_JOIN.name, 0.0) if next_join is None else next_join,
            BATCH_FULL.name: float(full), CHUNKED.name: float(chunked), BATCH_SIZE.name: float(batch_size),
            RATIO.name: ratio}


def steady_gate(ctx: WindowContext) -> Gate:
    """`gate_rule` before a steady decode step, over the whole waiting queue (`StepPass.steady_state`
    of the sglang passes): whether anybody waits decides `batch_is_full` when no slot is left."""
    st = ctx.scheduler_state
    return ctx.shared("sglang-steady-gate", lambda: gate_rule(
        ctx.running, ctx.waiting.size == 0, ctx.max_seqs, int(st.get(CHUNKED.name, CHUNKED.default)),
        float(st.get(BATCH_FULL.name, 0.0)), float(st.get(BATCH_SIZE.name, 0.0))))


@numba.njit(cache=True, nogil=True, inline="always")
def _reserve_and_never(total: int, prompt: int, max_new: int, clip: int, page: int,
                       usable_pages: int) -> tuple[int, bool]:
    """One request's remaining `max_new_tokens` clipped to `clip` (what admission reserves), and
    whether its tokens, that reservation and a page reach the whole pool (`never_fits`)."""
    left = min(max(max_new - (total - prompt), 0), clip)
    return left, total + left + page >= usable_pages * page


@numba.njit(cache=True, nogil=True)
def never_fits(total: np.ndarray, prompt: np.ndarray, max_new: np.ndarray, clip: int, page: int,
               usable_pages: int) -> tuple[np.ndarray, np.ndarray]:
    """Per request: its remaining `max_new_tokens` clipped to `clip` (what admission reserves),
    and whether its tokens, that reservation and a page reach the whole pool, so that it can
    never be admitted, cached prefix or not (`sglang-admit` rejects it, `exceeds-cache`)."""
    n = total.size
    left = np.empty(n, dtype=np.int64)
    never = np.empty(n, dtype=np.bool_)
    for i in range(n):
        left[i], never[i] = _reserve_and_never(total[i], prompt[i], max_new[i], clip, page, usable_pages)
    return left, never


@numba.njit(cache=True, nogil=True)
def passed_over(waiting: np.ndarray, total_of: np.ndarray, prompt_of: np.ndarray, max_of: np.ndarray, clip: int,
                page: int, usable_pages: int, oversized: np.ndarray) -> np.ndarray:
    """Per waiting request (columns by row): whether `add_one_req`'s loop goes on past it, known
    before the step: it can never fit (`never_fits`' rule) or reject-oversized took it out
    (`oversized`, positions). One pass (three gathers and six numpy passes over the queue before)."""
    n = waiting.size
    out = np.empty(n, dtype=np.bool_)
    for i in range(n):
        r = waiting[i]
        out[i] = _reserve_and_never(total_of[r], prompt_of[r], max_of[r], clip, page, usable_pages)[1]
    for p in oversized:
        out[p] = True
    return out


def skips_admission(ctx: WindowContext) -> bool:
    """`gate_rule` before the step is built, from the runtime's queues and state: whether the
    next step skips admission with somebody waiting (the sglang passes' `waiting_window`)."""
    st = ctx.scheduler_state
    return ctx.shared("sglang-admission-gate", lambda: gate_rule(
        ctx.running, False, ctx.max_seqs, int(st.get(CHUNKED.name, CHUNKED.default)),
        float(st.get(BATCH_FULL.name, 0.0)), float(st.get(BATCH_SIZE.name, 0.0))).skip)


@dataclass(frozen=True)
class SglangAdmit(StepPass):
    """Admit a prefill batch as SGLang's `Scheduler._get_new_batch_prefill_raw` does.

    Rules (`sglang/srt/managers/schedule_policy.py:PrefillAdder`, 0.5.23):
    - admission is skipped while `batch_is_full` (until the running batch shrinks) or when no
      request slot is left (`get_num_allocatable_reqs`: `max_seqs` minus the running batch);
    - the chunked request resumes first (`add_chunked_req`): its next chunk is what the chunk
      budget and the free + evictable KV (minus the reservations) allow;
    - then waiting requests in the list's order (`add_one_req`): each is matched against the
      radix tree (`init_next_round_input`, at most all tokens but one), and admitted when its
      uncached tokens plus its remaining `max_new_tokens` (clipped to `clip`) plus a page fit in
      free + evictable KV minus what is reserved: every running request's remaining
      `max_new_tokens` times `new_token_ratio`, and every admitted request's extend and clipped
      `max_new_tokens`. A prompt longer than the chunk budget left is chunked (page-aligned), one
      chunked request at a time; without chunking the first request may exceed
      `max_prefill_tokens` (the step's token budget), later ones may not;
    - the loop stops at the first request that does not fit (`NO_TOKEN` also sets
      `batch_is_full`), at the token or chunk budget, or when the slots are taken.
    Prefill first: a step that admits anything runs only the prefill batch (no decodes).

    One rule is schedir's: a request whose whole prompt (its cached prefix included: the prefix is
    locked while it is weighed, so it cannot be evicted to make room) plus its reservation reaches
    the whole pool could never be admitted, so it is rejected (reason `exceeds-cache`) and the loop
    goes on. SGLang's own queue stalls behind such a request (its `add_one_req` answers
    `NO_TOKEN` forever, with nothing running to free memory).
    """

    name: ClassVar[str] = "sglang-admit"
    requires: ClassVar[frozenset[str]] = frozenset({"radix-pool", "order"})
    provides: ClassVar[frozenset[str]] = frozenset({"waiting-scheduled"})
    request_state = (JOIN,)
    scheduler_state = SCHEDULER_STATE

    chunk: int = -1  # chunked_prefill_size; -1: the step's token budget (max_prefill_tokens); 0: no chunking
    mixed: int = 0  # enable_mixed_chunk: the running batch decodes in the prefill step (needs chunking)
    clip: int = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
    init_ratio: float = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO * schedule_conservativeness
    queue: str = "waiting"
    running: str = "running"
    steady_when: ClassVar[dict[str, str]] = {"queue": "waiting", "running": "running"}

    # the gate's state and the next join place (`steady_state` writes the ratio as a transition)
    steady_reads: ClassVar[frozenset[str]] = frozenset({CHUNKED.name, BATCH_FULL.name, BATCH_SIZE.name,
                                                        NEXT_JOIN.name})

    def steady_state(self, ctx: WindowContext) -> dict[str, float | Decay] | None:
        """A step that skips admission writes the gate's state (as `run` does then), else None;
        new_token_ratio as `Decay(0, 0, init-ratio)`: set where unset, else left as it is."""
        gate = steady_gate(ctx)
        if not gate.skip:
            return None
        writes: dict[str, float | Decay] = admission_state(ctx.scheduler_state, gate.full, gate.chunked,
                                                           gate.batch_size, 0.0)  # type: ignore[assignment]
        writes[RATIO.name] = Decay(0.0, 0.0, self.init_ratio)
        return writes

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """Nobody when the step skips admission (a full running batch, `batch_is_full`, no chunked
        prefill continuing: `_get_new_batch_prefill_raw` returns first), but one request the
        step will not reject: the gate reads whether anybody waits. Else the whole list."""
        if (self.queue, self.running) != ("waiting", "running"):
            return None
        if not skips_admission(ctx):
            return self._walked(ctx)
        refused = set(ctx.oversized.tolist())  # a handful at most: flagged at arrival, refused at once
        first = next((i for i in range(len(refused) + 1) if i not in refused), None)
        return np.array([first], dtype=np.int64) if first is not None and first < ctx.waiting.size else ctx.NONE

    def _walked(self, ctx: WindowContext) -> np.ndarray | None:
        """The waiting requests `add_one_req`'s loop can reach in the list's order (`ctx.rank`,
        `sglang-order`'s under fcfs): it goes on past a request that can never fit (rejected,
        `n + left + page >= usable pages`, known before the step) and past the ones
        reject-oversized took out, admits at most the free request slots (max_seqs minus the
        running batch; one more where the chunked request is among the running) and stops at
        the first other request it does not admit. None (the whole list) without a rank."""
        if ctx.rank is None or ctx.column_of is None:
            return None
        column = ctx.column_of
        passed = passed_over(ctx.waiting, column("total"), column("prompt"), column("max_tokens"), self.clip,
                             ctx.block_size, ctx.total_blocks, ctx.oversized)
        return ctx.reach(passed, max(ctx.max_seqs - ctx.running.size + 1, 0) + 1)

    def _mix(self, step: Step, pool, running, run_ids: np.ndarray, in_batch: np.ndarray):  # noqa: ANN001, ANN202
        """Mixed chunked prefill: the running batch (in its order) decodes in this prefill step if
        its tokens fit (`check_decode_mem`; no retraction in a mixed step). Returns its ids or None."""
        join = step.state_column(running, JOIN.name, JOIN.default)
        batch = run_ids[in_batch][np.argsort(join[in_batch], kind="stable")]
        if not pool.decode_fits(batch):
            return None
        pool.decode(batch, mixed=True)
        step.schedule(running, "decode", batch, np.ones(batch.size, dtype=np.int64))
        return batch

    def run(self, step: Step) -> None:
        facts = step.facts
        pool = pool_of(step)
        waiting = step.pending(self.queue)
        running = step.pending(self.running)
        st = step.states()
        gate = admission_gate(step, running, waiting, facts.max_seqs, st)
        run_ids, chunked, batch_size, full = gate.run_ids, gate.chunked, gate.batch_size, gate.full
        in_batch = run_ids != chunked
        ratio = float(st.get(RATIO.name, RATIO.default))
        if ratio < 0:
            ratio = self.init_ratio
        wait_ids = step.ids(waiting) if waiting is not None else np.zeros(0, dtype=np.int64)

        def done(new_chunked: int, admitted_count: int, next_join: float | None = None) -> None:
            new = admission_state(st, full, new_chunked, batch_size + admitted_count, ratio, next_join)
            changed = {k: v for k, v in new.items() if st.get(k) != v}  # a quiet step writes nothing
            if changed:
                step.set_state(**changed)

        if gate.skip:
            done(chunked, 0)
            return
        slots = facts.max_seqs - batch_size

        # the running batch's future decode tokens, at new_token_ratio
        offset = 0.0
        if batch_size:
            total, prompt, max_new = step.columns(running, ("total", "prompt", "max_tokens"))
            left = np.minimum(max_new[in_batch] - (total[in_batch] - prompt[in_batch]), self.clip)
            # Python's sum over the products, in batch order, as PrefillAdder's (the products are
            # exact: small integers times the ratio; only the summation order could round apart)
            offset = float(sum((left.astype(np.float64) * ratio).tolist()))
        chunk = facts.token_budget if self.chunk < 0 else (self.chunk or None)
        mixed = bool(self.mixed) and chunk is not None  # scheduler.py: is_mixed_chunk
        if chunk is not None and chunk < pool.block_size:
            raise ValueError(f"chunked prefill of {chunk} tokens is less than one page ({pool.block_size} tokens): "
                             "SGLang cuts chunks at page boundaries, so no prompt longer than it could start; "
                             "raise the token budget (max_num_batched_tokens) or the chunk option")
        budget = _Budget(pool, facts.token_budget, chunk, offset)
        if mixed:  # PrefillAdder(num_mixed_decode_tokens=running_bs): a token per running request
            budget.rem_input -= batch_size
            budget.rem_chunk -= batch_size
            budget.total_offset += batch_size
            budget.current_offset += batch_size
        page = budget.page
        batch_rows: list[int] = []
        batch_ends: list[int] = []
        new_rows: list[int] = []
        new_hits: list[int] = []
        new_tokens: list[int] = []
        resumed = -1
        resumed_tokens = 0
        new_chunked = -1
        hopeless: list[int] = []

        if chunked >= 0:  # add_chunked_req
            at = int(np.flatnonzero(run_ids == chunked)[0])
            total, computed, max_new = step.columns(running, ("total", "computed", "max_tokens"))
            prefix = int(computed[at])
            rem = min(budget.rem_chunk, int(budget.remaining_total()))
            if rem <= 0:
                rem = budget.rem_chunk
            cand = int(total[at]) - prefix
            truncated = cand > rem
            take = min(cand, rem)
            budget.reserve(take, 0 if truncated else min(int(max_new[at]), self.clip))
            batch_rows.append(chunked)
            batch_ends.append(prefix + take)
            resumed, resumed_tokens = chunked, take
            new_chunked = chunked if truncated else -1

        if waiting is not None and not full:
            total, prompt, max_new = step.columns(waiting, ("total", "prompt", "max_tokens"))
            lefts, never = never_fits(total, prompt, max_new, self.clip, page, pool.usable_blocks)
            for i, row in enumerate(wait_ids.tolist()):
                if budget.state() == OTHER:
                    break
                held = 1 if resumed >= 0 else 0  # rows holding KV in the batch: the chunked one
                allocatable = min(slots, max(slots - (1 if chunked >= 0 else 0) + held, 0))
                if len(batch_rows) >= allocatable:
                    full = True
                if full:
                    break
                n = int(total[i])
                prefix, node = pool.match(row, max(n - 1, 0))
                left = int(lefts[i])
                cand = n - prefix
                need = cand + left + page
                if never[i]:
                    # Never fits, cached prefix or not: the matched prefix is locked while the request
                    # is weighed, so it stays in the pool beside `need` (see the class docstring).
                    hopeless.append(row)
                    continue
                pool.lock_node(node)  # PrefillAdder._lock_node: its own prefix is not evictable
                fits = need < budget.remaining_total()
                pool.unlock_node(node)
                if not fits:
                    res = NO_TOKEN
                else:
                    paged = budget.ceil(cand)
                    if budget.rem_chunk is None and batch_rows and paged >= budget.rem_input:
                        res = OTHER
                    else:
                        reserve_new = min(int(max_new[i]), self.clip)
                        take = cand
                        if budget.rem_chunk is not None and paged > budget.rem_chunk:
                            take = budget.rem_chunk // page * page
                            take = (prefix + take) // page * page - prefix
                            reserve_new = 0
                        if take <= 0:
                            res = OTHER
                        else:
                            pool.lock_row(row, node)
                            pool.begin(row, prefix, node)
                            batch_rows.append(row)
                            batch_ends.append(prefix + take)
                            new_rows.append(row)
                            new_hits.append(prefix)
                            new_tokens.append(take)
                            if take < cand:
                                new_chunked = row
                            budget.reserve(take, reserve_new)
                            res = budget.state()
                if res != CONTINUE:
                    if res == NO_TOKEN:
                        full = bool(batch_rows) or batch_size > 0
                    break

        if hopeless:
            step.reject(waiting, np.asarray(hopeless, dtype=np.int64),
                        np.full(len(hopeless), int(Reason.EXCEEDS_CACHE), dtype=np.int64))
        if not batch_rows:
            done(chunked, 0)
            return
        pool.extend(np.asarray(batch_rows, dtype=np.int64), np.asarray(batch_ends, dtype=np.int64))
        if resumed >= 0:
            step.schedule(running, "prefill", np.array([resumed], dtype=np.int64),
                          np.array([resumed_tokens], dtype=np.int64))
        if new_rows:
            ids = np.asarray(new_rows, dtype=np.int64)
            step.match(waiting, ids, np.asarray(new_hits, dtype=np.int64))
            step.schedule(waiting, "prefill", ids, np.asarray(new_tokens, dtype=np.int64))
        # requests whose prefill completes join the running batch, in batch order: the chunked
        # one resumed (of the running queue), the new ones (waiting), then, in a mixed step, the
        # decoding batch (running); each takes the next place (no row is in two of them)
        base = int(st.get(NEXT_JOIN.name, NEXT_JOIN.default))
        resumed_joins = resumed >= 0 and resumed != new_chunked
        new_ids = np.asarray(new_rows, dtype=np.int64)
        new_ids = new_ids[new_ids != new_chunked]
        decoding = self._mix(step, pool, running, run_ids, in_batch) if mixed and batch_size else None
        if decoding is not None:
            # The mixed batch (prefills, then the decodes) becomes the running batch next step, in
            # that order, and a fresh batch's batch_is_full is False
            full = False
        else:
            decoding = np.zeros(0, dtype=np.int64)
        prefills = int(resumed_joins) + new_ids.size
        joined = prefills + decoding.size
        run_join = np.concatenate([np.array([resumed] if resumed_joins else [], dtype=np.int64), decoding])
        run_places = np.concatenate([np.full(int(resumed_joins), base, dtype=np.int64),
                                     base + prefills + np.arange(decoding.size, dtype=np.int64)])
        if run_join.size:
            step.set_request_state(running, run_join, **{JOIN.name: run_places})
        if new_ids.size:
            step.set_request_state(waiting, new_ids, **{JOIN.name: base + int(resumed_joins)
                                                        + np.arange(new_ids.size, dtype=np.int64)})
        # The next step expects the running batch plus this whole batch: a request that finished or
        # stays chunked (filtered out of the last batch, scheduler.py:get_next_batch_to_run) makes
        # the batch smaller than that, which clears batch_is_full.
        if batch_size == 0:
            # The running batch was empty: next step the new prefill batch *becomes* the running
            # batch (`self.running_batch = last`), a fresh ScheduleBatch whose batch_is_full is False.
            full = False
        done(new_chunked, len(batch_rows), float(base + joined))
