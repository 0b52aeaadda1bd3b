"""Run a seed-style `OptimizationPass` (reorder / filter the waiting list) as an IR pass.

The seed scheduler's passes took the waiting requests as Python objects and
returned them reordered, possibly with some left out. `as_step_pass` wraps one
so that it runs inside a pipeline: its order becomes a `req.sort` keyed
`"seed:<name>"`, and the requests it left out are deferred with reason
`policy`. This path builds one Python object per waiting request, so it is for
porting and experiments, not for the hot path.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

import attrs
import numpy as np

from schedir.dialects.codes import Reason
from schedir.dialects.sched import StepFacts
from schedir.ir.errors import PassFailure
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step


@attrs.frozen
class RequestInfo:
    """One waiting request as a seed pass sees it."""

    request_id: int
    prompt_len: int
    computed: int
    total: int
    max_tokens: int
    priority: int
    arrival: int
    hit_tokens: int = 0


class OptimizationPass(ABC):
    """The seed's pass interface: return the waiting requests reordered, optionally filtered."""

    name: str = ""

    @abstractmethod
    def optimize(self, requests: list[RequestInfo], facts: StepFacts) -> list[RequestInfo]:
        """Requests left out of the result wait for a later step."""


def as_step_pass(
    seed: OptimizationPass | type[OptimizationPass],
    *,
    name: str | None = None,
    requires: Iterable[str] = (),
    provides: Iterable[str] = ("order",),
    invalidates: Iterable[str] = (),
    queue: str = "waiting",
) -> type[StepPass]:
    """A `StepPass` class that runs `seed` on the pending `queue` set."""
    instance = seed() if isinstance(seed, type) else seed
    pass_name = name or instance.name
    if not pass_name:
        raise ValueError("a wrapped OptimizationPass needs a name (set `name` on it or pass name=...)")

    @dataclass(frozen=True)
    class SeedPass(StepPass):
        __doc__ = f"{(type(instance).__doc__ or 'A seed-style pass.').strip().splitlines()[0]} (seed pass)"

        def run(self, step: Step) -> None:
            _run_seed(instance, self.name, queue, step)

    SeedPass.name = pass_name  # type: ignore[misc]
    SeedPass.requires = frozenset(requires)  # type: ignore[misc]
    SeedPass.provides = frozenset(provides)  # type: ignore[misc]
    SeedPass.invalidates = frozenset(invalidates)  # type: ignore[misc]
    SeedPass.__name__ = SeedPass.__qualname__ = f"Seed_{pass_name.replace('-', '_')}"
    return SeedPass


def _run_seed(instance: OptimizationPass, pass_name: str, queue: str, step: Step) -> None:
    pending = step.pending(queue)
    if pending is None:
        root = step.queue(queue)
        if root is not None and not len(root):  # an empty queue: the seed still runs (it may keep state)
            _call_seed(instance, pass_name, [], step, set())
        return
    ids = step.ids(pending)
    cols = step.columns(pending, ("prompt", "computed", "total", "max_tokens", "priority", "arrival"))
    hits, _ = step.prefix_hits(pending)
    rows = zip(ids.tolist(), *(c.tolist() for c in cols), hits.tolist(), strict=True)
    requests = [RequestInfo(*row) for row in rows]
    order = _call_seed(instance, pass_name, requests, step, set(ids.tolist()))
    kept = np.asarray(order, dtype=np.int64)
    dropped = ids[~np.isin(ids, kept)]
    sorted_set = step.sort(pending, (f"seed:{pass_name}",), np.concatenate([kept, dropped]))
    if dropped.size:
        step.defer(sorted_set, dropped, np.full(dropped.size, int(Reason.POLICY), dtype=np.int64))
        step.keep(sorted_set, kept)


def _call_seed(instance: OptimizationPass, pass_name: str, requests: list[RequestInfo], step: Step,
               known: set[int]) -> list[int]:
    try:
        facts = attrs.evolve(step.facts, facts=tuple(sorted(step.fact_set)))  # the live facts
        result = instance.optimize(list(requests), facts)
    except Exception as err:  # a user's pass failing is reported, not re-raised raw
        raise PassFailure(pass_name, f"raised {type(err).__name__}: {err}") from err
    return _checked_ids(pass_name, result, known)


def _checked_ids(pass_name: str, result: object, known: set[int]) -> list[int]:
    if not isinstance(result, list):
        raise PassFailure(pass_name, f"must return a list of RequestInfo, returned {type(result).__name__}")
    seen: set[int] = set()
    order: list[int] = []
    for item in result:
        if not isinstance(item, RequestInfo):
            raise PassFailure(pass_name, f"returned {item!r}, not a RequestInfo")
        rid = item.request_id
        if rid not in known:
            raise PassFailure(pass_name, f"returned request {rid}, which is not in the waiting set")
        if rid in seen:
            raise PassFailure(pass_name, f"returned request {rid} twice")
        seen.add(rid)
        order.append(rid)
    return order
