"""Bad trace rows: what was wrong, where, and the policy that decides what happens next.

A trace row that cannot be read is never silently used: a loader either refuses the
file at that row (`TraceError`, the default) or skips the row and records a `BadRow`
in `Workload.skipped`, so a caller can always see what was left out.
"""

from __future__ import annotations

from pathlib import Path

import attrs

BAD_ROW_POLICIES = ("error", "skip")


@attrs.frozen
class BadRow:
    """One skipped row: its file, 1-based line number and what was wrong with it."""

    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{Path(self.path).name}:{self.line}: {self.reason}"


class TraceError(ValueError):
    """A trace that cannot be used as given, e.g. `trace.jsonl:17: output_length must be ...`."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"{Path(path).name}:{line}: {reason}")
        self.path = str(path)
        self.line = line
        self.reason = reason


def check_policy(on_bad_row: str) -> str:
    """Refuse an unknown policy before any row is read."""
    if on_bad_row not in BAD_ROW_POLICIES:
        raise ValueError(f"on_bad_row must be one of {BAD_ROW_POLICIES}, got {on_bad_row!r}")
    return on_bad_row


@attrs.define
class BadRowLog:
    """Applies a loader's `on_bad_row` policy: raise at the first bad row, or record and go on."""

    path: str
    policy: str = attrs.field(converter=check_policy)
    rows: list[BadRow] = attrs.Factory(list)

    def report(self, line: int, reason: str) -> None:
        if self.policy == "error":
            raise TraceError(self.path, line, reason)
        self.rows.append(BadRow(self.path, line, reason))

    def refuse(self, line: int, reason: str) -> TraceError:
        """A fault of the whole file (header, no rows): always an error, whatever the policy."""
        suffix = f" ({len(self.rows)} bad rows skipped)" if self.rows else ""
        return TraceError(self.path, line, reason + suffix)
