// RUN: schedir opt %s -p route-least-load | filecheck %s
// RUN: schedir opt %s -p least-load | filecheck %s

// route-least-load places requests in arrival order on the instance with the fewest
// requests queued + running, each adding one to its instance's load: loads 5, 1, 2 ->
// 30 to 1 (load 2), 31 to 1 or 2 (tie: the first, 1 -> 3), 32 to 2 (load 3), 33 to 1.
cluster.route_step 1 {now_us = 0, facts = []} {
  %fleet = cluster.fleet {id = [0, 1, 2], role = [both, both, both], queued = [2, 0, 1], running = [3, 1, 1], free_blocks = [10, 10, 10], total_blocks = [10, 10, 10], position = [0, 0, 0]}
  %req = cluster.arrivals {id = [30, 31, 32, 33], prompt = [100, 100, 100, 100], output = [8, 8, 8, 8], ttft_slo_ms = [0, 0, 0, 0], tbt_slo_ms = [0, 0, 0, 0]}
}

// CHECK: cluster.route %req {id = [30, 31, 32, 33], instance = [1, 1, 2, 1], decode = [1, 1, 2, 1], hit_blocks = [0, 0, 0, 0], why = [least_load, least_load, least_load, least_load]}
