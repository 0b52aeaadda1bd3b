"""Fit the cost model's constants per GPU to the measured tables and print them as Python.

    python benchmarks/calibrate_cost_model.py [--profiles DIR]

Reads the same in-domain rows as `benchmarks/cost_model_error.py` (see its docstring),
and for each GPU and operator family fits the `GpuSpec` fields of that family by
least squares on log(predicted / measured) (robust soft-L1 loss, every table weighted
equally whatever its row count), starting from the datasheet figures. Prints the
`GPUS = {...}` literal to paste between FITTED_GPUS_BEGIN/END in schedir/sim/models.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import attrs
import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_model_error import DEFAULT_PROFILES, PREDICT, Table, load_tables

from schedir.sim.cost_model import ELEMENTWISE_KINDS
from schedir.sim.models import GpuSpec

# Datasheet figures (not fitted): dense bf16 tensor-core peak, HBM bandwidth, and the
# total memory torch reports on the 80 GB parts.
DATASHEET = {
    "h100": {"name": "h100", "memory_gib": 79.2, "peak_tflops": 989.0, "mem_bw_tbs": 3.35},  # H100 SXM5 80GB
    "a100": {"name": "a100", "memory_gib": 79.2, "peak_tflops": 312.0, "mem_bw_tbs": 2.039},  # A100 SXM4 80GB
}

# Starting point of every fit (also the shape of a GpuSpec).
START = {
    "gemm_overhead_s": 5e-6, "gemm_eff_max": 0.75, "gemm_m_half": 64.0, "gemm_bw_eff": 0.8,
    "attn_prefill_overhead_s": 10e-6, "attn_prefill_eff_max": 0.5, "attn_prefill_q_half": 128.0,
    "attn_prefill_kv_weight": 0.3, "attn_prefill_causal": 0.5,
    "attn_decode_overhead_s": 10e-6, "attn_decode_per_request_s": 0.2e-6, "attn_decode_bw_eff": 0.7,
    "all_reduce_latency_s": (10e-6, 10e-6, 10e-6), "all_reduce_bus_gbs": (100.0, 100.0, 100.0),
    "all_reduce_bulk_latency_s": (30e-6, 30e-6, 30e-6), "all_reduce_bulk_bus_gbs": (300.0, 300.0, 300.0),
    "elementwise_overhead_s": 3e-6, "elementwise_bw_eff": tuple((k, 0.7) for k in ELEMENTWISE_KINDS),
}

# The GpuSpec fields each family's fit owns (all-reduce and elementwise are unpacked below).
FIELDS = {
    "gemm": ("gemm_overhead_s", "gemm_eff_max", "gemm_m_half", "gemm_bw_eff"),
    "attention_prefill": ("attn_prefill_overhead_s", "attn_prefill_eff_max", "attn_prefill_q_half",
                          "attn_prefill_kv_weight", "attn_prefill_causal"),
    "attention_decode": ("attn_decode_overhead_s", "attn_decode_per_request_s", "attn_decode_bw_eff"),
}


def _flat(spec: GpuSpec, family: str) -> tuple[list[str], np.ndarray]:
    if family in FIELDS:
        names = list(FIELDS[family])
        return names, np.array([getattr(spec, n) for n in names])
    if family == "all_reduce":
        values = (spec.all_reduce_latency_s + spec.all_reduce_bus_gbs + spec.all_reduce_bulk_latency_s
                  + spec.all_reduce_bulk_bus_gbs)
        return [f"{what}{tp}" for what in ("lat", "bw", "bulk_lat", "bulk_bw") for tp in (2, 4, 8)], np.array(values)
    names = ["elementwise_overhead_s"] + [k for k, _ in spec.elementwise_bw_eff]
    return names, np.array([spec.elementwise_overhead_s] + [v for _, v in spec.elementwise_bw_eff])


def _unflat(spec: GpuSpec, family: str, names: list[str], values: np.ndarray) -> GpuSpec:
    if family in FIELDS:
        return attrs.evolve(spec, **dict(zip(names, (float(v) for v in values))))
    if family == "all_reduce":
        v = [float(x) for x in values]
        return attrs.evolve(spec, all_reduce_latency_s=tuple(v[0:3]), all_reduce_bus_gbs=tuple(v[3:6]),
                            all_reduce_bulk_latency_s=tuple(v[6:9]), all_reduce_bulk_bus_gbs=tuple(v[9:12]))
    return attrs.evolve(spec, elementwise_overhead_s=float(values[0]),
                        elementwise_bw_eff=tuple((k, float(v)) for k, v in zip(names[1:], values[1:])))


# Physical ranges: the kernel pays at least the causal triangle and at most the full square.
BOUNDS = {"attn_prefill_causal": (0.5, 1.0)}


def held_fields(family: str, tables: list[Table]) -> set[str]:
    """Fields the tables cannot identify, kept at their starting value.

    Without cached context the causal fraction only scales like the efficiency; with a
    single head shape the kv-head weight does the same.
    """
    if family != "attention_prefill":
        return set()
    held = set()
    if all(np.all(t.columns["context"] == 0) for t in tables):
        held.add("attn_prefill_causal")
    shapes = {(q, kv) for t in tables for q, kv in zip(t.columns["q_heads"], t.columns["kv_heads"])}
    if len(shapes) == 1:
        held.add("attn_prefill_kv_weight")
    return held


def fit_family(spec: GpuSpec, family: str, tables: list[Table]) -> GpuSpec:
    """`spec` with `family`'s fields fitted to `tables` (log-space parameters keep them positive)."""
    all_names, all_x0 = _flat(spec, family)
    held = held_fields(family, tables)
    free = [i for i, n in enumerate(all_names) if n not in held]
    names = all_names
    weights = [1.0 / np.sqrt(len(t)) for t in tables]

    def full(logx: np.ndarray) -> np.ndarray:
        x = all_x0.copy()
        x[free] = np.exp(logx)
        return x

    def residuals(logx: np.ndarray) -> np.ndarray:
        trial = _unflat(spec, family, names, full(logx))
        parts = [w * np.log(PREDICT[family](trial, t.columns) / t.measured_s) for t, w in zip(tables, weights)]
        return np.concatenate(parts)

    lo = np.array([np.log(BOUNDS.get(all_names[i], (1e-30, 1e30))[0]) for i in free])
    hi = np.array([np.log(BOUNDS.get(all_names[i], (1e-30, 1e30))[1]) for i in free])
    x0 = np.clip(np.log(all_x0[free]), lo + 1e-9, hi - 1e-9)
    res = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05, max_nfev=2000)
    return _unflat(spec, family, names, full(res.x))


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, tuple):
        inner = ", ".join(_fmt(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    return repr(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", type=Path, default=DEFAULT_PROFILES)
    args = ap.parse_args(argv)
    if not args.profiles.is_dir():
        print(f"skip: {args.profiles} absent (the measured tables live in ../shared/data/profiles)")
        return 0
    tables = load_tables(args.profiles)
    print("GPUS: dict[str, GpuSpec] = {")
    start = dict(START)
    for gpu in ("h100", "a100"):  # h100 first: its fit seeds what the a100 tables cannot identify
        spec = GpuSpec(**DATASHEET[gpu], **start)
        sources = []
        for family in ("gemm", "elementwise", "attention_prefill", "attention_decode", "all_reduce"):
            mine = [t for t in tables if t.gpu == gpu and t.family == family]
            if mine:
                spec = fit_family(spec, family, mine)
                held = held_fields(family, mine)
                note = f" (held: {', '.join(f'{h}={getattr(spec, h):.4g}' for h in sorted(held))})" if held else ""
                sources.append(f"#   {family}: " + "; ".join(f"{t.source} ({len(t)} rows)" for t in mine) + note)
        start["attn_prefill_kv_weight"] = spec.attn_prefill_kv_weight
        print("    # fitted by benchmarks/calibrate_cost_model.py on:")
        print("\n".join("    " + s for s in sources))
        fields = ", ".join(f"{a.name}={_fmt(getattr(spec, a.name))}" for a in attrs.fields(GpuSpec))
        print(f'    "{gpu}": GpuSpec({fields}),')
    print("}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
