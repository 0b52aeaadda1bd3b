"""Plots of one or more runs: latency CDFs per config and batch composition over time.

They read only the metrics dicts (`series` in the run JSON), so `schedir stats`
can redraw a saved run and `schedir bench` draws every config on one figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt

LATENCIES = (("ttft_s", "TTFT (s)"), ("tbt_s", "time between tokens (s)"), ("e2e_s", "end-to-end latency (s)"))


def latency_cdfs(runs: Sequence[dict[str, Any]], path: Path) -> Path:
    fig, axes = plt.subplots(1, len(LATENCIES), figsize=(5 * len(LATENCIES), 4))
    for ax, (key, label) in zip(axes, LATENCIES, strict=True):
        for m in runs:
            values = m["series"]["cdf"][key]
            if values:
                ys = [i / (len(values) - 1) for i in range(len(values))] if len(values) > 1 else [1.0]
                ax.plot(values, ys, label=m["config"])
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests" if key != "tbt_s" else "fraction of token gaps")
        ax.set_xscale("symlog", linthresh=1e-2)
        ax.grid(True, alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize="small")
    fig.suptitle(f"latency CDFs — {runs[0]['workload'].get('name', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def batch_composition(runs: Sequence[dict[str, Any]], path: Path) -> Path:
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.8 * len(runs)), squeeze=False)
    for ax, m in zip(axes[:, 0], runs, strict=True):
        tl = m["series"]["timeline"]
        if tl["t_s"]:
            ax.stackplot(tl["t_s"], tl["prefill_tokens"], tl["decode_tokens"], labels=["prefill", "decode"],
                         alpha=0.8)
            twin = ax.twinx()
            twin.plot(tl["t_s"], tl["kv_usage"], color="black", linewidth=0.8, label="KV use")
            twin.set_ylim(0, 1.05)
            twin.set_ylabel("KV use")
        ax.set_title(m["config"], fontsize="medium")
        ax.set_ylabel("tokens / step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize="small")
    axes[-1, 0].set_xlabel("simulated time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(runs: Sequence[dict[str, Any]], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return [latency_cdfs(runs, directory / "latency_cdf.png"),
            batch_composition(runs, directory / "batch_composition.png")]
