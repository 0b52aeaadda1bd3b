// RUN: not schedir opt %s 2>&1 | filecheck %s
// A prefix migrated to the instance it is on.

cluster.route_step 1 {now_us = 0, facts = []} {
  %fleet = cluster.fleet {id = [0, 1], role = [both, both], queued = [0, 0], running = [0, 0], free_blocks = [10, 10], total_blocks = [10, 10], position = [0, 1]}
  cluster.migrate %fleet {hash = [3], src = [1], dst = [1], bytes = [64], benefit_us = [1]}
}

// CHECK: schedir: error: {{.*}}cluster-migrate-same.mlir:6:3: cluster.migrate: a prefix cannot move to the instance it is on (instance 1)
// CHECK-NOT: Traceback
