"""sarathi-budget: Sarathi-Serve's token budget, derived from a time-between-tokens target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step


@dataclass(frozen=True)
class SarathiBudget(StepPass):
    """Cap the step's token budget at what one iteration can run within the TBT target.

    Sarathi-Serve (Agrawal et al., OSDI '24, §4.3) picks the token budget from the latency
    target rather than the GPU's capacity: every iteration carries the running decodes, so an
    iteration's time is the time between their tokens, and the budget is the largest token count
    whose iteration stays under the target (the paper profiles it once per model and GPU). Here
    the profile is linear, `step-us + tokens * token-us`; the defaults are schedir's cost model
    for Llama-3-8B on one H100 (a decode-only step of a few dozen requests ~8 ms, ~29 µs per
    prefill token at 1-8k tokens), so `tbt-ms=100` gives 3,172 tokens. The step's
    `token_budget` fact is lowered (never raised) for every pass after this one.
    """

    name: ClassVar[str] = "sarathi-budget"
    # steady decode steps: it only lowers the budget: see steady_token_budget
    steady_when: ClassVar[dict[str, str]] = {}
    provides: ClassVar[frozenset[str]] = frozenset({"tbt-budget"})

    tbt_ms: int = 100
    step_us: int = 8000
    token_us: int = 29

    def __post_init__(self) -> None:
        if self.token_us < 1 or self.step_us < 0:
            raise ValueError("token-us must be >= 1 and step-us >= 0")
        if self.tbt_ms * 1000 <= self.step_us + self.token_us:
            raise ValueError(f"tbt-ms={self.tbt_ms} leaves no room for a token after the step's fixed "
                             f"{self.step_us} µs")

    def budget(self) -> int:
        return (self.tbt_ms * 1000 - self.step_us) // self.token_us

    def steady_token_budget(self, budget: int) -> int:
        return min(budget, self.budget())

    def run(self, step: Step) -> None:
        cap = self.budget()
        if cap < step.facts.token_budget:
            step.set_token_budget(cap)
