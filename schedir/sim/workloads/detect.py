"""`load_trace`: one entry point that picks the loader from the file (or from `format`)."""

from __future__ import annotations

import csv
from os import PathLike
from pathlib import Path

from schedir.sim.workloads.azure import AZURE_COLUMNS, load_azure
from schedir.sim.workloads.errors import TraceError
from schedir.sim.workloads.mooncake import load_mooncake
from schedir.sim.workloads.sharegpt import SHAREGPT_COLUMNS, load_sharegpt
from schedir.sim.workloads.vidur import VIDUR_COLUMNS, load_vidur_trace
from schedir.sim.workloads.workload import Workload

TRACE_FORMATS = ("mooncake", "azure", "sharegpt", "vidur")


def detect_format(path: str | PathLike[str]) -> str:
    """`.jsonl` is Mooncake; a CSV is told apart by the columns of its header."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return "mooncake"
    with open(path, encoding="utf-8", newline="") as f:
        header = next(csv.reader(f), None)
    if header is None:
        raise TraceError(str(path), 1, "empty file")
    columns = {h.strip().lstrip("\ufeff") for h in header}
    for fmt, required in (("azure", AZURE_COLUMNS), ("vidur", VIDUR_COLUMNS), ("sharegpt", SHAREGPT_COLUMNS)):
        if columns.issuperset(required):
            return fmt
    raise TraceError(str(path), 1, "unknown trace header: expected Mooncake .jsonl or CSV columns "
                                   + " | ".join(",".join(c) for c in (AZURE_COLUMNS, VIDUR_COLUMNS, SHAREGPT_COLUMNS))
                                   + f"; got {','.join(header)}")


def load_trace(path: str | PathLike[str], format: str | None = None, on_bad_row: str = "error",
               rate: float | None = None, seed: int = 0) -> Workload:
    """Load any supported trace. `rate` rescales timed traces; ShareGPT lengths need it for Poisson arrivals."""
    fmt = format or detect_format(path)
    if fmt == "sharegpt":
        if rate is None:
            raise ValueError("ShareGPT-style length files have no arrival times: pass rate= (requests per second; --rate on the command line)")
        return load_sharegpt(path, rate=rate, seed=seed, on_bad_row=on_bad_row)
    loaders = {"mooncake": load_mooncake, "azure": load_azure, "vidur": load_vidur_trace}
    if fmt not in loaders:
        raise ValueError(f"unknown trace format {fmt!r}; formats: {', '.join(TRACE_FORMATS)}")
    workload = loaders[fmt](path, on_bad_row=on_bad_row)
    return workload.with_rate(rate) if rate is not None else workload
