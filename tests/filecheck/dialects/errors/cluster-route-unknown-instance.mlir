// RUN: not schedir opt %s 2>&1 | filecheck %s
// A route to an instance that is not in the fleet.

cluster.route_step 1 {now_us = 0, facts = []} {
  %fleet = cluster.fleet {id = [0, 1], role = [both, both], queued = [0, 0], running = [0, 0], free_blocks = [10, 10], total_blocks = [10, 10], position = [0, 1]}
  %req = cluster.arrivals {id = [5, 6], prompt = [10, 20], output = [4, 4], ttft_slo_ms = [0, 0], tbt_slo_ms = [0, 0]}
  %r = cluster.route %req {id = [5], instance = [7], decode = [7], hit_blocks = [0], why = [least_load]}
}

// CHECK: schedir: error: {{.*}}cluster-route-unknown-instance.mlir:7:3: cluster.route: column 'instance' names instance(s) [7] that are not in the fleet
// CHECK-NOT: Traceback
