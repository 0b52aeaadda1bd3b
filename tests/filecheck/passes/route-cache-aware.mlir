// RUN: schedir opt %s -p route-cache-aware | filecheck %s
// RUN: schedir opt %s -p "route-cache-aware{hit-threshold=0.9}" | filecheck %s --check-prefix=STRICT
// RUN: schedir opt %s -p "route-cache-aware{overload-slack=0.0 overload-ratio=1.0}" | filecheck %s --check-prefix=LOADED

// Mooncake's rule: 40's chain 11,12,13 is cached on instance 2 up to 12 (2 of 3 blocks of
// 512 tokens: ratio 0.67 >= 0.25), so it goes there; 41's chain starts with 99, which
// nobody holds, so it goes to the least loaded instance (1). With a 0.9 threshold the hit
// is too small: least load. With no overload slack, instance 2 (load 4 > 1.0 x 1) is
// overloaded: least load too.
cluster.route_step 1 {now_us = 0, facts = []} {
  %fleet = cluster.fleet {id = [0, 1, 2], role = [both, both, both], queued = [2, 0, 1], running = [3, 1, 3], free_blocks = [10, 10, 10], total_blocks = [10, 10, 10], position = [0, 0, 0]}
  %req = cluster.arrivals {id = [40, 41], prompt = [1536, 1024], output = [8, 8], ttft_slo_ms = [0, 0], tbt_slo_ms = [0, 0]}
  cluster.digest %fleet {id = [0, 2, 2, 2], hash = [11, 11, 12, 77]}
  cluster.prefix %req {id = [40, 40, 40, 41, 41], hash = [11, 12, 13, 99, 11]}
}

// CHECK:   cluster.route %req {id = [40, 41], instance = [2, 1], decode = [2, 1], hit_blocks = [2, 0], why = [cache, least_load]}
// STRICT:  cluster.route %req {id = [40, 41], instance = [1, 1], decode = [1, 1], hit_blocks = [0, 0], why = [least_load, least_load]}
// LOADED:  cluster.route %req {id = [40, 41], instance = [1, 1], decode = [1, 1], hit_blocks = [0, 0], why = [least_load, least_load]}
