"""The vLLM plug-in's start-up contract: every scheduling-relevant vLLM option is carried over
or refused by name (never silently ignored), and the pipeline comes from the user's option."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from schedir.engines.vllm.config import PIPELINE_ENV, PIPELINE_KEY, UnsupportedFeature, check_supported, chosen_pipeline


def engine_config(**over: object) -> SimpleNamespace:
    """A stand-in for vLLM's VllmConfig with every feature off (the fields the adapter reads)."""
    sched = SimpleNamespace(enable_chunked_prefill=True, policy="fcfs", max_num_batched_tokens=2048, max_num_seqs=64,
                            max_num_scheduled_tokens=None, max_num_active_seqs=None,
                            long_prefill_token_threshold_adaptive=False, async_scheduling=False)
    cfg = SimpleNamespace(
        speculative_config=None, kv_transfer_config=None, ec_transfer_config=None, lora_config=None,
        model_config=SimpleNamespace(is_encoder_decoder=False, is_multimodal_model=False, runner_type="generate"),
        parallel_config=SimpleNamespace(pipeline_parallel_size=1, decode_context_parallel_size=1,
                                        prefill_context_parallel_size=1, data_parallel_size=1),
        scheduler_config=sched, additional_config={})
    for path, value in over.items():
        target = cfg
        *parents, leaf = path.split("__")
        for p in parents:
            target = getattr(target, p)
        setattr(target, leaf, value)
    return cfg


NO_GROUPS = SimpleNamespace(kv_cache_groups=[])


@pytest.mark.parametrize(("option", "value", "named"), [
    ("speculative_config", object(), "speculative decoding"),
    ("kv_transfer_config", object(), "KV connectors"),
    ("ec_transfer_config", object(), "encoder-cache connectors"),
    ("lora_config", object(), "LoRA adapters"),
    ("aux_output_config", SimpleNamespace(enabled=True), "routed-experts outputs"),
    ("model_config__return_sampling_mask", True, "sampling masks"),
    ("model_config__is_encoder_decoder", True, "encoder inputs"),
    ("model_config__is_multimodal_model", True, "encoder inputs"),
    ("model_config__runner_type", "pooling", "pooling models"),
    ("parallel_config__pipeline_parallel_size", 2, "pipeline parallelism"),
    ("parallel_config__data_parallel_size", 2, "data parallelism"),
    ("parallel_config__decode_context_parallel_size", 2, "context parallelism"),
    ("scheduler_config__enable_chunked_prefill", False, "chunked prefill off"),
    ("scheduler_config__long_prefill_token_threshold_adaptive", True, "adaptive long-prefill threshold"),
    ("scheduler_config__max_num_scheduled_tokens", 1024, "max_num_scheduled_tokens"),
    ("scheduler_config__max_num_active_seqs", 8, "max_num_active_seqs"),
])
def test_unsupported_features_are_refused_by_name(option: str, value: object, named: str) -> None:
    with pytest.raises(UnsupportedFeature, match=named):
        check_supported(engine_config(**{option: value}), NO_GROUPS)


def test_a_supported_config_reaches_the_kv_cache_check() -> None:
    """With every feature off, only the KV-cache layout is left to check (no group: refused as such)."""
    with pytest.raises(UnsupportedFeature, match="hybrid KV caches"):
        check_supported(engine_config(), NO_GROUPS)


def test_pipeline_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PIPELINE_ENV, raising=False)
    assert chosen_pipeline(engine_config()) == "vllm"
    monkeypatch.setenv(PIPELINE_ENV, "base")
    assert chosen_pipeline(engine_config()) == "base"
    assert chosen_pipeline(engine_config(additional_config={PIPELINE_KEY: " base-priority "})) == "base-priority"
    with pytest.raises(ValueError, match=PIPELINE_KEY):
        chosen_pipeline(engine_config(additional_config={PIPELINE_KEY: 3}))
