"""Plots of a fleet run: each instance's load over time, and where the router sent each request.

They read only the metrics dict (`fleet.series`), like `schedir.sim.plots`, so a saved run
can be redrawn without re-simulating.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def write_fleet_plots(m: dict[str, Any], out_dir: Path) -> list[Path]:
    """`<router>-load.png` (running requests per instance over time) and `<router>-routing.png`
    (arrival time against the instance each request went to, rejected ones at -1)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    series = m["fleet"]["series"]
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in m["config"])
    paths = []
    fig, ax = plt.subplots(figsize=(9, 4))
    for inst, (t, running) in enumerate(zip(series["load_t_s"], series["load_running"], strict=True)):
        if t:
            ax.plot(t, running, label=f"instance {inst}", linewidth=0.8)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("requests in the batch (mean per bin)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="x-small", ncol=4)
    ax.set_title(f"per-instance load — router {m['config']}")
    fig.tight_layout()
    path = out_dir / f"{stem}-load.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.scatter(series["arrival_s"], series["instance"], s=2, alpha=0.5)
    ax.set_xlabel("arrival (s)")
    ax.set_ylabel("instance (-1: rejected)")
    ax.set_title(f"routing timeline — router {m['config']}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path = out_dir / f"{stem}-routing.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths
