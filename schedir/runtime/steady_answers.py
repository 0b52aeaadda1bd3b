"""The passes' answers before a steady decode step, held over a run of steps while what they read holds.

A pipeline whose passes keep state answers, before each steady decode step, what each pass
writes (`StepPass.steady_state`) and in which order the batch decodes (`steady_order`). Over a
run of decode steps the answers repeat: SGLang's passes answer the same thing until a request
arrives or leaves, but for the ratio that decays every step, which they write as a transition
(`schedir.ir.state.Decay`; VTC's counters likewise, `Transition`). When every pass names the
scheduler state its answers read (`StepPass.steady_reads`), the runtime asks them once and
applies the answers it holds to the following steps, until the queues are other arrays,
declared request state was written, or a value they read changed; then it asks again. A
pipeline with a pass that does not declare is asked every step. One `SteadyAnswers` per installed pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import itemgetter

import numpy as np

from schedir.ir.pass_base import StepPass
from schedir.ir.state import Transition
from schedir.lowering.steady_program import SteadyProgram

_NO_CONSTANTS: dict = {}  # read only (the constants of an answer that sets none)


class SteadyAnswers:
    """The answers of one pipeline's declared passes, as one step's writes (constants set, then
    transitions applied, name by name in pipeline order) and the batch order, with what they
    were asked under. The runtime replaces its queue arrays whenever they change (never writes
    them in place), so identity is sameness; holding them here keeps an old array's identity
    from being taken by a new one."""

    def __init__(self, passes: Sequence[StepPass], orderers: Sequence[StepPass],
                 scheduler_state: Mapping[str, float | np.ndarray], request_names: Sequence[str] = (),
                 program: SteadyProgram | None = None) -> None:
        self.passes = tuple(passes)
        # the answers lowered to one kernel call (`schedir.lowering.steady_program`), when they all lower
        self.program = program
        self.lowered = True  # off: every pass asked in Python (the tests' reference)
        self.request_names = frozenset(request_names)  # declared request state: written per batch row
        self.orderers = tuple(orderers)
        reads = [p.steady_reads for p in self.passes]
        names = sorted(set().union(*[r for r in reads if r is not None]))
        # held over steps only when every pass declares what it reads, and that is numbers
        self.holds = bool(self.passes) and all(r is not None for r in reads) and all(
            not isinstance(scheduler_state.get(n, 0.0), np.ndarray) for n in names)
        self.reads = tuple(names)
        # the values they read, as one tuple (itemgetter: one C call, where a comprehension costs µs)
        self.read_values = (itemgetter(*names) if len(names) > 1 else
                            (lambda state, n=names[0]: (state[n],)) if names else (lambda state: ()))
        self.reuse = True  # off: every pass asked every step (the tests' reference)
        self.held: tuple | None = None  # (running, waiting, request-state writes, read values, answer)
        self.asked = 0  # steps whose passes were asked (the others took held answers)

    def holding(self, running: np.ndarray, waiting: np.ndarray, request_state_writes: int,
                scheduler_state: Mapping[str, float | np.ndarray]) -> tuple | None:
        """The answer held from an earlier step when it still holds (the same queues, no request
        state written, the same values read), else None (and it is dropped)."""
        held = self.held
        if held is not None:
            if (held[0] is running and held[1] is waiting and held[2] == request_state_writes
                    and held[3] == self.read_values(scheduler_state)):
                return held[4]
            self.held = None
        return None

    def hold(self, running: np.ndarray, waiting: np.ndarray, request_state_writes: int,
             scheduler_state: Mapping[str, float | np.ndarray], answer: tuple) -> None:
        """Keep `answer` for the next steps, when the passes declare what they read and it writes
        no request state (row values are written, so the next step asks again)."""
        if self.holds and self.reuse and not answer[3]:
            self.held = (running, waiting, request_state_writes, self.read_values(scheduler_state), answer)

    def answer(self, running: np.ndarray, waiting: np.ndarray, request_state_writes: int,
               scheduler_state: Mapping[str, float | np.ndarray], ctx_of) -> tuple | None:  # noqa: ANN001
        """This step's (constants, transitions, order, request-state rows), or None when a pass would
        decide it otherwise, the passes asked in Python (a lowered pipeline's steady step asks its
        program in the runtime's kernel: `schedir.runtime.steady_kernel`); `ctx_of(state)` builds
        the passes' `WindowContext` over a state dict when they must be asked."""
        held = self.holding(running, waiting, request_state_writes, scheduler_state)
        if held is not None:
            return held
        self.asked += 1
        state = dict(scheduler_state)  # as each pass leaves it for the next
        ctx = ctx_of(state)
        constants: dict = {}
        transitions: dict[str, list[Transition]] = {}
        rows: dict[str, np.ndarray] = {}
        requests = self.request_names
        for p in self.passes:
            said = p.steady_state(ctx)
            if not said:
                if said is None:
                    return None
                continue
            for name, value in said.items():
                if name in requests:  # the batch's rows' values, aligned with ctx.running
                    rows[name] = ctx.batch_state[name] = value  # the passes after it read them
                elif isinstance(value, Transition):
                    if name in constants:  # set earlier this step: the result is a constant too
                        constants[name] = value.apply(constants[name])
                    else:
                        transitions.setdefault(name, []).append(value)
                    state[name] = value.apply(state[name])
                else:
                    constants[name] = value
                    transitions.pop(name, None)
                    state[name] = value
        order = None
        for p in self.orderers:  # the first pass that orders the batch decides
            order = p.steady_order(ctx)
            if order is not None:
                break
        answer = (constants, tuple(transitions.items()), order, tuple(rows.items()))
        self.hold(running, waiting, request_state_writes, scheduler_state, answer)
        return answer

    @staticmethod
    def write(scheduler_state: dict, answer: tuple) -> None:
        """Write a step's answers into the scheduler state (once the step was taken)."""
        constants, transitions, _, _ = answer
        if constants:
            scheduler_state.update(constants)
        for name, steps in transitions:
            value = scheduler_state[name]
            for step in steps:
                value = step.apply(value)
            scheduler_state[name] = value
