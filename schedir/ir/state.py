"""State a pass keeps across steps, declared once and carried by the runtime.

Most scheduling ideas read only what the engine knows about a request (its prompt, what is
computed, its priority). Some keep their own memory: FastServe's MLFQ level and attained
service per request, VTC's per-tenant counters, SGLang's `new_token_ratio` that decays step by
step, the step a request last ran (an LRU victim rule). A pass declares such state on its
class, and nothing else is needed:

    class MlfqOrder(StepPass):
        request_state = (RequestState("level", default=-1, doc="MLFQ queue level; -1: not placed yet"),)
        scheduler_state = (SchedulerState("quantum_scale", default=1.0),)

- **Request state** is an int64 column per request. The runtime keeps it in its request table
  for the request's whole life (preemptions included) and puts it in every `req.queue` of the
  step IR beside the engine's own columns, so a pass reads it like any column
  (`step.column(value, "level")`) and a dump shows it. A new request starts at `default`, or at
  the value the engine gives in `Request.state` (a tenant id, a deadline). A pass writes new
  values with `step.set_request_state(value, ids, level=...)`: a `req.set_state` op the runtime
  applies after the step (the last write of a request's column wins).
- **Scheduler state** is a float scalar of the whole scheduler. The step IR starts with a
  `sched.state` op listing every declared value; a pass reads one with `step.state(name)` and
  writes it with `step.set_state(name=value)` (a `sched.set_state` op), applied after the step.

Because the state is in the IR, a dumped step replays alone to the same decisions. Two passes
may declare the same name (one writes, the other reads) if they agree on its default; the pass
manager refuses a pipeline whose declarations conflict, naming both passes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import attrs
import numpy as np

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
RESERVED_COLUMNS = frozenset({
    "id", "prompt", "computed", "total", "max_tokens", "priority", "arrival", "status", "blocks", "in_flight",
    "queued", "rank", "placeholders", "stale", "eos", "ignore_eos", "preemptions", "outputs", "has_stop", "serial",
    "hit", "cached_free", "tokens", "reason",
})
"""Names the runtime's own columns and the decision ops already use."""


def _state_name(instance: object, attribute: attrs.Attribute, value: str) -> None:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(f"state name {value!r} must be lower_snake_case (letters, digits, underscores)")


@attrs.frozen
class RequestState:
    """A per-request int64 column a pass owns: initialised at arrival, kept until the request ends."""

    name: str = attrs.field(validator=_state_name)
    default: int = 0
    doc: str = ""
    bounds: tuple[int, int] | None = None
    """(lowest, highest) value an engine may give in `Request.state` (checked at add_request)."""

    def __attrs_post_init__(self) -> None:
        if self.name in RESERVED_COLUMNS:
            raise ValueError(f"request state '{self.name}' would shadow the runtime's column of that name")

    def check(self, value: int) -> str | None:
        """Why `value` is not acceptable for this state, or None."""
        if self.bounds is not None and not self.bounds[0] <= value <= self.bounds[1]:
            return f"must be in {self.bounds[0]}..{self.bounds[1]}, got {value}"
        return None

    def describe(self) -> str:
        return f"{self.name} (per request, starts at {self.default})" + (f": {self.doc}" if self.doc else "")


@attrs.frozen
class SchedulerState:
    """A number the scheduler keeps from step to step (e.g. SGLang's new_token_ratio), or, with
    `size` > 1, a vector of them (e.g. a counter per tenant), every entry starting at `default`."""

    name: str = attrs.field(validator=_state_name)
    default: float = attrs.field(default=0.0, converter=float)
    doc: str = ""
    size: int = 1

    def __attrs_post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"scheduler state '{self.name}': size must be >= 1, got {self.size}")

    def initial(self) -> float | np.ndarray:
        return self.default if self.size == 1 else np.full(self.size, self.default, dtype=np.float64)

    def describe(self) -> str:
        shape = "scheduler" if self.size == 1 else f"scheduler, {self.size} entries"
        return f"{self.name} ({shape}, starts at {self.default:g})" + (f": {self.doc}" if self.doc else "")


class Transition:
    """A steady step's write of scheduler state as a function of its value, not the value itself
    (`StepPass.steady_state`): an answer written so does not depend on the value, so it holds
    over a run of steps (`StepPass.steady_reads`) and is applied to each (`Decay`, VTC's charge
    and lift in `schedir.passes.vtc_state`)."""

    def apply(self, value: float | np.ndarray) -> float | np.ndarray:
        raise NotImplementedError


@attrs.frozen
class Decay(Transition):
    """A steady step's write of scheduler state as a transition of its value, not the value:
    `unset` where the value is below 0 (not set yet), then lowered by `by`, not below `floor`.
    SGLang's new_token_ratio after a decode step is `Decay(step, floor, init)`; `Decay(0, 0,
    init)` sets an unset ratio and leaves a set one. Written so (`StepPass.steady_state`), the
    answer does not depend on the value, and holds over a run of steps (`StepPass.steady_reads`)."""

    by: float
    floor: float
    unset: float

    def apply(self, value: float) -> float:
        return max((self.unset if value < 0 else value) - self.by, self.floor)


@attrs.frozen
class DeclaredState:
    """Every state a pipeline's passes declare, in first-declared order."""

    requests: tuple[RequestState, ...] = ()
    scheduler: tuple[SchedulerState, ...] = ()

    @property
    def request_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.requests)

    @property
    def scheduler_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.scheduler)

    def __bool__(self) -> bool:
        return bool(self.requests or self.scheduler)


class StateConflict(ValueError):
    """Two passes declare the same state differently."""


def declared_state(passes: Iterable[object]) -> DeclaredState:
    """The union of the passes' `request_state` and `scheduler_state`; a name declared twice
    must be declared the same way (same default), else `StateConflict` names both passes."""
    requests: dict[str, tuple[RequestState, str]] = {}
    scheduler: dict[str, tuple[SchedulerState, str]] = {}
    for p in passes:
        pass_name = getattr(p, "name", type(p).__name__)
        _merge(requests, getattr(p, "request_state", ()), pass_name, "request")
        _merge(scheduler, getattr(p, "scheduler_state", ()), pass_name, "scheduler")
    clash = set(requests) & set(scheduler)
    if clash:
        name = sorted(clash)[0]
        raise StateConflict(f"state '{name}' is declared per request by pass '{requests[name][1]}' and per "
                            f"scheduler by pass '{scheduler[name][1]}'")
    return DeclaredState(tuple(s for s, _ in requests.values()), tuple(s for s, _ in scheduler.values()))


def _merge(into: dict, declared: Sequence, pass_name: str, kind: str) -> None:
    for s in declared:
        seen = into.get(s.name)
        if seen is None:
            into[s.name] = (s, pass_name)
        elif seen[0] != s and (seen[0].default != s.default or getattr(seen[0], "size", 1) != getattr(s, "size", 1)):
            raise StateConflict(f"{kind} state '{s.name}' is declared by pass '{seen[1]}' with default "
                                f"{seen[0].default}{_size(seen[0])} and by pass '{pass_name}' with default "
                                f"{s.default}{_size(s)}")


def _size(s: object) -> str:
    size = getattr(s, "size", 1)
    return f" (size {size})" if size != 1 else ""
