"""slo-early-reject: refuse now the requests the fleet cannot serve within their SLO."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba as nb
import numpy as np

from schedir.dialects.codes import Role, Why
from schedir.ir.route_step import RouteView
from schedir.lowering import route_state as rs
from schedir.passes.route_kernels import CostOptions, slo_miss_kernel

_SLO, _PREFILL, _DECODE = int(Why.SLO), int(Role.PREFILL), int(Role.DECODE)


@nb.njit(cache=True)
def slo_early_reject_lowered(F, A, P, S, o) -> None:  # noqa: ANN001
    """`SloEarlyReject.run` inside the routing program (the fleet's `queued_tokens`); `o` = (slack,
    block tokens, the cost model's rates)."""
    rows = rs.pending(S)
    if rows.size == 0:
        return
    miss = slo_miss_kernel(A[rs.A_PROMPT][rows], S[2][rows], F[rs.F_QUEUED_TOKENS], F[rs.F_RUNNING], F[rs.F_ROLE],
                           A[rs.A_TTFT][rows], A[rs.A_TBT][rows], o[0], int(o[1]), o[2], o[3], o[4], _PREFILL,
                           _DECODE)
    rs.reject(A, S, rows[miss], _SLO)


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

    lowered = staticmethod(slo_early_reject_lowered)

    def lowered_options(self) -> tuple[float, ...]:
        return (float(self.slack), self.block_tokens, *self.rates())

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
