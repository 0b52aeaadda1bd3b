// RUN: schedir opt %s -p mooncake | filecheck %s
// RUN: schedir opt %s -p round-robin | filecheck %s --check-prefix=RR

// The mooncake preset on one step: 100's SLO cannot be met (refused), 101 goes where its
// prefix is cached (instance 1), 102 to the least loaded instance. Round robin instead
// spreads by id and ignores both the cache and the SLO.
cluster.route_step 5 {now_us = 250000, facts = []} {
  %fleet = cluster.fleet {id = [0, 1, 2], role = [both, both, both], queued = [1, 1, 0], running = [4, 4, 2], free_blocks = [100, 100, 100], total_blocks = [100, 100, 100], position = [0, 0, 1], queued_tokens = [4000, 4000, 0]}
  %req = cluster.arrivals {id = [100, 101, 102], prompt = [900000, 2048, 512], output = [8, 64, 64], ttft_slo_ms = [2000, 2000, 2000], tbt_slo_ms = [100, 100, 100]}
  cluster.digest %fleet {id = [1, 1, 1], hash = [5, 6, 7]}
  cluster.prefix %req {id = [101, 101, 101, 101, 102], hash = [5, 6, 7, 8, 9]}
}

// CHECK:      cluster.route_step 5 {now_us = 250000, facts = ["hot-prefix", "kv-moves", "routed", "slo-checked"]}
// CHECK:      cluster.reject %req {id = [100], why = [slo]}
// CHECK-NEXT: cluster.route %req {id = [101, 102], instance = [1, 2], decode = [1, 2], hit_blocks = [3, 0], why = [cache, least_load]}
// CHECK-NEXT: cluster.yield

// RR:         cluster.route %req {id = [100, 101, 102], instance = [1, 2, 0], decode = [1, 2, 0], hit_blocks = [0, 0, 0], why = [round_robin, round_robin, round_robin]}
