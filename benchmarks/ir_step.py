"""How long one scheduling step costs in the IR: build, each pass, verify, print.

Builds a step with N running (decoding) requests and a burst of waiting prompts
(some with prefix-cache hits), then runs the `base` pipeline over it. Prints the
median µs of each part, and build + pipeline without verification (the
production path) against the 100 µs target.

    python benchmarks/ir_step.py [--reps 300] [--sizes 32,256,1024] [--waiting 32]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections import defaultdict

import numpy as np

from schedir.dialects.sched import StepFacts
from schedir.ir.builder import build_step
from schedir.ir.pipeline import PassManager, parse_passes
from schedir.ir.textio import print_ir
from schedir.passes.presets import PRESETS

TARGET_US = 100.0


def queue_columns(ids: np.ndarray, running: bool, rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = ids.size
    prompt = rng.integers(16, 2048, n, dtype=np.int64)
    generated = rng.integers(1, 256, n, dtype=np.int64) if running else np.zeros(n, dtype=np.int64)
    total = prompt + generated
    computed = total - 1 if running else np.zeros(n, dtype=np.int64)
    return {
        "id": ids,
        "prompt": prompt,
        "computed": computed,
        "total": total,
        "max_tokens": np.full(n, 512, dtype=np.int64),
        "priority": rng.integers(0, 4, n, dtype=np.int64),
        "arrival": np.sort(rng.integers(0, 10**9, n, dtype=np.int64)),
        "status": np.full(n, 1 if running else 0, dtype=np.int64),
        "blocks": (computed + 15) // 16,
    }


def workload(n_running: int, n_waiting: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    running = queue_columns(np.arange(n_running, dtype=np.int64), True, rng)
    waiting = queue_columns(np.arange(n_running, n_running + n_waiting, dtype=np.int64), False, rng)
    hit = (rng.integers(0, 2, n_waiting) * rng.integers(0, waiting["prompt"] // 16 + 1)) * 16
    hits = {"id": waiting["id"], "hit": hit.astype(np.int64), "cached_free": (hit // 16 // 2).astype(np.int64)}
    used = int(running["blocks"].sum())
    facts = StepFacts(
        step=1, token_budget=8192, max_seqs=n_running + 64, block_size=16,
        free_blocks=max(used, 4096), cached_free_blocks=int(hits["cached_free"].sum()),
        total_blocks=used + max(used, 4096), max_model_len=32768, facts=("prefix-hits",),
    )
    return facts, {"running": running, "waiting": waiting}, {"waiting": hits}


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def run(size: int, n_waiting: int, reps: int) -> dict[str, float]:
    facts, queues, hits = workload(size, n_waiting)
    production = PassManager(parse_passes(PRESETS["base"].replace(",verify-step", "")))
    checker = PassManager(parse_passes("verify-step"))
    samples: dict[str, list[float]] = defaultdict(list)
    clock = time.perf_counter
    # The production path alone, as an engine's step loop runs it.
    for rep in range(reps + 20):
        t0 = clock()
        module = build_step(facts, queues, hits)
        t1 = clock()
        production.run(module)
        t2 = clock()
        if rep < 20:  # warm-up: JIT caches, attribute caches
            continue
        samples["build"].append(t1 - t0)
        for timing in production.timings:
            samples[timing.name].append(timing.seconds)
        samples["pipeline (no verify)"].append(t2 - t1)
        samples["build + pipeline"].append(t2 - t0)
    # The debug-mode extras, measured on the finished step.
    for rep in range(max(reps // 4, 10)):
        module = build_step(facts, queues, hits)
        production.run(module)
        t2 = clock()
        checker.run(module)
        t3 = clock()
        module.verify()
        t4 = clock()
        print_ir(module)
        t5 = clock()
        samples["verify-step pass"].append(t3 - t2)
        samples["module.verify()"].append(t4 - t3)
        samples["print"].append(t5 - t4)
    return {name: median_us(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--sizes", default="32,256,1024")
    parser.add_argument("--waiting", type=int, default=32)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    gc.collect()
    results = {size: run(size, args.waiting, args.reps) for size in sizes}
    names = list(next(iter(results.values())))
    print(f"median µs per step, base pipeline, {args.waiting} waiting, {args.reps} reps")
    print(f"{'part':28s}" + "".join(f"{'N=' + str(s):>12s}" for s in sizes))
    for name in names:
        print(f"{name:28s}" + "".join(f"{results[s][name]:12.1f}" for s in sizes))
    print(f"{'target (build + pipeline)':28s}" + "".join(f"{TARGET_US:12.1f}" for _ in sizes))
    print(f"{'ratio to target':28s}" + "".join(f"{results[s]['build + pipeline'] / TARGET_US:12.2f}" for s in sizes))


if __name__ == "__main__":
    main()
