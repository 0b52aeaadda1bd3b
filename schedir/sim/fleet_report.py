"""Rich tables for a fleet run: routers side by side, and the load each instance carried."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.table import Table

Metrics = dict[str, Any]


def _mean_tbt_ms(m: Metrics) -> float:
    return float(m["tbt_s"]["mean"]) * 1e3


def _load_spread(m: Metrics) -> str:
    routed = [p["routed"] for p in m["fleet"]["per_instance"]]
    return f"{min(routed)}-{max(routed)}" if routed else "-"


def _busy_spread(m: Metrics) -> str:
    busy = [p["gpu_busy_s"] for p in m["fleet"]["per_instance"]]
    return f"{min(busy):.0f}-{max(busy):.0f}" if busy else "-"


def _copies(m: Metrics) -> str:
    skipped = m["fleet"].get("copy_skipped", {})
    return f"{m['fleet'].get('copied_blocks', 0)}; {sum(skipped.values())}"


ROWS: tuple[tuple[str, Callable[[Metrics], object], str], ...] = (
    ("requests finished", lambda m: m["requests"]["finished"], "{:.0f}"),
    ("requests rejected", lambda m: m["requests"]["rejected"], "{:.0f}"),
    ("goodput (req/s)", lambda m: m["goodput_req_s"], "{:.3f}"),
    ("SLO attainment", lambda m: m["slo_attainment"], "{:.1%}"),
    ("prefix-hit rate", lambda m: m["prefix_hit_rate"], "{:.1%}"),
    ("TTFT p50 (s)", lambda m: m["ttft_s"]["p50"], "{:.3f}"),
    ("TTFT p99 (s)", lambda m: m["ttft_s"]["p99"], "{:.3f}"),
    ("TBT p50 (ms)", lambda m: m["tbt_s"]["p50"] * 1e3, "{:.1f}"),
    ("TBT p99 (ms)", lambda m: m["tbt_s"]["p99"] * 1e3, "{:.1f}"),
    ("TBT mean (ms)", _mean_tbt_ms, "{:.1f}"),
    ("throughput (req/s)", lambda m: m["throughput_req_s"], "{:.3f}"),
    ("routed per instance (min-max)", _load_spread, "{}"),
    ("GPU busy per instance (s, min-max)", _busy_spread, "{}"),
    ("prefix replicas / pulls", lambda m: m["fleet"]["replicas"], "{:.0f}"),
    ("prefix KV copied (blocks; copies skipped)", lambda m: _copies(m), "{}"),
    ("re-routed (instance removed)", lambda m: m["fleet"]["rerouted"], "{:.0f}"),
    ("router µs per request (all)", lambda m: m["fleet"]["route_us_per_request"], "{:.1f}"),
    ("routing pipeline µs per request", lambda m: m["fleet"]["pipeline_us_per_request"], "{:.1f}"),
    ("simulator wall (s)", lambda m: m["sim_wall_s"], "{:.1f}"),
)


def fleet_comparison_table(runs: Sequence[Metrics]) -> Table:
    first = runs[0]
    table = Table(title=f"{first['fleet']['instances']} instances · {first['workload']['name']} · "
                        f"{first['requests']['total']} requests · goodput: TTFT p99 <= {first['slo']['ttft_s']:g} s, "
                        f"mean TBT <= {first['slo']['tbt_s'] * 1e3:g} ms")
    table.add_column("metric")
    for m in runs:
        table.add_column(m["config"], justify="right")
    for label, get, fmt in ROWS:
        table.add_row(label, *[fmt.format(get(m)) for m in runs])
    return table


def instance_table(m: Metrics) -> Table:
    table = Table(title=f"per-instance load · router {m['config']}")
    for col in ("instance", "alive", "routed", "finished", "steps", "GPU busy (s)", "mean running"):
        table.add_column(col, justify="right")
    for p in m["fleet"]["per_instance"]:
        table.add_row(str(p["instance"]), "yes" if p["alive"] else "removed", str(p["routed"]), str(p["finished"]),
                      str(p["steps"]), f"{p['gpu_busy_s']:.1f}", f"{p['mean_running']:.1f}")
    return table
