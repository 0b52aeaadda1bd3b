// RUN: not schedir opt %s 2>&1 | filecheck %s
// A request both routed and rejected.

cluster.route_step 1 {now_us = 0, facts = []} {
  %fleet = cluster.fleet {id = [0, 1], role = [both, both], queued = [0, 0], running = [0, 0], free_blocks = [10, 10], total_blocks = [10, 10], position = [0, 1]}
  %req = cluster.arrivals {id = [5, 6], prompt = [10, 20], output = [4, 4], ttft_slo_ms = [0, 0], tbt_slo_ms = [0, 0]}
  %r = cluster.route %req {id = [5], instance = [0], decode = [0], hit_blocks = [0], why = [round_robin]}
  cluster.reject %req {id = [5], why = [overloaded]}
}

// CHECK: schedir: error: {{.*}}cluster-decided-twice.mlir:4:1: cluster.route_step: request(s) [5] are decided more than once (routed or rejected)
// CHECK-NOT: Traceback
