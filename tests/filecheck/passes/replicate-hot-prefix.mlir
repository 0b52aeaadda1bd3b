// RUN: schedir opt %s -p replicate-hot-prefix,route-cache-aware | filecheck %s
// RUN: schedir opt %s -p "replicate-hot-prefix{min-requests=4},route-cache-aware" | filecheck %s --check-prefix=COLD

// Three arrivals share the chain 11,12; only instance 0 holds it, and instance 0 is
// overloaded (load 30 > 1.5 x 0 + 8). The chain is copied from it to the least loaded
// instance (2: 2 blocks x 512 tokens x 128 KiB = 128 MiB), and the routing pass that follows
// sends the requests to the replica for their cache. Requiring 4 sharers, the chain is
// not hot: no copy, and the requests go by load.
cluster.route_step 1 {now_us = 0, facts = []} {
  %fleet = cluster.fleet {id = [0, 1, 2], role = [both, both, both], queued = [10, 5, 0], running = [20, 5, 0], free_blocks = [10, 10, 10], total_blocks = [10, 10, 10], position = [0, 1, 0]}
  %req = cluster.arrivals {id = [70, 71, 72], prompt = [1100, 1100, 1100], output = [8, 8, 8], ttft_slo_ms = [0, 0, 0], tbt_slo_ms = [0, 0, 0]}
  cluster.digest %fleet {id = [0, 0], hash = [11, 12]}
  cluster.prefix %req {id = [70, 70, 70, 71, 71, 71, 72, 72, 72], hash = [11, 12, 13, 11, 12, 14, 11, 12, 15]}
}

// CHECK:      cluster.route_step 1 {now_us = 0, facts = ["hot-prefix", "routed"]}
// CHECK:      cluster.replicate %fleet {hash = [12], src = [0], dst = [2], bytes = [134217728], benefit_us = [{{[0-9]+}}]}
// CHECK-NEXT: cluster.route %req {id = [70, 71, 72], instance = [2, 2, 2], decode = [2, 2, 2], hit_blocks = [2, 2, 2], why = [cache, cache, cache]}

// COLD-NOT:   cluster.replicate
// COLD:       cluster.route %req {id = [70, 71, 72], instance = [2, 2, 2], decode = [2, 2, 2], hit_blocks = [0, 0, 0], why = [least_load, least_load, least_load]}
