"""Traces, scenario configs and the fake model runner shared by SGLang's reference driver and schedir.

Why a separate, standard-library-only module: the reference driver runs inside SGLang's own
virtual environment (no xDSL, Numba or attrs there), while schedir's future `sglang` preset
runs in schedir's. Both sides must see the same arrivals, the same prompts and the same
sampled tokens (a retracted request re-prefills prompt + output, so the output tokens decide
its radix-cache hits). Everything both sides need is here, in plain dicts and lists that
serialise to JSON.

A trace is `{"requests": [{"rid", "arrival_step", "prompt", "max_new_tokens", "output_len"}]}`:
`output_len <= max_new_tokens` is how many tokens the fake model emits; when it is shorter,
the last one is `EOS_TOKEN_ID` (SGLang finishes the request on it), else the request stops at
`max_new_tokens` (finish by length).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

EOS_TOKEN_ID = 2
VOCAB_SIZE = 32000
TOKEN_LO = 3
"""Prompt and sampled tokens stay in [TOKEN_LO, VOCAB_SIZE): never BOS/EOS unless on purpose."""


def fake_token(ordinal: int, position: int, output_len: int, max_new_tokens: int) -> int:
    """The token the fake model samples for trace request number `ordinal` at output `position`.

    Deterministic and engine-independent: a function of the request's place in the trace and
    how many tokens it has already produced. The last token of a request that stops early
    (`output_len < max_new_tokens`) is EOS.
    """
    if position == output_len - 1 and output_len < max_new_tokens:
        return EOS_TOKEN_ID
    return TOKEN_LO + (ordinal * 7919 + position * 104729 + 17) % (VOCAB_SIZE - TOKEN_LO)


DEFAULT_CONFIG: dict[str, Any] = {
    "policy": "lpm",
    "page_size": 1,
    "num_kv_tokens": 4096,
    "max_running_requests": 64,
    "max_context_len": 4096,
    "chunked_prefill_size": 512,
    "max_prefill_tokens": 4096,
    "init_new_token_ratio": 0.7,
    "min_new_token_ratio_factor": 0.14,
    "new_token_ratio_decay_steps": 600,
    "retract_decode_steps": 20,
    "clip_max_new_tokens": 4096,
    "max_steps": 5000,
    "random_seed": 0,
    "enable_mixed_chunk": False,
}
"""The reference loop's knobs, named after SGLang's server args / environment variables:
`num_kv_tokens` is the token-to-KV pool size (`max_total_num_tokens`), `max_running_requests`
the request-to-token pool size, `chunked_prefill_size` <= 0 or None disables chunking,
`init_new_token_ratio` is SGLANG_INIT_NEW_TOKEN_RATIO * schedule_conservativeness, the min
ratio is init * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR and the decay per decode step is
(init - min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS; `retract_decode_steps` is
SGLANG_RETRACT_DECODE_STEPS and `clip_max_new_tokens` SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION.
`random_seed` seeds Python's `random` for the `random` policy."""

POLICIES = ("lpm", "fcfs", "dfs-weight", "lof", "random")


def check_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """`cfg` over the defaults; unknown keys or bad values are a ValueError that names them."""
    unknown = sorted(set(cfg) - set(DEFAULT_CONFIG))
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; known: {sorted(DEFAULT_CONFIG)}")
    out = {**DEFAULT_CONFIG, **cfg}
    if out["policy"] not in POLICIES:
        raise ValueError(f"policy {out['policy']!r} is not one of {POLICIES}")
    for key in ("page_size", "num_kv_tokens", "max_running_requests", "max_context_len", "max_prefill_tokens",
                "new_token_ratio_decay_steps", "retract_decode_steps", "clip_max_new_tokens", "max_steps"):
        if not isinstance(out[key], int) or out[key] <= 0:
            raise ValueError(f"config {key} must be a positive integer, got {out[key]!r}")
    if out["chunked_prefill_size"] is not None and not isinstance(out["chunked_prefill_size"], int):
        raise ValueError(f"chunked_prefill_size must be an integer or null, got {out['chunked_prefill_size']!r}")
    if not 0.0 < float(out["init_new_token_ratio"]) <= 1.0:
        raise ValueError("init_new_token_ratio must be in (0, 1]")
    if not isinstance(out["enable_mixed_chunk"], bool):
        raise ValueError(f"enable_mixed_chunk must be true or false, got {out['enable_mixed_chunk']!r}")
    return out


def check_trace(trace: dict[str, Any], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace's requests, validated; a ValueError names the first bad request and field."""
    reqs = trace.get("requests") if isinstance(trace, dict) else None
    if not isinstance(reqs, list):
        raise ValueError('a trace is a JSON object {"requests": [...]}')
    seen: set[str] = set()
    for i, r in enumerate(reqs):
        where = f"trace request #{i}"
        for key in ("rid", "arrival_step", "prompt", "max_new_tokens", "output_len"):
            if key not in r:
                raise ValueError(f"{where} lacks {key!r}")
        if not isinstance(r["rid"], str) or r["rid"] in seen:
            raise ValueError(f"{where}: rid must be a unique string, got {r['rid']!r}")
        seen.add(r["rid"])
        if not r["prompt"] or not all(isinstance(t, int) and TOKEN_LO <= t < VOCAB_SIZE for t in r["prompt"]):
            raise ValueError(f"{where} ({r['rid']}): prompt must be non-empty ints in [{TOKEN_LO}, {VOCAB_SIZE})")
        if not 1 <= r["output_len"] <= r["max_new_tokens"]:
            raise ValueError(f"{where} ({r['rid']}): need 1 <= output_len <= max_new_tokens")
        if len(r["prompt"]) + r["max_new_tokens"] > cfg["max_context_len"]:
            raise ValueError(f"{where} ({r['rid']}): prompt + max_new_tokens exceeds max_context_len")
        if not isinstance(r["arrival_step"], int) or r["arrival_step"] < 0:
            raise ValueError(f"{where} ({r['rid']}): arrival_step must be a non-negative int")
    return reqs


def make_trace(
    *,
    num_requests: int,
    seed: int,
    prompt_len: tuple[int, int] = (16, 256),
    output_len: tuple[int, int] = (4, 64),
    num_prefixes: int = 0,
    prefix_len: tuple[int, int] = (32, 128),
    share_prob: float = 0.0,
    arrival_rate: float = 1.0,
    early_stop_prob: float = 0.0,
    burst_at: int | None = None,
) -> dict[str, Any]:
    """A seeded synthetic trace: uniform prompt/output lengths, optional shared prefixes.

    A request shares one of `num_prefixes` prefixes with probability `share_prob` (its prompt
    is the prefix plus its own suffix). Arrivals are Poisson with `arrival_rate` requests per
    step (0: all at step 0). With probability `early_stop_prob` a request emits EOS before its
    `max_new_tokens` (so SGLang's new_token_ratio estimate matters).

    `burst_at`: first one warm-up request per prefix arrives at step 0 (it puts the prefix in
    the radix cache), then every other request arrives at once at step `burst_at`; this is
    the workload where cache-aware orders (LPM) and FCFS admit in different orders.
    """
    rng = random.Random(seed)
    prefixes = [
        [rng.randrange(TOKEN_LO, VOCAB_SIZE) for _ in range(rng.randint(*prefix_len))] for _ in range(num_prefixes)
    ]
    reqs: list[dict[str, Any]] = []
    step, t = 0, 0.0
    if burst_at is not None:
        for p, prefix in enumerate(prefixes):
            body = prefix + [rng.randrange(TOKEN_LO, VOCAB_SIZE) for _ in range(8)]
            reqs.append({"rid": f"w{p}", "arrival_step": 0, "prompt": body, "max_new_tokens": 2, "output_len": 2})
    for i in range(num_requests):
        if burst_at is not None:
            step = burst_at
        elif arrival_rate > 0:
            t += rng.expovariate(arrival_rate)
            step = int(t)
        body = [rng.randrange(TOKEN_LO, VOCAB_SIZE) for _ in range(rng.randint(*prompt_len))]
        if prefixes and rng.random() < share_prob:
            body = prefixes[rng.randrange(len(prefixes))] + body
        max_new = rng.randint(*output_len)
        out_len = rng.randint(1, max_new) if rng.random() < early_stop_prob else max_new
        reqs.append({"rid": f"r{i}", "arrival_step": step, "prompt": body, "max_new_tokens": max_new,
                     "output_len": out_len})
    return {"requests": reqs}


def scenarios() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """The named reference scenarios: name -> (trace, config). Each runs in seconds.

    - lpm-burst / fcfs-burst: the same trace (prefixes warmed at step 0, a burst at step 10)
      under LPM and FCFS, with a prefill budget that spreads the burst over several steps;
      lpm-burst-page16 is LPM on it with 16-token pages (SGLang's paged allocator);
    - shared-prefix: Poisson arrivals, 80% of prompts share one of 3 prefixes (LPM);
    - chunked: prompts of 300-1200 tokens with chunked_prefill_size 256;
    - retract: a KV pool of 1000 tokens, long outputs and a low initial new_token_ratio, so
      decode runs out of memory and retract_decode fires several times;
    - mixed / mixed-tight: SGLang's mixed chunked prefill (`enable_mixed_chunk`): running requests
      decode in the prefill step when their tokens fit; the tight one also retracts;
    - dfs-weight, lof, random: the other policies on small traces;
    - lpm-long-queue: 220 requests in one burst behind 8 request slots, so more than 128 wait
      (LPM is FCFS there, and schedir's steps hold a window of the list, counting it from their
      `waiting_count` fact) until the queue drains below 128 and LPM sorts by prefix again.
    """
    shared = dict(num_prefixes=3, prefix_len=(64, 160), share_prob=0.8)
    burst = make_trace(num_requests=24, seed=1, burst_at=10, prompt_len=(16, 128), output_len=(4, 32), **shared)
    burst_cfg = {"num_kv_tokens": 16384, "chunked_prefill_size": 512, "max_prefill_tokens": 512}
    return {
        "lpm-burst": (burst, {"policy": "lpm", **burst_cfg}),
        "fcfs-burst": (burst, {"policy": "fcfs", **burst_cfg}),
        "lpm-burst-page16": (burst, {"policy": "lpm", **burst_cfg, "page_size": 16}),
        "shared-prefix": (
            make_trace(num_requests=40, seed=2, arrival_rate=2.0, **shared),
            {"policy": "lpm", "num_kv_tokens": 8192, "chunked_prefill_size": 1024},
        ),
        "chunked": (
            make_trace(num_requests=12, seed=3, arrival_rate=0.5, prompt_len=(300, 1200), output_len=(4, 16)),
            {"policy": "fcfs", "num_kv_tokens": 16384, "chunked_prefill_size": 256, "max_prefill_tokens": 1024},
        ),
        "retract": (
            make_trace(num_requests=60, seed=4, arrival_rate=1.0, prompt_len=(32, 96), output_len=(64, 200), **shared),
            {"policy": "lpm", "num_kv_tokens": 1000, "chunked_prefill_size": 256, "max_running_requests": 32,
             "init_new_token_ratio": 0.2, "new_token_ratio_decay_steps": 10},
        ),
        "mixed": (
            make_trace(num_requests=30, seed=8, arrival_rate=1.0, prompt_len=(100, 600), output_len=(8, 40), **shared),
            {"policy": "lpm", "num_kv_tokens": 8192, "chunked_prefill_size": 256, "max_prefill_tokens": 1024,
             "enable_mixed_chunk": True},
        ),
        "mixed-tight": (
            make_trace(num_requests=40, seed=9, arrival_rate=1.0, prompt_len=(32, 200), output_len=(32, 150), **shared),
            {"policy": "fcfs", "num_kv_tokens": 1200, "chunked_prefill_size": 128, "max_running_requests": 32,
             "init_new_token_ratio": 0.2, "new_token_ratio_decay_steps": 10, "enable_mixed_chunk": True},
        ),
        "lpm-long-queue": (
            make_trace(num_requests=220, seed=10, burst_at=2, prompt_len=(16, 96), output_len=(2, 12), **shared),
            {"policy": "lpm", "num_kv_tokens": 16384, "chunked_prefill_size": 512, "max_prefill_tokens": 512,
             "max_running_requests": 8},
        ),
        "dfs-weight": (
            make_trace(num_requests=24, seed=5, burst_at=10, **shared),
            {"policy": "dfs-weight", "num_kv_tokens": 16384, "chunked_prefill_size": 512, "max_prefill_tokens": 512},
        ),
        "lof": (
            make_trace(num_requests=20, seed=6, arrival_rate=0.0, output_len=(4, 80)),
            {"policy": "lof", "num_kv_tokens": 4096, "max_prefill_tokens": 512, "chunked_prefill_size": 512},
        ),
        "random": (
            make_trace(num_requests=20, seed=7, arrival_rate=0.0),
            {"policy": "random", "num_kv_tokens": 4096, "max_prefill_tokens": 512, "chunked_prefill_size": 512,
             "random_seed": 7},
        ),
    }


def write_json(path: str | Path, obj: Any) -> None:
    Path(path).write_text(json.dumps(obj))
