"""A pipeline's steady answers lowered to one Numba kernel call per steady decode step.

Before a steady decode step the runtime asks each pass of a stateful pipeline what it writes
(`StepPass.steady_state`) and in which order the batch decodes (`steady_order`): in Python, a
`WindowContext` read and a kernel call per pass, 25-30 µs of FastServe's ~60 µs step on a
2-core machine where `vllm`'s whole step is ~15. Here the answers are compiled the way the
routing pipeline is (`schedir.lowering.route_program`): each pass whose answer has a lowered
form (`StepPass.steady_lowered`, a Numba function beside `steady_state` in the pass's own file,
written rule for rule after it) becomes an opcode with its options and table rows as numbers
(`steady_lowered_options`), and one kernel (`run_steady`) asks them in pipeline order over the
runtime's tables (`schedir.lowering.steady_layout`), into buffers the program keeps. A pass
that keeps the default answer (`{}` while its waiting window is empty) is an opcode too when
the class that writes its window names the window's rule (`steady_layout.window_steady_lowered`:
nobody, the oversized, nobody while the seats are taken: `schedule-running`, `verify-step`,
`reject-oversized`, `admit-greedy`); else it is asked in Python. The runtime
asks the program and settles the step in one call (`schedir.runtime.steady_kernel`).

A pipeline is lowered only when every pass that writes its own steady answer has a lowered form
(written by the same class that writes the answer: a subclass with a rule of its own does not
inherit its parent's kernel), the scheduler state a lowered answer writes is numbers (its slots
of `SS`, written back once the step was taken), and no pass asked in Python declares scheduler
state (its window could read what a lowered pass before it writes). The answers are the same as
asking the passes (tested step by step; `python benchmarks/parity_fuzz.py --steady` checks the
steady steps against the IR). Lowered: FastServe's `mlfq-*` passes, whose four Python answers
cost 2-3x `vllm`'s whole steady step, the seed's `memory-aware-preemption` (`with-all-passes`)
and vLLM v0's passes (`vllm-v0*`: the delay rule's clock and the running queue's places are
scheduler state; under the priority policy the sorted deque's record and the batch's order). `python benchmarks/steady_answers.py` times the program against asking in
Python. Asked in Python: SGLang's and VTC's passes (transitions held over steps), `order-slo`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import itemgetter

import attrs
import numba as nb
import numpy as np

from schedir.ir.pass_base import StepPass
from schedir.lowering.own_kernel import definer, own_kernel
from schedir.lowering.steady_layout import ASK_IR, MEMO_WIDTH, ORDERED, WROTE, SteadyLayout, \
    window_steady_lowered
from schedir.passes.memory_aware_preemption import map_steady_lowered
from schedir.passes.mlfq_account import account_steady_lowered
from schedir.passes.mlfq_levels import levels_steady_lowered
from schedir.passes.mlfq_order import order_steady_lowered
from schedir.passes.mlfq_swap_in import swap_in_steady_lowered
from schedir.passes.order_slo import slo_steady_lowered
from schedir.passes.v0_chunked_running import chunked_running_steady_lowered
from schedir.passes.v0_prefills import prefills_steady_lowered
from schedir.passes.v0_priority_preemption import priority_steady_lowered
from schedir.passes.v0_running import running_steady_lowered

# the opcode of each lowered answer is its place here (`run_steady` dispatches on it); 4 is the
# default answer (`{}` while the pass's waiting window is empty) over its window's rule
LOWERED = (levels_steady_lowered, order_steady_lowered, swap_in_steady_lowered, account_steady_lowered,
           window_steady_lowered, map_steady_lowered, prefills_steady_lowered, running_steady_lowered,
           chunked_running_steady_lowered, slo_steady_lowered, priority_steady_lowered)


@nb.njit(cache=True, nogil=True)
def run_steady(codes: np.ndarray, options: np.ndarray, first_write: np.ndarray, write_rows: np.ndarray,
               D: np.ndarray, ST: np.ndarray, NB: np.ndarray, running: np.ndarray, waiting: np.ndarray,
               swapped: np.ndarray, sc: np.ndarray, SS: np.ndarray, memo: np.ndarray, flags: np.ndarray,
               order: np.ndarray, scratch: np.ndarray, rows: np.ndarray, over: np.ndarray) -> int:
    """Ask the lowered answers `codes` in pipeline order, into the caller's buffers (kept across
    steps, `SteadyProgram.buffers_for`: allocating and boxing them cost ~2 µs a step); returns
    flags[0], with flags[0] 0 when one would let the IR decide, flags[1] 1 when a pass ordered
    the batch (the first that did: `order`), flags[2 + i] 1 when pass i wrote its request state for the batch's rows
    (`rows[first_write[i]:...]`; `write_rows`: the `ST` row of each). What a pass wrote the
    passes after it read (`over`, `steady_layout.running_state`). `order`, `scratch` and `rows`
    are as long as `running`; `over` has a slot per `ST` row. `memo`: each pass's memo row (all
    zeros, `MEMO_SET` unset, when made anew); `SS`: the scheduler state's slots, which the
    answers may write for the passes after them (see `schedir.lowering.steady_layout`)."""
    writes = write_rows.size
    flags[:] = 0
    over[:] = -1
    for i in range(codes.size):
        c = codes[i]
        o = options[i]
        w = first_write[i]
        into = order if flags[1] == 0 else scratch  # the first pass that orders the batch decides
        if c == 0:
            r = levels_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, into, rows, w, memo[i], over)
        elif c == 1:
            r = order_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, into, rows, w, memo[i], over)
        elif c == 2:
            r = swap_in_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, into, rows, w, memo[i], over)
        elif c == 3:
            r = account_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, into, rows, w, memo[i], over)
        elif c == 4:
            r = window_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, into, rows, w, memo[i], over)
        elif c == 5:
            r = map_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, into, rows, w, memo[i], over)
        elif c == 6:
            r = prefills_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, into, rows, w, memo[i], over)
        elif c == 7:
            r = running_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, into, rows, w, memo[i], over)
        elif c == 8:
            r = chunked_running_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, into, rows, w,
                                               memo[i], over)
        elif c == 9:
            r = slo_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, into, rows, w, memo[i], over)
        else:
            r = priority_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, into, rows, w, memo[i],
                                        over)
        if r == ASK_IR:
            return 0
        if r == ORDERED:
            flags[1] = 1
        elif r == WROTE:
            flags[2 + i] = 1
            end = first_write[i + 1] if i + 1 < codes.size else writes
            for j in range(w, end):
                over[write_rows[j]] = j
    flags[0] = 1
    return 1


def lowered_form(kind: type) -> object | None:
    """The pass class's lowered steady answer: its kernel, `StepPass` itself for a class that keeps
    the default answers with no kernel of its window's rule (asked in Python), or None (it has an
    answer of its own and no kernel written with it). A default answer reads the pass's waiting
    window, so its kernel must be written by the class that writes the window."""
    if definer(kind, "steady_state") is StepPass and definer(kind, "steady_order") is StepPass:
        return own_kernel(kind, ("waiting_window",), "steady_lowered", LOWERED) or StepPass
    return own_kernel(kind, ("steady_state", "steady_order"), "steady_lowered", LOWERED)


@attrs.frozen
class SteadyProgram:
    """A pipeline's lowered steady answers: opcodes, options, and the passes still asked in Python."""

    codes: np.ndarray  # int64 opcode per lowered pass, in pipeline order
    options: np.ndarray  # float64[passes, width]: each one's `steady_lowered_options(layout)`
    first_write: np.ndarray  # int64: each one's first row of the written request state
    writes: tuple[str, ...]  # the request state written for the batch's rows, in pipeline order
    write_rows: np.ndarray  # int64: the `ST` row of each of `writes` (the layout's)
    # per writing pass: (its flag in `run_steady`'s flags, its (name, row of `rows`) pairs)
    slots: tuple[tuple[int, tuple[tuple[str, int], ...]], ...]
    asked: tuple[StepPass, ...]  # the passes keeping the default answer (asked in Python)
    scalars: tuple[str, ...] = ()  # the scheduler state in `SS`, slot by slot (the layout's)
    memo_kept: list = attrs.field(factory=lambda: [0], eq=False, repr=False, init=False)  # steps reusing its memo
    # its memo's key among the runtime's answers over the queued requests (one per program)
    memo_key: list = attrs.field(factory=lambda: [("steady-program", object())], eq=False, repr=False, init=False)
    # (plan, marks, work, flags, order): the kernel's inputs and buffers (`buffers_for`; flags and
    # order are views of marks and work), made again when the batch's size changes
    buffers: list = attrs.field(factory=lambda: [None], eq=False, repr=False, init=False)
    # (SS, a reader of its values from the scheduler state), made once
    scalar_slots: list = attrs.field(factory=lambda: [None], eq=False, repr=False, init=False)

    def scalars_from(self, scheduler_state: Mapping[str, float | np.ndarray]) -> np.ndarray:
        """`SS` for this call: the scheduler state's values in their slots (a buffer the program
        keeps; loaded anew every call, as an answer that left the step to the IR may have written it)."""
        slots = self.scalar_slots[0]
        if slots is None:
            names = self.scalars
            slots = self.scalar_slots[0] = (np.zeros(len(names), dtype=np.float64), itemgetter(*names) if len(
                names) > 1 else (lambda state, n=names[0]: (state[n],)))
        SS, values = slots
        SS[:] = values(scheduler_state)
        return SS

    def write_scalars(self, scheduler_state: dict) -> None:
        """Write the slots the last answers left (`scalars_from`'s buffer) into the scheduler state,
        once the step was taken: a slot no answer wrote holds the value it was loaded with."""
        scheduler_state.update(zip(self.scalars, self.scalar_slots[0][0].tolist(), strict=True))

    @classmethod
    def lower(cls, passes: Sequence[StepPass], layout: SteadyLayout) -> SteadyProgram | None:
        """The passes' answers lowered, or None when one has no lowered form (or none has one), one
        names scheduler state the layout has no slot for (not a number), or a pass asked in Python
        declares scheduler state."""
        codes, rows, first, writes, asked = [], [], [], [], []
        for p in passes:
            kernel = lowered_form(type(p))
            if kernel is None:
                return None
            if kernel is StepPass:
                if p.scheduler_state:
                    return None
                asked.append(p)
                continue
            codes.append(next(i for i, k in enumerate(LOWERED) if k is kernel))
            try:
                rows.append(tuple(float(v) for v in p.steady_lowered_options(layout)))
            except KeyError:  # a slot the layout lacks
                return None
            first.append(len(writes))
            writes.extend(p.steady_lowered_writes)
        if not codes or len(set(writes)) < len(writes):
            return None
        width = max(len(r) for r in rows) or 1
        options = np.zeros((len(rows), width), dtype=np.float64)
        for i, r in enumerate(rows):
            options[i, :len(r)] = r
        ends = first[1:] + [len(writes)]
        slots = tuple((2 + i, tuple((writes[j], j) for j in range(a, b)))
                      for i, (a, b) in enumerate(zip(first, ends, strict=True)) if b > a)
        scalars = tuple(sorted(layout.scalars, key=layout.scalars.__getitem__))
        return cls(np.asarray(codes, dtype=np.int64), options, np.asarray(first, dtype=np.int64), tuple(writes),
                   np.asarray([layout.state(n) for n in writes], dtype=np.int64), slots, tuple(asked), scalars)

    @property
    def writer(self) -> tuple[int, ...]:
        """The pass (its place in `codes`) that writes each of `writes` (from `slots`)."""
        return tuple(flag - 2 for flag, named in self.slots for _ in named)

    def buffers_for(self, held: dict, ST: np.ndarray, nr: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                        np.ndarray]:
        """(memo, plan, marks, work): what `program_steady` reads and asks into for a batch of `nr`
        (`schedir.runtime.steady_kernel`), packed as few arrays as the kernel can split (a call
        costs ~0.12 µs an argument): `plan` is codes | first_write | write_rows, `marks` is
        `run_steady`'s flags | over, `work` its order, scratch and rows (a row each). `held`: the
        runtime's answers over the queued requests (`Scheduler._queued_answers`, dropped when
        the queue or a queued request's state changes): the passes' memo rows live there (made
        anew as zeros: every memo unset)."""
        key = self.memo_key[0]
        memo = held.get(key)
        if memo is None:
            memo = held[key] = np.zeros((self.codes.size, MEMO_WIDTH), dtype=np.int64)
        else:
            self.memo_kept[0] += 1
        buffers = self.buffers[0]
        if buffers is None or buffers[2].shape[1] != nr or buffers[1].size != 2 + self.codes.size + ST.shape[0]:
            n = self.codes.size
            plan = np.concatenate((self.codes, self.first_write, self.write_rows)).astype(np.int64)
            marks = np.zeros(2 + n + ST.shape[0], dtype=np.int64)
            work = np.empty((2 + self.write_rows.size, nr), dtype=np.int64)
            buffers = self.buffers[0] = (plan, marks, work, marks[:2 + n], work[0])
        return memo, buffers[0], buffers[1], buffers[2]

    def ordered(self) -> np.ndarray | None:
        """The batch order the last answers gave (positions in the running queue; a copy), or None."""
        flags, order = self.buffers[0][3:5]
        return order.copy() if flags[1] else None
