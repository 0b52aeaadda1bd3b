"""vtc-account: charge each tenant's Virtual Token Counter for this step's service."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.req import ScheduleOp
from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step, positions
from schedir.passes.vtc_state import COUNTERS, TENANT


@dataclass(frozen=True)
class VtcAccount(StepPass):
    """Add `w-in` per prompt token and `w-out` per generated token scheduled this step to the
    counter of the request's tenant (VTC, OSDI '24 §4: the paper's weights are 1 and 2, an
    output token costing about twice an input one). Runs after every scheduling pass."""

    name: ClassVar[str] = "vtc-account"
    requires: ClassVar[frozenset[str]] = frozenset({"running-scheduled", "waiting-scheduled"})
    request_state = (TENANT,)
    scheduler_state = (COUNTERS,)

    w_in: int = 1
    w_out: int = 2

    def run(self, step: Step) -> None:
        counters = np.array(step.state(COUNTERS.name, COUNTERS.initial()), dtype=np.float64)
        charged = False
        for op in step.ops_of(ScheduleOp):
            ids = op.ids  # type: ignore[attr-defined]
            if not ids.size:
                continue
            tokens = op.col("tokens")  # type: ignore[attr-defined]
            root = step.root(op.operands[0]).results[0]
            at = positions(step.ids(root), ids)
            prompt = step.column(root, "prompt")[at]
            computed = step.column(root, "computed")[at]
            prefill = np.clip(np.minimum(computed + tokens, prompt) - computed, 0, None)
            cost = self.w_in * prefill + self.w_out * (tokens - prefill)
            np.add.at(counters, step.state_column(root, TENANT.name, TENANT.default)[at], cost)
            charged = True
        if charged:
            step.set_state(vtc_counter=counters)
