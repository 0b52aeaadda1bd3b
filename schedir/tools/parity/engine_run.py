"""Run a whole vLLM 0.32 engine (tiny random-weight Llama on CPU) with a chosen scheduler class
on a deterministic workload, recording every step's decisions and every request's tokens.

Why: the vLLM plug-in's promise is "same tokens, same steps, one flag". Running the real
engine twice, once with vLLM's own scheduler and once with schedir's, on the same arrivals,
aborts and sampling params, and diffing the two runs is the proof (`tests/test_vllm_engine.py`).
Dummy weights give few distinct tokens, so each step's scheduled tokens per request and its
preempted set are compared as well.

    python -m schedir.tools.parity.engine_run --scheduler schedir --workload preempt --out run.json

The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the recording
subclass can be handed to `LLM(scheduler_cls=...)` as a class object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import numpy as np

SCHEDULERS = {
    "stock": "vllm.v1.core.sched.scheduler.Scheduler",
    "schedir": "schedir.engines.vllm.Scheduler",
}

TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 32000,
    "max_position_embeddings": 16384, "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "float16", "tie_word_embeddings": False,
}
"""Random weights (load_format=dummy); head_dim 64, the smallest vLLM's CPU attention takes."""
BLOCK_SIZE = 32
"""vLLM's CPU attention takes block sizes that are multiples of 32 (its default is 128)."""
KV_BYTES_PER_BLOCK = 2 * 2 * 256 * 2 * BLOCK_SIZE
"""layers x (K, V) x hidden x bf16 bytes x block_size: one block of the tiny model."""


@attrs.frozen
class Workload:
    """An engine configuration and a deterministic request stream."""

    name: str
    num_blocks: int = 512
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 16
    max_model_len: int = 1024
    enable_prefix_caching: bool = True
    policy: str = "fcfs"
    long_prefill_token_threshold: int = 0
    num_requests: int = 14
    prompt_min: int = 16
    prompt_max: int = 600
    output_min: int = 4
    output_max: int = 32
    arrivals_per_step: float = 0.5
    share_prob: float = 0.5
    aborts: int = 3
    n_sampled: int = 1
    seed: int = 0


WORKLOADS = {
    w.name: w
    for w in (
        # shared prefixes, prompts longer than the 256-token budget (chunked), aborts, n=2
        Workload("shared-prefix", n_sampled=2),
        # a KV cache of 12 usable blocks (384 tokens): decodes outgrow it and are preempted
        Workload("preempt", num_blocks=13, max_model_len=384, prompt_min=40, prompt_max=160, output_min=48,
                 output_max=96, arrivals_per_step=3.0, num_requests=8, aborts=2),
        # priorities, a long-prefill threshold, max_num_seqs 4
        Workload("priority", policy="priority", long_prefill_token_threshold=64, max_num_seqs=4, num_requests=10,
                 output_max=24),
        # no prefix caching, a small cache
        Workload("no-prefix-cache", enable_prefix_caching=False, num_blocks=14, max_model_len=384, prompt_max=250,
                 output_min=16, output_max=48, num_requests=8, aborts=2),
    )
}


@attrs.frozen
class TraceEntry:
    req_id: str
    arrival_step: int
    prompt: list[int]
    max_tokens: int
    priority: int
    abort_step: int | None


def make_trace(w: Workload) -> list[TraceEntry]:
    """Deterministic arrivals; a few aborts, some mid-prefill (long prompts) and some mid-decode."""
    rng = np.random.default_rng(w.seed)
    prefixes = [rng.integers(3, 32000, size=int(rng.integers(64, 257))).tolist() for _ in range(3)]
    out: list[TraceEntry] = []
    step = 0.0
    aborted = set(rng.choice(w.num_requests, size=min(w.aborts, w.num_requests), replace=False).tolist())
    for i in range(w.num_requests):
        step += float(rng.exponential(1.0 / w.arrivals_per_step)) if i else 0.0
        length = int(rng.integers(w.prompt_min, w.prompt_max + 1))
        prompt = prefixes[int(rng.integers(len(prefixes)))][:length] if rng.random() < w.share_prob else []
        prompt = prompt + rng.integers(3, 32000, size=length - len(prompt)).tolist()
        arrival = int(step)
        abort = arrival + int(rng.integers(1, 12)) if i in aborted else None
        out.append(TraceEntry(f"r{i:03d}", arrival, prompt, int(rng.integers(w.output_min, w.output_max + 1)),
                              int(rng.integers(0, 4)) if w.policy == "priority" else 0, abort))
    return out


def _recording(cls: type, steps: list[dict[str, Any]], seen: dict[str, Any]) -> type:
    class Recording(cls):  # type: ignore[misc, valid-type]
        def schedule(self, *args: Any, **kwargs: Any) -> Any:
            so = super().schedule(*args, **kwargs)
            runtime = getattr(self, "runtime", None)
            seen["pipeline"] = runtime.spec if runtime is not None else None
            steps.append({
                "scheduled": list(so.num_scheduled_tokens.items()),
                "new": [r.req_id for r in so.scheduled_new_reqs],
                "resumed": sorted(so.scheduled_cached_reqs.resumed_req_ids),
                "preempted": sorted(so.preempted_req_ids or ()),
                "finished": sorted(so.finished_req_ids),
            })
            return so

    Recording.__name__ = f"Recording{cls.__name__}"
    return Recording


def run(w: Workload, scheduler: str, pipeline: str | None = None) -> dict[str, Any]:
    """Drive the engine step by step over the workload; returns steps, tokens and timings.
    `pipeline`: the schedir pipeline the plug-in runs (its `schedir_pipeline` option)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"] = "1"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import importlib

    from vllm import LLM, SamplingParams

    module, _, name = SCHEDULERS.get(scheduler, scheduler).rpartition(".")
    steps: list[dict[str, Any]] = []
    seen: dict[str, Any] = {}
    cls = _recording(getattr(importlib.import_module(module), name), steps, seen)
    model_dir = Path(tempfile.mkdtemp(prefix="schedir-tiny-llama-"))
    (model_dir / "config.json").write_text(json.dumps(TINY_LLAMA))
    t0 = time.perf_counter()
    llm = LLM(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", seed=0,
              enforce_eager=True, max_model_len=w.max_model_len, max_num_seqs=w.max_num_seqs,
              max_num_batched_tokens=w.max_num_batched_tokens, enable_prefix_caching=w.enable_prefix_caching,
              scheduling_policy=w.policy, long_prefill_token_threshold=w.long_prefill_token_threshold,
              block_size=BLOCK_SIZE, kv_cache_memory_bytes=w.num_blocks * KV_BYTES_PER_BLOCK, scheduler_cls=cls,
              additional_config={"schedir_pipeline": pipeline} if pipeline else {})
    startup = time.perf_counter() - t0
    engine = llm.llm_engine
    trace = make_trace(w)
    pending = sorted(trace, key=lambda e: e.arrival_step)
    aborts = sorted((e.abort_step, e.req_id) for e in trace if e.abort_step is not None)
    done_samples: dict[str, dict[int, tuple[list[int], str]]] = {}
    engine_steps = 0
    t1 = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and pending[0].arrival_step <= engine_steps:
            e = pending.pop(0)
            # n > 1 needs random sampling (vLLM refuses greedy), and per-request seeds fail on
            # vLLM's CPU runner ("CPU Generator does not use offset"): such tokens differ run to
            # run, so that workload compares steps and token counts, not token values
            params = SamplingParams(max_tokens=e.max_tokens, ignore_eos=True, detokenize=False, n=w.n_sampled,
                                    temperature=0.0 if w.n_sampled == 1 else 0.8)
            engine.add_request(e.req_id, {"prompt_token_ids": e.prompt}, params, arrival_time=float(e.arrival_step),
                               priority=e.priority)
        while aborts and aborts[0][0] <= engine_steps:
            engine.abort_request([aborts.pop(0)[1]])
        for ro in engine.step():  # with n > 1 each sample may arrive in its own output
            for c in ro.outputs:
                if c.finish_reason is not None:
                    done_samples.setdefault(ro.request_id, {})[c.index] = (list(c.token_ids), c.finish_reason)
        engine_steps += 1
        if engine_steps > 20000:
            raise RuntimeError(f"workload '{w.name}' did not drain in 20000 steps with the {scheduler} scheduler")
    wall = time.perf_counter() - t1
    tokens = {rid: [samples[i][0] for i in sorted(samples)] for rid, samples in done_samples.items()}
    reasons = {rid: [samples[i][1] for i in sorted(samples)] for rid, samples in done_samples.items()}
    generated = sum(len(t) for outs in tokens.values() for t in outs)
    del llm
    return {"workload": w.name, "scheduler": scheduler, "class": f"{cls.__mro__[1].__module__}.{cls.__mro__[1].__name__}",
            "requests": len(trace), "max_tokens": {e.req_id: e.max_tokens for e in trace},
            "pipeline": seen.get("pipeline"), "steps": steps, "tokens": tokens, "reasons": reasons,
            "engine_steps": engine_steps, "startup_s": startup, "wall_s": wall,
            "output_tokens_per_s": generated / wall if wall else 0.0}


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """Where two runs of one workload first differ (steps, then tokens), or None."""
    for i, (sa, sb) in enumerate(zip(a["steps"], b["steps"])):
        if sa != sb:
            field = next(k for k in sa if sa[k] != sb.get(k))
            return (f"step {i}: `{field}` differs\n  {a['scheduler']}: {sa[field]}\n  {b['scheduler']}: {sb[field]}")
    if len(a["steps"]) != len(b["steps"]):
        return f"{a['scheduler']} ran {len(a['steps'])} steps, {b['scheduler']} {len(b['steps'])}"
    greedy = WORKLOADS[a["workload"]].n_sampled == 1 if a["workload"] in WORKLOADS else True

    def seen(run: dict[str, Any], rid: str) -> object:
        toks = run["tokens"].get(rid)
        return toks if greedy or toks is None else [len(t) for t in toks]

    for rid in sorted(a["tokens"].keys() | b["tokens"].keys()):
        if seen(a, rid) != seen(b, rid) or a["reasons"].get(rid) != b["reasons"].get(rid):
            return (f"request {rid}: tokens or finish reasons differ\n  {a['scheduler']}: {seen(a, rid)} "
                    f"{a['reasons'].get(rid)}\n  {b['scheduler']}: {seen(b, rid)} {b['reasons'].get(rid)}")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m schedir.tools.parity.engine_run",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--workload", action="append", choices=[*sorted(WORKLOADS), "all"],
                        help="a workload (repeatable; default: all)")
    parser.add_argument("--scheduler", default="schedir",
                        help="stock, schedir, or a dotted class path (default: schedir)")
    parser.add_argument("--compare", action="store_true",
                        help="run each workload on vLLM's scheduler and on schedir's, and diff them (exit 1 if they differ)")
    parser.add_argument("--pipeline", help="the schedir pipeline the plug-in runs (default: the vllm preset)")
    parser.add_argument("--out", type=Path, help="write the runs as JSON here")
    args = parser.parse_args(argv)
    if args.compare and args.pipeline:
        parser.error("--compare checks the vllm preset against vLLM; --pipeline runs another policy alone")
    names = sorted(WORKLOADS) if not args.workload or "all" in args.workload else args.workload
    schedulers = ["stock", "schedir"] if args.compare else [args.scheduler]
    runs: list[dict[str, Any]] = []
    differ = 0
    print(f"{'workload':16} {'scheduler':10} {'steps':>6} {'preempt':>7} {'done':>5} {'tok/s':>7}  same as stock")
    for name in names:
        pair = []
        for scheduler in schedulers:
            try:
                result = run(WORKLOADS[name], scheduler, args.pipeline)
            except ImportError as exc:
                print(f"engine_run: cannot import vLLM or the scheduler class: {exc}", file=sys.stderr)
                return 2
            pair.append(result)
            runs.append(result)
            same = ""
            if args.compare and scheduler != "stock":
                diff = first_difference(pair[0], result)
                same = "yes (steps and tokens)" if diff is None else "NO"
                differ += diff is not None
            print(f"{name:16} {scheduler:10} {len(result['steps']):6d} "
                  f"{sum(len(s['preempted']) for s in result['steps']):7d} {len(result['tokens']):5d} "
                  f"{result['output_tokens_per_s']:7.1f}  {same}", flush=True)
            if same == "NO":
                print("  " + str(diff).replace("\n", "\n  "))
    if args.out:
        args.out.write_text(json.dumps(runs))
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
