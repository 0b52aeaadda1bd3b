"""Rich tables for `schedir sim`, `schedir bench` and `schedir stats`.

One row per metric; a bench adds one column per config with its ratio to the
first config, so "which policy wins, by how much" reads off one table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

Metrics = dict[str, Any]


def _q(key: str, q: str) -> Callable[[Metrics], float]:
    return lambda m: float(m[key][q])


ROWS: tuple[tuple[str, Callable[[Metrics], float], str], ...] = (
    ("requests finished", lambda m: m["requests"]["finished"], "{:.0f}"),
    ("requests rejected", lambda m: m["requests"]["rejected"], "{:.0f}"),
    ("TTFT p50 (s)", _q("ttft_s", "p50"), "{:.3f}"),
    ("TTFT p90 (s)", _q("ttft_s", "p90"), "{:.3f}"),
    ("TTFT p99 (s)", _q("ttft_s", "p99"), "{:.3f}"),
    ("TBT p50 (ms)", lambda m: m["tbt_s"]["p50"] * 1e3, "{:.1f}"),
    ("TBT p90 (ms)", lambda m: m["tbt_s"]["p90"] * 1e3, "{:.1f}"),
    ("TBT p99 (ms)", lambda m: m["tbt_s"]["p99"] * 1e3, "{:.1f}"),
    ("E2E p50 (s)", _q("e2e_s", "p50"), "{:.2f}"),
    ("E2E p90 (s)", _q("e2e_s", "p90"), "{:.2f}"),
    ("E2E p99 (s)", _q("e2e_s", "p99"), "{:.2f}"),
    ("queueing p50 (s)", _q("queueing_s", "p50"), "{:.3f}"),
    ("queueing p99 (s)", _q("queueing_s", "p99"), "{:.3f}"),
    ("throughput (req/s)", lambda m: m["throughput_req_s"], "{:.3f}"),
    ("throughput (out tok/s)", lambda m: m["throughput_tok_s"], "{:.0f}"),
    ("goodput (req/s)", lambda m: m["goodput_req_s"], "{:.3f}"),
    ("SLO attainment", lambda m: m["slo_attainment"], "{:.1%}"),
    ("prefix-hit rate", lambda m: m["prefix_hit_rate"], "{:.1%}"),
    ("batch efficiency (tokens/budget)", lambda m: m["batch_efficiency"], "{:.1%}"),
    ("compute efficiency (of peak)", lambda m: m["compute_efficiency"], "{:.1%}"),
    ("KV utilisation", lambda m: m["kv_utilization"], "{:.1%}"),
    ("preemptions", lambda m: m["preemptions"], "{:.0f}"),
    ("steps", lambda m: m["steps"], "{:.0f}"),
    ("scheduler us/step p50", lambda m: m["scheduler_us"]["p50"], "{:.0f}"),
    ("scheduler us/step p99", lambda m: m["scheduler_us"]["p99"], "{:.0f}"),
    ("scheduler wall / GPU time", lambda m: m["scheduler_share_of_gpu_time"], "{:.2%}"),
    ("simulated time (s)", lambda m: m["simulated_s"], "{:.0f}"),
    ("simulator wall time (s)", lambda m: m["sim_wall_s"], "{:.1f}"),
)


def _title(m: Metrics) -> str:
    s = m["settings"]
    w = m["workload"]
    return (f"{w.get('name', 'workload')} ({m['requests']['total']} requests) on {s['model']} / {s['gpu']}"
            f" TP{s['tp']}, {m['num_blocks']} KV blocks of {s['block_size']}")


def run_table(m: Metrics) -> Table:
    table = Table(title=f"{m['config']}: {_title(m)}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for label, get, fmt in ROWS:
        table.add_row(label, fmt.format(get(m)))
    return table


def comparison_table(runs: Sequence[Metrics]) -> Table:
    """Metrics side by side; every column after the first shows its ratio to the first."""
    table = Table(title=_title(runs[0]))
    table.add_column("metric")
    for i, m in enumerate(runs):
        table.add_column(m["config"] if i == 0 else f"{m['config']} (x first)", justify="right")
    for label, get, fmt in ROWS:
        first = get(runs[0])
        cells = [fmt.format(first)]
        for m in runs[1:]:
            value = get(m)
            ratio = f" ({value / first:.2f}x)" if first else ""
            cells.append(fmt.format(value) + ratio)
        table.add_row(label, *cells)
    return table


def print_notes(console: Console, m: Metrics) -> None:
    runs = m.get("decode_run_steps", 0)
    if runs:
        console.print(f"{m['config']}: {runs:,} of {m['steps']:,} steps ran in decode runs (steady decode "
                      "steps between arrivals, one kernel call each run: docs/simulator.md); their scheduler "
                      "µs are their run's wall over its steps (--no-decode-runs times each step's "
                      "schedule() + update() as an engine pays them)", markup=False, highlight=False)
    if m.get("stalled"):
        console.print(f"[bold red]{m['config']} stopped early:[/] {m['stalled']}")
    if m["rejected_reasons"]:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(m["rejected_reasons"].items()))
        console.print(f"{m['config']}: rejected requests by reason — {reasons}")
