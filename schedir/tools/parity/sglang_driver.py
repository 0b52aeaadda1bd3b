"""SGLang 0.5.23's real scheduling classes, driven step by step on a trace with a fake model.

Why: schedir's `sglang` preset claims SGLang's rules (LPM / DFS-weight orders over a radix
tree, PrefillAdder with `new_token_ratio`, chunked prefill, retract_decode). The reference
side of that claim is SGLang itself. This driver calls SGLang's own classes for every
decision and reproduces only the glue of `Scheduler.event_loop_normal`, which needs a
whole server (ZMQ, a model worker, a tokenizer) to construct. Each glue rule names the
SGLang function it reproduces (`scheduler.py:Scheduler.<name>` means
`sglang/srt/managers/scheduler.py`). No SGLang code is copied.

Real SGLang objects used (all on CPU, `device="cpu"`):
- `SchedulePolicy.calc_priority` (ordering, in-batch prefix de-prioritisation),
- `PrefillAdder` (`add_chunked_req`, `add_one_req`, `budget_state`: chunked prefill,
  max_prefill_tokens, rem_total_tokens with new_token_ratio),
- `RadixCache` (match, insert, lock, LRU eviction), `TokenToKVPoolAllocator` (the real
  token-to-KV allocator: it runs on CPU, so no stand-in), `ReqToTokenPool`,
- `Req`, `ScheduleBatch` (`init_new`, `prepare_for_extend`, `prepare_for_decode`,
  `filter_batch`, `merge_batch`, `check_decode_mem`, `retract_decode`),
- `NewTokenRatioTracker` (decay, reset), `release_kv_cache`, `checkpoint_kv_cache`.
The config is published through SGLang's own `runtime_context.publish` from a real
`ServerArgs` over a local config.json for a tiny Llama (no weights, no tokenizer).

Run it with SGLang's interpreter, not schedir's (this file imports only the standard
library and SGLang; it is run as a script, so schedir's package `__init__` is not loaded):

    /work/sgl-env/bin/python schedir/tools/parity/sglang_driver.py \
        --trace trace.json --config cfg.json --out steps.json

Output: `{"sglang_version", "config", "steps": [record, ...], "summary": {...}}`; the record
format is documented in docs/sglang-reference.md and in `_record` below.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sglang_env import install_shims  # type: ignore[import-not-found]
    from sglang_trace import EOS_TOKEN_ID, VOCAB_SIZE, check_config, check_trace, fake_token  # type: ignore
else:  # imported as part of schedir (tests of the pure helpers)
    from schedir.tools.parity.sglang_env import install_shims
    from schedir.tools.parity.sglang_trace import EOS_TOKEN_ID, VOCAB_SIZE, check_config, check_trace, fake_token

_TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "torch_dtype": "float16",
    "bos_token_id": 1, "eos_token_id": EOS_TOKEN_ID,
}
"""Only its shape matters: ServerArgs / ModelConfig read vocab size and context length from it."""


def _set_env(cfg: dict[str, Any]) -> None:
    """SGLang reads these knobs from the environment when its modules import (schedule_policy's
    CLIP_MAX_NEW_TOKENS is a module constant), so they are set before the first import."""
    os.environ["SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION"] = str(cfg["clip_max_new_tokens"])
    os.environ["SGLANG_RETRACT_DECODE_STEPS"] = str(cfg["retract_decode_steps"])
    os.environ["SGLANG_INIT_NEW_TOKEN_RATIO"] = str(cfg["init_new_token_ratio"])
    os.environ["SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR"] = str(cfg["min_new_token_ratio_factor"])
    os.environ["SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS"] = str(cfg["new_token_ratio_decay_steps"])
    os.environ.setdefault("SGLANG_LOGGING_LEVEL", "ERROR")


class Reference:
    """One SGLang scheduler's state (what `Scheduler.__init__` would hold) and its step loop."""

    def __init__(self, cfg: dict[str, Any], trace: list[dict[str, Any]]) -> None:
        self.cfg = cfg
        self.trace = trace
        self._ordinal = {r["rid"]: i for i, r in enumerate(trace)}
        self._spec = {r["rid"]: r for r in trace}

        import random

        import torch
        from sglang.srt import runtime_context
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.schedule_policy import SchedulePolicy
        from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        model_dir = tempfile.mkdtemp(prefix="schedir-sglang-tiny-llama-")
        (Path(model_dir) / "config.json").write_text(json.dumps(_TINY_LLAMA))
        chunk = cfg["chunked_prefill_size"]
        self.chunked_prefill_size = chunk if chunk is not None and chunk > 0 else None
        server_args = ServerArgs(
            model_path=model_dir, device="cpu", skip_tokenizer_init=True, schedule_policy=cfg["policy"],
            page_size=cfg["page_size"], chunked_prefill_size=self.chunked_prefill_size or -1,
            max_prefill_tokens=cfg["max_prefill_tokens"], max_running_requests=cfg["max_running_requests"],
            context_length=cfg["max_context_len"],
        )
        runtime_context.publish(server_args, role="scheduler")
        self.model_config = ModelConfig.from_server_args(server_args)
        self.page_size = cfg["page_size"]
        self.max_prefill_tokens = cfg["max_prefill_tokens"]
        self.req_to_token_pool = ReqToTokenPool(
            size=cfg["max_running_requests"], max_context_len=cfg["max_context_len"] + 4, device="cpu",
            enable_memory_saver=False,
        )
        if self.page_size == 1:
            self.allocator = TokenToKVPoolAllocator(
                size=cfg["num_kv_tokens"], dtype=torch.float16, device="cpu", kvcache=None, need_sort=False
            )
        else:
            from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

            self.allocator = PagedTokenToKVPoolAllocator(
                size=cfg["num_kv_tokens"], page_size=self.page_size, dtype=torch.float16, device="cpu",
                kvcache=None, need_sort=False,
            )
        self.tree_cache = RadixCache(CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.allocator,
            page_size=self.page_size,
        ))
        # scheduler.py:Scheduler.init_schedule_policy: priority scheduling off, low values first.
        self.policy = SchedulePolicy(cfg["policy"], self.tree_cache, False, False, True)
        # scheduler.py:Scheduler.__init__ -> NewTokenRatioTracker.from_config (init, min, decay).
        self.ratio = NewTokenRatioTracker.from_config()
        self.spec_algorithm = SpeculativeAlgorithm.NONE
        self._ScheduleBatch = ScheduleBatch
        # scheduler.py:Scheduler.__init__: `self.running_batch = ScheduleBatch(reqs=[], batch_is_full=False)`.
        self.running_batch = ScheduleBatch(reqs=[], batch_is_full=False)
        self.last_batch: Any = None
        self.chunked_req: Any = None
        self.waiting_queue: list[Any] = []
        self.finished: list[str] = []
        self.step_no = 0
        # The `random` policy shuffles with Python's global random: seed it last, after the
        # set-up above (ServerArgs and friends draw from it), so the first shuffle sees the seed.
        random.seed(cfg["random_seed"])

    # ---- requests -------------------------------------------------------------------------
    def _make_req(self, spec: dict[str, Any]) -> Any:
        """A real `Req` as `Scheduler.handle_generate_request` builds one from a tokenized request."""
        from array import array

        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        params = SamplingParams(max_new_tokens=spec["max_new_tokens"], ignore_eos=False)
        params.normalize(None)
        return Req(spec["rid"], "", array("q", spec["prompt"]), params, vocab_size=VOCAB_SIZE,
                   eos_token_ids={EOS_TOKEN_ID})

    def _add_request_to_queue(self, req: Any) -> None:
        """scheduler.py:Scheduler._add_request_to_queue (no disaggregation): append, stamp entry time."""
        self.waiting_queue.append(req)
        req.time_stats.set_wait_queue_entry_time()

    # ---- one engine step ------------------------------------------------------------------
    def step(self) -> dict[str, Any]:
        """One iteration of scheduler.py:Scheduler.event_loop_normal with a fake model."""
        for spec in self.trace:  # ingest_requests: arrivals of this step, in trace order
            if spec["arrival_step"] == self.step_no:
                self._add_request_to_queue(self._make_req(spec))
        ratio_before = self.ratio.current
        rec: dict[str, Any] = {"step": self.step_no, "mode": "idle", "queue_order": [], "admitted": [],
                               "decode": [], "retracted": [], "finished": [], "ratio_used": ratio_before}
        batch = self._get_next_batch_to_run(rec)
        if batch is not None:
            self._run_and_process(batch, rec)
        else:
            self._on_idle()
        self.last_batch = batch
        rec.update(self._snapshot())
        self.step_no += 1
        return rec

    def _get_next_batch_to_run(self, rec: dict[str, Any]) -> Any:
        """scheduler.py:Scheduler.get_next_batch_to_run, the non-DP, non-spec, non-dLLM path."""
        from sglang.srt.mem_cache.common import checkpoint_kv_cache

        excluded = []
        if self.chunked_req is not None:
            # Move the chunked request out of the last batch; stash its computed KV in the tree
            # (scheduler.py:Scheduler.stash_chunked_request -> mem_cache/common.py:checkpoint_kv_cache).
            excluded.append(self.chunked_req)
            if self.chunked_req.extend_end > self.chunked_req.prefix_len:
                checkpoint_kv_cache(self.chunked_req, self.tree_cache)
        last = self.last_batch
        if last is not None and last.forward_mode.is_extend():
            if last.chunked_req is not None:
                excluded.append(last.chunked_req)
            last_bs = last.batch_size()
            last.filter_batch(reqs_to_exclude=excluded)
            if last.batch_size() < last_bs:
                self.running_batch.batch_is_full = False
            if not last.is_empty() and last is not self.running_batch:
                if self.running_batch.is_empty():
                    self.running_batch = last
                else:
                    self.running_batch.merge_batch(last)
        running_bs = self.running_batch.batch_size()
        self.running_batch.filter_batch()
        if self.running_batch.batch_size() < running_bs:
            self.running_batch.batch_is_full = False

        new_batch = self._get_new_batch_prefill(rec)
        if new_batch is not None:
            return new_batch  # prefill first
        if not self.running_batch.is_empty() and not self.running_batch.is_prefill_only:
            decode = self._update_running_batch(rec)
            return decode if decode is not None and not decode.is_empty() else None
        return None

    def _num_allocatable_reqs(self, running_bs: int, num_held_rows: int) -> int:
        """scheduler.py:Scheduler.get_num_allocatable_reqs without PP or beams: free request rows
        (plus rows the counted requests already hold), capped by max_running_requests."""
        pp_budget = self.cfg["max_running_requests"] - running_bs
        rows = max(self.req_to_token_pool.available_size() + num_held_rows, 0)
        return min(pp_budget, rows)

    def _get_new_batch_prefill(self, rec: dict[str, Any]) -> Any:
        """scheduler.py:Scheduler._get_new_batch_prefill_raw: order the queue, fill a PrefillAdder."""
        from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

        running = self.running_batch
        if running.is_empty():
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting_queue) and self.chunked_req is None:
            return None
        running_bs = len(running.reqs)
        if self._num_allocatable_reqs(running_bs, 0) <= 0 and self.chunked_req is None:
            running.batch_is_full = True
            return None
        self.policy.calc_priority(self.waiting_queue, running)
        # The order the policy chose, with each request's cached-prefix length as the sort saw it.
        rec["queue_order"] = [[r.rid, int(getattr(r, "num_matched_prefix_tokens", 0) or 0)] for r in self.waiting_queue]
        # scheduler.py:Scheduler.__init__: is_mixed_chunk needs chunked prefill; the adder then
        # reserves one token per running request (num_mixed_decode_tokens = running_bs).
        mixed = self.cfg["enable_mixed_chunk"] and self.chunked_prefill_size is not None
        adder = PrefillAdder(
            self.page_size, self.tree_cache, self.allocator, running, self.ratio.current,
            self.max_prefill_tokens, self.chunked_prefill_size, running_bs if mixed else 0,
            max_running_requests=self.cfg["max_running_requests"], waiting_queue_len=len(self.waiting_queue),
        )
        resumed = self.chunked_req
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input()
            adder.chunked_req_limit = self.policy.shortest_prefill_chunk_limit(
                self.chunked_req, self.waiting_queue, adder.rem_chunk_tokens or 0, self.page_size)
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting_queue:
            if adder.budget_state() == AddReqResult.OTHER:
                break
            held = sum(r.kv.holds_kv for r in adder.can_run_list)
            if len(adder.can_run_list) >= self._num_allocatable_reqs(len(running.reqs), held):
                running.batch_is_full = True
            if running.batch_is_full:
                break  # priority preemption is off
            req.init_next_round_input(self.tree_cache)
            res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None, truncation_align_size=None)
            if res != AddReqResult.CONTINUE:
                if res == AddReqResult.NO_TOKEN:
                    running.batch_is_full = len(adder.can_run_list) > 0 or not running.is_empty()
                break
        can_run = adder.can_run_list
        if not can_run:
            return None
        can_run_set = set(can_run)
        self.waiting_queue = [r for r in self.waiting_queue if r not in can_run_set]
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1
        batch = self._ScheduleBatch.init_new(
            can_run, self.req_to_token_pool, self.allocator, self.tree_cache, self.model_config, False,
            self.spec_algorithm, chunked_req=self.chunked_req,
        )
        batch.prepare_for_extend()
        rec["mode"] = "extend"
        rec["admitted"] = [
            {"rid": r.rid, "extend": int(r.extend_len), "prefix": int(r.prefix_len), "continued": r is resumed}
            for r in can_run
        ]
        # scheduler.py:_get_new_batch_prefill_raw, "Mixed-style chunked prefill" (no overlap, so no
        # in-flight finishers): the running batch decodes in this step too when its tokens fit
        # (check_decode_mem; no retraction here), and an empty batch takes its place.
        if mixed and not running.is_empty():
            if running.check_decode_mem():
                running.prepare_for_decode()
                batch.mix_with_running(running)
                batch.decoding_reqs = running.reqs
                rec["decode"] = [r.rid for r in running.reqs]
                self.running_batch = self._ScheduleBatch(reqs=[], batch_is_full=running.batch_is_full)
        else:
            batch.decoding_reqs = None
        return batch

    def _update_running_batch(self, rec: dict[str, Any]) -> Any:
        """scheduler.py:Scheduler.update_running_batch (no overlap, so no in-flight finishers)."""
        batch = self.running_batch
        initial_bs = batch.batch_size()
        if batch.is_empty():
            batch.batch_is_full = False
            return batch
        if not batch.check_decode_mem():
            retracted, new_ratio, aborted = batch.retract_decode()
            # Jump: the ratio becomes retract_decode's estimate from the requests that stay.
            self.ratio.current = new_ratio
            rec["retracted"] = [r.rid for r in retracted]
            rec["aborted"] = [r.rid for r in aborted]
            for req in retracted:
                self._add_request_to_queue(req)
        else:
            self.ratio.decay_step()
        if batch.batch_size() < initial_bs:
            batch.batch_is_full = False
        if batch.is_empty():
            return batch
        batch.prepare_for_decode()
        rec["mode"] = "decode"
        rec["decode"] = [r.rid for r in batch.reqs]
        return batch

    # ---- the fake model and process_batch_result ------------------------------------------
    def _sample(self, req: Any) -> int:
        spec = self._spec[req.rid]
        return fake_token(self._ordinal[req.rid], len(req.output_ids), spec["output_len"], spec["max_new_tokens"])

    def _run_and_process(self, batch: Any, rec: dict[str, Any]) -> None:
        """The model runner's output (one sampled token per request) and
        scheduler_components/batch_result_processor.py:process_batch_result_{prefill,decode}."""
        import torch
        from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

        tokens = [self._sample(r) for r in batch.reqs]
        # TpModelWorker: non-overlap run_batch hands the sampled ids to the next decode as input.
        batch.output_ids = torch.tensor(tokens, dtype=torch.int64)
        self.allocator.free_group_begin()
        if batch.forward_mode.is_extend():
            for req, tok in zip(batch.reqs, tokens):
                if (req.finished() and req.inflight_middle_chunks <= 0) or req.is_retracted:
                    continue
                if req.inflight_middle_chunks <= 0:
                    req.output_ids.append(tok)
                    req.update_finish_state()
                    if req.finished():
                        release_kv_cache(req, self.tree_cache, checkpoint=True)
                        rec["finished"].append(req.rid)
                    elif not batch.decoding_reqs or req not in batch.decoding_reqs:
                        checkpoint_kv_cache(req, self.tree_cache)  # a mixed batch's decodes are not
                else:
                    req.inflight_middle_chunks -= 1  # a middle chunk: no token, no stream
        else:
            for req, tok in zip(batch.reqs, tokens):
                req.output_ids.extend([tok])
                req.update_finish_state(1)
                if req.finished():
                    release_kv_cache(req, self.tree_cache, checkpoint=True)
                    rec["finished"].append(req.rid)
        self.allocator.free_group_end()
        self.finished.extend(rec["finished"])

    def _on_idle(self) -> None:
        """scheduler.py:Scheduler.on_idle: when fully idle (scheduler.py:Scheduler.is_fully_idle:
        nothing running, no chunked request, no last batch, empty waiting queue) the ratio resets."""
        idle = (self.running_batch.is_empty() and self.chunked_req is None
                and (self.last_batch is None or self.last_batch.is_empty()) and not self.waiting_queue)
        if idle:
            self.ratio.reset()

    # ---- records ---------------------------------------------------------------------------
    def _snapshot(self) -> dict[str, Any]:
        """End-of-step state: the ratio the next step starts from, the chunked request, the
        queues, and the radix cache / pool sizes in tokens."""
        return {
            "new_token_ratio": self.ratio.current,
            "chunked": self.chunked_req.rid if self.chunked_req is not None else None,
            "waiting": [r.rid for r in self.waiting_queue],
            "running": [r.rid for r in self.running_batch.reqs],
            "cache_tokens": int(self.tree_cache.total_size()),
            "evictable": int(self.tree_cache.evictable_size()),
            "protected": int(self.tree_cache.protected_size()),
            "free_tokens": int(self.allocator.available_size()),
        }

    def done(self) -> bool:
        return len(self.finished) == len(self.trace)


def _prepare(cfg: dict[str, Any]) -> None:
    """Environment, shims and logging, once per process, before the first SGLang import."""
    _set_env(cfg)
    warnings.filterwarnings("ignore")
    install_shims()
    import logging

    logging.disable(logging.WARNING)  # retraction warnings go to the records instead


def run(cfg: dict[str, Any], trace: dict[str, Any]) -> dict[str, Any]:
    """Run `trace` to completion (or `max_steps`) and return the JSON-able result."""
    cfg = check_config(cfg)
    reqs = check_trace(trace, cfg)
    if "sglang" not in sys.modules:
        _prepare(cfg)
    elif int(os.environ.get("SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", "4096")) != cfg["clip_max_new_tokens"]:
        # schedule_policy.CLIP_MAX_NEW_TOKENS is read once at import time.
        raise ValueError("clip_max_new_tokens must be the same for every run of one process")
    else:
        _set_env(cfg)  # the other knobs are read at call time (envs.X.get())
    import sglang

    ref = Reference(cfg, reqs)
    steps = []
    while not ref.done() and ref.step_no < cfg["max_steps"]:
        steps.append(ref.step())
    summary = {
        "steps": len(steps),
        "finished": len(ref.finished),
        "requests": len(reqs),
        "retractions": sum(len(s["retracted"]) for s in steps),
        "extend_steps": sum(s["mode"] == "extend" for s in steps),
        "decode_steps": sum(s["mode"] == "decode" for s in steps),
        "prefix_hit_tokens": sum(a["prefix"] for s in steps for a in s["admitted"]),
        "final_free_tokens": ref.allocator.available_size(),
        "final_evictable": int(ref.tree_cache.evictable_size()),
        "final_protected": int(ref.tree_cache.protected_size()),
    }
    return {"sglang_version": sglang.__version__, "config": cfg, "steps": steps, "summary": summary}


def probe() -> dict[str, Any]:
    """Import the modules the reference needs; report SGLang's and torch's versions."""
    _prepare(check_config({}))
    import torch

    import sglang
    from sglang.srt.managers import schedule_batch, schedule_policy  # noqa: F401
    from sglang.srt.mem_cache import radix_cache  # noqa: F401

    return {"sglang": sglang.__version__, "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", help="trace JSON (see sglang_trace.py)")
    ap.add_argument("--config", help="config JSON (keys of sglang_trace.DEFAULT_CONFIG); defaults if absent")
    ap.add_argument("--batch", help='JSON {"name": {"trace": ..., "config": ...}}: several runs, one import')
    ap.add_argument("--out", help="where to write the step records (JSON)")
    ap.add_argument("--probe", action="store_true", help="only check that SGLang imports; print versions as JSON")
    args = ap.parse_args(argv)
    try:
        if args.probe:
            print(json.dumps(probe()))
            return 0
        if not args.out or bool(args.trace) == bool(args.batch):
            raise ValueError("give --out and exactly one of --trace or --batch")
        if args.batch:
            runs = json.loads(Path(args.batch).read_text())
            if not isinstance(runs, dict) or not all(isinstance(v, dict) and "trace" in v for v in runs.values()):
                raise ValueError('--batch wants {"name": {"trace": {...}, "config": {...}}, ...}')
            result: dict[str, Any] = {name: run(v.get("config", {}), v["trace"]) for name, v in runs.items()}
        else:
            trace = json.loads(Path(args.trace).read_text())
            cfg = json.loads(Path(args.config).read_text()) if args.config else {}
            result = run(cfg, trace)
    except (OSError, ValueError) as exc:
        print(f"sglang_driver: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"sglang_driver: SGLang does not import here ({exc})", file=sys.stderr)
        return 3
    Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
