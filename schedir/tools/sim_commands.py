"""`schedir sim`, `schedir bench` and `schedir stats`: simulate, compare, show a saved run.

The workload is a trace file (`--trace`, format from the file) or a built-in
synthetic workload (`--workload`, default `conversation`: the Mooncake
conversation trace's statistics). Bad input — a trace row, an unknown model,
GPU, preset or config field — is one clear message and exit status 2.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from schedir.ir.errors import SchedirError
from schedir.runtime.config import POLICIES
from schedir.sim.config import SimConfig
from schedir.sim.metrics import REQUEST_COLUMNS, per_request, summarize
from schedir.sim.records import SimResult
from schedir.sim.report import comparison_table, print_notes, run_table
from schedir.sim.runspec import parse_configs
from schedir.sim.simulator import Simulator
from schedir.sim.workloads import BUILTIN_WORKLOADS, Workload, builtin_workload, load_trace
from schedir.tools.fleet_commands import (add_fleet_arguments, check_fleet_args, cmd_fleet_bench,
                                          cmd_fleet_sim)

DEFAULT_BENCH_CONFIGS = "vllm,vllm@enable_prefix_caching=false,vllm@max_num_batched_tokens=2048"
DEFAULT_BENCH_REQUESTS = 600
# The built-in conversation workload at Mooncake's own 3.4 req/s overloads one H100 serving
# Llama-3-8B (it sustains ~1.4 req/s of those 12k-token prompts); a bench compares policies
# at a load the engine can carry unless --rate says otherwise.
DEFAULT_BENCH_RATE = 1.0
# a bench runs WARMUP_REQUESTS of its workload through each config before timing anything, then
# short chats through a cache of WARMUP_TIGHT_TOKENS tokens, where they preempt (see warm_up)
WARMUP_REQUESTS = 4
WARMUP_TIGHT_TOKENS = 4800


def add_workload_arguments(p: argparse.ArgumentParser, default_requests: int | None) -> None:
    source = p.add_mutually_exclusive_group()
    source.add_argument("--trace", type=Path, help="a trace file: Mooncake .jsonl, Azure / ShareGPT / Vidur .csv")
    source.add_argument("--workload", default=None, metavar="NAME",
                        help=f"a built-in synthetic workload: {', '.join(BUILTIN_WORKLOADS)} (default: conversation)")
    p.add_argument("--trace-format", choices=("mooncake", "azure", "sharegpt", "vidur"),
                   help="the trace's format, when the file name and header do not tell")
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="skip (and list) malformed trace rows instead of refusing the trace")
    p.add_argument("--num-requests", type=int, default=default_requests, metavar="N",
                   help="replay only the first N requests" + (f" (default {default_requests})" if default_requests else ""))
    p.add_argument("--rate", type=float, metavar="R",
                   help="requests per second (rescales a trace's arrivals; default: the trace's or workload's own"
                        + (f", {DEFAULT_BENCH_RATE} for a built-in workload in a bench)" if default_requests else ")"))
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic workload")


def add_deployment_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="llama-3-8b", help="llama-3-8b, llama-2-7b, llama-2-70b")
    p.add_argument("--gpu", default="h100", help="h100, a100")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs")
    p.add_argument("--policy", choices=POLICIES, default="fcfs",
                   help="waiting-queue policy; lpm, dfs-weight, lof and random are SGLang's (the sglang preset)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, help="KV cache blocks (default: what the GPU memory holds)")
    p.add_argument("--max-model-len", type=int, help="context limit (default: the model's)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--long-prefill", type=int, default=0, metavar="TOKENS",
                   help="long_prefill_token_threshold (0: off)")
    p.add_argument("--no-prefix-caching", action="store_true", help="turn the prefix cache off (default: on, but for "
                   "the vllm-v0 presets, whose engine's prefix caching is not reproduced)")
    p.add_argument("--ttft-slo", type=float, default=2.0, metavar="S", help="TTFT SLO for goodput (seconds)")
    p.add_argument("--tbt-slo", type=float, default=0.1, metavar="S", help="mean time-between-tokens SLO (seconds)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the metrics JSON here")
    p.add_argument("--plots", type=Path, metavar="DIR", help="write latency CDFs and batch composition plots here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--no-decode-runs", action="store_true",
                   help="take every step one at a time, timing each schedule() + update() as an engine pays it "
                        "(default: steady decode steps between arrivals run in one kernel call, the same steps; "
                        "one engine: a fleet's instances always take them)")


def add_commands(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser("sim", help="simulate one scheduler on a trace or a built-in workload")
    add_workload_arguments(sim, None)
    sim.add_argument("--preset", default="vllm", metavar="NAME", help="a preset or a pass list (default vllm)")
    add_deployment_arguments(sim)
    sim.add_argument("--dump-steps", metavar="LIST", help="steps whose IR to dump after every pass: 1,5,10-12 or all "
                     "(with --instances: the router's routing steps)")
    sim.add_argument("--dump-dir", type=Path, metavar="DIR", help="where --dump-steps writes")
    sim.add_argument("--requests-csv", type=Path, metavar="OUT",
                     help="write one row per request: queueing, TTFT, mean TBT, E2E, preemptions, prefix hit")
    add_fleet_arguments(sim, bench=False)

    bench = sub.add_parser("bench", help="run several presets or pipelines on one workload, side by side")
    add_workload_arguments(bench, DEFAULT_BENCH_REQUESTS)
    bench.add_argument("--configs", default=DEFAULT_BENCH_CONFIGS, metavar="A,B,C",
                       help="presets or pass lists (passes joined by +), each optionally with @field=value "
                            f"overrides (default: {DEFAULT_BENCH_CONFIGS})")
    add_deployment_arguments(bench)
    bench.set_defaults(plots=Path("bench-plots"), builtin_rate=DEFAULT_BENCH_RATE)
    add_fleet_arguments(bench, bench=True)

    stats = sub.add_parser("stats", help="print a saved run (schedir sim/bench --json)")
    stats.add_argument("run", type=Path, help="the JSON a sim or bench wrote")
    stats.add_argument("--plots", type=Path, metavar="DIR", help="redraw its plots here")


def load_workload(args: argparse.Namespace, console: Console) -> Workload:
    on_bad = "skip" if args.skip_bad_rows else "error"
    if args.num_requests is not None and args.num_requests < 1:
        raise ValueError(f"--num-requests must be positive, got {args.num_requests}")
    if args.rate is not None and args.rate <= 0:
        raise ValueError(f"--rate must be positive, got {args.rate}")
    if args.trace is not None:
        try:
            workload = load_trace(args.trace, format=args.trace_format, on_bad_row=on_bad, rate=args.rate)
        except UnicodeDecodeError as e:  # a binary or mis-encoded file: say where, not the codec's words
            line = args.trace.read_bytes()[: e.start].count(b"\n") + 1
            raise ValueError(f"{args.trace}:{line}: not UTF-8 text (byte {e.object[e.start]:#04x})") from None
        for bad in workload.skipped[:20]:
            console.print(f"[yellow]skipped[/] {bad.path}:{bad.line}: {bad.reason}")
        if len(workload.skipped) > 20:
            console.print(f"[yellow]skipped {len(workload.skipped) - 20} more bad rows[/]")
        if args.num_requests is not None:
            workload = workload.head(args.num_requests)
        if args.rate is not None:
            workload = workload.with_rate(args.rate)
        return workload
    rate = args.rate if args.rate is not None else getattr(args, "builtin_rate", None)
    return builtin_workload(args.workload or "conversation", num_requests=args.num_requests, rate=rate,
                            seed=args.seed)


# SimConfig fields whose command-line flag is not simply --field-name
_FLAGS = {"long_prefill_token_threshold": "--long-prefill", "ttft_slo_s": "--ttft-slo", "tbt_slo_s": "--tbt-slo",
          "enable_prefix_caching": "--no-prefix-caching"}


def base_config(args: argparse.Namespace, pipeline: str) -> SimConfig:
    """The shared settings from the command line; a bad value names its flag (`--max-model-len
    must be positive, got 0`), not the config field."""
    try:
        return _base_config(args, pipeline)
    except ValueError as e:
        message = str(e)
        field = message.split(" ", 1)[0]
        if field in {a.name for a in attrs.fields(SimConfig)}:
            message = _FLAGS.get(field, "--" + field.replace("_", "-")) + message[len(field):]
        raise ValueError(message) from None


def _base_config(args: argparse.Namespace, pipeline: str) -> SimConfig:
    return SimConfig(
        pipeline=pipeline, policy=args.policy, model=args.model, gpu=args.gpu, tp=args.tp,
        block_size=args.block_size, max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len, num_blocks=args.num_blocks,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=False if args.no_prefix_caching else None,  # None: the engine's own (SimConfig)
        long_prefill_token_threshold=args.long_prefill, ttft_slo_s=args.ttft_slo, tbt_slo_s=args.tbt_slo,
        seed=args.seed,
    )


def parse_dump_steps(text: str | None) -> tuple[int, ...] | str:
    if not text:
        return ()
    if text.strip() == "all":
        return "all"
    steps: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise ValueError(f"--dump-steps {text!r}: {part!r} is not a step number or range such as 10-12") from None
        if first < 1 or last < first:
            raise ValueError(f"--dump-steps {text!r}: {part!r} is not a range of positive step numbers")
        steps.extend(range(first, last + 1))
    return tuple(steps)


def simulate(config: SimConfig, workload: Workload, console: Console, quiet: bool,
             decode_runs: bool = True) -> tuple[dict[str, Any], SimResult]:
    simulator = Simulator(config, decode_runs=decode_runs)
    simulator.check()  # a pipeline the runtime refuses: said before the progress bar
    if quiet:
        result = simulator.run(workload)
    else:
        # the label goes in as a task field: a pass option's braces (`order-slo{hopeless=reject}`) would
        # otherwise be read as a format field, and its brackets as rich markup
        with Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
                      TextColumn("requests  sim {task.fields[sim]:.0f} s"), TimeElapsedColumn(),
                      console=console) as bar:
            task = bar.add_task(config.name, total=len(workload), sim=0.0)
            result = simulator.run(workload, progress=lambda done, total, now: bar.update(task, completed=done, sim=now))
    return summarize(result), result


def cmd_sim(args: argparse.Namespace, console: Console) -> int:
    check_fleet_args(args)
    if args.instances is not None:
        return cmd_fleet_sim(args, console)
    if args.dump_steps and args.dump_dir is None:
        raise ValueError("--dump-steps needs --dump-dir (where to write the IR)")
    workload = load_workload(args, console)
    config = attrs.evolve(base_config(args, args.preset), dump_dir=args.dump_dir,
                          dump_steps=parse_dump_steps(args.dump_steps))
    metrics, result = simulate(config, workload, console, args.quiet, not args.no_decode_runs)
    if args.dump_dir is not None and shutil.which("dot") is None and any(args.dump_dir.glob("*.dot")):
        from schedir.ir.dot import svg_skipped_note
        console.print(svg_skipped_note(args.dump_dir), markup=False, highlight=False)
    console.print(run_table(metrics))
    print_notes(console, metrics)
    _write_outputs(args, [metrics], console, single=True)
    if args.requests_csv:
        args.requests_csv.parent.mkdir(parents=True, exist_ok=True)
        with args.requests_csv.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(REQUEST_COLUMNS)
            writer.writerows(per_request(result))
        console.print(f"wrote {args.requests_csv}")
    return 1 if metrics["stalled"] else 0


def warm_up(configs: Sequence[SimConfig], workload: Workload) -> None:
    """Run a few requests through each config, untimed, and discard the results.

    The first simulation of a process pays Numba's compilation (~14 s on a cold cache) or cache
    loads, and first-use costs in xDSL and numpy; without this they land in the first column's
    scheduler µs/step and simulator wall, and skew every "x first" ratio. Each config runs the
    workload's first WARMUP_REQUESTS requests (its real shapes: long prompts, chunks, prefix
    hits), then a burst of short chats in a cache small enough to preempt: a kernel compiles
    once per argument signature, and a step that preempts passes different arrays than one
    that does not, so a warm-up without preemption leaves a compilation to the timed run."""
    tight = builtin_workload("chat-short", num_requests=16, rate=100.0, seed=0)
    tight = attrs.evolve(tight, output_len=np.minimum(tight.output_len, 64))
    for config in configs:
        Simulator(config).run(workload.head(WARMUP_REQUESTS))
        squeezed = attrs.evolve(config, num_blocks=max(1, WARMUP_TIGHT_TOKENS // config.block_size))
        try:
            Simulator(squeezed).run(tight)
        except SchedirError:  # a pipeline that cannot run in so small a cache: the real run still warms it
            pass


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    check_fleet_args(args)
    if args.instances is not None:
        return cmd_fleet_bench(args, console)
    configs = parse_configs(args.configs, base_config(args, "vllm"))
    workload = load_workload(args, console)
    for config in configs:  # a pipeline the runtime refuses: said before the warm-up line
        Simulator(config).check()
    if not args.quiet:
        console.print("warming up: a few requests through each config, untimed "
                      "(Numba compiles its kernels on a first run)")
    warm_up(configs, workload)
    runs = [simulate(config, workload, console, args.quiet, not args.no_decode_runs)[0] for config in configs]
    console.print(comparison_table(runs))
    for m in runs:
        print_notes(console, m)
    _write_outputs(args, runs, console, single=False)
    return 0


def cmd_stats(args: argparse.Namespace, console: Console) -> int:
    try:
        data = json.loads(args.run.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{args.run}:{e.lineno}: not a run JSON ({e.msg})") from None
    runs = data["runs"] if isinstance(data, dict) and "runs" in data else [data]
    if not isinstance(runs, list) or not runs:
        raise ValueError(f"{args.run}: 'runs' is not a list of runs: not written by schedir sim/bench")
    for i, m in enumerate(runs):
        if not isinstance(m, dict):
            raise ValueError(f"{args.run}: run {i} is not a JSON object: not written by schedir sim/bench")  # noqa: TRY004 (bad input: exit 2)
        missing = [k for k in ("config", "ttft_s", "tbt_s", "e2e_s", "requests", "settings") if k not in m]
        if missing:
            raise ValueError(f"{args.run}: run {i} lacks {', '.join(missing)}: not written by schedir sim/bench")
    try:
        table = run_table(runs[0]) if len(runs) == 1 else comparison_table(runs)
    except (KeyError, TypeError, AttributeError, IndexError) as e:  # a hand-edited or foreign JSON
        field = f"field {e.args[0]!r} missing" if isinstance(e, KeyError) else "a field of the wrong type"
        raise ValueError(f"{args.run}: not a run written by schedir sim/bench ({field})") from None
    console.print(table)
    for m in runs:
        print_notes(console, m)
    if args.plots:
        from schedir.sim.plots import write_plots
        for path in write_plots(runs, args.plots):
            console.print(f"wrote {path}")
    return 0


def _write_outputs(args: argparse.Namespace, runs: Sequence[dict[str, Any]], console: Console, single: bool) -> None:
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(runs[0] if single else {"runs": list(runs)}, indent=1))
        console.print(f"wrote {args.json}")
    if args.plots:
        from schedir.sim.plots import write_plots  # matplotlib only when plots are asked for
        for path in write_plots(runs, args.plots):
            console.print(f"wrote {path}")
