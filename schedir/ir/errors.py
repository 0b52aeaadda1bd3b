"""Errors schedir reports to a user: each says what was wrong and where."""

from __future__ import annotations


class SchedirError(Exception):
    """Base of every error schedir raises for bad input (never a bug in schedir)."""


class StepParseError(SchedirError):
    """A step IR text that does not parse or verify; the message starts with file:line:column."""


class PipelineError(SchedirError):
    """A pipeline refused before it runs: unknown pass, bad option, missing dependency."""


class PassFailure(SchedirError):
    """A pass found the step illegal (or produced an illegal step); names the pass and requests."""

    def __init__(self, pass_name: str, message: str) -> None:
        super().__init__(f"pass '{pass_name}': {message}")
        self.pass_name = pass_name
