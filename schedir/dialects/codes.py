"""Small integer codes stored in request columns, and their keywords in the IR text.

Columns are int64 arrays, so enumerations are stored as codes; the printer writes
their keyword (`reason = [budget, memory]`) so a dump reads as a decision log.
"""

from __future__ import annotations

from enum import IntEnum


class Reason(IntEnum):
    """Why a request was deferred or rejected this step."""

    BUDGET = 1  # the step's token budget is spent
    MAX_SEQS = 2  # the step already holds max_seqs requests
    MEMORY = 3  # not enough free KV blocks
    BLOCKED = 4  # waits behind a queue head that could not be admitted
    POLICY = 5  # a policy pass chose not to run it this step
    IN_FLIGHT = 6  # scheduled by an earlier step whose update has not arrived
    TOO_LONG = 7  # longer than the model's max length (rejection)
    EXCEEDS_CACHE = 8  # needs more blocks than the whole KV cache (rejection)
    SLO = 9  # predicted to miss its latency target (rejection by an SLO-aware pass)


DEFER_REASONS = frozenset(
    {Reason.BUDGET, Reason.MAX_SEQS, Reason.MEMORY, Reason.BLOCKED, Reason.POLICY, Reason.IN_FLIGHT}
)
REJECT_REASONS = frozenset({Reason.TOO_LONG, Reason.EXCEEDS_CACHE, Reason.SLO})


class Status(IntEnum):
    """Lifecycle state of a request when the step was built."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    SWAPPED = 3


class PreemptMode(IntEnum):
    RECOMPUTE = 0  # drop the KV blocks; the prompt is recomputed on resume
    SWAP = 1  # move the KV blocks to host memory; swapped back on resume


class Phase(IntEnum):
    PREFILL = 0
    DECODE = 1
    MIXED = 2


class Role(IntEnum):
    """What an engine instance of a fleet serves (`cluster.fleet`)."""

    BOTH = 0  # prefill and decode
    PREFILL = 1
    DECODE = 2


class Why(IntEnum):
    """Why a router decided as it did (`cluster.route`, `cluster.reject`)."""

    ROUND_ROBIN = 0  # the next instance in turn
    LEAST_LOAD = 1  # the least loaded instance
    CACHE = 2  # the instance caching the longest prefix (hit ratio above the threshold)
    DISAGGREGATED = 3  # a prefill and a decode instance (P/D disaggregation)
    SLO = 4  # predicted to miss its TTFT or TBT target (rejection)
    OVERLOADED = 5  # no instance has room (rejection)
    NO_INSTANCE = 6  # no instance can serve it (rejection)


def keyword(enum: type[IntEnum], code: int) -> str:
    return enum(code).name.lower()


def keywords(enum: type[IntEnum]) -> dict[str, int]:
    return {member.name.lower(): int(member) for member in enum}


ENUM_COLUMNS: dict[str, type[IntEnum]] = {"reason": Reason, "status": Status, "role": Role, "why": Why}
"""Columns whose values print as keywords of an enumeration."""
