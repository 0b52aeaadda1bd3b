"""`SchedulerConfig` and `Request`: what an engine hands the runtime."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import attrs
import numpy as np

POLICIES = ("fcfs", "priority", "lpm", "dfs-weight", "lof", "random")
SGLANG_POLICIES = ("lpm", "dfs-weight", "lof", "random")  # honoured by sglang-order only


def _positive(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if value < 1:
        raise ValueError(f"SchedulerConfig.{attribute.name} must be positive, got {value}")


def _steps(value: Iterable[int] | str | None) -> frozenset[int] | str:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        if value != "all":
            raise ValueError(f"dump_steps must be step numbers or 'all', got {value!r}")
        return value
    return frozenset(int(v) for v in value)


@attrs.frozen
class SchedulerConfig:
    """Limits and policy of one scheduler (names follow vLLM's where they mean the same).

    `pipeline` is a preset name (`vllm`, `base`, ...) or a pass list; with
    `dump_dir`, the IR after every pass (text and DOT) is written for the steps
    in `dump_steps` (step numbers, or "all").
    """

    num_blocks: int = attrs.field(default=2000, validator=_positive)
    block_size: int = attrs.field(default=16, validator=_positive)
    max_num_batched_tokens: int = attrs.field(default=8192, validator=_positive)
    max_num_seqs: int = attrs.field(default=256, validator=_positive)
    max_model_len: int = attrs.field(default=8192, validator=_positive)
    enable_prefix_caching: bool = True
    pipeline: str = "vllm"
    policy: str = attrs.field(default="fcfs")
    long_prefill_token_threshold: int = 0
    async_scheduling: bool = False
    """vLLM's async scheduling: a step's sampled tokens are placeholders until they come back, so a
    decoding request is scheduled again before its previous token is known (its steps overlap).
    Needs a pipeline whose running pass provides 'decode-overlap' (the vllm preset's)."""
    num_cpu_blocks: int = 0
    """Host (CPU) KV blocks for preemption by swap (vLLM v0's `num_cpu_blocks`, from its
    `swap_space`); 0: no swap space, a pass that would swap preempts by recompute instead."""
    batch_plan: bool = True
    """Build each step's batch plan and block table (`SchedulerOutput.batch` / `block_table`, what a
    model runner consumes). An engine that runs no model, such as the simulator, turns it off: the
    outputs then carry None there, and a step of hundreds of long requests skips copying their
    block tables (tens of µs)."""
    verify_each: bool = False
    dump_dir: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    dump_steps: frozenset[int] | str = attrs.field(default=None, converter=_steps)
    dump_dot: bool = True

    @policy.validator
    def _check_policy(self, attribute: attrs.Attribute, value: str) -> None:
        if value not in POLICIES:
            raise ValueError(f"SchedulerConfig.policy must be one of {', '.join(POLICIES)}, got {value!r}")

    def __attrs_post_init__(self) -> None:
        if self.num_blocks < 2:
            raise ValueError("SchedulerConfig.num_blocks must be at least 2 (block 0 is reserved)")
        if self.num_cpu_blocks < 0:
            raise ValueError(f"SchedulerConfig.num_cpu_blocks must be >= 0, got {self.num_cpu_blocks}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("SchedulerConfig.long_prefill_token_threshold must be >= 0")

    def dumps(self, step: int) -> bool:
        if self.dump_dir is None:
            return False
        return self.dump_steps == "all" or step in self.dump_steps  # type: ignore[operator]


@attrs.define
class Request:
    """One generation request: prompt tokens, how far to generate, when to stop."""

    request_id: str
    prompt_token_ids: Sequence[int] | np.ndarray
    max_tokens: int = 16
    priority: int = 0
    arrival_time: float | None = None  # seconds on the scheduler's clock; None: now
    eos_token_id: int | None = None
    ignore_eos: bool = False
    stop_token_ids: Sequence[int] = ()
    state: Mapping[str, int] = attrs.field(factory=dict)
    """Initial values of request state the pipeline's passes declare (e.g. a tenant id), by name;
    undeclared names are refused. Unnamed state starts at its declared default."""

    def arrival(self, clock: Callable[[], float] = time.monotonic) -> float:
        """The arrival time on the scheduler's clock (now, if the request did not say)."""
        return clock() if self.arrival_time is None else float(self.arrival_time)
