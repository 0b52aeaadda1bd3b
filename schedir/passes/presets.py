"""Named pipelines: a preset name can stand wherever a pass list is expected."""

from __future__ import annotations

PRESETS: dict[str, str] = {
    # The seed's base scheduler: FIFO order, running requests first, greedy admission. Admission
    # chunks a prompt larger than the budget left (admit-greedy's default; unchunked, a prompt
    # longer than the whole budget was deferred forever).
    "base": "reject-oversized,order-fcfs,schedule-running,admit-greedy,verify-step",
    # The same with priority order (lower value first, then arrival).
    "base-priority": "reject-oversized,order-priority,schedule-running,admit-greedy,verify-step",
    # Orca (OSDI '22, Algorithm 1): iteration-level batching, whole prompts under the token cap,
    # the whole KV of each request reserved at admission, so it never preempts.
    "orca": "reject-oversized,order-fcfs,schedule-running,orca-admit,verify-step",
    # vLLM 0.32's v1 Scheduler.schedule(): same decisions, step by step (needs the step's mem.pool).
    "vllm": "reject-oversized,order-vllm,vllm-schedule-running,vllm-admit",
}

# Routers: pipelines of the cluster dialect's passes (run on a cluster.route_step).
from schedir.passes.route_presets import ROUTER_PRESETS  # noqa: E402

PRESETS.update(ROUTER_PRESETS)
