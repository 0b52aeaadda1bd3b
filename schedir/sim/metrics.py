"""A simulation's figures: latency quantiles, throughput, goodput, efficiency, scheduler cost.

Definitions (all times simulated seconds unless named _us / wall):
- TTFT: first token - arrival; E2E: finish - arrival; queueing: first scheduled - arrival;
- TBT: every gap between two consecutive tokens of a request (all samples pooled);
- throughput: finished requests (output tokens) / (last finish - first arrival);
- goodput: finished requests with TTFT <= ttft_slo and mean TBT <= tbt_slo, per second;
- batch efficiency: tokens scheduled / token budget, averaged over steps; compute efficiency:
  model FLOPs / (GPU time x peak FLOP/s);
- KV utilisation: blocks in use / usable blocks, weighted by step time;
- prefix-hit rate: prompt tokens found in the prefix cache at first admission / prompt tokens admitted.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schedir.sim.records import SimResult

QUANTILES = (50, 90, 99)
CDF_POINTS = 201
TIMELINE_BINS = 400


def quantiles(values: np.ndarray) -> dict[str, float]:
    """p50/p90/p99 and mean (NaN-free input; an empty one gives zeros and count 0)."""
    if values.size == 0:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0, "count": 0}
    qs = np.percentile(values, QUANTILES)
    return {"p50": float(qs[0]), "p90": float(qs[1]), "p99": float(qs[2]), "mean": float(values.mean()),
            "count": int(values.size)}


def met_slo(result: SimResult) -> np.ndarray:
    """Per request: it finished with TTFT <= the TTFT SLO and mean TBT <= the TBT SLO."""
    r = result.requests
    finished = ~np.isnan(r.finish_s)
    mean_tbt = np.where(r.tokens_out > 1, (r.last_token_s - r.first_token_s) / np.maximum(r.tokens_out - 1, 1), 0.0)
    cfg = result.config
    with np.errstate(invalid="ignore"):
        return finished & (r.first_token_s - r.arrival_s <= float(cfg["ttft_slo_s"])) & (
            mean_tbt <= float(cfg["tbt_slo_s"]))


def summarize(result: SimResult) -> dict[str, Any]:
    """The metrics JSON of one run (the keys `schedir sim --json` writes and `schedir stats` reads)."""
    r = result.requests
    steps = result.steps
    finished = ~np.isnan(r.finish_s)
    ttft = (r.first_token_s - r.arrival_s)[~np.isnan(r.first_token_s)]
    e2e = (r.finish_s - r.arrival_s)[finished]
    queueing = (r.first_scheduled_s - r.arrival_s)[~np.isnan(r.first_scheduled_s)]
    gaps = r.gaps()
    span_end = float(np.nanmax(r.finish_s)) if finished.any() else 0.0
    span = max(span_end - float(r.arrival_s.min()), 1e-9) if r.arrival_s.size else 1e-9
    out_tokens = int(r.tokens_out[finished].sum())

    cfg = result.config
    good = met_slo(result)

    admitted = r.prefix_hit_tokens >= 0
    prompt_admitted = int(r.input_len[admitted].sum())
    hit_tokens = int(r.prefix_hit_tokens[admitted].sum())

    gpu_s = steps.column("gpu_s")
    busy = float(gpu_s.sum())
    budget = float(cfg["max_num_batched_tokens"])
    scheduled = steps.column("prefill_tokens") + steps.column("decode_tokens")
    sched_us = steps.column("sched_us")
    return {
        "config": result.config_name,
        "settings": result.config,
        "workload": result.workload,
        "num_blocks": result.num_blocks,
        "max_model_len": result.max_model_len,
        "requests": {"total": int(r.arrival_s.size), "finished": int(finished.sum()),
                     "rejected": len(r.rejected), "unfinished": int(r.arrival_s.size - finished.sum() - len(r.rejected))},
        "rejected_reasons": _count(r.rejected.values()),
        "ttft_s": quantiles(ttft),
        "tbt_s": quantiles(gaps),
        "e2e_s": quantiles(e2e),
        "queueing_s": quantiles(queueing),
        "throughput_req_s": float(finished.sum()) / span,
        "throughput_tok_s": out_tokens / span,
        "goodput_req_s": float(good.sum()) / span,
        # over every request: a rejected or unfinished one missed its SLO too
        "slo_attainment": float(good.sum()) / max(int(r.arrival_s.size), 1),
        "slo": {"ttft_s": float(cfg["ttft_slo_s"]), "tbt_s": float(cfg["tbt_slo_s"])},
        "prefix_hit_rate": hit_tokens / prompt_admitted if prompt_admitted else 0.0,
        "batch_efficiency": float((scheduled / budget).mean()) if scheduled.size else 0.0,
        "compute_efficiency": float(steps.column("flops").sum() / (busy * result.peak_flops)) if busy else 0.0,
        "kv_utilization": float((steps.column("kv_usage") * gpu_s).sum() / busy) if busy else 0.0,
        "preemptions": int(r.preemptions.sum()),
        "steps": int(steps.size),
        "simulated_s": span_end,
        "gpu_busy_s": busy,
        "scheduler_us_per_step": float(np.median(sched_us)) if sched_us.size else 0.0,
        "scheduler_us": quantiles(sched_us),
        "scheduler_share_of_gpu_time": float(sched_us.sum() / 1e6 / busy) if busy else 0.0,
        "sim_wall_s": result.sim_wall_s,
        "decode_run_steps": int(result.decode_run_steps),
        "stalled": result.stalled,
        "runtime": result.runtime_metrics,
        "series": {
            "cdf": {"ttft_s": cdf_points(ttft), "tbt_s": cdf_points(gaps), "e2e_s": cdf_points(e2e)},
            "timeline": timeline(result),
        },
    }


REQUEST_COLUMNS = ("request", "arrival_s", "input_tokens", "output_tokens", "prefix_hit_tokens", "queueing_s",
                   "ttft_s", "mean_tbt_s", "e2e_s", "preemptions", "rejected")


def per_request(result: SimResult) -> list[tuple[object, ...]]:
    """One row per request (`REQUEST_COLUMNS`; empty cells where it never happened)."""
    r = result.requests

    def cell(value: float) -> object:
        return "" if np.isnan(value) else round(float(value), 6)

    mean_tbt = np.where(r.tokens_out > 1, (r.last_token_s - r.first_token_s) / np.maximum(r.tokens_out - 1, 1),
                        np.nan)
    rows = []
    for i in range(r.arrival_s.size):
        rows.append((i, round(float(r.arrival_s[i]), 6), int(r.input_len[i]), int(r.tokens_out[i]),
                     int(r.prefix_hit_tokens[i]) if r.prefix_hit_tokens[i] >= 0 else "",
                     cell(r.first_scheduled_s[i] - r.arrival_s[i]), cell(r.first_token_s[i] - r.arrival_s[i]),
                     cell(mean_tbt[i]), cell(r.finish_s[i] - r.arrival_s[i]), int(r.preemptions[i]),
                     r.rejected.get(i, "")))
    return rows


def cdf_points(values: np.ndarray, points: int = CDF_POINTS) -> list[float]:
    """The values at `points` evenly spaced quantiles: a CDF that fits in the JSON at any run size."""
    if values.size == 0:
        return []
    return [float(v) for v in np.percentile(values, np.linspace(0, 100, points))]


def timeline(result: SimResult, bins: int = TIMELINE_BINS) -> dict[str, list[float]]:
    """Batch composition over simulated time: mean tokens per step (prefill, decode), requests, KV use."""
    steps = result.steps
    if steps.size == 0:
        return {"t_s": [], "prefill_tokens": [], "decode_tokens": [], "num_reqs": [], "kv_usage": []}
    start = steps.column("start_s")
    edges = np.linspace(start[0], start[-1] + 1e-9, bins + 1)
    which = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, bins - 1)
    count = np.bincount(which, minlength=bins)
    keep = count > 0

    def mean_of(name: str) -> list[float]:
        total = np.bincount(which, weights=steps.column(name), minlength=bins)
        return [float(v) for v in (total[keep] / count[keep])]

    mid = (edges[:-1] + edges[1:]) / 2
    return {"t_s": [float(v) for v in mid[keep]], "prefill_tokens": mean_of("prefill_tokens"),
            "decode_tokens": mean_of("decode_tokens"), "num_reqs": mean_of("num_reqs"), "kv_usage": mean_of("kv_usage")}


def _count(values) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return counts
