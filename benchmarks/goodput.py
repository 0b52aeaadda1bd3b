"""Goodput under overload: every preset beside `vllm` at 1.5x, 2x and 3x the load one H100 sustains.

Goodput is the requests per second that finish within both SLOs (TTFT <= 2 s, mean TBT <=
100 ms; the simulator's defaults), Llama-3-8B on one simulated H100. "The load one H100
sustains" is measured, not assumed: the `vllm` preset's throughput (req/s) when the workload
arrives far faster than it can serve. Each row then replays the same requests at a multiple of
that rate through every preset, and prints goodput, its ratio to `vllm`'s in the same run, SLO
attainment over all requests (rejected ones count as misses), and the worst class's
attainment, classes being the prompt-length terciles (short, medium, long prompts), so a policy
that wins by starving long prompts shows it.

    python benchmarks/goodput.py                       # chat-short, 1500 requests
    python benchmarks/goodput.py --workloads conversation --num-requests 600
    python benchmarks/goodput.py --workloads chat-short --num-requests 600 --loads 2

Simulated figures: the same on any machine (no wall-clock time is reported).
"""

from __future__ import annotations

import argparse
import sys

import attrs
import numpy as np

from schedir.sim.config import SimConfig
from schedir.sim.metrics import met_slo, summarize
from schedir.sim.runspec import parse_configs
from schedir.sim.simulator import Simulator
from schedir.sim.workloads import builtin_workload

PRESETS = "vllm,slo-aware,slo-aware-reject,sarathi,fastserve,orca@max_model_len=8192,base"
SATURATING_RATE = 200.0  # req/s: far past what one H100 serves of either workload
CLASSES = ("short", "medium", "long")


def run(config: SimConfig, workload) -> tuple[dict, np.ndarray, np.ndarray]:
    result = Simulator(config).run(workload)
    return summarize(result), met_slo(result), result.requests.input_len


def worst_class(good: np.ndarray, prompt: np.ndarray) -> tuple[str, float]:
    """The prompt-length tercile with the lowest SLO attainment, and that attainment."""
    edges = np.quantile(prompt, [1 / 3, 2 / 3])
    cls = np.searchsorted(edges, prompt, side="right")
    rates = [(CLASSES[c], float(good[cls == c].mean()) if (cls == c).any() else 1.0) for c in range(3)]
    return min(rates, key=lambda item: item[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="chat-short")
    parser.add_argument("--num-requests", type=int, default=1500)
    parser.add_argument("--loads", default="1.5,2,3", help="multiples of the sustained rate")
    parser.add_argument("--configs", default=PRESETS, help="presets or pass lists as `schedir bench --configs` takes them (first: the peer)")
    args = parser.parse_args(argv)
    base = SimConfig()
    configs = parse_configs(args.configs, base)
    loads = [float(x) for x in args.loads.split(",")]
    print(f"goodput (req/s) meeting TTFT <= {base.ttft_slo_s:g} s and mean TBT <= {base.tbt_slo_s * 1000:g} ms; "
          f"Llama-3-8B, one simulated H100; x = ratio to {configs[0].name} in the same row")
    for name in args.workloads.split(","):
        saturated = builtin_workload(name, num_requests=args.num_requests, rate=SATURATING_RATE, seed=0)
        capacity = run(attrs.evolve(configs[0]), saturated)[0]["throughput_req_s"]
        print(f"\n{name}: {args.num_requests} requests; one H100 sustains {capacity:.2f} req/s "
              f"({configs[0].name}'s throughput at {SATURATING_RATE:g} req/s offered)")
        table: dict[str, list[str]] = {c.name: [] for c in configs}
        for load in loads:
            workload = builtin_workload(name, num_requests=args.num_requests, rate=load * capacity, seed=0)
            peer = None
            for config in configs:
                metrics, good, prompt = run(config, workload)
                goodput = metrics["goodput_req_s"]
                peer = goodput if peer is None else peer
                ratio = goodput / peer if peer else float("nan")
                cls, worst = worst_class(good, prompt)
                table[config.name].append(f"{goodput:6.2f} {ratio:5.2f}x {metrics['slo_attainment']:4.0%} "
                                          f"{cls[0]}{worst:4.0%}")
        width = max(len(n) for n in table)
        print(f"{'':{width}}  " + "  ".join(f"{f'{load:g}x: {load * capacity:.1f} req/s':>24}" for load in loads))
        for config_name, cells in table.items():
            print(f"{config_name:{width}}  " + "  ".join(f"{c:>24}" for c in cells))
        print("cells: goodput, x vllm, SLO attainment of all requests, worst prompt-length class (s/m/l) and its "
              "attainment")
    return 0


if __name__ == "__main__":
    sys.exit(main())
