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
    # FastServe (Wu et al. 2023, §4.1, §4.3): skip-join MLFQ, iteration-level preemption of lower
    # levels, starvation promotion; preempted jobs' KV swapped to the host tier (recompute when it is
    # full or absent) and swapped back in their turn.
    "fastserve": "reject-oversized,mlfq-levels,mlfq-order{preemption=swap},schedule-running,mlfq-swap-in,"
                 "admit-greedy,mlfq-account,verify-step",
    # vLLM's step with a deadline-aware order: waiting requests that can still meet their TTFT
    # target first, the hopeless ones behind them (goodput under overload; see order-slo).
    "slo-aware": "reject-oversized,order-slo,vllm-schedule-running,vllm-admit",
    # ... rejecting the hopeless ones at once (reason slo) instead of serving them last.
    "slo-aware-reject": "reject-oversized,order-slo{hopeless=reject},vllm-schedule-running,vllm-admit",
    # Sarathi-Serve (OSDI '24): stall-free batching (decodes, then partial prefills, then new
    # ones, chunked) under a token budget derived from a TBT target; vLLM's mechanics otherwise.
    "sarathi": "reject-oversized,sarathi-budget,order-vllm,order-decodes-first,vllm-schedule-running,vllm-admit",
    # Virtual Token Counter (Sheng et al., OSDI '24): tenants served in order of their weighted
    # service so far; vLLM's mechanics otherwise. Requests carry a tenant (Request.state).
    "vtc": "reject-oversized,vtc-order,vllm-schedule-running,vllm-admit,vtc-account",
    # vLLM 0.32's v1 Scheduler.schedule(): same decisions, step by step (needs the step's mem.pool).
    "vllm": "reject-oversized,order-vllm,vllm-schedule-running,vllm-admit",
    # vLLM v0's scheduler (0.6.3's, checked against 0.8.5's real v0 Scheduler), chunked prefill off:
    # prefill-first steps (whole prompts; none while requests are swapped out), else decodes
    # with preemption from the back, then swapped requests back in. `vllm-v0-swap` preempts by
    # swap to the host tier (SchedulerConfig.num_cpu_blocks), as v0's --preemption-mode swap.
    "vllm-v0": "order-vllm,v0-prefills,v0-running,v0-swapped",
    "vllm-v0-swap": "order-vllm,v0-prefills,v0-running{preemption=swap},v0-swapped",
    # ... under --scheduling-policy priority (config policy "priority"): v0's waiting deque sorted by
    # (priority, arrival) in every step without prefills, and running requests of lower priority
    # than its head preempted by recompute (_schedule_priority_preemption); under FCFS as vllm-v0.
    "vllm-v0-priority": "order-v0-priority,v0-prefills,v0-priority-preemption,v0-running,v0-swapped",
    # ... with chunked prefill (v0's _schedule_chunked_prefill): running requests first (decodes and
    # prefill chunks), then swapped ones, then new prefills in chunks, in one mixed batch.
    "vllm-v0-chunked": "order-vllm,v0-chunked-running,v0-swapped,v0-chunked-prefills",
    # SGLang 0.5.23's scheduler (managers/scheduler.py, schedule_policy.py): SGLang's KV memory (a
    # radix tree over a page pool), the waiting list ordered by the config's policy (fcfs, lpm,
    # dfs-weight, lof, random), PrefillAdder's admission with new_token_ratio, prefill-first steps,
    # decode with retraction. Checked step by step against SGLang's own classes.
    "sglang": "reject-oversized,sglang-order,sglang-admit,sglang-decode",
    # ... with SGLang's mixed chunked prefill (--enable-mixed-chunk): running requests decode in
    # the prefill step when their tokens fit.
    "sglang-mixed": "reject-oversized,sglang-order,sglang-admit{mixed=1},sglang-decode",
    # The seed's base scheduler with its PrefixCacheAware order (longest cached prefix first).
    "with-prefix-aware": "reject-oversized,prefix-cache-aware,schedule-running,admit-greedy,verify-step",
    # All four seed passes: sharers of a cached prefix, then similar lengths, then priority (stable
    # sorts: the last order is the primary key), then room made for urgent prefills by preempting
    # less urgent decodes (schedule-running keeps FCFS victims for its own shortfalls).
    "with-all-passes": "reject-oversized,prefix-cache-aware,batching-efficiency,priority-based,"
                       "memory-aware-preemption,schedule-running,admit-greedy,verify-step",
}

# Routers: pipelines of the cluster dialect's passes (run on a cluster.route_step).
from schedir.passes.route_presets import ROUTER_PRESETS  # noqa: E402

PRESETS.update(ROUTER_PRESETS)
