"""Field checks shared by the trace loaders; each raises `BadField` with the reason a row is bad."""

from __future__ import annotations

import math
from typing import Any


class BadField(Exception):
    """A field that makes its row unusable; the message is the reason shown to the user."""


def positive_int(name: str, value: Any) -> int:
    """A length: a JSON int, or CSV text holding an integer (an integral float like `12.0` is fine)."""
    original = value
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                as_float = float(text)
            except ValueError:
                raise BadField(f"{name} must be a positive integer, got {value!r}") from None
            value = int(as_float) if math.isfinite(as_float) and as_float.is_integer() else value
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BadField(f"{name} must be a positive integer, got {original!r}")
    return value


def time_value(name: str, value: Any) -> float:
    """A relative arrival time: finite and >= 0."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise BadField(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise BadField(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def in_order(name: str, value: float, previous: float | None, shown: str = "", previous_shown: str = "") -> float:
    """Traces are sorted by arrival; a row that goes back in time is bad, never reordered."""
    if previous is not None and value < previous:
        raise BadField(f"{name} {shown or f'{value:g}'} is earlier than the previous row's "
                       f"{previous_shown or f'{previous:g}'} (rows must be in arrival order)")
    return value
