"""Plots of a fleet run: each instance's load over time, and the routing timeline.

They read only the metrics dict (`fleet.series`), like `schedir.sim.plots`, so a saved run
can be redrawn without re-simulating. Each figure comes with a CSV of the numbers it draws,
so a reader (or a test) can check a figure's data without reading pixels.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

LOAD_PANELS = (("load_running", "running (batch size)"), ("load_queued", "waiting queue"),
               ("load_kv", "KV cache use (0-1)"))


def write_fleet_plots(m: dict[str, Any], out_dir: Path) -> list[Path]:
    """`<router>-load.png/.csv` (per instance over time: running requests, waiting queue, KV
    use) and `<router>-routing.png/.csv` (every arrival against the instance it went to,
    rejections with their reason, P/D KV transfers and prefix copies between instances)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in m["config"])
    series = m["fleet"]["series"]
    return [*_load(series, m["config"], out_dir / f"{stem}-load"),
            *_routing(series, m["config"], out_dir / f"{stem}-routing")]


def _load(series: dict[str, Any], name: str, base: Path) -> list[Path]:
    fig, axes = plt.subplots(len(LOAD_PANELS), 1, figsize=(10, 2.6 * len(LOAD_PANELS)), sharex=True)
    for ax, (key, label) in zip(axes, LOAD_PANELS, strict=True):
        for inst, (t, values) in enumerate(zip(series["load_t_s"], series.get(key, []), strict=False)):
            if t:
                ax.plot(t, values, label=f"instance {inst}", linewidth=0.8)
        ax.set_ylabel(label, fontsize="small")
        ax.grid(True, alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize="x-small", ncol=4)
    axes[-1].set_xlabel("simulated time (s)")
    axes[0].set_title(f"per-instance load (mean per time bin) — router {name}")
    fig.tight_layout()
    png = base.with_suffix(".png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    path = base.with_suffix(".csv")
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["instance", "t_s", *(key.removeprefix("load_") for key, _ in LOAD_PANELS)])
        for inst, t in enumerate(series["load_t_s"]):
            columns = [series.get(key, [[]] * len(series["load_t_s"]))[inst] for key, _ in LOAD_PANELS]
            for k, x in enumerate(t):
                w.writerow([inst, x, *(col[k] if k < len(col) else "" for col in columns)])
    return [png, path]


def _routing(series: dict[str, Any], name: str, base: Path) -> list[Path]:
    arrival, instance = series["arrival_s"], series["instance"]
    rejected = series.get("rejected", [])
    transfers, copies = series.get("transfers", []), series.get("copies", [])
    fig, ax = plt.subplots(figsize=(10, 4.5))
    served = [(a, i) for a, i in zip(arrival, instance, strict=True) if i >= 0]
    if served:
        ax.scatter(*zip(*served, strict=True), s=3, alpha=0.5, label="routed (instance that served it)")
    if rejected:
        ax.scatter([r[0] for r in rejected], [-1] * len(rejected), s=12, marker="x", color="red",
                   label=f"rejected ({len(rejected)})")
    for k, (sent, landed, _, src, dst) in enumerate(transfers):
        ax.annotate("", (landed, dst), (sent, src), arrowprops={"arrowstyle": "->", "color": "green", "alpha": 0.3,
                                                                "linewidth": 0.6})
        if k == 0:
            ax.plot([], [], color="green", label=f"P/D KV transfers ({len(transfers)})")
    for k, (decided, landed, src, dst, _, migrate, why) in enumerate(copies):
        style = {"arrowstyle": "->", "color": "purple" if not why else "gray", "linewidth": 1.2,
                 "linestyle": "--" if migrate else "-"}
        ax.annotate("", (landed, dst), (decided, src), arrowprops=style)
        if k == 0:
            ax.plot([], [], color="purple", label=f"prefix copies ({len(copies)}; gray: skipped)")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("instance (-1: rejected)")
    ax.set_title(f"routing timeline — router {name}")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="x-small", loc="upper right")
    fig.tight_layout()
    png = base.with_suffix(".png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    path = base.with_suffix(".csv")
    reasons = {r[1]: r[2] for r in rejected}
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "event", "request", "src", "dst", "landed_s", "detail"])
        for r, (a, i) in enumerate(zip(arrival, instance, strict=True)):
            if r in reasons:
                w.writerow([a, "reject", r, "", "", "", reasons[r]])
            else:
                w.writerow([a, "route", r, "", i, "", ""])
        for sent, landed, r, src, dst in transfers:
            w.writerow([sent, "transfer", r, src, dst, landed, ""])
        for decided, landed, src, dst, blocks, migrate, why in copies:
            w.writerow([decided, "migrate" if migrate else "replicate", "", src, dst, landed,
                        why or f"{blocks} blocks"])
    return [png, path]
