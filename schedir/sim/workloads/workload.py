"""`Workload`: a whole trace as columns, the one shape every loader and generator returns.

Columns rather than a list of request objects: a 12k-request trace is a handful of
numpy arrays that a simulator slices and indexes without Python objects per request.
Prompt content is a ragged array of 512-token block ids (`block_ids`, `block_offsets`):
equal ids mean equal content, so prefix sharing in a trace becomes real token
sharing through `prompt_tokens`.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

from schedir.sim.workloads.errors import BadRow
from schedir.sim.workloads.prefix import prefix_hit_tokens
from schedir.sim.workloads.tokens import block_tokens_of


def _read_only(values: Any, dtype: type) -> np.ndarray:
    arr = np.array(values, dtype=dtype)  # a private copy, so read-only cannot leak to the caller
    arr.setflags(write=False)
    return arr


def _f64(values: Any) -> np.ndarray:
    return _read_only(values, np.float64)


def _i64(values: Any) -> np.ndarray:
    return _read_only(values, np.int64)


def blocks_for(input_len: np.ndarray, block_tokens: int) -> np.ndarray:
    """Content blocks per request: ceil(input_len / block_tokens)."""
    return -(-np.asarray(input_len, dtype=np.int64) // block_tokens)


@attrs.frozen(eq=False)
class Workload:
    """A trace: arrivals (s, from 0), lengths, priorities (lower = more urgent) and content blocks."""

    name: str
    source: str
    arrival_s: np.ndarray = attrs.field(converter=_f64)
    input_len: np.ndarray = attrs.field(converter=_i64)
    output_len: np.ndarray = attrs.field(converter=_i64)
    priority: np.ndarray = attrs.field(converter=_i64)
    block_offsets: np.ndarray = attrs.field(converter=_i64)
    block_ids: np.ndarray = attrs.field(converter=_i64)
    block_tokens: int = 512
    skipped: tuple[BadRow, ...] = attrs.field(default=(), converter=tuple)

    def __attrs_post_init__(self) -> None:
        n = len(self.arrival_s)
        for col in ("input_len", "output_len", "priority"):
            if len(getattr(self, col)) != n:
                raise ValueError(f"{col} has {len(getattr(self, col))} entries, arrival_s has {n}")
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")
        if n and self.arrival_s[0] != 0.0:
            raise ValueError(f"the first arrival must be 0.0, got {self.arrival_s[0]}")
        if not np.all(np.isfinite(self.arrival_s)) or np.any(np.diff(self.arrival_s) < 0):
            raise ValueError("arrival_s must be finite and non-decreasing")
        if np.any(self.input_len < 1) or np.any(self.output_len < 1):
            raise ValueError("input_len and output_len must be >= 1")
        if len(self.block_offsets) != n + 1 or self.block_offsets[0] != 0 or \
                self.block_offsets[-1] != len(self.block_ids):
            raise ValueError("block_offsets must have n + 1 entries from 0 to len(block_ids)")
        if not np.array_equal(np.diff(self.block_offsets), blocks_for(self.input_len, self.block_tokens)):
            raise ValueError(f"request i must have ceil(input_len[i] / {self.block_tokens}) content blocks")

    @classmethod
    def without_content(cls, name: str, source: str, arrival_s: np.ndarray, input_len: np.ndarray,
                        output_len: np.ndarray, block_tokens: int = 512,
                        skipped: tuple[BadRow, ...] = ()) -> Workload:
        """A trace with lengths only (Azure, ShareGPT, Vidur): fresh block ids, so nothing is shared."""
        counts = blocks_for(input_len, block_tokens)
        offsets = np.concatenate(([0], np.cumsum(counts)))
        return cls(name=name, source=source, arrival_s=arrival_s, input_len=input_len,
                   output_len=output_len, priority=np.zeros(len(input_len), dtype=np.int64),
                   block_offsets=offsets, block_ids=np.arange(offsets[-1], dtype=np.int64),
                   block_tokens=block_tokens, skipped=skipped)

    def __len__(self) -> int:
        return len(self.arrival_s)

    def blocks(self, i: int) -> np.ndarray:
        """Request i's content block ids."""
        return self.block_ids[self.block_offsets[i]:self.block_offsets[i + 1]]

    def prompt_tokens(self, i: int, vocab_size: int = 32000) -> np.ndarray:
        """Request i's prompt (int32): equal block ids give equal tokens in every process."""
        return block_tokens_of(self.blocks(i), int(self.input_len[i]), self.block_tokens, vocab_size)

    def head(self, n: int) -> Workload:
        """The first n requests (all of them if n >= len)."""
        n = max(0, min(n, len(self)))
        end = self.block_offsets[n]
        return attrs.evolve(self, arrival_s=self.arrival_s[:n], input_len=self.input_len[:n],
                            output_len=self.output_len[:n], priority=self.priority[:n],
                            block_offsets=self.block_offsets[:n + 1], block_ids=self.block_ids[:end])

    def with_rate(self, rate: float) -> Workload:
        """The same requests with arrivals stretched so that len / duration == rate."""
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"rate must be a positive finite number, got {rate}")
        duration = self.duration_s
        if duration <= 0:
            raise ValueError(f"{self.name}: all arrivals coincide, there is no rate to rescale")
        scale = len(self) / rate / duration
        return attrs.evolve(self, arrival_s=self.arrival_s * scale,
                            source=f"{self.source} (arrivals x{scale:.4g} for {rate:g} req/s)")

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0

    def prefix_hit_tokens(self) -> np.ndarray:
        """Per request, input tokens an unbounded 512-token-block prefix cache would hold (Mooncake's count)."""
        return prefix_hit_tokens(self.block_ids, self.block_offsets, self.input_len, self.block_tokens)

    def stats(self) -> dict[str, float]:
        """Rate, length quantiles and the unbounded-cache prefix-hit fraction of input tokens."""
        n = len(self)
        out: dict[str, float] = {"n": n, "duration_s": self.duration_s,
                                 "rate_req_s": n / self.duration_s if self.duration_s > 0 else math.nan}
        for col in ("input", "output"):
            values = getattr(self, f"{col}_len")
            p50, p90, p99 = np.percentile(values, [50, 90, 99]) if n else (math.nan,) * 3
            out |= {f"{col}_p50": float(p50), f"{col}_p90": float(p90), f"{col}_p99": float(p99),
                    f"{col}_mean": float(values.mean()) if n else math.nan}
        total = int(self.input_len.sum())
        out["prefix_hit_token_fraction"] = float(self.prefix_hit_tokens().sum() / total) if total else math.nan
        out["skipped"] = len(self.skipped)
        return out
