"""Workloads for the simulator: trace loaders, a synthetic generator and the built-in workloads.

Every source becomes one columnar `Workload` (arrivals, lengths, priorities, content
block ids). Traces are read from where they lie and never shipped; the built-in
"conversation" workload reproduces Mooncake's conversation trace statistically.
"""

from schedir.sim.workloads.azure import load_azure
from schedir.sim.workloads.builtin import BUILTIN_WORKLOADS, builtin_workload
from schedir.sim.workloads.detect import TRACE_FORMATS, detect_format, load_trace
from schedir.sim.workloads.errors import BadRow, TraceError
from schedir.sim.workloads.mooncake import load_mooncake
from schedir.sim.workloads.sharegpt import load_sharegpt
from schedir.sim.workloads.synthetic import LogNormalMix, SyntheticSpec, generate
from schedir.sim.workloads.vidur import load_vidur_trace
from schedir.sim.workloads.workload import Workload

__all__ = [
    "BUILTIN_WORKLOADS",
    "TRACE_FORMATS",
    "BadRow",
    "LogNormalMix",
    "SyntheticSpec",
    "TraceError",
    "Workload",
    "builtin_workload",
    "detect_format",
    "generate",
    "load_azure",
    "load_mooncake",
    "load_sharegpt",
    "load_trace",
    "load_vidur_trace",
]
