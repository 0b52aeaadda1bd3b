"""slo-early-reject: refuse now the requests the fleet cannot serve within their SLO."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba as nb
import numpy as np

from schedir.dialects.codes import Role, Why
from schedir.ir.route_step import RouteView
from schedir.lowering import route_state as rs
from schedir.passes.route_kernels import CostOptions, best_tbt_ms, best_ttft_ms, slo_miss_kernel, slo_missed

_SLO, _PREFILL, _DECODE = int(Why.SLO), int(Role.PREFILL), int(Role.DECODE)


@nb.njit(cache=True)
def slo_early_reject_lowered(F, A, P, S, o) -> None:  # noqa: ANN001
    """`SloEarlyReject.run` inside the routing program (the fleet's `queued_tokens`); `o` = (slack,
    block tokens, the cost model's rates)."""
    decided, hits = S[0], S[2]
    tbt = best_tbt_ms(F[rs.F_RUNNING], F[rs.F_ROLE], o[3], o[4], _PREFILL)
    miss = np.empty(decided.size, dtype=np.int64)
    n = 0
    for i in range(decided.size):  # the pending rows, tested in place (`slo_miss_kernel`, row by row)
        if decided[i]:
            continue
        ttft = best_ttft_ms(A[rs.A_PROMPT][i], hits, i, F[rs.F_QUEUED_TOKENS], F[rs.F_ROLE], int(o[1]), o[2],
                            _DECODE)
        if slo_missed(ttft, tbt, A[rs.A_TTFT][i], A[rs.A_TBT][i], o[0]):
            miss[n] = i
            n += 1
    rs.reject(A, S, miss[:n], _SLO)


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
