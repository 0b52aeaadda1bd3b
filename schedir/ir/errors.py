"""Errors schedir reports to a user: each says what was wrong and where."""

from __future__ import annotations

import errno


class SchedirError(Exception):
    """Base of every error schedir raises for bad input (never a bug in schedir)."""


class StepParseError(SchedirError):
    """A step IR text that does not parse or verify; the message starts with file:line:column."""


class PipelineError(SchedirError):
    """A pipeline refused before it runs: unknown pass, bad option, missing dependency."""


class QueueOptionError(PipelineError):
    """A pass option names a queue the input step does not have (a misspelt `queue=waitingx`)."""


class PassFailure(SchedirError):
    """A pass found the step illegal (or produced an illegal step); names the pass and requests."""

    def __init__(self, pass_name: str, message: str) -> None:
        super().__init__(f"pass '{pass_name}': {message}")
        self.pass_name = pass_name


_OS_REASONS = {
    errno.ENOENT: "no such file or folder",
    errno.EISDIR: "is a folder, not a file",
    errno.ENOTDIR: "a part of that path is a file, not a folder",
    errno.EEXIST: "exists and is not a folder",
    errno.EACCES: "permission denied",
    errno.EPERM: "not permitted",
    errno.EROFS: "the file system is read-only",
    errno.ENOSPC: "no space left on the device",
    errno.ENAMETOOLONG: "the name is too long",
}


def os_error_reason(err: OSError) -> str:
    """What went wrong with a file, in words: `no such file or folder`, never `[Errno 2] ...`."""
    reason = _OS_REASONS.get(err.errno or 0)
    if reason is None:
        reason = (err.strerror or type(err).__name__).lower()
    return reason


def os_error_message(err: OSError, subject: str = "", path: object = None, verb: str = "") -> str:
    """`SUBJECT: cannot VERB: REASON`, e.g. `--json out/x.json: cannot write: out exists and is not
    a folder`. SUBJECT says which file (the option that named it); the path the error is about
    is added when it is not `path` itself (a parent that is a file, a file inside a folder)."""
    named = err.filename
    subject = subject or str(named or path or "")
    detail = os_error_reason(err)
    if verb == "write" and err.errno == errno.ENOENT:
        detail = "its folder does not exist"
    if named is not None and path is not None and str(named) != str(path):
        detail = f"{named}: {detail}"
    if verb:
        detail = f"cannot {verb}: {detail}"
    return f"{subject}: {detail}" if subject else detail
