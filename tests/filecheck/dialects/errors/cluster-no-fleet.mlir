// RUN: not schedir opt %s 2>&1 | filecheck %s
// A routing step without a fleet.

cluster.route_step 1 {now_us = 0, facts = []} {
  %req = cluster.arrivals {id = [5, 6], prompt = [10, 20], output = [4, 4], ttft_slo_ms = [0, 0], tbt_slo_ms = [0, 0]}
}

// CHECK: schedir: error: {{.*}}cluster-no-fleet.mlir:4:1: cluster.route_step: needs exactly one cluster.fleet, found 0
// CHECK-NOT: Traceback
