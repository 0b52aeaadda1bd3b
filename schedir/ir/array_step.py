"""An IR step decided over the runtime's arrays: the same passes, the same decisions, no ops built.

An IR step costs its build, one xDSL op per decision and the walks that read them back (~1-2 ms
for FastServe's eight passes over ~800 requests, where its decisions are a few kernel calls).
A pass that declares it (`StepPass.decides_array_steps`) also decides from an `ArrayStep`: the
step's queues as table rows, in the order the passes leave them, the decisions so far as
arrays, and the budgets they consumed, read with the calls a pass makes of a `Step`
(`pending`, `sort`, `keep`, `schedule`, `defer`, `preempt`, `set_state`, `prefix_hits`,
`served`; the budgets as `tokens`, `seqs`, `free_left()`). Its `run_arrays` is written rule for
rule after its `run` (the rules themselves shared where they can be), and the runtime checks
nothing else: the two are compared step by step (`tests/test_runtime_steady.py`,
`test_array_steps_decide_as_the_ir`; `benchmarks/parity_fuzz.py --arrays`). When every pass of a
pipeline declares, the runtime takes its IR steps this way unless it is asked for the IR
(dumps, `keep_ir`, `verify_each`); the decisions are lowered as the IR's are.

Request state a pass writes (`set_state`) is seen by the passes after it, as a `req.set_state`
is: it is written into the table at once, the values it replaced kept (`undo_state`), so a step
that is decided again (a ranked window that did not hold) or fails leaves the table as it found
it. A copy of each written column per step (the earlier way) read the whole table, ~6 columns
of 8,192 rows a FastServe step, whatever the step wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import attrs
import numpy as np

from schedir.dialects.sched import StepFacts
from schedir.ir.step import positions

EMPTY = np.zeros(0, dtype=np.int64)
EMPTY.flags.writeable = False


class ArrayServed(NamedTuple):
    """One scheduling decision's service (`ArrayStep.served`): its rows and their tokens."""

    rows: np.ndarray
    prefill: np.ndarray  # prompt tokens computed this step, per request
    decode: np.ndarray  # generated-token positions computed this step, per request


@attrs.define(eq=False, slots=True)
class ArrayQueue:
    """One queue of an array step: every request the step's `req.queue` would hold (table rows,
    queue order), and those not decided yet in the order the passes left them (`pending`, with
    their positions in `rows`, `at`; None once a pass decided them all)."""

    name: str
    rows: np.ndarray
    pending: np.ndarray | None
    at: np.ndarray | None


def read_only_view(values: np.ndarray) -> np.ndarray:
    """`values` as an IR op's column is: a read-only view, so the kernels that lower either path
    (`settle_step`, `commit`, verify-step's) see one array type and compile once, not again
    mid-run at the first step whose decisions mix writable and read-only arrays (seconds)."""
    if not values.flags.writeable:
        return values
    view = values.view()
    view.flags.writeable = False
    return view


@attrs.define(eq=False, slots=True)
class Decision:
    """One decision on requests of a queue, in the order the passes took them (an IR op's worth):
    kind is 'schedule' (with tokens), 'defer' / 'reject' (with reasons) or 'preempt' (mode)."""

    kind: str
    queue: str
    rows: np.ndarray
    values: np.ndarray = EMPTY  # tokens, or reasons
    mode: str = ""  # a preemption's: "recompute" or "swap"


@attrs.define(eq=False)
class ArrayStep:
    """What the passes read and decide in an array step (see the module docstring). Columns are
    whole-table rows indexed by request row (`column`, `state`): `data` is a read-only view of
    the runtime's table, whose `blocks` row holds every queued request's block count as the
    step's queue columns show it (device blocks, host blocks for a swapped one)."""

    facts: StepFacts
    data: np.ndarray
    column_index: dict[str, int]
    state_table: np.ndarray
    state_index: dict[str, int]
    queues: dict[str, ArrayQueue]
    # prefix-hit tokens of the waiting queue and their blocks in the free queue, aligned with its
    # rows; with `look_up`, looked up only when read (-1: not yet; see `prefix_hit_head`)
    hit: np.ndarray | None = None
    cached_free: np.ndarray | None = None
    look_up: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None  # rows -> (hit, cached_free)
    tokens: int = 0
    seqs: int = 0
    blocks_taken: int = 0
    blocks_given: int = 0
    decisions: list[Decision] = attrs.field(factory=list)
    # block effects per request, as the IR's mem ops hold them: (rows, blocks, shared blocks)
    effects: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = attrs.field(factory=list)
    # the writes so far, in order: (state index, rows, the values they replaced)
    state_undo: list[tuple[int, np.ndarray, np.ndarray]] = attrs.field(factory=list)

    # ------------------------------------------------------------ queues
    def queue(self, name: str) -> ArrayQueue | None:
        return self.queues.get(name)

    def pending(self, name: str) -> ArrayQueue | None:
        """The queue when some of its requests are not decided yet, else None (`Step.pending`)."""
        q = self.queues.get(name)
        if q is None or q.pending is None or not q.pending.size:
            return None
        return q

    def sort(self, q: ArrayQueue, order: np.ndarray) -> None:
        """Reorder the pending requests (`order`: positions in the pending set)."""
        q.pending = q.pending[order]  # type: ignore[index]
        q.at = q.at[order]  # type: ignore[index]

    def keep(self, q: ArrayQueue, picked: np.ndarray) -> None:
        """Leave `picked` (positions in the pending set) pending, in that order (`Step.keep`);
        the others have their decisions."""
        q.pending = q.pending[picked]  # type: ignore[index]
        q.at = q.at[picked]  # type: ignore[index]

    @staticmethod
    def decided(q: ArrayQueue) -> None:
        """Every pending request of `q` has its decision now."""
        q.pending = None
        q.at = None

    # ------------------------------------------------------------ columns
    def column(self, name: str) -> np.ndarray:
        """A queue column of every table row (`blocks`: see the class docstring)."""
        return self.data[self.column_index[name]]

    def state(self, name: str) -> np.ndarray:
        """Declared request state of every row, with this step's writes so far (the table's own
        row: read what you need before writing it)."""
        return self.state_table[self.state_index[name]]

    def set_state(self, rows: np.ndarray, **columns: np.ndarray) -> None:
        """New values of declared request state for `rows`, seen by the passes after this one
        and kept from the next step on (`Step.set_request_state`), unless `undo_state`."""
        if not rows.size:
            return
        table = self.state_table
        for name, values in columns.items():
            index = self.state_index[name]
            self.state_undo.append((index, rows, table[index, rows]))
            table[index, rows] = values

    def wrote_state(self) -> bool:
        """Whether the passes wrote request state (already in the table: see `set_state`)."""
        return bool(self.state_undo)

    def undo_state(self) -> None:
        """Put back the values this step's writes replaced (last write first), so the table is as
        before the step: for a step decided again, or one a pass failed."""
        table = self.state_table
        for index, rows, old in reversed(self.state_undo):
            table[index, rows] = old
        self.state_undo.clear()

    # ------------------------------------------------------------ decisions
    def schedule(self, q: ArrayQueue, rows: np.ndarray, tokens: np.ndarray) -> None:
        if rows.size:
            self.decisions.append(Decision("schedule", q.name, read_only_view(rows), read_only_view(tokens)))
            self.tokens += int(tokens.sum())
            self.seqs += rows.size

    def defer(self, q: ArrayQueue, rows: np.ndarray, reasons: np.ndarray) -> None:
        if rows.size:
            self.decisions.append(Decision("defer", q.name, read_only_view(rows), read_only_view(reasons)))

    def reject(self, q: ArrayQueue, rows: np.ndarray, reasons: np.ndarray) -> None:
        if rows.size:
            self.decisions.append(Decision("reject", q.name, read_only_view(rows), read_only_view(reasons)))

    def preempt(self, q: ArrayQueue, mode: str, rows: np.ndarray) -> None:
        if rows.size:
            self.decisions.append(Decision("preempt", q.name, read_only_view(rows), mode=mode))

    def alloc(self, rows: np.ndarray, blocks: np.ndarray) -> None:
        """New blocks for `rows` (`mem.alloc`; `mem.swap_in` too: the host blocks copied back)."""
        if rows.size:
            self.blocks_taken += int(blocks.sum())
            self.effects.append((rows, blocks, np.zeros(rows.size, dtype=np.int64)))

    def share(self, rows: np.ndarray, blocks: np.ndarray, revived: np.ndarray) -> None:
        """Cached prefix blocks `rows` share (`mem.share`): the `revived` ones leave the free queue."""
        if rows.size:
            self.blocks_taken += int(revived.sum())
            self.effects.append((rows, blocks, blocks))

    # ------------------------------------------------------------ what the decisions use
    def free_left(self) -> int:
        return self.facts.free_blocks + self.blocks_given - self.blocks_taken

    def of_kind(self, kind: str, queue: str | None = None) -> list[Decision]:
        return [d for d in self.decisions if d.kind == kind and (queue is None or d.queue == queue)]

    def scheduled_rows(self) -> np.ndarray:
        parts = [d.rows for d in self.decisions if d.kind == "schedule"]
        return EMPTY if not parts else parts[0] if len(parts) == 1 else np.concatenate(parts)

    def running_not_scheduled(self, queue: str = "running") -> int:
        """Requests of `queue` this step neither scheduled nor preempted: they keep their slots
        (`admit_greedy.running_not_scheduled`)."""
        q = self.queues.get(queue)
        if q is None or not q.rows.size:
            return 0
        from schedir.passes.kernels import count_members  # (the passes' kernels import this module)

        gone = [d.rows for d in self.decisions if d.queue == queue and d.kind in ("schedule", "preempt")]
        if not gone:
            return q.rows.size
        return q.rows.size - count_members(q.rows, np.concatenate(gone) if len(gone) > 1 else gone[0])

    def prefix_hit_source(self, q: ArrayQueue) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(hit, cached_free, positions): pending request i of `q` has `hit[positions[i]]`
        (`Step.prefix_hit_source`; three empty arrays without the step's prefix hits)."""
        if q.name != "waiting" or self.hit is None or q.at is None:
            return EMPTY, EMPTY, EMPTY
        self._look_up(q.at)
        return self.hit, self.cached_free, q.at  # type: ignore[return-value]

    def prefix_hit_head(self, q: ArrayQueue, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`prefix_hit_source` with only the first `count` pending requests' hits looked up (the
        others' read -1): an admission that fills a few seats from a head of hundreds reads a
        few hits (`kernels.fit_arrays`), and each lookup is a walk of the prefix cache per block."""
        if q.name != "waiting" or self.hit is None or q.at is None:
            return EMPTY, EMPTY, EMPTY
        self._look_up(q.at[:count])
        return self.hit, self.cached_free, q.at  # type: ignore[return-value]

    def waiting_hits(self, rows: np.ndarray) -> np.ndarray:
        """The prefix-hit tokens of waiting `rows` (table rows of the waiting queue), looked up
        where not yet."""
        at = positions(self.queues["waiting"].rows, rows)
        self._look_up(at)
        return self.hit[at]  # type: ignore[index]

    def _look_up(self, at: np.ndarray) -> None:
        """Look up the waiting queue's positions `at` whose hits are not known yet."""
        if self.look_up is None or not at.size:
            return
        missing = at[self.hit[at] < 0]  # type: ignore[index]
        if missing.size:
            hit, cached_free = self.look_up(self.queues["waiting"].rows[missing])
            self.hit[missing] = hit  # type: ignore[index]
            self.cached_free[missing] = cached_free  # type: ignore[index]

    def prefix_hits(self, q: ArrayQueue) -> tuple[np.ndarray, np.ndarray]:
        """Cached prefix tokens and cached-free blocks per pending request of `q`, zeros where
        none (`Step.prefix_hits`)."""
        hit, cached_free, at = self.prefix_hit_source(q)
        if not hit.size:
            zeros = np.zeros(0 if q.pending is None else q.pending.size, dtype=np.int64)
            return zeros, zeros
        return hit[at], cached_free[at]

    def served(self) -> Iterator[ArrayServed]:
        """This step's service so far, one per scheduling decision (`Step.served`): tokens below
        the prompt's end count as prefill, the rest as decode."""
        computed_of, prompt_of = self.column("computed"), self.column("prompt")
        for d in self.decisions:
            if d.kind != "schedule":
                continue
            computed = computed_of[d.rows]
            prefill = np.clip(np.minimum(computed + d.values, prompt_of[d.rows]) - computed, 0, None)
            yield ArrayServed(d.rows, prefill, d.values - prefill)
