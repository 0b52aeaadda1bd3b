"""`SimConfig`: one simulated deployment — the scheduler's pipeline and limits, the model and GPU.

A bench compares several of these on one workload; `label` names a column.
The KV cache size and the context limit default to what the model and GPU
give (the cost model's memory accounting), as an engine would size them.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from schedir.runtime.config import POLICIES, SchedulerConfig


def _positive(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


def _optional_positive(instance: object, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


@attrs.frozen
class SimConfig:
    """Scheduler, model and hardware of one simulated engine."""

    pipeline: str = "vllm"  # a preset name or a pass list
    policy: str = attrs.field(default="fcfs")
    model: str = "llama-3-8b"
    gpu: str = "h100"
    tp: int = attrs.field(default=1, validator=_positive)
    block_size: int = attrs.field(default=16, validator=_positive)
    max_num_batched_tokens: int = attrs.field(default=8192, validator=_positive)
    max_num_seqs: int = attrs.field(default=256, validator=_positive)
    max_model_len: int | None = attrs.field(default=None, validator=_optional_positive)  # None: the model's
    num_blocks: int | None = attrs.field(default=None, validator=_optional_positive)  # None: what fits the GPU
    gpu_memory_utilization: float = attrs.field(default=0.9)
    # None: the engine's own choice, on but for a pipeline whose engine's prefix caching schedir does
    # not reproduce (a pass declaring `no_prefix_cache`: the chunked and priority vllm-v0 presets) or
    # whose engine runs without it by default (vLLM v0's: a pass declaring `v0_prefix_cache`)
    enable_prefix_caching: bool | None = None
    long_prefill_token_threshold: int = 0
    swap_space_gib: float = 4.0  # host memory for preemption by swap (vLLM v0's --swap-space default)
    ttft_slo_s: float = attrs.field(default=2.0, validator=_positive)
    tbt_slo_s: float = attrs.field(default=0.1, validator=_positive)
    seed: int = 0
    dump_dir: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    dump_steps: tuple[int, ...] | str = ()
    label: str | None = None

    @policy.validator
    def _check_policy(self, attribute: attrs.Attribute, value: str) -> None:
        if value not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {value!r}")

    @gpu_memory_utilization.validator
    def _check_utilization(self, attribute: attrs.Attribute, value: float) -> None:
        if not 0 < value <= 1:
            raise ValueError(f"gpu_memory_utilization must lie in (0, 1], got {value}")

    @property
    def name(self) -> str:
        return self.label or self.pipeline

    @property
    def prefix_caching(self) -> bool:
        """Whether the engine caches prefixes: as set, else on unless a pass of the pipeline decides
        without the cache (`StepPass.no_prefix_cache`) or reproduces vLLM v0, whose default is off
        (`StepPass.v0_prefix_cache`); a pipeline that does not parse says on (the runtime then
        reports what is wrong with it)."""
        if self.enable_prefix_caching is not None:
            return self.enable_prefix_caching
        from schedir.ir.errors import SchedirError
        from schedir.ir.pipeline import PassManager  # (the passes import the runtime's modules)

        try:
            passes = PassManager.parse(self.pipeline).passes
        except (SchedirError, ValueError, KeyError):
            return True
        return not any(p.no_prefix_cache or p.v0_prefix_cache for p in passes)

    def recorded(self) -> dict:
        """The config as a run's record shows it (prefix caching resolved)."""
        return {**attrs.asdict(self, value_serializer=plain_value), "enable_prefix_caching": self.prefix_caching}

    def scheduler_config(self, num_blocks: int, max_model_len: int, num_cpu_blocks: int = 0) -> SchedulerConfig:
        """The runtime's config for this deployment (sizes resolved by the simulator; host blocks
        only matter to a pipeline that swaps, the vllm-v0 presets)."""
        dump = self.dump_dir is not None and bool(self.dump_steps)
        return SchedulerConfig(
            num_blocks=num_blocks, block_size=self.block_size, max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs, max_model_len=max_model_len,
            enable_prefix_caching=self.prefix_caching, pipeline=self.pipeline, policy=self.policy,
            long_prefill_token_threshold=self.long_prefill_token_threshold, num_cpu_blocks=num_cpu_blocks,
            dump_dir=self.dump_dir if dump else None, dump_steps=self.dump_steps if dump else None,
            batch_plan=False,  # no model runs here: the cost model reads token counts, never slots or block ids
        )


# Fields a bench config may override with `name@field=value` (see runspec.py).
OVERRIDABLE = tuple(a.name for a in attrs.fields(SimConfig) if a.name not in ("dump_dir", "dump_steps"))


def plain_value(instance: object, attribute: attrs.Attribute | None, value: object) -> object:
    """attrs' value serializer for a config in a result's JSON: tuples as lists, paths as strings."""
    if isinstance(value, (tuple, frozenset)):
        return list(value)
    if hasattr(value, "__fspath__"):
        return str(value)
    return value
