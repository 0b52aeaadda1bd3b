"""schedir's `sglang` preset on a reference trace, recorded as SGLang's reference driver records.

The same trace (`sglang_trace`: arrival steps, prompts, the fake model's tokens) and config
run through `Scheduler(pipeline="sglang")`; each engine step yields a record with the fields of
`sglang_driver.Reference.step` (docs/sglang-reference.md §4), so `compare` can put the two side
by side step by step: mode, queue order with prefix hits, admitted requests (extend, prefix,
continued), the chunked request, decodes, retractions, finishes, `new_token_ratio`, the queues
and the radix cache / pool sizes in tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schedir.dialects.mem import MatchOp
from schedir.ir.step import steps_of
from schedir.runtime.config import Request, SchedulerConfig
from schedir.runtime.scheduler import Scheduler
from schedir.tools.parity.sglang_trace import EOS_TOKEN_ID, check_config, check_trace, fake_token

COMPARED = ("mode", "queue_order", "admitted", "chunked", "decode", "retracted", "finished", "new_token_ratio",
            "waiting", "cache_tokens", "evictable", "protected", "free_tokens")
"""Record fields `compare` checks (`running` is left out: SGLang shows a prefill batch in it only
from the next step, schedir at once)."""


def pipeline_for(cfg: dict[str, Any]) -> str:
    """The `sglang` preset's passes with the config's knobs as pass options."""
    chunk = cfg["chunked_prefill_size"] if cfg["chunked_prefill_size"] and cfg["chunked_prefill_size"] > 0 else 0
    init = float(cfg["init_new_token_ratio"])
    return (f"reject-oversized,sglang-order{{seed={cfg['random_seed']}}},"
            f"sglang-admit{{chunk={chunk} clip={cfg['clip_max_new_tokens']} init-ratio={init!r} "
            f"mixed={int(cfg['enable_mixed_chunk'])}}},"
            f"sglang-decode{{init-ratio={init!r} min-factor={float(cfg['min_new_token_ratio_factor'])!r} "
            f"decay-steps={cfg['new_token_ratio_decay_steps']} retract-steps={cfg['retract_decode_steps']}}}")


def scheduler_for(cfg: dict[str, Any]) -> Scheduler:
    page = cfg["page_size"]
    return Scheduler(SchedulerConfig(
        num_blocks=cfg["num_kv_tokens"] // page + 1, block_size=page, max_num_seqs=cfg["max_running_requests"],
        max_num_batched_tokens=cfg["max_prefill_tokens"], max_model_len=cfg["max_context_len"],
        pipeline=pipeline_for(cfg), policy=cfg["policy"],
    ))


def run(cfg: dict[str, Any], trace: dict[str, Any]) -> dict[str, Any]:
    """Run `trace` to completion (or `max_steps`) through the `sglang` preset; SGLang-shaped records."""
    cfg = check_config(cfg)
    reqs = check_trace(trace, cfg)
    sched = scheduler_for(cfg)
    sched.keep_ir = True
    ordinal = {r["rid"]: i for i, r in enumerate(reqs)}
    spec = {r["rid"]: r for r in reqs}
    outputs: dict[str, int] = {r["rid"]: 0 for r in reqs}
    init = float(cfg["init_new_token_ratio"])
    finished: list[str] = []
    steps: list[dict[str, Any]] = []
    step_no = 0

    def ratio() -> float:
        value = float(sched.scheduler_state.get("new_token_ratio", -1.0))
        return init if value < 0 else value

    while len(finished) < len(reqs) and step_no < cfg["max_steps"]:
        for r in reqs:
            if r["arrival_step"] == step_no:
                sched.add_request(Request(request_id=r["rid"], prompt_token_ids=r["prompt"],
                                          max_tokens=r["max_new_tokens"], eos_token_id=EOS_TOKEN_ID))
        ratio_used = ratio()
        chunked_before = _chunked(sched)
        waiting_before = [sched.table.names[r] for r in sched.waiting.tolist()]
        out = sched.schedule()
        rec: dict[str, Any] = {"step": step_no, "mode": "idle", "queue_order": [], "admitted": [], "decode": [],
                               "retracted": [], "finished": [], "ratio_used": ratio_used}
        pool = sched.pool
        names = out.names.tolist()
        if pool.extend_rows.size:
            rec["mode"] = "extend"
            extend = set(pool.extend_rows.tolist())
            rows = out.rows.tolist()
            rec["admitted"] = [{"rid": n, "extend": int(t), "prefix": int(c), "continued": n == chunked_before}
                               for n, t, c, r in zip(names, out.num_tokens.tolist(), out.computed.tolist(), rows,
                                                     strict=True) if r in extend]
            rec["decode"] = [n for n, r in zip(names, rows, strict=True) if r not in extend]  # a mixed step's
        elif names:
            rec["mode"] = "decode"
            rec["decode"] = names
        rec["queue_order"] = _queue_order(sched, waiting_before)
        rec["retracted"] = _in_order(out.preempted_req_ids, sched)
        toks = np.array([fake_token(ordinal[n], outputs[n], spec[n]["output_len"], spec[n]["max_new_tokens"])
                         if s else -1 for n, s in zip(names, out.sampled.tolist(), strict=True)], dtype=np.int64)
        done = sched.update(out, toks)
        for n, s in zip(names, out.sampled.tolist(), strict=True):
            outputs[n] += int(s)
        rec["finished"] = [n for n in names if n in set(done)]
        finished.extend(rec["finished"])
        rec.update(_snapshot(sched, ratio()))
        steps.append(rec)
        step_no += 1
    summary = {
        "steps": len(steps), "finished": len(finished), "requests": len(reqs),
        "retractions": sum(len(s["retracted"]) for s in steps),
        "extend_steps": sum(s["mode"] == "extend" for s in steps),
        "decode_steps": sum(s["mode"] == "decode" for s in steps),
        "prefix_hit_tokens": sum(a["prefix"] for s in steps for a in s["admitted"]),
        "final_free_tokens": sched.pool.available, "final_evictable": sched.pool.evictable,
        "final_protected": sched.pool.protected_size,
    }
    return {"config": cfg, "steps": steps, "summary": summary}


def _chunked(sched: Scheduler) -> str | None:
    row = int(sched.scheduler_state.get("sglang_chunked", -1.0))
    return str(sched.table.names[row]) if row >= 0 else None


def _queue_order(sched: Scheduler, waiting_before: list[str]) -> list[list[Any]]:
    """The waiting list as the order pass left it, with the hits its matches found (0 when it
    did not match: cache-agnostic policies); empty when admission did not look at it."""
    module = sched.last_module
    if module is None or not waiting_before:
        return []
    block = steps_of(module)[0].body.block
    hits: dict[str, int] = {}
    for op in block.ops:  # the order pass matches (cache-aware policies) before it sorts
        if op.name == "req.sort":
            break
        if isinstance(op, MatchOp):
            for r, h in zip(op.ids.tolist(), op.col("hit").tolist(), strict=True):  # type: ignore[attr-defined]
                hits[sched.table.names[r]] = int(h)
    else:
        return []  # admission was skipped: SGLang did not order the queue
    pos = {n: sched.request_state(n)["sglang_pos"] for n in waiting_before if n in sched.table.row_of}
    ordered = sorted(pos, key=lambda n: pos[n])
    return [[n, hits.get(n, 0)] for n in ordered]


def _in_order(names: frozenset[str], sched: Scheduler) -> list[str]:
    """Retracted requests in retraction order (their places in the waiting list)."""
    return sorted(names, key=lambda n: sched.request_state(n)["sglang_pos"]) if names else []


def _snapshot(sched: Scheduler, ratio: float) -> dict[str, Any]:
    pool = sched.pool
    table = sched.table
    wait = sched.waiting.tolist()
    pos = [int(table.state[table.state_index["sglang_pos"], r]) for r in wait]
    order = sorted(range(len(wait)), key=lambda i: (pos[i] < 0, pos[i] if pos[i] >= 0 else i))
    return {
        "new_token_ratio": ratio,
        "chunked": _chunked(sched),
        "waiting": [table.names[wait[i]] for i in order],
        "running": [table.names[r] for r in sched.running.tolist()],
        "cache_tokens": pool.cache_tokens, "evictable": pool.evictable, "protected": pool.protected_size,
        "free_tokens": pool.available,
    }


def compare(reference: dict[str, Any], ours: dict[str, Any], fields: tuple[str, ...] = COMPARED) -> list[str]:
    """Differences, step by step, as one line each ("step 12 admitted: ..."); empty when equal."""
    diffs: list[str] = []
    a, b = reference["steps"], ours["steps"]
    cache_aware = reference["config"]["policy"] in ("lpm", "dfs-weight")
    if len(a) != len(b):
        diffs.append(f"steps: SGLang ran {len(a)}, schedir {len(b)}")
    for ra, rb in zip(a, b):
        for f in fields:
            va, vb = ra.get(f), rb.get(f)
            if f == "new_token_ratio" and va is not None and vb is not None:
                if abs(float(va) - float(vb)) > 1e-9:
                    diffs.append(f"step {ra['step']} {f}: SGLang {va!r}, schedir {vb!r}")
            elif f == "queue_order" and (not cache_aware or len(va) > 128):
                # SGLang's record reads `num_matched_prefix_tokens`, left over from an earlier match
                # when the policy does not match (cache-agnostic, or LPM above 128): compare the order
                if [x[0] for x in va] != [x[0] for x in vb]:
                    diffs.append(f"step {ra['step']} {f}: SGLang {[x[0] for x in va]}, schedir {[x[0] for x in vb]}")
            elif f == "admitted":
                norm = [[x["rid"], x["extend"], x["prefix"], x["continued"]] for x in va]
                mine = [[x["rid"], x["extend"], x["prefix"], x["continued"]] for x in vb]
                if norm != mine:
                    diffs.append(f"step {ra['step']} {f}: SGLang {norm}, schedir {mine}")
            elif va != vb:
                diffs.append(f"step {ra['step']} {f}: SGLang {va!r}, schedir {vb!r}")
    return diffs


def random_scenarios(count: int, seed: int = 0) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """`count` seeded random scenarios for differential runs: policy, page size, pool from tight
    (retractions, evictions) to ample, chunk size, request slots, shared prefixes, early stops."""
    import random

    from schedir.tools.parity.sglang_trace import make_trace

    out: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for i in range(count):
        rng = random.Random(seed + i)  # each scenario from its own seed: `--random 1 --seed K` replays random-K
        page = rng.choice([1, 1, 1, 4, 16])
        cfg: dict[str, Any] = {
            "policy": rng.choice(["lpm", "lpm", "fcfs", "dfs-weight", "lof", "random"]),
            "page_size": page,
            "num_kv_tokens": rng.choice([600, 1000, 2000, 4096, 16384]) // page * page,
            "max_running_requests": rng.choice([4, 8, 32, 64]),
            "chunked_prefill_size": rng.choice([None, 64, 128, 256, 512]),
            "max_prefill_tokens": rng.choice([256, 512, 1024, 4096]),
            "init_new_token_ratio": rng.choice([0.2, 0.5, 0.7]),
            "new_token_ratio_decay_steps": rng.choice([10, 100, 600]),
            "retract_decode_steps": rng.choice([5, 20]),
            "random_seed": rng.randrange(1000),
            "max_steps": 4000,
            "enable_mixed_chunk": rng.random() < 0.3,
        }
        if cfg["chunked_prefill_size"] is not None and cfg["chunked_prefill_size"] < page:
            cfg["chunked_prefill_size"] = page * 4
        trace = make_trace(
            num_requests=rng.randint(8, 40), seed=rng.randrange(1 << 30), num_prefixes=rng.randint(0, 4),
            prefix_len=(16, 200), share_prob=rng.random(), prompt_len=(8, 300), output_len=(2, 120),
            arrival_rate=rng.choice([0.0, 0.5, 2.0, 8.0]), early_stop_prob=rng.choice([0.0, 0.3]),
        )
        # SGLang never admits a request whose prompt and reserved output exceed the whole pool (its
        # server refuses such requests up front; schedir rejects them, see sglang-admit): keep every
        # request admissible, so a difference found is a difference in scheduling
        need = max(len(r["prompt"]) + r["max_new_tokens"] for r in trace["requests"]) + 2 * page
        if cfg["num_kv_tokens"] < need:
            cfg["num_kv_tokens"] = -(-need // page) * page
        out[f"random-{seed + i}"] = (trace, cfg)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run every reference scenario through SGLang's classes and the `sglang` preset; print the tally."""
    import argparse
    import time

    from schedir.tools.parity import sglang_reference
    from schedir.tools.parity.sglang_trace import scenarios

    ap = argparse.ArgumentParser(prog="python -m schedir.tools.parity.sglang_schedir", description=main.__doc__)
    ap.add_argument("--scenarios", default="", help="comma-separated names (default: all of sglang_trace.scenarios)")
    ap.add_argument("--show", type=int, default=5, help="differences to print per scenario")
    ap.add_argument("--random", type=int, default=0, metavar="N",
                    help="instead of the named scenarios, N seeded random ones (differential run)")
    ap.add_argument("--seed", type=int, default=0, help="first seed of --random")
    args = ap.parse_args(argv)
    known = random_scenarios(args.random, args.seed) if args.random else scenarios()
    names = [n for n in args.scenarios.split(",") if n] or list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)}")
        return 2
    why = sglang_reference.unavailable_reason()
    if why is not None:
        print(f"SGLang's reference cannot run here: {why}")
        return 2
    t0 = time.perf_counter()
    refs = sglang_reference.run_reference({n: known[n] for n in names})
    t_ref = time.perf_counter() - t0
    total_steps = total_diffs = 0
    t_ours = 0.0
    print(f"{'scenario':<18} {'steps':>6} {'retracted':>9} {'prefix hits':>11} {'differences':>11}")
    for n in names:
        trace, cfg = known[n]
        t1 = time.perf_counter()
        ours = run(cfg, trace)
        t_ours += time.perf_counter() - t1
        diffs = compare(refs[n], ours)
        total_steps += len(refs[n]["steps"])
        total_diffs += len(diffs)
        s = refs[n]["summary"]
        print(f"{n:<18} {len(refs[n]['steps']):>6} {s['retractions']:>9} {s['prefix_hit_tokens']:>11} {len(diffs):>11}")
        for line in diffs[: args.show]:
            print(f"    {line}")
    print(f"{len(names)} scenarios, {total_steps} steps compared, {total_diffs} differences "
          f"(SGLang {refs[names[0]]['sglang_version']}: {t_ref:.1f} s with its import; schedir: {t_ours:.1f} s)")
    return 1 if total_diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
