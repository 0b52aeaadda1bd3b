"""Named synthetic workloads: the built-in default and a few that separate scheduling policies."""

from __future__ import annotations

import attrs

from schedir.sim.workloads.synthetic import LogNormalMix, SyntheticSpec, generate
from schedir.sim.workloads.workload import Workload

BUILTIN_WORKLOADS: dict[str, SyntheticSpec] = {
    # Mooncake's conversation trace: long multi-turn prompts, ~37% prefix-hit tokens.
    "conversation": SyntheticSpec(name="conversation"),
    # Short single-turn chat (Azure 2023 conv / ShareGPT-like lengths: input p50 ~1k, output p50 ~130):
    # decode-heavy, no prefix reuse beyond a short shared system prompt.
    "chat-short": SyntheticSpec(
        name="chat-short", rate=5.5, system_prompt_tokens=0,
        first_turn=LogNormalMix(medians=(1020.0,), sigmas=(0.75,), high=8192),
        output=LogNormalMix(medians=(129.0,), sigmas=(0.8,), high=1024),
        continue_probs=(0.0,), continue_weights=(1.0,)),
    # Bursty arrivals (gamma gaps, CV 3) of two priority classes (0 = interactive, 20%; 1 = batch):
    # what priority scheduling and preemption are for.
    "bursty-priority": SyntheticSpec(
        name="bursty-priority", rate=5.0, arrival="bursty", burst_cv=3.0, system_prompt_tokens=512,
        first_turn=LogNormalMix(medians=(800.0, 4000.0), sigmas=(0.8, 0.8), weights=(0.7, 0.3), high=30_000),
        output=LogNormalMix(medians=(200.0,), sigmas=(0.8,), high=2000),
        continue_probs=(0.0,), continue_weights=(1.0,), priority_weights=(0.2, 0.8)),
}


def builtin_workload(name: str, num_requests: int | None = None, rate: float | None = None,
                     seed: int = 0) -> Workload:
    """Generate the named built-in workload, optionally with another size, rate or seed."""
    try:
        spec = BUILTIN_WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; built-in workloads: {', '.join(BUILTIN_WORKLOADS)}") from None
    changes: dict[str, object] = {"seed": seed}
    if num_requests is not None:
        changes["num_requests"] = num_requests
    if rate is not None:
        changes["rate"] = rate
    return generate(attrs.evolve(spec, **changes))
