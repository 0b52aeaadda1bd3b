"""Routing over a fleet: the cost of a routing step, and routers compared on the Mooncake trace.

    python benchmarks/routing.py                         # both parts
    python benchmarks/routing.py --part cost             # µs per routed request at 8 and 64 instances
    python benchmarks/routing.py --part compare --num-requests 3000   # a prefix of the trace
    python benchmarks/routing.py --part compare --num-requests 4000 --rate 10   # near saturation
    python benchmarks/routing.py --part capacity         # each router's highest rate keeping 90% in SLO

Part 1 (cost) builds a `cluster.route_step` over a synthetic fleet (queues, running
requests, a digest of the instances' cached prefix blocks) and a batch of arrivals with
Mooncake-sized chains (24 blocks of 512 tokens), runs each router preset over it and reports
the median µs per step and per routed request, at 8 and 64 instances and batches of 1, 8
and 32 arrivals (issue 17's target: <= 20 µs per request at 64 instances), four ways, taking
turns in blocks of 10 steps (each way routes 10 steps in a row, as a router process would, and
the machine's slow moments fall on every way alike): a fresh IR per step (`build_route_step`,
freed after, timed with it), one recycled IR skeleton refilled per step (`RecycledRouteStep`),
the passes over the step's arrays (`RouteArrays`, `PassManager.run_view`), and the fleet
simulator's path, the pipeline lowered to one Numba kernel call a step
(`schedir.lowering.route_program.RouteProgram`; the same decisions as the passes, tested). The
step holds a handful of columns whatever the number of requests in flight; per-request work is
numpy/Numba.

Part 2 (compare) replays the Mooncake conversation trace at its own rate through 8
simulated H100s serving Llama-3-8B (the vllm preset on each) behind each router, and prints
goodput (TTFT <= 2 s and mean TBT <= 100 ms per request), prefix-hit rate, TTFT/TBT
percentiles and the load each instance carried. The trace is read from ../shared/data/traces
(not shipped); without it, part 2 is skipped with a message.

Part 3 (capacity, only when asked) measures goodput as DistServe defines it: per router, the
highest arrival rate at which at least 90% of the trace's first 3,000 requests (rescaled to
that rate) finish within both SLOs, by bisection between 2 and 16 req/s. At the trace's own
rate every router keeps most requests within the SLO (part 2), so goodput as requests within
the SLO per second cannot tell them apart there; the rate each can carry can.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import time
from pathlib import Path

import numpy as np
from rich.console import Console

from schedir.ir.fastop import dispose
from schedir.ir.pipeline import PassManager
from schedir.ir.route_arrays import RouteArrays
from schedir.ir.route_step import RecycledRouteStep, build_route_step
from schedir.lowering.route_program import RouteProgram, arrival_matrix, fleet_matrix
from schedir.sim.config import SimConfig
from schedir.sim.fleet import FleetConfig, FleetSimulator
from schedir.sim.fleet_report import fleet_comparison_table, instance_table
from schedir.sim.metrics import summarize
from schedir.sim.workloads import load_trace

TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "mooncake" / "conversation_trace.jsonl"
ROUTERS = ("round-robin", "least-load", "mooncake", "sglang-router")
CHAIN = 24  # prefix blocks per request (12k-token prompts, the trace's mean)
BLOCK = 10  # steps each way routes in a row (as a router process would), the ways taking turns


def synthetic_step(rng: np.random.Generator, m: int, k: int, step: int):
    """Fleet state, k arrivals and their chains, and a digest in which each chain's first
    blocks are cached on a few instances (so the cache-aware rules have something to find)."""
    fleet = {"id": np.arange(m), "role": np.zeros(m, np.int64), "queued": rng.integers(0, 8, m),
             "running": rng.integers(0, 40, m), "free_blocks": rng.integers(0, 20000, m),
             "total_blocks": np.full(m, 20000), "position": np.arange(m) // 8,
             "queued_tokens": rng.integers(0, 60000, m), "digest_blocks": rng.integers(0, 3000, m)}
    ids = np.arange(step * k, (step + 1) * k)
    arrivals = {"id": ids, "prompt": np.full(k, CHAIN * 512 - 100), "output": np.full(k, 350),
                "ttft_slo_ms": np.full(k, 2000), "tbt_slo_ms": np.full(k, 100)}
    sessions = rng.integers(0, 64, k)  # chains share their first blocks within a session
    p_hash = (sessions[:, None] * 1000 + np.arange(CHAIN)[None, :] + 1).ravel()
    p_id = np.repeat(ids, CHAIN)
    held = np.unique(p_hash)
    holders = rng.integers(0, m, held.size)
    cached = (held % 1000) < rng.integers(4, CHAIN, held.size)  # a prefix of each chain
    digest = (holders[cached], held[cached])
    return fleet, arrivals, digest, (p_id, p_hash)


def routing_cost(console: Console, reps: int) -> list[dict]:
    rows = []
    console.print("[bold]routing step cost[/] (median over steps; build + pipeline, no verify; fresh IR per "
                  "step / recycled IR skeleton / passes over arrays / lowered to one kernel, the fleet's path)")
    console.print(f"{'router':16s} {'instances':>9s} {'batch':>5s} {'fresh µs/step':>14s} {'µs/req':>7s} "
                  f"{'recycled µs/step':>17s} {'µs/req':>7s} {'arrays µs/step':>15s} {'µs/req':>7s} "
                  f"{'lowered µs/step':>16s} {'µs/req':>7s}")
    for router in ROUTERS:
        manager = PassManager.parse(router)
        program = RouteProgram.lower(manager)
        for m in (8, 64):
            for k in (1, 8, 32):
                rng = np.random.default_rng(0)
                times, recycled_times, array_times, lowered_times = [], [], [], []
                skeleton = RecycledRouteStep()
                steps = [synthetic_step(rng, m, k, step) for step in range(reps + BLOCK)]

                def fresh(step: int, fleet, arrivals, digest, prefix) -> None:  # noqa: ANN001
                    module = build_route_step(step, step * 1000, fleet, arrivals, digest, prefix)
                    manager.run(module)
                    dispose(module)  # freed after, as the fleet would

                def recycled(step: int, fleet, arrivals, digest, prefix) -> None:  # noqa: ANN001
                    manager.run(skeleton.build(step, step * 1000, fleet, arrivals, digest, prefix))

                def arrays(step: int, fleet, arrivals, digest, prefix) -> None:  # noqa: ANN001
                    manager.run_view(RouteArrays(step, step * 1000, fleet, arrivals, digest, prefix))

                matrices = [(fleet_matrix(s[0]), arrival_matrix(s[1])) for s in steps]

                def lowered(step: int, fleet, arrivals, digest, prefix) -> None:  # noqa: ANN001
                    program.decide(*matrices[step], digest, prefix)  # the fleet's columns as it keeps them

                ways = ((fresh, times), (recycled, recycled_times), (arrays, array_times), (lowered, lowered_times))
                for b, start in enumerate(range(0, reps + BLOCK, BLOCK)):
                    order = ways[b % 4:] + ways[:b % 4]  # each way leads in turn
                    for way, out in order:
                        for step in range(start, start + BLOCK):
                            t0 = time.perf_counter()
                            way(step, *steps[step])
                            if b:  # the first block compiles / loads Numba kernels
                                out.append(time.perf_counter() - t0)
                us = float(np.median(times)) * 1e6
                rus = float(np.median(recycled_times)) * 1e6
                aus = float(np.median(array_times)) * 1e6
                lus = float(np.median(lowered_times)) * 1e6
                rows.append({"router": router, "instances": m, "batch": k, "us_per_step": us,
                             "us_per_request": us / k, "recycled_us_per_step": rus, "recycled_us_per_request": rus / k,
                             "arrays_us_per_step": aus, "arrays_us_per_request": aus / k,
                             "lowered_us_per_step": lus, "lowered_us_per_request": lus / k})
                console.print(f"{router:16s} {m:9d} {k:5d} {us:14.1f} {us / k:7.1f} {rus:17.1f} {rus / k:7.1f} "
                              f"{aus:15.1f} {aus / k:7.1f} {lus:16.1f} {lus / k:7.1f}")
    return rows


def compare(console: Console, args: argparse.Namespace) -> list[dict]:
    if not TRACE.exists():
        console.print(f"[yellow]skipped the router comparison: {TRACE} is absent "
                      "(the Mooncake trace is read from ../shared/data, never shipped)[/]")
        return []
    workload = load_trace(TRACE)
    if args.num_requests:
        workload = workload.head(args.num_requests)
    if args.rate:
        workload = workload.with_rate(args.rate)
    console.print(f"[bold]router comparison[/]: {len(workload)} requests of {TRACE.name} at "
                  f"{'its own rate' if not args.rate else 'a rescaled rate'} "
                  f"({len(workload) / workload.duration_s:.2f} req/s), {args.instances} x H100, Llama-3-8B, "
                  "vllm preset")
    runs = []
    for router in args.routers.split(","):
        sim = FleetSimulator(SimConfig(), FleetConfig(instances=args.instances, router=router))
        t0 = time.perf_counter()
        out = sim.run(workload)
        m = summarize(out.result)
        m["fleet"] = out.fleet
        del m["series"]
        console.print(f"  {router}: goodput {m['goodput_req_s']:.3f} req/s, prefix hit {m['prefix_hit_rate']:.1%}, "
                      f"wall {time.perf_counter() - t0:.0f} s")
        runs.append(m)
    console.print(fleet_comparison_table(runs))
    for m in runs:
        console.print(instance_table(m))
    base = runs[0]["goodput_req_s"]
    for m in runs[1:]:
        console.print(f"{m['config']}: {m['goodput_req_s'] / base:.2f}x {runs[0]['config']}'s goodput")
    return runs


def capacity(console: Console, args: argparse.Namespace) -> list[dict]:
    """Goodput as DistServe defines it: the highest arrival rate at which a router keeps at least
    `--attainment` of the requests within both SLOs (TTFT <= 2 s, mean TBT <= 100 ms; a rejected
    request misses), found by bisection (geometric, `--capacity-steps` halvings between the
    bracket's ends) over the trace's first `--num-requests` requests rescaled to each rate."""
    if not TRACE.exists():
        console.print(f"[yellow]skipped the capacity search: {TRACE} is absent[/]")
        return []
    workload = load_trace(TRACE).head(args.num_requests or 3000)
    lo0, hi0 = args.capacity_range
    console.print(f"[bold]capacity[/] (DistServe's goodput): the highest rate with >= {args.attainment:.0%} of "
                  f"{len(workload)} requests of {TRACE.name} within the SLOs, {args.instances} x H100, Llama-3-8B, "
                  f"vllm preset; rates searched in [{lo0:g}, {hi0:g}] req/s")
    rows = []
    for router in args.routers.split(","):
        tried: dict[float, float] = {}

        def attainment(rate: float, router: str = router, tried: dict[float, float] = tried) -> float:
            sim = FleetSimulator(SimConfig(), FleetConfig(instances=args.instances, router=router))
            tried[rate] = summarize(sim.run(workload.with_rate(rate)).result)["slo_attainment"]
            return tried[rate]

        lo, hi = lo0, hi0
        if attainment(lo) < args.attainment:
            best = None  # even the bracket's low end misses
        elif attainment(hi) >= args.attainment:
            best = hi  # (at least) the high end
        else:
            for _ in range(args.capacity_steps):
                mid = float(np.sqrt(lo * hi))
                if attainment(mid) >= args.attainment:
                    lo = mid
                else:
                    hi = mid
            best = lo
        row = {"router": router, "capacity_req_s": best, "attainment_there": tried.get(best) if best else None,
               "next_rate_missed": hi if best not in (None, hi0) else None,
               "tried": dict(sorted(tried.items()))}
        rows.append(row)
        console.print(f"  {router}: {'< ' + format(lo0, 'g') if best is None else format(best, '.2f')} req/s "
                      f"({', '.join(f'{r:.2f}: {a:.1%}' for r, a in sorted(tried.items()))})")
    base = rows[0]["capacity_req_s"] if rows else None
    console.print(f"{'router':16s} {'capacity req/s':>15s} {'x ' + rows[0]['router'] if rows else '':>18s}")
    for row in rows:
        c = row["capacity_req_s"]
        ratio = f"{c / base:.2f}x" if c and base else "-"
        console.print(f"{row['router']:16s} {c if c is None else round(c, 2)!s:>15s} {ratio:>18s}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("cost", "compare", "capacity", "all"), default="all",
                        help="all: cost and compare (capacity runs only when named: ~28 fleet runs)")
    parser.add_argument("--reps", type=int, default=200, help="routing steps timed per configuration")
    parser.add_argument("--num-requests", type=int, help="replay only the trace's first N requests")
    parser.add_argument("--rate", type=float, help="rescale the trace's arrivals to R req/s (default: its own)")
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--attainment", type=float, default=0.9,
                        help="capacity: the share of requests within the SLOs a rate must keep (DistServe: 90%%)")
    parser.add_argument("--capacity-range", type=float, nargs=2, default=(2.0, 16.0), metavar=("LO", "HI"),
                        help="capacity: the rates (req/s) the search starts between")
    parser.add_argument("--capacity-steps", type=int, default=5, help="capacity: bisection steps per router")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    console = Console(width=200)
    out: dict[str, object] = {}
    if args.part in ("cost", "all"):
        out["cost"] = routing_cost(console, args.reps)
    if args.part in ("compare", "all"):
        out["compare"] = compare(console, args)
    if args.part == "capacity":
        out["capacity"] = capacity(console, args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
