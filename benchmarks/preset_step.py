"""Each engine preset's `schedule()` cost at 32 and 256 running requests, beside `vllm`'s.

Every preset should stay in the `vllm` preset's speed class: a step's cost set by the
policy, not by the load. For each preset and size N, N requests (128-token prompts, 1,000
tokens to generate, distinct prefixes) start together, with N/2 more waiting behind them where
the max_num_seqs cap (N) keeps them out; once every running request decodes, `schedule()` is
timed over `--steps` steps (update() untimed) and its median printed, with the ratio to
`vllm`'s median in the same run. The presets take turns (10 rounds of steps/10 steps each), so a
drift in the machine's speed moves them all alike.

    python benchmarks/preset_step.py                  # every engine preset, 32 and 256
    python benchmarks/preset_step.py --presets vllm,vtc --sizes 32 --steps 300
    python benchmarks/preset_step.py --finishing      # requests finish: admissions, IR steps' median
    python benchmarks/preset_step.py --finishing --waiting 5000 --spread-arrivals --presets vllm,with-all-passes
    python benchmarks/preset_step.py --finishing --waiting 5000 --shared-prefix 512
    python benchmarks/preset_step.py --presets vllm,vllm-v0,vllm-v0@cache --shared-prefix 512

`--finishing` gives each request 20-399 tokens to generate, so requests finish and the head of
the queue is admitted every few steps: most steps then run their IR (or decide it over arrays,
`schedir.ir.array_step`), and the IR med column compares those steps with `vllm`'s own
admission steps; `moved` says how many requests such a step admits, preempts or swaps out, on
average (FastServe's, with 5,000 new jobs ranked above the running ones, displace running jobs
by the dozen or the hundred where `vllm`'s admits one; a mean, since those steps alternate with
steps that move a few, and a median would show only one kind). `--spread-arrivals` has the
requests arrive 0.1 ms apart (distinct arrival times, as a real trace's) instead of all at
t = 0, where every order's arrival tie-break ties;
`--shared-prefix` starts every prompt with one system prompt, so every waiting request hits the
prefix cache (an order by prefix hits looks them all up). A preset runs with prefix caching as
its engine runs by default (off for the v0 presets, as in v0); `NAME@cache` runs it on
(`vllm-v0@cache`: v0's prefix-caching allocator).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from schedir import Request, Scheduler, SchedulerConfig
from schedir.ir.pipeline import PassManager
from schedir.passes.presets import PRESETS
from schedir.passes.route_presets import ROUTER_PRESETS

PROMPT = 128


# the config policy a preset runs under here (default fcfs): the one it is for
PRESET_POLICY = {"vllm-v0-priority": "priority"}


def engine_presets() -> list[str]:
    return [name for name in PRESETS if name not in ROUTER_PRESETS]


def _decoding_scheduler(preset: str, n: int, waiting: int | None = None, finishing: bool = False,
                        spread: bool = False, shared: int = 0) -> Scheduler:
    """A scheduler of `preset` with N requests decoding and `waiting` (default N/2) waiting behind
    max_num_seqs (`finishing`: each generates 20-399 tokens, so requests finish and the queue's
    head is admitted every few steps, in IR steps; else 1,000, none finishes while timed; `spread`:
    they arrive 0.1 ms apart, else all at t = 0; `shared`: every prompt starts with the same
    `shared` tokens, a system prompt)."""
    preset, at, cache = preset.partition("@")
    if at and cache != "cache":
        raise SystemExit(f"preset_step: '{preset}@{cache}': the one suffix is @cache (prefix caching on)")
    passes = PassManager.parse(PRESETS[preset]).passes
    # the v0 presets run as v0 does by default, cache off
    no_cache = not at and any(p.no_prefix_cache or p.v0_prefix_cache for p in passes)
    cfg = SchedulerConfig(num_blocks=n * 80 + 64, block_size=16, max_num_batched_tokens=16384, max_num_seqs=n,
                          max_model_len=2048, pipeline=preset, enable_prefix_caching=not no_cache,
                          policy=PRESET_POLICY.get(preset, "fcfs"),
                          num_cpu_blocks=n * 80 if any("swapped-queue" in p.requires for p in passes) else 0)
    s = Scheduler(cfg, clock=lambda: 0.0)  # every request fresh: order-slo keeps them all
    for i in range(n + (n // 2 if waiting is None else waiting)):
        tokens = np.arange(PROMPT) + i * PROMPT + 1  # distinct prefixes, however many requests
        if shared:
            tokens = np.concatenate([np.arange(shared) + (1 << 30), tokens])
        s.add_request(Request(f"r{i}", tokens, max_tokens=20 + (i * 7919) % 380 if finishing else 1000,
                              arrival_time=i * 1e-4 if spread else 0.0,
                              state={"tenant": i % 4} if preset == "vtc" else {}))
    for _ in range(8):  # until every running request decodes
        out = s.schedule()
        s.update(out, np.full(len(out.req_ids), 7, dtype=np.int64))
    return s


def _timed_steps(s: Scheduler, steps: int, into: list[float], ir_into: list[float] | None = None,
                 moved_into: list[int] | None = None) -> int:
    """Time `steps` steps into `into` (and the IR steps' also into `ir_into`, the requests each of
    them moved into `moved_into`: admitted, preempted, swapped out); returns how many of them ran
    their IR or decided it over arrays (not steady)."""
    clock = time.perf_counter
    steady = s.metrics.steady_steps
    for _ in range(steps):
        before = s.metrics.steady_steps
        start = clock()
        out = s.schedule()
        took = clock() - start
        into.append(took)
        if ir_into is not None and s.metrics.steady_steps == before:
            ir_into.append(took)
            if moved_into is not None:
                moved_into.append(len(out.new_prompts) + len(out.preempted_req_ids) + len(out.swapped_out_req_ids))
        s.update(out, np.full(len(out.req_ids), 7, dtype=np.int64))
    return steps - (s.metrics.steady_steps - steady)


def median_step_us(preset: str, n: int, steps: int, waiting: int | None = None, finishing: bool = False,
                   spread: bool = False, shared: int = 0) -> float:
    """One preset alone: its median `schedule()` over `steps` decode steps."""
    times: list[float] = []
    _timed_steps(_decoding_scheduler(preset, n, waiting, finishing, spread, shared), steps, times)
    return float(np.median(times)) * 1e6


def interleaved_medians(cases: list[tuple[str, int]], steps: int, rounds: int = 10,
                        waiting: int | None = None,
                        ir_share: dict[tuple[str, int], float] | None = None,
                        means: dict[tuple[str, int], float] | None = None,
                        finishing: bool = False,
                        spread: bool = False,
                        ir_medians: dict[tuple[str, int], float] | None = None,
                        moved: dict[tuple[str, int], float] | None = None,
                        shared: int = 0) -> dict[tuple[str, int], float]:
    """Every case's median `schedule()`, the cases taking turns in `rounds` rounds of steps/rounds
    steps each: a machine whose speed drifts (a shared 2-core box) moves every case alike, so the
    ratios to `vllm` hold even when the absolute figures wander. `ir_share`, when given, gets
    each case's share of steps that ran their IR (a policy that preempts decides those), and
    `ir_medians` the median of those steps alone (nan: none) and `moved` the mean number of
    requests such a step admitted, preempted or swapped out (the work a policy gives it)."""
    schedulers = {case: _decoding_scheduler(*case, waiting, finishing, spread, shared) for case in cases}
    times: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    ir_times: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    moved_counts: dict[tuple[str, int], list[int]] = {case: [] for case in cases}
    ir_steps = dict.fromkeys(cases, 0)
    per_round = max(1, steps // rounds)
    for _ in range(rounds):
        for case, s in schedulers.items():
            ir_steps[case] += _timed_steps(s, per_round, times[case], ir_times[case], moved_counts[case])
    if moved is not None:
        moved.update({case: float(np.mean(m)) if m else float("nan") for case, m in moved_counts.items()})
    if ir_share is not None:
        ir_share.update({case: ir_steps[case] / len(times[case]) for case in cases})
    if ir_medians is not None:
        ir_medians.update({case: float(np.median(t)) * 1e6 if t else float("nan") for case, t in ir_times.items()})
    if means is not None:  # every step's mean, the IR steps' cost included (a median hides it)
        means.update({case: float(np.mean(t)) * 1e6 for case, t in times.items()})
    return {case: float(np.median(t)) * 1e6 for case, t in times.items()}


def _ir_cell(value: float, base: float) -> str:
    """An IR-median cell: µs and the ratio to vllm's ('-' where a case ran no IR step)."""
    if value != value:  # nan: no IR step
        return f"{'-':>7} {'-':>6}"
    ratio = f"{value / base:5.2f}x" if base == base else f"{'-':>6}"
    return f"{value:7.0f} {ratio}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=",".join(engine_presets()))
    parser.add_argument("--sizes", default="32,256")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--waiting", type=int, help="requests waiting behind the full batch (default N/2): "
                        "an overload shows whether a preset's step grows with the queue")
    parser.add_argument("--finishing", action="store_true", help="requests generate 20-399 tokens, so they finish "
                        "and the queue's head is admitted every few steps: the IR steps' cost (IR med) shows")
    parser.add_argument("--spread-arrivals", action="store_true", help="requests arrive 0.1 ms apart (distinct "
                        "arrival times, as a trace's), not all at t = 0")
    parser.add_argument("--shared-prefix", type=int, default=0, metavar="TOKENS", help="every prompt starts "
                        "with the same TOKENS tokens (a system prompt): every waiting request hits the prefix cache")
    args = parser.parse_args(argv)
    presets = [p for p in args.presets.split(",") if p]
    sizes = [int(x) for x in args.sizes.split(",")]
    if "vllm" not in presets:
        presets.insert(0, "vllm")
    for preset in presets:  # compile and load every kernel a preset's steps use before timing any (the
        for n in sizes:      # first load of a cached kernel costs ms, which a mean would charge to the preset)
            median_step_us(preset, n, 60, args.waiting, args.finishing, args.spread_arrivals, args.shared_prefix)
    share: dict[tuple[str, int], float] = {}
    means: dict[tuple[str, int], float] = {}
    ir_medians: dict[tuple[str, int], float] = {}
    moved: dict[tuple[str, int], float] = {}
    results = interleaved_medians([(p, n) for n in sizes for p in presets], args.steps, waiting=args.waiting,
                                  ir_share=share, means=means, finishing=args.finishing,
                                  spread=args.spread_arrivals, ir_medians=ir_medians, moved=moved,
                                  shared=args.shared_prefix)
    behind = "N/2" if args.waiting is None else f"{args.waiting:,}"
    print(f"schedule() median, µs ({args.steps} {'steps, requests finishing' if args.finishing else 'decode steps'} "
          f"in 10 interleaved rounds, N running + {behind} waiting"
          f"{', arriving 0.1 ms apart' if args.spread_arrivals else ''}"
          f"{f', a shared {args.shared_prefix}-token prompt' if args.shared_prefix else ''}); x = / vllm's; "
          "IR = share of steps that ran their IR (or decided it over arrays; the rest: steady steps); "
          "mean = every step's mean, µs (the IR steps' cost shows there); IR med = those steps' median, µs, "
          "and / vllm's; moved = the requests such a step admits, preempts or swaps out (mean: the work its "
          "policy gives it)")
    print(f"{'preset':<18}" + "".join(f"{f'N={n}':>54}" for n in sizes))
    for p in presets:
        cells = "".join(f"{results[(p, n)]:10.1f} {results[(p, n)] / results[('vllm', n)]:5.2f}x "
                        f"{share[(p, n)]:4.0%} IR {means[(p, n)]:8.1f} "
                        + _ir_cell(ir_medians[(p, n)], ir_medians[("vllm", n)])
                        + (f" {moved[(p, n)]:5.0f}" if moved[(p, n)] == moved[(p, n)] else f" {'-':>5}")
                        for n in sizes)
        print(f"{p:<18}{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
