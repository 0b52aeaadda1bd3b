// RUN: schedir opt %s -p route-cache-balance | filecheck %s
// RUN: schedir opt %s -p sglang-router | filecheck %s
// RUN: schedir opt %s -p "route-cache-balance{balance-abs-threshold=2.0 balance-rel-threshold=1.2}" | filecheck %s --check-prefix=IMBALANCED

// The SGLang router's rule. Balanced (loads 5, 1, 4 differ by less than 64): 50's match on
// instance 2 (2 of 3 blocks, rate 0.67 > 0.3) wins; 51 matches nothing, so it goes to the
// instance with the smallest tree (0 and 1 hold no prefix blocks; 1 is less loaded). With thresholds 2 and 1.2
// the fleet is imbalanced (5 - 1 > 2, 5 > 1.2 x 1): shortest queue for both.
cluster.route_step 1 {now_us = 0, facts = []} {
  %fleet = cluster.fleet {id = [0, 1, 2], role = [both, both, both], queued = [2, 0, 1], running = [3, 1, 3], free_blocks = [90, 10, 10], total_blocks = [100, 100, 100], position = [0, 0, 0]}
  %req = cluster.arrivals {id = [50, 51], prompt = [1536, 1024], output = [8, 8], ttft_slo_ms = [0, 0], tbt_slo_ms = [0, 0]}
  cluster.digest %fleet {id = [2, 2], hash = [11, 12]}
  cluster.prefix %req {id = [50, 50, 50, 51, 51], hash = [11, 12, 13, 98, 99]}
}

// CHECK:      cluster.route %req {id = [50, 51], instance = [2, 1], decode = [2, 1], hit_blocks = [2, 0], why = [cache, least_load]}
// IMBALANCED: cluster.route %req {id = [50, 51], instance = [1, 1], decode = [1, 1], hit_blocks = [0, 0], why = [least_load, least_load]}
