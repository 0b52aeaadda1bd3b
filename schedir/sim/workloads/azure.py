"""Azure LLM inference trace 2023 (`TIMESTAMP,ContextTokens,GeneratedTokens`).

TIMESTAMP is wall-clock time with 7 fractional digits (`2023-11-16 18:17:03.9799600`).
It is parsed by hand: dateutil per row costs ~100x more, and only the offset from
the first row matters.
"""

from __future__ import annotations

from datetime import date
from os import PathLike

from schedir.sim.workloads.csvrows import load_timed_lengths
from schedir.sim.workloads.fields import BadField
from schedir.sim.workloads.workload import Workload

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def parse_timestamp(text: str, day_cache: dict[str, int]) -> float:
    """Seconds since the proleptic epoch of `YYYY-MM-DD HH:MM:SS[.fffffff]`."""
    t = text.strip()
    try:
        if len(t) < 19 or t[10] not in " T" or t[13] != ":" or t[16] != ":":
            raise ValueError
        day = day_cache.get(t[:10])
        if day is None:
            day = day_cache[t[:10]] = date.fromisoformat(t[:10]).toordinal()
        hours, minutes, seconds = int(t[11:13]), int(t[14:16]), float(t[17:])
        if not (0 <= hours < 24 and 0 <= minutes < 60 and 0 <= seconds < 61):
            raise ValueError
    except ValueError:
        raise BadField(f"TIMESTAMP must look like 2023-11-16 18:17:03.9799600, got {text!r}") from None
    return day * 86400.0 + hours * 3600.0 + minutes * 60.0 + seconds


def load_azure(path: str | PathLike[str], on_bad_row: str = "error", limit: int | None = None,
               block_tokens: int = 512) -> Workload:
    """Read an Azure 2023 trace CSV; prompts get fresh block ids (the trace says nothing about content)."""
    days: dict[str, int] = {}
    return load_timed_lengths(path, AZURE_COLUMNS, lambda text: parse_timestamp(text, days), on_bad_row, limit,
                              block_tokens)
