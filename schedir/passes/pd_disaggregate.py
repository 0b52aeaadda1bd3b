"""pd-disaggregate: a prefill and a decode instance per request, and the KV transfer between them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from schedir.dialects.codes import Role, Why
from schedir.ir.route_step import RouteView
from schedir.passes.route_kernels import LinkOptions, cache_aware_kernel


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


