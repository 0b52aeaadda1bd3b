"""From a vLLM 0.32 engine configuration to schedir's `SchedulerConfig`, refusing at start-up
what schedir cannot do yet (by name, never silently wrong).

Why a module of its own: the mapping is the adapter's contract with the user. Every vLLM
option that changes a scheduling decision is either carried over or refused here, so a
user who switches `scheduler_cls` gets the scheduler they configured or a clear error.
"""

from __future__ import annotations

import os
from typing import Any

from schedir.passes.presets import PRESETS
from schedir.runtime.config import SchedulerConfig

PIPELINE_ENV = "SCHEDIR_PIPELINE"
"""Environment variable naming the schedir pipeline (a preset or a pass list)."""
PIPELINE_KEY = "schedir_pipeline"
"""Key of `additional_config` (`LLM(additional_config={...})`, `--additional-config`) naming it."""


class UnsupportedFeature(ValueError):
    """A vLLM feature the schedir scheduler does not implement yet; raised at start-up."""


def _refuse(feature: str, how: str) -> UnsupportedFeature:
    return UnsupportedFeature(
        f"schedir's vLLM scheduler does not support {feature} yet ({how}); "
        "run without it, or use vLLM's own scheduler (drop scheduler_cls)"
    )


def chosen_pipeline(vllm_config: Any) -> str:
    """The pipeline the user asked for: `additional_config["schedir_pipeline"]`, else
    $SCHEDIR_PIPELINE, else the `vllm` preset (vLLM's own policy, decided identically)."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    value = extra.get(PIPELINE_KEY) if isinstance(extra, dict) else None
    if value is None:
        value = os.environ.get(PIPELINE_ENV) or "vllm"
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{PIPELINE_KEY} must name a schedir preset ({', '.join(sorted(PRESETS))}) "
                         f"or a pass list, got {value!r}")
    return value.strip()


def check_supported(vllm_config: Any, kv_cache_config: Any) -> None:
    """Refuse, by name, every feature whose scheduling schedir does not reproduce."""
    if getattr(vllm_config, "speculative_config", None) is not None:
        raise _refuse("speculative decoding", "speculative_config is set")
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        raise _refuse("KV connectors (disaggregated prefill, KV offloading)", "kv_transfer_config is set")
    if getattr(vllm_config, "ec_transfer_config", None) is not None:
        raise _refuse("encoder-cache connectors", "ec_transfer_config is set")
    if getattr(vllm_config, "lora_config", None) is not None:
        raise _refuse("LoRA adapters", "enable_lora is set")
    aux = getattr(vllm_config, "aux_output_config", None)
    if aux is not None and getattr(aux, "enabled", False):
        raise _refuse("routed-experts outputs", "aux_output_config.enable_return_routed_experts is set")
    model = vllm_config.model_config
    if getattr(model, "return_sampling_mask", False):
        raise _refuse("sampling masks in the output", "return_sampling_mask=True")
    if getattr(model, "is_encoder_decoder", False):
        raise _refuse("encoder inputs", "the model is an encoder-decoder model")
    if getattr(model, "is_multimodal_model", False):
        raise _refuse("encoder inputs", "the model takes multimodal inputs")
    if getattr(model, "runner_type", "generate") != "generate":
        raise _refuse("pooling models", f"the model runs as '{model.runner_type}'")
    parallel = vllm_config.parallel_config
    if getattr(parallel, "pipeline_parallel_size", 1) > 1:
        raise _refuse("pipeline parallelism", f"pipeline_parallel_size={parallel.pipeline_parallel_size}")
    for name in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        if getattr(parallel, name, 1) > 1:
            raise _refuse("context parallelism", f"{name}={getattr(parallel, name)}")
    if getattr(parallel, "data_parallel_size", 1) > 1:
        raise _refuse("data parallelism (its prefill balancing across ranks)",
                      f"data_parallel_size={parallel.data_parallel_size}")
    sched = vllm_config.scheduler_config
    if getattr(sched, "long_prefill_token_threshold_adaptive", False):
        raise _refuse("the adaptive long-prefill threshold", "long_prefill_token_threshold_adaptive=True")
    if not sched.enable_chunked_prefill:
        raise _refuse("scheduling with chunked prefill off", "enable_chunked_prefill=False")
    if sched.policy not in ("fcfs", "priority"):
        raise _refuse(f"the '{sched.policy}' scheduling policy", "policy must be fcfs or priority")
    for name, limit in (("max_num_scheduled_tokens", sched.max_num_batched_tokens),
                        ("max_num_active_seqs", sched.max_num_seqs)):
        value = getattr(sched, name, None)
        if value is not None and value != limit:
            raise _refuse(f"a {name} different from its default", f"{name}={value}")
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise _refuse("hybrid KV caches (several KV cache groups)", f"{len(groups)} groups")
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = groups[0].kv_cache_spec
    if type(spec) is not FullAttentionSpec:
        raise _refuse(f"{type(spec).__name__} KV caches (sliding window, Mamba, ...)",
                      "only full attention is scheduled")
    if getattr(kv_cache_config, "needs_kv_cache_zeroing", False):
        raise _refuse("attention backends that need new KV blocks zeroed", "needs_kv_cache_zeroing")


def schedir_config(vllm_config: Any, kv_cache_config: Any, block_size: int,
                   async_scheduling: bool = False) -> SchedulerConfig:
    """schedir's limits and policy for this engine (the names mean what vLLM's do);
    `async_scheduling`: decodes overlap their previous step (the AsyncScheduler class)."""
    check_supported(vllm_config, kv_cache_config)
    sched = vllm_config.scheduler_config
    return SchedulerConfig(
        num_blocks=int(kv_cache_config.num_blocks),
        block_size=int(block_size),
        max_num_batched_tokens=int(sched.max_num_batched_tokens),
        max_num_seqs=int(sched.max_num_seqs),
        max_model_len=int(vllm_config.model_config.max_model_len),
        enable_prefix_caching=bool(vllm_config.cache_config.enable_prefix_caching),
        pipeline=chosen_pipeline(vllm_config),
        policy=sched.policy,
        long_prefill_token_threshold=int(sched.long_prefill_token_threshold or 0),
        async_scheduling=async_scheduling,
    )
