// RUN: schedir opt %s -p route-least-load,topology-distance | filecheck %s
// RUN: schedir opt %s -p "route-least-load,topology-distance{intra-gbs=0.001 inter-gbs=0.001}" | filecheck %s --check-prefix=SLOW
// RUN: not schedir opt %s -p topology-distance 2>&1 | filecheck %s --check-prefix=ORDER

// 60 goes to the least loaded instance 1, which holds none of its chain 11,12,13,14.
// Instances 0 (position 1) and 2 (position 0, like 1) both hold all four blocks: the
// nearer one, 2, is the source. Moving 4 x 512 tokens of KV (268 MB) over the fast link
// costs ~2.7 ms, recomputing them ~100 ms: a cluster.replicate of the chain ending at 14.
// Over a link of 1 MB/s it is not worth it: nothing moves. Without a routing pass before
// it, the pipeline is refused.
cluster.route_step 1 {now_us = 0, facts = []} {
  %fleet = cluster.fleet {id = [0, 1, 2], role = [both, both, both], queued = [9, 0, 9], running = [9, 0, 9], free_blocks = [10, 10, 10], total_blocks = [10, 10, 10], position = [1, 0, 0]}
  %req = cluster.arrivals {id = [60], prompt = [2048], output = [8], ttft_slo_ms = [0], tbt_slo_ms = [0]}
  cluster.digest %fleet {id = [0, 0, 0, 0, 2, 2, 2, 2], hash = [11, 12, 13, 14, 11, 12, 13, 14]}
  cluster.prefix %req {id = [60, 60, 60, 60], hash = [11, 12, 13, 14]}
}

// CHECK:      cluster.route_step 1 {now_us = 0, facts = ["kv-moves", "routed"]}
// CHECK:      cluster.route %req {id = [60], instance = [1], decode = [1], hit_blocks = [0], why = [least_load]}
// CHECK-NEXT: cluster.replicate %fleet {hash = [14], src = [2], dst = [1], bytes = [268435456], benefit_us = [{{[0-9]+}}]}
// CHECK-NEXT: cluster.yield

// SLOW:      cluster.route %req
// SLOW-NOT:  cluster.replicate
// SLOW:      cluster.yield

// ORDER: pass 'topology-distance' (#1) requires 'routed', which no earlier pass provides
