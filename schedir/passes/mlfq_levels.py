"""mlfq-levels: FastServe's skip-join placement, demotion by attained service, starvation promotion."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np

from schedir.ir.array_step import ArrayStep
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.window import WindowContext
from schedir.lowering.steady_layout import ANSWERED, ASK_IR, MEMO_SET, SC_STEP, WROTE
from schedir.passes.mlfq_state import LAST_RUN, LEVEL, LEVEL_START, MLFQ_STATE, SERVED_DECODE, SERVED_PREFILL


@numba.njit(cache=True, nogil=True, inline="always")
def _place(lv: int, st: int, last: int, prompt: int, prefill: int, decode: int, step: int, quantum: int, ratio: int,
           levels: int, prefill_cost: int, starve_steps: int) -> tuple[int, int, int]:
    """One request's (level, level_start, last_run) after `place_rows`' three rules."""
    served = decode + (prefill + prefill_cost - 1) // prefill_cost
    if lv < 0:  # skip-join
        first = (prompt + prefill_cost - 1) // prefill_cost
        lv = 0
        q = quantum
        while lv < levels - 1 and q < first:
            lv += 1
            q *= ratio
        return lv, served, step
    q = quantum
    for _ in range(lv):
        q *= ratio
    while lv < levels - 1 and served - st >= q:  # demotion
        st += q
        lv += 1
        q *= ratio
    if lv > 0 and step - last >= starve_steps:  # starvation: promote to the top
        return 0, served, step
    return lv, st, last


@numba.njit(cache=True, nogil=True)
def place_rows(rows: np.ndarray, level: np.ndarray, start: np.ndarray, last_run: np.ndarray, prompt: np.ndarray,
               prefill: np.ndarray, decode: np.ndarray, step: int, quantum: int, ratio: int, levels: int,
               prefill_cost: int, starve_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """New (level, level_start, last_run) of the requests `rows`, as int64[3, n], and the positions
    in `rows` whose placement changes their state; FastServe §4.1:

    - skip-join: a job not placed yet joins the highest level whose quantum covers its first
      iteration (its prefill, `ceil(prompt / prefill_cost)` units), not always the top one;
    - demotion: a job that has used its level's quantum (quantum * ratio**level units of
      service since it entered the level) moves down one level, repeatedly, to the last level;
    - starvation: a job that has not run for `starve_steps` steps goes back to the top level.

    The columns are read by row id: whole-table views for a queue of thousands (no gather per
    column, ~200 µs a step), or a step's own columns with `rows` their positions."""
    n = rows.size
    out = np.empty((3, n), dtype=np.int64)
    changed = np.empty(n, dtype=np.int64)
    c = 0
    for i in range(n):
        r = rows[i]
        lv, st, last = _place(level[r], start[r], last_run[r], prompt[r], prefill[r], decode[r], step, quantum,
                              ratio, levels, prefill_cost, starve_steps)
        out[0, i] = lv
        out[1, i] = st
        out[2, i] = last
        if lv != level[r] or st != start[r] or last != last_run[r]:
            changed[c] = i
            c += 1
    return out, changed[:c]


NEVER = np.iinfo(np.int64).max


@numba.njit(cache=True, nogil=True, inline="always")
def _next_change(rows: np.ndarray, level: np.ndarray, start: np.ndarray, last_run: np.ndarray, prompt: np.ndarray,
                 prefill: np.ndarray, decode: np.ndarray, step: int, quantum: int, ratio: int, levels: int,
                 prefill_cost: int, starve_steps: int) -> int:
    first = NEVER
    for r in rows:
        lv, st, last = _place(level[r], start[r], last_run[r], prompt[r], prefill[r], decode[r], step, quantum,
                              ratio, levels, prefill_cost, starve_steps)
        if lv != level[r] or st != start[r] or last != last_run[r]:
            return step
        if lv > 0:  # `_place`'s starvation rule promotes it at this step
            first = min(first, last + starve_steps)
    return first


@numba.njit(cache=True, nogil=True)
def queued_next_change(waiting: np.ndarray, swapped: np.ndarray, level: np.ndarray, start: np.ndarray,
                       last_run: np.ndarray, prompt: np.ndarray, prefill: np.ndarray, decode: np.ndarray, step: int,
                       quantum: int, ratio: int, levels: int, prefill_cost: int, starve_steps: int) -> int:
    """The first step, from `step` on, at which `place_rows` changes a waiting or swapped job
    (`step` itself: now; NEVER: none will), for as long as they stay queued: their service does
    not grow then, so no demotion comes later than now, and only the starvation clock moves.
    The steady program keeps it over the steps the queues stay as they are."""
    return min(_next_change(waiting, level, start, last_run, prompt, prefill, decode, step, quantum, ratio, levels,
                            prefill_cost, starve_steps),
               _next_change(swapped, level, start, last_run, prompt, prefill, decode, step, quantum, ratio, levels,
                            prefill_cost, starve_steps))


@numba.njit(cache=True, nogil=True)
def demoted_running(running: np.ndarray, level: np.ndarray, start: np.ndarray, last_run: np.ndarray,
                    prompt: np.ndarray, prefill: np.ndarray, decode: np.ndarray, step: int, quantum: int, ratio: int,
                    levels: int, prefill_cost: int, starve_steps: int, out: np.ndarray) -> int:
    """`place_rows` over the running jobs, into `out[0]` (level) and `out[1]` (level start),
    aligned with `running`: 0 when none changes, 1 when some job is demoted and nothing else
    changes, -1 when a running job would be placed otherwise (skip-join, or starvation moving
    its last run): the IR decides that."""
    moved = 0
    for k in range(running.size):
        r = running[k]
        lv, st, last = _place(level[r], start[r], last_run[r], prompt[r], prefill[r], decode[r], step, quantum,
                              ratio, levels, prefill_cost, starve_steps)
        if last != last_run[r] or level[r] < 0:
            return -1
        if lv != level[r] or st != start[r]:
            moved = 1
        out[0, k] = lv
        out[1, k] = st
    return moved


@numba.njit(cache=True, nogil=True)
def levels_steady_lowered(D, ST, NB, running, waiting, swapped, sc, SS, o, order, rows, w, m, over) -> int:  # noqa: ANN001
    """`MlfqLevels.steady_state` in the steady program (`schedir.lowering.steady_program`): over
    the queued jobs, the step at which one changes, kept in the memo (`queued_next_change`) while
    they stay queued as they are; the running jobs' demotions into `rows[w]` / `rows[w + 1]`."""
    step = sc[SC_STEP]
    if m[MEMO_SET] == 0:
        m[1] = queued_next_change(waiting, swapped, ST[int(o[0])], ST[int(o[1])], ST[int(o[2])], D[int(o[3])],
                                  ST[int(o[4])], ST[int(o[5])], step, int(o[6]), int(o[7]), int(o[8]), int(o[9]),
                                  int(o[10]))
        m[MEMO_SET] = 1
    if step >= m[1]:
        return ASK_IR
    moved = demoted_running(running, ST[int(o[0])], ST[int(o[1])], ST[int(o[2])], D[int(o[3])], ST[int(o[4])],
                            ST[int(o[5])], step, int(o[6]), int(o[7]), int(o[8]), int(o[9]), int(o[10]), rows[w:w + 2])
    if moved < 0:
        return ASK_IR
    return WROTE if moved else ANSWERED


@dataclass(frozen=True)
class MlfqLevels(StepPass):
    """Place, demote and promote every request among FastServe's MLFQ levels (state only).

    Level i has a quantum of `quantum * quantum-ratio**i` iteration units (a decode token is
    one unit, a prefill of t tokens ceil(t / prefill-cost) units). A new request skips to the
    highest level whose quantum covers its prefill (skip-join); a request that used up its
    level's quantum is demoted; one that has not run for `starve-steps` steps is promoted to
    level 0 (FastServe's starvation rule, in steps so that a step replays alone). Writes the
    changed levels with `req.set_state`; `mlfq-order` reads them in the same step.
    """

    name: ClassVar[str] = "mlfq-levels"
    provides: ClassVar[frozenset[str]] = frozenset({"mlfq-levels"})
    request_state = MLFQ_STATE

    quantum: int = 8
    quantum_ratio: int = 2
    levels: int = 6
    prefill_cost: int = 512
    starve_steps: int = 400

    # steady decode steps: it changes nobody's level then (`steady_state`)
    steady_when: ClassVar[dict[str, str]] = {}
    steady_swapped: ClassVar[bool] = True  # its answer judges the swapped jobs too

    def steady_state(self, ctx: WindowContext) -> dict[str, np.ndarray] | None:
        """Nothing written, when no running, waiting or swapped job is placed, demoted or
        promoted this step (every queue's levels as `run` would place them); the running jobs'
        new level and level start (aligned with `ctx.running`) when the only change is the
        demotion of running jobs (the passes after it read them: `mlfq-order` then judges
        whether a demoted job gives way); else None: the IR decides (a queued job placed or
        promoted can take a seat)."""
        state_of = ctx.state_of
        args = (state_of(LEVEL.name), state_of(LEVEL_START.name), state_of(LAST_RUN.name), ctx.column_of("prompt"),
                state_of(SERVED_PREFILL.name), state_of(SERVED_DECODE.name), ctx.step, self.quantum,
                self.quantum_ratio, self.levels, self.prefill_cost, self.starve_steps)
        # the step at which a queued job is next placed otherwise, held while the queues stay as they are
        if ctx.queued(("mlfq-levels-next-change", self),
                      lambda: queued_next_change(ctx.waiting, ctx.swapped, *args)) <= ctx.step:
            return None
        out = np.empty((2, ctx.running.size), dtype=np.int64)
        moved = demoted_running(ctx.running, *args, out)
        if moved < 0:
            return None
        return {LEVEL.name: out[0], LEVEL_START.name: out[1]} if moved else {}

    steady_lowered_writes = (LEVEL.name, LEVEL_START.name)

    steady_lowered = staticmethod(levels_steady_lowered)

    def placed(self, ctx: WindowContext, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`place_rows` over `rows` as the next step will place them, and the positions in
        `rows` whose state that placement writes (`place_rows`)."""
        state_of = ctx.state_of
        return place_rows(rows, state_of(LEVEL.name), state_of(LEVEL_START.name), state_of(LAST_RUN.name),
                          ctx.column_of("prompt"), state_of(SERVED_PREFILL.name), state_of(SERVED_DECODE.name),
                          ctx.step, self.quantum, self.quantum_ratio, self.levels, self.prefill_cost,
                          self.starve_steps)

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """The waiting jobs it places, demotes or promotes in a step built now (the only ones it
        writes). Their levels after this step's placement, waiting and swapped, are left for
        `mlfq-order`'s rank (`ctx.shared("mlfq-placed-levels")`), the running jobs' for the count
        of those it can displace ("mlfq-placed-running")."""
        if ctx.state_of is None or ctx.column_of is None:
            return None
        placed, changed = self.placed(ctx, ctx.waiting)
        swapped = ctx.memo[("mlfq-placed-swapped", self)] = self.placed(ctx, ctx.swapped)
        ctx.memo["mlfq-placed-levels"] = (placed[0], swapped[0][0])
        ctx.memo["mlfq-placed-running"] = self.placed(ctx, ctx.running)[0][0]  # (the jobs mlfq-order may displace)
        return changed

    def swapped_window(self, ctx: WindowContext) -> np.ndarray | None:
        """The swapped jobs it places, demotes or promotes in a step built now (as `waiting_window`:
        a starving one goes back to the top level)."""
        if ctx.state_of is None or ctx.column_of is None:
            return None
        placed = ctx.memo.get(("mlfq-placed-swapped", self))
        return (self.placed(ctx, ctx.swapped) if placed is None else placed)[1]

    def steady_lowered_options(self, layout) -> tuple[float, ...]:  # noqa: ANN001
        return (layout.state(LEVEL.name), layout.state(LEVEL_START.name), layout.state(LAST_RUN.name),
                layout.column("prompt"), layout.state(SERVED_PREFILL.name), layout.state(SERVED_DECODE.name),
                self.quantum, self.quantum_ratio, self.levels, self.prefill_cost, self.starve_steps)

    def __post_init__(self) -> None:
        for name in ("quantum", "levels", "prefill_cost", "starve_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.quantum_ratio < 1:
            raise ValueError(f"quantum-ratio must be >= 1, got {self.quantum_ratio}")

    array_step_when: ClassVar[dict[str, str]] = {}  # `run_arrays`: any options

    def run_arrays(self, step: ArrayStep) -> None:
        """`run` over an array step (`schedir.ir.array_step`): every queue's requests placed."""
        state = step.state
        for queue in step.queues.values():
            rows = queue.rows
            if not rows.size:
                continue
            placed, changed = place_rows(rows, state(LEVEL.name), state(LEVEL_START.name), state(LAST_RUN.name),
                                         step.column("prompt"), state(SERVED_PREFILL.name),
                                         state(SERVED_DECODE.name), step.facts.step, self.quantum,
                                         self.quantum_ratio, self.levels, self.prefill_cost, self.starve_steps)
            if changed.size:
                step.set_state(rows[changed], mlfq_level=placed[0][changed], mlfq_level_start=placed[1][changed],
                               mlfq_last_run=placed[2][changed])

    def run(self, step: Step) -> None:
        for queue in step.queues():
            if not len(queue):
                continue
            value = queue.result
            level = step.state_column(value, LEVEL.name, LEVEL.default)
            start = step.state_column(value, LEVEL_START.name, LEVEL_START.default)
            last = step.state_column(value, LAST_RUN.name, LAST_RUN.default)
            placed, changed = place_rows(np.arange(level.size), level, start, last, step.column(value, "prompt"),
                                         step.state_column(value, SERVED_PREFILL.name, 0),
                                         step.state_column(value, SERVED_DECODE.name, 0), step.facts.step,
                                         self.quantum, self.quantum_ratio, self.levels, self.prefill_cost,
                                         self.starve_steps)
            if changed.size:
                ids = step.ids(value)
                step.set_request_state(value, ids[changed], mlfq_level=placed[0][changed],
                                       mlfq_level_start=placed[1][changed], mlfq_last_run=placed[2][changed])
