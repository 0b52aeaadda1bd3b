"""Statistics of the real traces next to the built-in synthetic workloads, and the fit behind the defaults.

    python benchmarks/workload_stats.py            # side-by-side table (real traces from ../shared/data)
    python benchmarks/workload_stats.py --fit      # refit the "conversation" defaults to Mooncake's trace

The traces are read from `../shared/data/traces` (relative to the repository root) and
never copied; without them the script prints the synthetic workloads alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import attrs
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from schedir.sim.workloads import (
    BUILTIN_WORKLOADS,
    LogNormalMix,
    Workload,
    builtin_workload,
    generate,
    load_azure,
    load_mooncake,
    load_sharegpt,
)

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
MOONCAKE = TRACES / "mooncake" / "conversation_trace.jsonl"
ROWS = ("n", "duration_s", "rate_req_s", "input_p50", "input_p90", "input_p99", "input_mean",
        "output_p50", "output_p90", "output_p99", "output_mean", "prefix_hit_token_fraction")


def _timed(label: str, make) -> tuple[str, Workload, float]:
    start = time.perf_counter()
    workload = make()
    return label, workload, time.perf_counter() - start


def table(columns: list[tuple[str, Workload, float]]) -> str:
    width = max(16, *(len(label) + 2 for label, _, _ in columns))
    lines = ["stat".ljust(28) + "".join(label.rjust(width) for label, _, _ in columns)]
    stats = [w.stats() for _, w, _ in columns]
    for row in ROWS:
        cells = []
        for s in stats:
            v = s[row]
            cells.append(f"{v:.3f}" if row in ("prefix_hit_token_fraction", "rate_req_s") else f"{v:,.0f}")
        lines.append(row.ljust(28) + "".join(c.rjust(width) for c in cells))
    lines.append("load/generate s".ljust(28) + "".join(f"{t:.3f}".rjust(width) for _, _, t in columns))
    return "\n".join(lines)


def side_by_side() -> None:
    generate(attrs.evolve(BUILTIN_WORKLOADS["conversation"], num_requests=10))  # JIT/cache warm-up, untimed
    if MOONCAKE.exists():
        real = _timed("mooncake conv", lambda: load_mooncake(MOONCAKE))
        real[1].stats()
        real = _timed("mooncake conv", lambda: load_mooncake(MOONCAKE))
        synth = _timed("synthetic conv", lambda: builtin_workload("conversation", num_requests=len(real[1])))
        print("Mooncake conversation trace vs the built-in 'conversation' workload (same number of requests)\n")
        print(table([real, synth]))
        print("\nFirst 3000 requests only (the trace starts cold, so does the generator's window):\n")
        print(table([("mooncake head", real[1].head(3000), 0.0),
                     _timed("synthetic 3000", lambda: builtin_workload("conversation", num_requests=3000))]))
    else:
        print(f"skipped the real traces: {TRACES} is absent")
        print(table([_timed("synthetic conv", lambda: builtin_workload("conversation"))]))
    others = []
    for name in ("AzureLLMInferenceTrace_conv", "AzureLLMInferenceTrace_code"):
        path = TRACES / "azure2023" / f"{name}.csv"
        if path.exists():
            others.append(_timed(f"azure {name.split('_')[-1]}", lambda p=path: load_azure(p)))
    sharegpt = TRACES / "sharegpt" / "sharegpt_val_10k_llama2.csv"
    if sharegpt.exists():
        others.append(_timed("sharegpt@5/s", lambda: load_sharegpt(sharegpt, rate=5.0)))
    for name in BUILTIN_WORKLOADS:
        if name != "conversation":
            others.append(_timed(name, lambda n=name: builtin_workload(n)))
    print("\nAzure 2023 and ShareGPT traces, and the other built-in workloads:\n")
    print(table(others))


# ---- the fit behind schedir/sim/workloads/synthetic.py's Mooncake defaults ----

IN_Q = (10, 25, 50, 75, 90, 99)
OUT_Q = (5, 10, 25, 50, 75, 90, 95, 99)


def _depths(w: Workload) -> np.ndarray:
    """Per request, its turn depth: the chain of earlier requests whose full prefix it continues (> 1 block)."""
    owner: dict[tuple[int, ...], int] = {}
    depth = np.zeros(len(w), dtype=np.int64)
    for i in range(len(w)):
        blocks = tuple(int(b) for b in w.blocks(i))
        k, parent = 0, -1
        while k < len(blocks) and blocks[:k + 1] in owner:
            parent = owner[blocks[:k + 1]]
            k += 1
        if k > 1:
            depth[i] = depth[parent] + 1
        for j in range(len(blocks)):
            owner[blocks[:j + 1]] = i
    return depth


def fit() -> None:
    from scipy.optimize import minimize

    real = load_mooncake(MOONCAKE)
    spec0 = BUILTIN_WORKLOADS["conversation"]

    # 1. turns per conversation: two kinds of conversation, each geometric.
    per_root = np.bincount(_depths(real))[:12] / np.count_nonzero(_depths(real) == 0)

    def depth_loss(x: np.ndarray) -> float:
        w, p1, p2 = 1 / (1 + np.exp(-x))
        d = np.arange(len(per_root))
        model = (1 - w) * p1**d + w * p2**d
        return float(np.sum((np.log(model[1:]) - np.log(per_root[1:])) ** 2))

    r = minimize(depth_loss, np.array([-2.0, -1.0, 1.0]), method="Nelder-Mead")
    w, p1, p2 = 1 / (1 + np.exp(-r.x))
    print(f"continue_probs=({p1:.3f}, {p2:.3f}), continue_weights=({1 - w:.3f}, {w:.3f})")

    # 2. output lengths: independent of the prompt in the trace (log-log correlation 0.05). A broad
    #    short-answer component and a tight mode near 400 tokens; the median and the tail weigh more.
    out_target = np.log(np.percentile(real.output_len, OUT_Q))
    out_weight = np.array([1, 1, 1, 4, 1, 3, 1, 3.0])

    def out_mix(x: np.ndarray) -> LogNormalMix:
        w = np.exp(x[6:9]) / np.exp(x[6:9]).sum()
        return LogNormalMix(tuple(np.exp(x[0:3])), tuple(np.abs(x[3:6])), tuple(w), high=2000)

    def out_loss(x: np.ndarray) -> float:
        sample = out_mix(x).sample(np.random.default_rng(1), 40_000)
        return float(np.sum(out_weight * (np.log(np.percentile(sample, OUT_Q)) - out_target) ** 2))

    starts = ([30, 400, 600, 1.5, 0.3, 0.6, 0.3, 0.6, 0.1], [40, 390, 500, 1.3, 0.25, 0.5, 0.3, 0.55, 0.15])
    fits = [minimize(out_loss, np.array([*np.log(x[:3]), *x[3:6], *np.log(x[6:])]), method="Powell",
                     options={"maxiter": 20_000, "xtol": 1e-3}) for x in starts]
    output = out_mix(min(fits, key=lambda r: r.fun).x)

    # 3. prompts: first-turn and follow-up text, fitted through the whole generator.
    in_target = np.log(np.percentile(real.input_len, IN_Q))
    in_weight = np.array([1, 1, 3, 1, 1, 3.0])  # the median and p99 are the figures people quote
    hit_target = real.stats()["prefix_hit_token_fraction"]

    def in_spec(x: np.ndarray) -> object:
        def mix(y: np.ndarray, high: int) -> LogNormalMix:
            w = 1 / (1 + np.exp(-y[4]))
            return LogNormalMix((float(np.exp(y[0])), float(np.exp(y[1]))), (abs(y[2]), abs(y[3])),
                                (1 - w, w), high=high)

        return attrs.evolve(spec0, num_requests=len(real), output=output,
                            continue_probs=(p1, p2), continue_weights=(1 - w, w),
                            first_turn=mix(x[:5], spec0.first_turn.high), follow_up=mix(x[5:], spec0.follow_up.high))

    def in_loss(x: np.ndarray) -> float:
        loss = 0.0
        for seed in range(3):
            g = generate(attrs.evolve(in_spec(x), seed=seed))
            loss += float(np.sum(in_weight * (np.log(np.percentile(g.input_len, IN_Q)) - in_target) ** 2))
            loss += 100.0 * (g.stats()["prefix_hit_token_fraction"] - hit_target) ** 2
        return loss / 3

    f, u = spec0.first_turn, spec0.follow_up
    x0 = np.array([np.log(f.medians[0]), np.log(f.medians[1]), f.sigmas[0], f.sigmas[1], np.log(f.weights[1] / f.weights[0]),
                   np.log(u.medians[0]), np.log(u.medians[1]), u.sigmas[0], u.sigmas[1], np.log(u.weights[1] / u.weights[0])])
    r = minimize(in_loss, x0, method="Nelder-Mead", options={"maxiter": 1500, "xatol": 1e-3, "fatol": 1e-5})
    best = in_spec(r.x)
    print(f"loss {r.fun:.5f} after {r.nfev} evaluations")
    for field in ("first_turn", "follow_up"):
        print(f"{field} = {getattr(best, field)!r}")
    print(f"output = {output!r}")
    print(table([("mooncake conv", real, 0.0), ("fitted", generate(best), 0.0)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", action="store_true", help="refit the conversation defaults (needs scipy)")
    args = parser.parse_args()
    if args.fit:
        if not MOONCAKE.exists():
            raise SystemExit(f"--fit needs the Mooncake trace at {MOONCAKE}")
        fit()
    else:
        side_by_side()


if __name__ == "__main__":
    main()
