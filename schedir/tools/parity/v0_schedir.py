"""schedir's `vllm-v0` preset against vLLM 0.8.5's real v0 scheduler, step by step.

The reference (`v0_driver.py`, run in the v0 environment) replays a trace through v0's
`Scheduler` and records every step; this module replays the same trace through schedir's
runtime with the same engine loop (arrivals at their step, aborts, schedule, the same fake
token for every sampling request, stop at max_tokens, idle stretches skipped) and compares
the records field by field: who was scheduled with how many tokens in which phase, who was
swapped out and in with how many blocks, who was recomputed or ignored, who finished, the
three queues in order, and the free GPU and CPU blocks.

    python -m schedir.tools.parity.v0_schedir              # every scenario in scope, a table
    python -m schedir.tools.parity.v0_schedir --show swap  # the first difference in detail

Scope (docs/vllm-v0-reference.md §7): v0's default path (chunked prefill off, no prefix
caching, FCFS). Scenarios outside it are listed with the reason and not compared.
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import Any

import numpy as np

from schedir.passes.order_v0_priority import deque_order
from schedir.runtime import table as T
from schedir.runtime.config import Request, SchedulerConfig
from schedir.runtime.scheduler import Scheduler
from schedir.tools.parity import v0_reference, v0_trace

COMPARED = ("kind", "scheduled", "swapped_out", "swapped_in", "recomputed", "ignored", "finished", "waiting",
            "running", "swapped", "free_gpu_blocks", "free_cpu_blocks")


def out_of_scope(cfg: dict[str, Any]) -> str | None:
    """Why the `vllm-v0` preset does not reproduce a reference config (None: it does)."""
    if cfg["enable_prefix_caching"] and cfg["enable_chunked_prefill"]:
        return "v0's prefix caching is reproduced with chunked prefill off only"
    if cfg["enable_prefix_caching"] and cfg["preemption_mode"] == "swap":
        return "v0's swap of prefix-cached blocks (its CPU prefix-caching allocator) is not reproduced"
    if cfg["enable_prefix_caching"] and cfg["policy"] == "priority":
        return "v0's prefix caching is reproduced under the fcfs policy only"
    if cfg["policy"] == "priority" and cfg["enable_chunked_prefill"]:
        return "v0's chunked-prefill path with the priority policy is not reproduced (0.8.5 never sorts there)"
    if cfg["policy"] == "priority" and cfg["preemption_mode"] == "swap":
        return ("v0 0.8.5 swaps a priority victim out but queues it as waiting and drops its blocks_to_swap_out "
                "(its next prefill pass fails); vllm-v0-priority preempts by recompute only")
    return None


def pipeline_for(cfg: dict[str, Any]) -> str:
    """The `vllm-v0` pipeline with a reference config's preemption mode and delay factor."""
    mode = {None: "auto", "swap": "swap", "recompute": "recompute"}[cfg["preemption_mode"]]
    delay = float(cfg["delay_factor"])
    if cfg["enable_chunked_prefill"]:
        p = cfg["max_num_partial_prefills"]
        return (f"order-vllm,v0-chunked-running{{preemption={mode} partial={p}}},v0-swapped,"
                f"v0-chunked-prefills{{delay-factor={delay} partial={p}}}")
    if cfg["policy"] == "priority":
        return (f"order-v0-priority,v0-prefills{{delay-factor={delay}}},v0-priority-preemption{{preemption={mode}}},"
                f"v0-running{{preemption={mode}}},v0-swapped")
    return f"order-vllm,v0-prefills{{delay-factor={delay}}},v0-running{{preemption={mode}}},v0-swapped"


def scheduler_config(cfg: dict[str, Any], pipeline: str | None = None) -> SchedulerConfig:
    """schedir's config for a reference config (v0's GPU allocator has no null block: one more
    here), running `pipeline` (None: `pipeline_for(cfg)`)."""
    return SchedulerConfig(num_blocks=cfg["num_gpu_blocks"] + 1, block_size=cfg["block_size"],
                           max_num_batched_tokens=cfg["max_num_batched_tokens"], max_num_seqs=cfg["max_num_seqs"],
                           max_model_len=cfg["max_model_len"], enable_prefix_caching=cfg["enable_prefix_caching"],
                           pipeline=pipeline or pipeline_for(cfg), num_cpu_blocks=cfg["num_cpu_blocks"],
                           policy=cfg["policy"])


def run_schedir(trace: dict[str, Any], cfg: dict[str, Any], pipeline: str | None = None) -> dict[str, Any]:
    """Replay `trace` through the `vllm-v0` preset (or `pipeline`) with the reference driver's engine loop."""
    c = v0_trace.check_config(cfg)
    reqs = v0_trace.check_trace(trace)
    now = [0.0]
    sched = Scheduler(scheduler_config(c, pipeline), clock=lambda: now[0])
    d = sched.table.data
    names = sched.table.names
    pending = sorted(reqs, key=lambda r: r["arrival_step"])
    aborts = sorted((r["abort_step"], r["rid"]) for r in reqs if r["abort_step"] is not None)
    added: set[str] = set()
    steps: list[dict[str, Any]] = []
    step = i = 0
    empty_run = 0
    error = None
    run_order: list[str] = []  # v0's running deque under the priority policy (`_priority_running_order`)
    while i < len(pending) or sched.has_unfinished_requests():
        while i < len(pending) and pending[i]["arrival_step"] <= step:
            r = pending[i]
            sched.add_request(Request(r["rid"], r["prompt"], max_tokens=r["max_tokens"], ignore_eos=True,
                                      arrival_time=step * c["step_seconds"], priority=r["priority"]))
            added.add(r["rid"])
            i += 1
        due = [rid for at, rid in aborts if at <= step and rid in added]
        aborted = []
        if due:
            aborted = sched.finish_requests(due)
            aborts = [a for a in aborts if a[1] not in set(due)]
        if not sched.has_unfinished_requests():
            if aborted:  # the reference records a step whose aborts emptied the queues
                steps.append({"step": step, "kind": "empty", "scheduled": [], "swapped_out": {}, "swapped_in": {},
                              "recomputed": [], "ignored": [], "finished": [], **_queues(sched, names, None),
                              "free_gpu_blocks": sched.pool.num_free,
                              "free_cpu_blocks": sched.pool.host.num_free if sched.pool.host is not None else 0})
            if i >= len(pending):
                break
            step = pending[i]["arrival_step"]
            continue
        now[0] = step * c["step_seconds"]
        status_before = {r: int(d[T.STATUS, r]) for r in np.concatenate([sched.running, sched.waiting,
                                                                          sched.swapped]).tolist()}
        end = sched.table.state_index.get("v0_prefill_end")
        in_prefill = {r for r in status_before
                      if end is not None and d[T.COMPUTED, r] < sched.table.state[end, r]}
        out = sched.schedule()
        rec = _record(sched, out, status_before, in_prefill, step, sort=c["enable_chunked_prefill"])
        tokens = np.where(out.sampled, [v0_trace.fake_token(int(d[T.TOTAL, r])) for r in out.rows.tolist()], -1)
        rec["finished"] = sorted(sched.update(out, np.asarray(tokens, dtype=np.int64)))
        if c["policy"] == "priority":  # v0 sorts its running deque in every step without prefills
            run_order = _priority_running_order(sched, names, run_order, sort=rec["kind"] != "prefill")
        rec.update(_queues(sched, names, run_order if c["policy"] == "priority" else None))
        rec["free_gpu_blocks"] = sched.pool.num_free
        rec["free_cpu_blocks"] = sched.pool.host.num_free if sched.pool.host is not None else 0
        steps.append(rec)
        empty_run = 0 if rec["scheduled"] else empty_run + 1
        if empty_run >= 1000 or step >= c["max_steps"]:
            error = "stalled" if empty_run >= 1000 else "max_steps reached"
            break
        step += 1
    sched.pool.check()
    return {"steps": steps, "error": error}


def _record(sched: Scheduler, out: Any, status_before: dict[int, int], in_prefill: set[int], step: int,
            sort: bool) -> dict[str, Any]:
    rows = out.rows.tolist()
    came = [status_before.get(r, T.WAITING) for r in rows]
    phases = ["prefill" if s in (T.WAITING, T.PREEMPTED) or r in in_prefill else "decode"
              for r, s in zip(rows, came, strict=True)]
    # a prefill's prefix hit: v0 counts it in the chunk it schedules (token_chunk_size) and charges
    # it as cached; schedir's request starts past it (its computed tokens before the step)
    hits = [int(c) if s in (T.WAITING, T.PREEMPTED) else 0 for c, s in zip(out.computed.tolist(), came, strict=True)]
    scheduled = [{"rid": n, "tokens": int(t) + h, "phase": p, "cached": h}
                 for n, t, p, h in zip(out.req_ids, out.num_tokens.tolist(), phases, hits, strict=True)]
    if sort:  # v0 lists a chunked batch's prefills first; schedir's batch is in pass order
        scheduled.sort(key=lambda e: e["rid"])
    kinds = set(phases)
    kind = "empty" if not kinds else ("mixed" if len(kinds) == 2 else kinds.pop())
    names = sched.table.names
    moved_in = {names[r]: int(b) for r, b, s in zip(rows, out.nblk_after.tolist(), came, strict=True)
                if s == T.SWAPPED}
    out_blocks: dict[str, int] = {}
    if out.swapped_out_req_ids:  # their blocks now sit on the host tier
        host = sched.pool.host
        out_blocks = {n: int(host.hnblk[sched.table.row_of[n]]) for n in out.swapped_out_req_ids}
    recomputed = sorted(out.preempted_req_ids)
    # a swapped-in request needs one more block when its last one was full: count the copies only
    for n in list(moved_in):
        moved_in[n] = int(np.count_nonzero(np.isin(out.blocks_to_swap_in[:, 1],
                                                   out.block_table[out.req_ids.index(n)])))
    return {"step": step, "kind": kind, "scheduled": scheduled, "swapped_out": out_blocks, "swapped_in": moved_in,
            "recomputed": recomputed, "ignored": sorted(out.rejected)}


def _priority_running_order(sched: Scheduler, names: np.ndarray, before: list[str], sort: bool) -> list[str]:
    """v0's running deque after a step under the priority policy, from the one before it: those
    still running, sorted by (priority, arrival) when the step scheduled no prefill
    (`_schedule_priority_preemption` keeps its sorted `running_queue`), then those that joined
    (admitted, or swapped in) in the runtime's order. The batch itself is compared as scheduled:
    this only lists the queue as v0 does, since schedir's running array keeps join order."""
    d = sched.table.data
    row_of = sched.table.row_of
    running = {names[r] for r in sched.running.tolist()}
    kept = [n for n in before if n in running]
    if sort:
        kept.sort(key=lambda n: (int(d[T.PRIORITY, row_of[n]]), int(d[T.ARRIVAL, row_of[n]])))
    held = set(kept)
    return kept + [names[r] for r in sched.running.tolist() if names[r] not in held]


def queues(sched: Scheduler) -> dict[str, list[str]]:
    """A v0 preset's three queues as v0 lists them (its deque order under the priority policy;
    the running queue in the runtime's order)."""
    return _queues(sched, sched.table.names, None)


def _queues(sched: Scheduler, names: np.ndarray, running_order: list[str] | None) -> dict[str, list[str]]:
    d = sched.table.data
    waiting = sched.waiting[np.argsort(d[T.QUEUED, sched.waiting], kind="stable")]
    if sched.config.policy == "priority":  # the deque order-v0-priority sorts the step's waiting queue into
        w, state, at = sched.waiting, sched.scheduler_state, sched.table.state_index
        sorted_at = sched.table.state[at["v0_sorted_at"], w]
        waiting = w[deque_order(d[T.QUEUED, w], d[T.PRIORITY, w], d[T.ARRIVAL, w], sorted_at,
                                state["v0_sort_step"], state["v0_sort_lo"], state["v0_sort_hi"])]
    if running_order is not None:
        return {"waiting": [names[r] for r in waiting.tolist()], "running": running_order,
                "swapped": [names[r] for r in sched.swapped.tolist()]}
    running = sched.running
    pos = sched.table.state_index.get("v0_run_pos")
    if pos is not None and "v0-chunked-running" in sched.spec:  # the order v0-chunked-running sorts it into
        running = running[np.argsort(sched.table.state[pos, running], kind="stable")]
    return {"waiting": [names[r] for r in waiting.tolist()], "running": [names[r] for r in running.tolist()],
            "swapped": [names[r] for r in sched.swapped.tolist()]}


def normalise_reference(rec: dict[str, Any], sort: bool = False) -> dict[str, Any]:
    """A reference step in the comparable shape (sorted sets, scheduled entries without extras;
    with `sort`, the batch by request id: v0 lists a chunked batch's prefills first)."""
    scheduled = [{"rid": s["rid"], "tokens": s["tokens"], "phase": s["phase"], "cached": s.get("cached", 0)}
                 for s in rec["scheduled"]]
    if sort:
        scheduled.sort(key=lambda e: e["rid"])
    return {"step": rec["step"], "kind": rec["kind"], "scheduled": scheduled,
            "swapped_out": dict(rec["swapped_out"]), "swapped_in": dict(rec["swapped_in"]),
            "recomputed": sorted(rec["recomputed"]), "ignored": sorted(rec["ignored"]),
            "finished": sorted(rec["finished"]), "waiting": rec["waiting"], "running": rec["running"],
            "swapped": rec["swapped"], "free_gpu_blocks": rec["free_gpu_blocks"],
            "free_cpu_blocks": rec["free_cpu_blocks"]}


def compare(reference: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """Differences, one line each, up to the reference's error step (v0 raised there: no decision)."""
    ref_steps = [s for s in reference["steps"] if "error" not in s]
    ref_steps = [s for s in ref_steps if s.get("scheduled") is not None and "kind" in s]
    mine = {s["step"]: s for s in ours["steps"]}
    diffs: list[str] = []
    for rs in ref_steps:
        r = normalise_reference(rs, sort=bool(reference["config"]["enable_chunked_prefill"]))
        m = mine.get(r["step"])
        if m is None:
            diffs.append(f"step {r['step']}: schedir ran no such step")
            continue
        for f in COMPARED:
            if r[f] != m[f]:
                diffs.append(f"step {r['step']}: {f}: v0 {r[f]!s} / schedir {m[f]!s}")
    ref_error = next((s["error"] for s in reference["steps"] if "error" in s), None)
    if ref_error is None:
        extra = sorted(set(mine) - {s["step"] for s in ref_steps})
        if extra:
            diffs.append(f"schedir ran steps the reference did not: {extra[:5]}")
    return diffs


def random_scenario(seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A random trace and config in the presets' scope (chunked prefill on or off, swap, recompute
    or v0's choice, CPU pools from none to ample, pools from tight to ample, the delay rule,
    partial prefills, aborts while waiting, running or swapped). Every request fits the GPU pool
    alone; a CPU pool too small for a swap makes v0 raise, which the comparison stops at."""
    rng = random.Random(seed)
    bs = rng.choice((4, 8, 16))
    chunked = rng.random() < 0.5
    mml = rng.choice((256, 512, 1024))
    budget = rng.choice((64, 128, 256, 512)) if chunked else rng.choice((mml, 2 * mml))
    prompt_hi = rng.choice((64, 200, 600))
    out_hi = rng.choice((16, 64, 160))
    need = -(-min(prompt_hi + out_hi + 1, mml + 1) // bs)  # the longest request's blocks
    gpu = rng.randint(need + 2, need * rng.choice((2, 4, 8)) + 4)
    cfg = {"block_size": bs, "num_gpu_blocks": gpu, "num_cpu_blocks": rng.choice((0, gpu // 4, gpu, 4 * gpu)),
           "max_num_batched_tokens": budget, "max_num_seqs": rng.choice((2, 4, 8, 32)), "max_model_len": mml,
           "enable_chunked_prefill": chunked, "preemption_mode": rng.choice((None, "swap", "swap", "recompute")),
           "delay_factor": rng.choice((0.0, 0.0, 0.5, 2.0)),
           "max_num_partial_prefills": rng.choice((1, 1, 2, 3)) if chunked else 1}
    trace = v0_trace.make_trace(num_requests=rng.randint(4, 40), seed=seed, prompt_len=(1, prompt_hi),
                                output_len=(1, out_hi), arrival_rate=rng.choice((0.3, 1.0, 4.0)))
    for r in trace["requests"]:
        if rng.random() < 0.1:
            r["abort_step"] = r["arrival_step"] + rng.randint(0, 40)
    return trace, cfg


def random_priority_scenario(seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A random trace and config under the priority policy, in the `vllm-v0-priority` preset's
    scope (chunked prefill off, recompute or v0's choice): one to four priority levels, pools
    from tight to ample, the delay rule, swapped requests never (recompute only), aborts."""
    rng = random.Random(seed)
    bs = rng.choice((4, 8, 16))
    mml = rng.choice((256, 512, 1024))
    prompt_hi = rng.choice((64, 200, 600))
    out_hi = rng.choice((16, 64, 160))
    need = -(-min(prompt_hi + out_hi + 1, mml + 1) // bs)
    gpu = rng.randint(need + 2, need * rng.choice((2, 3, 6)) + 4)
    cfg = {"block_size": bs, "num_gpu_blocks": gpu, "num_cpu_blocks": 0,
           "max_num_batched_tokens": rng.choice((mml, 2 * mml)), "max_num_seqs": rng.choice((2, 4, 8, 32)),
           "max_model_len": mml, "enable_chunked_prefill": False, "preemption_mode": rng.choice((None, "recompute")),
           "delay_factor": rng.choice((0.0, 0.0, 0.5)), "max_num_partial_prefills": 1, "policy": "priority"}
    trace = v0_trace.make_trace(num_requests=rng.randint(4, 40), seed=seed, prompt_len=(1, prompt_hi),
                                output_len=(1, out_hi), arrival_rate=rng.choice((0.3, 1.0, 4.0)),
                                priorities=rng.choice((1, 2, 4)))
    for r in trace["requests"]:
        if rng.random() < 0.1:
            r["abort_step"] = r["arrival_step"] + rng.randint(0, 40)
    return trace, cfg


def random_prefix_scenario(seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A random trace and config with v0's prefix caching on, in the `vllm-v0` preset's scope
    (chunked prefill off, recompute or v0's choice, FCFS): prompts on one to four shared
    prefixes, some repeated whole (their outputs are the same tokens too, so full decode blocks
    meet cached twins), pools from tight (cached blocks evicted all the time) to ample, the
    delay rule, aborts."""
    rng = random.Random(seed)
    bs = rng.choice((4, 8, 16))
    mml = rng.choice((256, 512))
    prompt_hi = rng.choice((32, 128, 300))
    out_hi = rng.choice((8, 40, 120))
    prefix_hi = rng.choice((bs, 4 * bs, 12 * bs))
    need = -(-min(prefix_hi + prompt_hi + out_hi + 1, mml + 1) // bs)
    gpu = rng.randint(need + 2, need * rng.choice((2, 3, 6)) + 4)
    cfg = {"block_size": bs, "num_gpu_blocks": gpu, "num_cpu_blocks": 0,
           "max_num_batched_tokens": rng.choice((mml, 2 * mml)), "max_num_seqs": rng.choice((2, 4, 8, 32)),
           "max_model_len": mml, "enable_chunked_prefill": False, "enable_prefix_caching": True,
           "preemption_mode": rng.choice((None, "recompute")), "delay_factor": rng.choice((0.0, 0.0, 0.5)),
           "max_num_partial_prefills": 1}
    trace = v0_trace.make_trace(num_requests=rng.randint(4, 40), seed=seed, prompt_len=(1, prompt_hi),
                                output_len=(1, out_hi), arrival_rate=rng.choice((0.3, 1.0, 4.0)),
                                num_prefixes=rng.choice((1, 2, 4)), prefix_len=(1, prefix_hi),
                                share_prob=rng.choice((0.5, 0.9)))
    reqs = trace["requests"]
    for i, r in enumerate(reqs):
        if i and rng.random() < 0.15:  # a repeat of an earlier prompt, whole
            r["prompt"] = list(reqs[rng.randrange(i)]["prompt"])
        if rng.random() < 0.1:
            r["abort_step"] = r["arrival_step"] + rng.randint(0, 40)
    return trace, cfg


def v0_livelock(reference: dict[str, Any], ours: dict[str, Any]) -> int | None:
    """The step where v0 livelocked and schedir, by design, did not: v0's run hit its step limit,
    and from the first differing step on v0 preempted its only running request (which schedir
    keeps running; see v0_kernels.v0_running). None when the differences are anything else."""
    if reference["summary"].get("error") not in ("max_steps reached",):
        return None
    mine = {s["step"]: s for s in ours["steps"]}
    for rs in reference["steps"]:
        m = mine.get(rs["step"])
        if m is None or "kind" not in rs:
            return None
        r = normalise_reference(rs, sort=bool(reference["config"]["enable_chunked_prefill"]))
        if all(r[f] == m[f] for f in COMPARED):
            continue
        alone = len(rs.get("recomputed", [])) == 1 and not rs["scheduled"] and not rs["running"]
        return rs["step"] if alone and [e["rid"] for e in m["scheduled"]] == rs["recomputed"] else None
    return None


def scenarios_in_scope() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    return {n: tc for n, tc in v0_trace.scenarios().items() if out_of_scope(v0_trace.check_config(tc[1])) is None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Compare schedir's vllm-v0 preset with vLLM 0.8.5's v0 scheduler.")
    ap.add_argument("--show", help="print every difference of this scenario")
    ap.add_argument("--random", type=int, default=0, metavar="N", help="also N random scenarios")
    ap.add_argument("--random-priority", type=int, default=0, metavar="N",
                    help="also N random scenarios under the priority policy")
    ap.add_argument("--random-prefix", type=int, default=0, metavar="N",
                    help="also N random scenarios with v0's prefix caching on")
    ap.add_argument("--seed", type=int, default=0, help="first random seed")
    ap.add_argument("--no-named", action="store_true", help="only the random scenarios")
    args = ap.parse_args(argv)
    reason = v0_reference.unavailable_reason()
    if reason:
        print(f"no v0 reference here: {reason}", file=sys.stderr)
        return 2
    every = {} if args.no_named else v0_trace.scenarios()
    every.update({f"random-{k}": random_scenario(k) for k in range(args.seed, args.seed + args.random)})
    every.update({f"random-priority-{k}": random_priority_scenario(k)
                  for k in range(args.seed, args.seed + args.random_priority)})
    every.update({f"random-prefix-{k}": random_prefix_scenario(k)
                  for k in range(args.seed, args.seed + args.random_prefix)})
    runnable = {n: tc for n, tc in every.items() if out_of_scope(v0_trace.check_config(tc[1])) is None}
    refs = v0_reference.run_reference(runnable)
    total_steps = total_diffs = livelocks = 0
    print(f"{'scenario':20} {'steps':>6} {'differences':>12}  note")
    for name, (trace, cfg) in every.items():
        why = out_of_scope(v0_trace.check_config(cfg))
        if why:
            print(f"{name:20} {'-':>6} {'-':>12}  not compared: {why}")
            continue
        ours = run_schedir(trace, cfg)
        diffs = compare(refs[name], ours)
        err = refs[name]["summary"].get("error")
        total_steps += len(ours["steps"])
        note = f"v0 stops: {err}" if err else ""
        locked = v0_livelock(refs[name], ours) if diffs else None
        if locked is not None:  # the one intended difference: not counted, listed
            livelocks += 1
            note = f"v0 livelocks from step {locked} (preempts its only running request forever); schedir goes on"
            diffs = []
        total_diffs += len(diffs)
        if not name.startswith("random-") or diffs or locked is not None or args.show == name:
            print(f"{name:20} {len(ours['steps']):>6} {len(diffs):>12}  {note}")
        if args.show == name:
            for line in diffs[:40]:
                print("   ", line)
    print(f"{'total':20} {total_steps:>6} {total_diffs:>12}  ({len(every)} scenarios"
          + (f"; {livelocks} where v0 livelocks, not counted" if livelocks else "") + ")")
    by_rule = [[p["by"] == "priority" for s in refs[n]["steps"] for p in s.get("preemptions", [])]
               for n, (_, cfg) in runnable.items() if cfg.get("policy") == "priority"]
    if by_rule:  # what the priority scenarios exercised
        count = sum(map(sum, by_rule))
        print(f"v0 preempted {count} request{'' if count == 1 else 's'} by its priority rule (in "
              f"{sum(any(r) for r in by_rule)} of {len(by_rule)} priority scenarios) and "
              f"{sum(len(r) - sum(r) for r in by_rule)} for want of blocks")
    return 0 if total_diffs == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
