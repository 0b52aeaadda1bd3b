"""Traces, configs and scenarios shared by vLLM v0's reference driver and schedir's `vllm-v0` side.

Why a separate, standard-library-only module: the reference driver runs inside vLLM 0.8.5's own
virtual environment (no xDSL, Numba or attrs there), while schedir's future `vllm-v0` preset runs
in schedir's. Both sides must see the same arrivals, prompts, aborts and sampled tokens, so
everything both need is here, in plain dicts and lists that serialise to JSON.

A trace is `{"requests": [{"rid", "arrival_step", "prompt", "max_tokens", "priority"?,
"abort_step"?}]}`, the JSON form of the parity harness's `TraceRequest` (`req_id` ->
`rid`, `prompt_token_ids` -> `prompt`; `from_harness` converts). Requests never emit EOS: each
stops at `max_tokens` (or at `max_model_len`), exactly as in the v1 parity harness, and the
sampled token is the harness's `fake_token` of the position, so a request recomputed after a
preemption re-prefills the same tokens on both sides.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

VOCAB_LO, VOCAB_HI = 3, 32000
"""Prompt tokens stay in [VOCAB_LO, VOCAB_HI): above BOS/EOS (1, 2)."""
EOS_TOKEN_ID = 2


def fake_token(computed_after: int) -> int:
    """The token the fake model samples once `computed_after` tokens are computed.

    The same function as `harness.fake_token` (1000 + 7919 * position mod 30000, never EOS),
    restated here because the harness imports attrs/numpy, which vLLM 0.8.5's env need not have.
    """
    return 1000 + (computed_after * 7919) % 30000


DEFAULT_CONFIG: dict[str, Any] = {
    "block_size": 16,
    "num_gpu_blocks": 256,
    "num_cpu_blocks": 256,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 64,
    "max_model_len": 2048,
    "enable_chunked_prefill": False,
    "enable_prefix_caching": False,
    "preemption_mode": None,
    "delay_factor": 0.0,
    "policy": "fcfs",
    "max_num_partial_prefills": 1,
    "step_seconds": 1.0,
    "max_steps": 5000,
}
"""The reference's knobs, named after vLLM 0.8.5's `SchedulerConfig` / `CacheConfig` fields.

`num_gpu_blocks` / `num_cpu_blocks` are set on the `CacheConfig` as the engine does after
profiling (`cache_config.num_gpu_blocks = ...`); `preemption_mode` None lets v0 choose
(scheduler.py `_preempt`: recompute for a single-sequence group, swap otherwise), "swap" or
"recompute" forces one. `step_seconds` is the fake clock: engine step s runs at time
s * step_seconds (arrival times, `delay_factor`'s latency and prefix-cache access times all read
it). The block manager's watermark is v0's fixed 0.01 (the scheduler does not pass one)."""

PREEMPTION_MODES = (None, "swap", "recompute")
POLICIES = ("fcfs", "priority")


def check_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """`cfg` over the defaults; unknown keys or bad values are a ValueError that names them."""
    unknown = sorted(set(cfg) - set(DEFAULT_CONFIG))
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; known: {sorted(DEFAULT_CONFIG)}")
    out = {**DEFAULT_CONFIG, **cfg}
    for key in ("block_size", "num_gpu_blocks", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
                "max_num_partial_prefills", "max_steps"):
        if not isinstance(out[key], int) or isinstance(out[key], bool) or out[key] <= 0:
            raise ValueError(f"config {key} must be a positive integer, got {out[key]!r}")
    if not isinstance(out["num_cpu_blocks"], int) or out["num_cpu_blocks"] < 0:
        raise ValueError(f"config num_cpu_blocks must be a non-negative integer, got {out['num_cpu_blocks']!r}")
    if out["preemption_mode"] not in PREEMPTION_MODES:
        raise ValueError(f"preemption_mode {out['preemption_mode']!r} is not one of {PREEMPTION_MODES}")
    if out["policy"] not in POLICIES:
        raise ValueError(f"policy {out['policy']!r} is not one of {POLICIES}")
    for key in ("delay_factor", "step_seconds"):
        if not isinstance(out[key], (int, float)) or out[key] < 0:
            raise ValueError(f"config {key} must be a non-negative number, got {out[key]!r}")
    if not isinstance(out["enable_chunked_prefill"], bool) or not isinstance(out["enable_prefix_caching"], bool):
        raise ValueError("enable_chunked_prefill and enable_prefix_caching must be booleans")
    return out


def check_trace(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace's requests with defaults filled in; a ValueError names the first bad request and field.

    Prompts longer than the model or the GPU pool are allowed on purpose: v0 ignores them
    (FINISHED_IGNORED), and that is one of the behaviours the reference records.
    """
    reqs = trace.get("requests") if isinstance(trace, dict) else None
    if not isinstance(reqs, list):
        raise ValueError('a trace is a JSON object {"requests": [...]}')
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for i, r in enumerate(reqs):
        where = f"trace request #{i}"
        if not isinstance(r, dict):
            raise ValueError(f"{where} is not an object")
        for key in ("rid", "arrival_step", "prompt", "max_tokens"):
            if key not in r:
                raise ValueError(f"{where} lacks {key!r}")
        rid = r["rid"]
        if not isinstance(rid, str) or not rid or rid in seen:
            raise ValueError(f"{where}: rid must be a unique non-empty string, got {rid!r}")
        seen.add(rid)
        prompt = r["prompt"]
        if not isinstance(prompt, list) or not prompt or not all(
                isinstance(t, int) and VOCAB_LO <= t < VOCAB_HI for t in prompt):
            raise ValueError(f"{where} ({rid}): prompt must be non-empty ints in [{VOCAB_LO}, {VOCAB_HI})")
        if not isinstance(r["max_tokens"], int) or r["max_tokens"] < 1:
            raise ValueError(f"{where} ({rid}): max_tokens must be a positive int")
        if not isinstance(r["arrival_step"], int) or r["arrival_step"] < 0:
            raise ValueError(f"{where} ({rid}): arrival_step must be a non-negative int")
        abort = r.get("abort_step")
        if abort is not None and (not isinstance(abort, int) or abort < 0):
            raise ValueError(f"{where} ({rid}): abort_step must be null or a non-negative int")
        if not isinstance(r.get("priority", 0), int):
            raise ValueError(f"{where} ({rid}): priority must be an int (lower runs first)")
        out.append({"rid": rid, "arrival_step": r["arrival_step"], "prompt": list(prompt),
                    "max_tokens": r["max_tokens"], "priority": r.get("priority", 0), "abort_step": abort})
    return out


def from_harness(trace: Iterable[Any]) -> dict[str, Any]:
    """A parity-harness trace (`harness.TraceRequest` objects) as a v0 trace dict (duck-typed)."""
    return {"requests": [
        {"rid": r.req_id, "arrival_step": int(r.arrival_step), "prompt": [int(t) for t in r.prompt_token_ids],
         "max_tokens": int(r.max_tokens), "priority": int(getattr(r, "priority", 0)),
         "abort_step": getattr(r, "abort_step", None)}
        for r in trace
    ]}


def make_trace(
    *,
    num_requests: int,
    seed: int,
    prompt_len: tuple[int, int] = (16, 256),
    output_len: tuple[int, int] = (4, 64),
    arrival_rate: float = 1.0,
    num_prefixes: int = 0,
    prefix_len: tuple[int, int] = (32, 128),
    share_prob: float = 0.0,
    priorities: int = 0,
    rid_prefix: str = "r",
) -> dict[str, Any]:
    """A seeded synthetic trace: uniform prompt/output lengths, Poisson arrivals, shared prefixes.

    `arrival_rate` is requests per step (0: all at step 0). With `num_prefixes`, a request starts
    with one of them with probability `share_prob`. `priorities` > 0 draws a priority in
    [0, priorities) per request (lower runs first in v0). Request ids are zero-padded so that
    string order is trace order.
    """
    rng = random.Random(seed)
    prefixes = [[rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(rng.randint(*prefix_len))]
                for _ in range(num_prefixes)]
    width = len(str(max(num_requests - 1, 0)))
    reqs: list[dict[str, Any]] = []
    t = 0.0
    for i in range(num_requests):
        if arrival_rate > 0 and i > 0:
            t += rng.expovariate(arrival_rate)
        body = [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(rng.randint(*prompt_len))]
        if prefixes and rng.random() < share_prob:
            body = prefixes[rng.randrange(len(prefixes))] + body
        reqs.append({"rid": f"{rid_prefix}{i:0{width}d}", "arrival_step": int(t), "prompt": body,
                     "max_tokens": rng.randint(*output_len),
                     "priority": rng.randrange(priorities) if priorities else 0, "abort_step": None})
    return {"requests": reqs}


def _req(rid: str, step: int, n: int, max_tokens: int, seed: int, **extra: Any) -> dict[str, Any]:
    """One hand-written request with a seeded random prompt of `n` tokens."""
    rng = random.Random(seed)
    return {"rid": rid, "arrival_step": step, "prompt": [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(n)],
            "max_tokens": max_tokens, "priority": extra.get("priority", 0), "abort_step": extra.get("abort_step")}


def scenarios() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """The named reference scenarios: name -> (trace, config). All of them run in seconds.

    - swap: 40 requests, long outputs, a 96-block GPU pool and a 256-block CPU pool, swap forced
      (0.8.5 only swaps single-sequence requests when told to): decodes run out of blocks, the
      newest running requests are swapped out, and swapped requests come back before new ones;
    - swap-chunked: the same trace with chunked prefill on (decodes first, then swapped, then new);
    - swap-cpu-exhausted: swap forced with a 4-block CPU pool: v0 does not fall back to recompute,
      the scheduler raises "Aborted due to the lack of CPU swap space" and the run records it;
    - recompute: the swap trace with v0's default choice (single-sequence groups -> recompute);
    - ignored: chunked prefill off, 24 GPU blocks, max_model_len 512: huge-gpu (450 tokens, more
      than the pool: can_allocate NEVER), huge-len (700) and huge-both (1100, both over
      `_get_prompt_limit`) are all ignored, among normal requests;
    - ignored-chunked: the same trace with chunked prefill on and 64 GPU blocks: huge-gpu now fits
      and runs, huge-both is ignored (can_allocate NEVER), and huge-len is NOT ignored (0.8.5
      compares the prompt limit with the chunk, not the prompt): it is prefilled in chunks and
      stops length-capped after one token;
    - chunked: long prompts with chunked prefill on, several partial prefills per step;
    - prefix: 80% of prompts share one of 3 prefixes, prefix caching on (cached tokens recorded);
    - delay: delay_factor 3 with a steady arrival stream (prefills held back while decodes run);
    - priority: priority policy, default mode (recompute), 64 GPU blocks: four low-priority
      requests (128 + 100 tokens, 15 blocks each at most, so they never preempt each other), then
      at step 30 two high-priority 200-token prompts; the second cannot be allocated, so
      `_schedule_priority_preemption` recomputes the newest low-priority request for it;
    - priority-swap: the same with swap forced: `_schedule_priority_preemption` swaps the victim
      out but puts it in the waiting queue, and the next `_schedule_prefills` fails its
      one-WAITING-sequence assertion (recorded as the run's error);
    - aborts: swap forced, requests aborted while waiting, running and swapped out.
    """
    long_out = make_trace(num_requests=40, seed=11, prompt_len=(32, 160), output_len=(60, 200), arrival_rate=2.0)
    pressure = {"num_gpu_blocks": 96, "num_cpu_blocks": 256, "max_num_seqs": 32, "max_num_batched_tokens": 2048}
    ignored = make_trace(num_requests=8, seed=12, prompt_len=(16, 120), output_len=(4, 24), arrival_rate=1.0)
    ignored["requests"] += [
        _req("huge-gpu", 2, 450, 8, seed=1),    # <= max_model_len 512, 29 blocks: more than 24 GPU blocks
        _req("huge-len", 3, 700, 8, seed=2),    # > max_model_len, 44 blocks: fits a 64-block pool
        _req("huge-both", 4, 1100, 8, seed=3),  # > max_model_len and 69 blocks: fits neither
    ]
    ignored_cfg = {"num_gpu_blocks": 24, "num_cpu_blocks": 24, "max_model_len": 512, "max_num_batched_tokens": 512}
    prio = {"requests": [_req(f"lo{i}", 0, 128, 100, seed=20 + i, priority=5) for i in range(4)]
            + [_req(f"hi{i}", 30, 200, 10, seed=30 + i, priority=0) for i in range(2)]}
    aborts = make_trace(num_requests=24, seed=15, prompt_len=(32, 128), output_len=(80, 160), arrival_rate=3.0)
    for rid, at in (("r03", 2), ("r10", 12), ("r15", 15), ("r17", 25), ("r20", 40), ("r23", 60)):
        next(r for r in aborts["requests"] if r["rid"] == rid)["abort_step"] = at
    return {
        "swap": (long_out, {**pressure, "preemption_mode": "swap"}),
        "swap-chunked": (long_out, {**pressure, "preemption_mode": "swap", "enable_chunked_prefill": True,
                                    "max_num_batched_tokens": 512}),
        "swap-cpu-exhausted": (long_out, {**pressure, "preemption_mode": "swap", "num_cpu_blocks": 4}),
        "recompute": (long_out, dict(pressure)),
        "ignored": (ignored, ignored_cfg),
        "ignored-chunked": (ignored, {**ignored_cfg, "num_gpu_blocks": 64, "enable_chunked_prefill": True}),
        "chunked": (
            make_trace(num_requests=12, seed=16, prompt_len=(300, 1200), output_len=(4, 16), arrival_rate=0.5),
            {"num_gpu_blocks": 1024, "enable_chunked_prefill": True, "max_num_batched_tokens": 256,
             "max_num_partial_prefills": 2},
        ),
        "prefix": (
            make_trace(num_requests=30, seed=17, prompt_len=(16, 64), output_len=(4, 24), arrival_rate=1.5,
                       num_prefixes=3, prefix_len=(64, 160), share_prob=0.8),
            {"num_gpu_blocks": 512, "enable_prefix_caching": True},
        ),
        "delay": (
            make_trace(num_requests=30, seed=18, prompt_len=(16, 96), output_len=(8, 32), arrival_rate=1.0),
            {"num_gpu_blocks": 512, "delay_factor": 3.0},
        ),
        "priority": (prio, {"num_gpu_blocks": 64, "num_cpu_blocks": 0, "policy": "priority"}),
        "priority-swap": (prio, {"num_gpu_blocks": 64, "num_cpu_blocks": 256, "policy": "priority",
                                 "preemption_mode": "swap"}),
        "aborts": (aborts, {**pressure, "num_gpu_blocks": 80, "preemption_mode": "swap"}),
    }


def write_json(path: str | Path, obj: Any) -> None:
    """Write `obj` as JSON (the driver's input and output files)."""
    Path(path).write_text(json.dumps(obj))
