// RUN: schedir opt %s -p route-round-robin | filecheck %s
// RUN: schedir opt %s -p round-robin | filecheck %s

// route-round-robin sends request id mod n to the n-th instance serving whole requests
// (role both): the prefill-only instance 2 is skipped. Ids 20..24 over instances 0, 1, 3.
cluster.route_step 1 {now_us = 0, facts = []} {
  %fleet = cluster.fleet {id = [0, 1, 2, 3], role = [both, both, prefill, both], queued = [9, 0, 0, 0], running = [9, 0, 0, 0], free_blocks = [10, 10, 10, 10], total_blocks = [10, 10, 10, 10], position = [0, 0, 0, 0]}
  %req = cluster.arrivals {id = [20, 21, 22, 23, 24], prompt = [100, 100, 100, 100, 100], output = [8, 8, 8, 8, 8], ttft_slo_ms = [0, 0, 0, 0, 0], tbt_slo_ms = [0, 0, 0, 0, 0]}
}

// CHECK:      cluster.route_step 1 {now_us = 0, facts = ["routed"]}
// CHECK:      %{{.*}} = cluster.route %req {id = [20, 21, 22, 23, 24], instance = [3, 0, 1, 3, 0], decode = [3, 0, 1, 3, 0], hit_blocks = [0, 0, 0, 0, 0], why = [round_robin, round_robin, round_robin, round_robin, round_robin]}
// CHECK-NEXT: cluster.yield %{{.*}}
