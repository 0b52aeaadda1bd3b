"""pd-disaggregate: a prefill and a decode instance per request, and the KV transfer between them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba as nb
import numpy as np

from schedir.dialects.codes import Role, Why
from schedir.ir.route_step import RouteView
from schedir.lowering import route_state as rs
from schedir.passes.route_kernels import LinkOptions, cache_aware_kernel, one_move_us

_DISAGGREGATED = int(Why.DISAGGREGATED)


@nb.njit(cache=True)
def pd_disaggregate_lowered(F, A, P, S, o) -> None:  # noqa: ANN001
    """`PdDisaggregate.run` inside the routing program; `o` = `link_options`, then hit-threshold,
    overload-ratio, overload-slack."""
    rows = rs.pending(S)
    if rows.size == 0:
        return
    prefill_ok = rs.role_is(F, rs.ROLE_PREFILL)
    decode_ok = rs.role_is(F, rs.ROLE_DECODE)
    if not prefill_ok.any() or not decode_ok.any():
        return
    hits = S[2][rows]
    prompt = A[rs.A_PROMPT][rows]
    load = rs.load(F, S)
    pre, _ = cache_aware_kernel(hits, prompt, load, prefill_ok, int(o[0]), o[7], o[8], o[9])
    position = F[rs.F_POSITION]
    dec = np.empty(rows.size, dtype=np.int64)
    dload = load.copy()
    hit = np.empty(rows.size, dtype=np.int64)
    for k in range(rows.size):  # the least loaded decode instance, the prefill's position among equals
        best, best_score = -1, 0
        for j in range(dload.size):
            if decode_ok[j]:
                score = 2 * dload[j] + (1 if position[j] != position[pre[k]] else 0)
                if best < 0 or score < best_score:
                    best, best_score = j, score
        dec[k] = best
        dload[best] += 1
        hit[k] = hits[k, pre[k]]
    routed = rs.route(F, A, S, rows, pre, np.full(rows.size, _DISAGGREGATED, np.int64), dec, hit)
    nbytes = prompt * int(o[1])
    latency = np.empty(rows.size, dtype=np.int64)
    for k in range(rows.size):
        latency[k] = np.int64(np.ceil(one_move_us(position[pre[k]], position[dec[k]], nbytes[k], o[2], o[3], o[4],
                                                 o[5])))
    fleet_ids = F[rs.F_ID]
    rs.transfer(S, routed, A[rs.A_ID][rows], fleet_ids[pre], fleet_ids[dec], nbytes, latency)


@dataclass(frozen=True)
class PdDisaggregate(LinkOptions):
    """Pick a prefill instance and a decode instance per request; account the KV transfer.

    DistServe / Mooncake's disaggregation: the prefill instance is chosen by Mooncake's
    cache-aware rule among `prefill` instances (longest cached prefix above `hit-threshold`
    unless overloaded, else the least loaded), the decode instance is the least loaded
    `decode` instance, preferring the prefill instance's position (no network hop) among
    equally loaded ones. The request's whole prompt KV moves from one to the other: a
    `cluster.transfer` with its bytes and the link model's latency. Requests stay pending when
    the fleet has no prefill or no decode instance."""

    name: ClassVar[str] = "pd-disaggregate"
    provides: ClassVar[frozenset[str]] = frozenset({"routed", "kv-transfers"})

    hit_threshold: float = 0.25
    overload_ratio: float = 1.5
    overload_slack: float = 8.0

    lowered = staticmethod(pd_disaggregate_lowered)

    def lowered_options(self) -> tuple[float, ...]:
        return (*self.link_options(), self.hit_threshold, self.overload_ratio, self.overload_slack)

    def run(self, route: RouteView) -> None:
        rows = route.pending()
        if rows.size == 0:
            return
        role = route.fleet_col("role")
        prefill_ok = role == int(Role.PREFILL)
        decode_ok = role == int(Role.DECODE)
        if not prefill_ok.any() or not decode_ok.any():
            return
        hits = np.ascontiguousarray(route.prefix_hits()[rows])
        prompt = route.arrival_col("prompt")[rows]
        load = route.load()
        pre, _ = cache_aware_kernel(hits, prompt, load, prefill_ok, self.block_tokens, self.hit_threshold,
                                    self.overload_ratio, self.overload_slack)
        position = route.fleet_col("position")
        # decode load in units of 1/2 a request, the position tie-break in between: the same
        # position wins among equally loaded decode instances only
        dec = np.empty(rows.size, dtype=np.int64)
        dload = load.copy()
        for k in range(rows.size):  # a few decode candidates: a vector step per request
            score = np.where(decode_ok, 2 * dload + (position != position[pre[k]]), np.iinfo(np.int64).max)
            dec[k] = int(np.argmin(score))
            dload[dec[k]] += 1
        routed = route.route(rows, pre, Why.DISAGGREGATED, decode=dec, hit_blocks=hits[np.arange(rows.size), pre])
        ids = route.arrival_col("id")[rows]
        fleet_ids = route.fleet_col("id")
        nbytes = prompt * self.kv_bytes_per_token
        latency = np.ceil(self.move_us(position[pre], position[dec], nbytes)).astype(np.int64)
        route.transfer(routed, ids, fleet_ids[pre], fleet_ids[dec], nbytes.astype(np.int64), latency)  # type: ignore


