"""slo-early-reject: refuse now the requests the fleet cannot serve within their SLO."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.codes import Role, Why
from schedir.ir.route_step import RouteView
from schedir.passes.route_kernels import CostOptions, slo_miss_kernel


@dataclass(frozen=True)
class SloEarlyReject(CostOptions):
    """Reject requests whose predicted TTFT or TBT misses their SLO on every instance.

    Mooncake's early rejection (FAST '25, section 6): refusing at arrival a request that would
    miss its SLO anyway saves the prefill it would waste. Per instance the prediction is
    TTFT = (prefill tokens queued + the request's uncached tokens) / prefill rate, and TBT =
    a decode step at its running batch + 1, both from the cost model (`model`, `gpu`, `tp`);
    tokens queued come from the fleet's `queued_tokens` column when present, else queued
    requests x the step's mean prompt. A request is kept if some instance that can prefill it
    meets both targets (`slack` x SLO); an SLO of 0 is none."""

    name: ClassVar[str] = "slo-early-reject"
    provides: ClassVar[frozenset[str]] = frozenset({"slo-checked"})

    slack: float = 1.0
    block_tokens: int = 512

    def run(self, route: RouteView) -> None:
        rows = route.pending()
        if rows.size == 0:
            return
        prefill_per_us, decode_us, per_running_us = self.rates()
        queued_tokens = route.fleet_col("queued_tokens") if route.has_fleet_col("queued_tokens") else \
            route.fleet_col("queued") * int(route.arrival_col("prompt").mean())
        miss = slo_miss_kernel(route.arrival_col("prompt")[rows], np.ascontiguousarray(route.prefix_hits()[rows]),
                               np.asarray(queued_tokens, np.int64), route.fleet_col("running"),
                               route.fleet_col("role"), route.arrival_col("ttft_slo_ms")[rows],
                               route.arrival_col("tbt_slo_ms")[rows], float(self.slack), self.block_tokens,
                               prefill_per_us, decode_us, per_running_us, int(Role.PREFILL), int(Role.DECODE))
        route.reject(rows[miss], Why.SLO)
