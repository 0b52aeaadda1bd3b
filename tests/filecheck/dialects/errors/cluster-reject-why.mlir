// RUN: not schedir opt %s 2>&1 | filecheck %s
// A rejection whose reason is a routing reason.

cluster.route_step 1 {now_us = 0, facts = []} {
  %fleet = cluster.fleet {id = [0, 1], role = [both, both], queued = [0, 0], running = [0, 0], free_blocks = [10, 10], total_blocks = [10, 10], position = [0, 1]}
  %req = cluster.arrivals {id = [5, 6], prompt = [10, 20], output = [4, 4], ttft_slo_ms = [0, 0], tbt_slo_ms = [0, 0]}
  cluster.reject %req {id = [6], why = [cache]}
}

// CHECK: schedir: error: {{.*}}cluster-reject-why.mlir:7:3: cluster.reject: request 6 has why 'cache', expected one of no_instance, overloaded, slo
// CHECK-NOT: Traceback
