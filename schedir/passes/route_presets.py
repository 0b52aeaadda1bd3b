"""Named routing pipelines over `cluster.route_step` (merged into `PRESETS`)."""

from __future__ import annotations

ROUTER_PRESETS: dict[str, str] = {
    # each request to the next instance in turn
    "round-robin": "route-round-robin",
    # each request to the instance with the fewest requests queued and running
    "least-load": "route-least-load",
    # Mooncake's Conductor (FAST '25): early rejection against the SLO, hot-prefix replication,
    # the longest cached prefix unless overloaded, then a longer prefix pulled over the link
    # when moving it beats recomputing it
    "mooncake": "slo-early-reject,replicate-hot-prefix,route-cache-aware,topology-distance",
    # the same with prefill and decode on separate instances and the KV transferred
    "mooncake-pd": "slo-early-reject,pd-disaggregate",
    # the SGLang router's cache_aware policy: prefix match while balanced, shortest queue when not
    "sglang-router": "route-cache-balance",
}
