// RUN: schedir opt %s -p slo-early-reject,route-least-load | filecheck %s
// RUN: schedir opt %s -p "slo-early-reject{slack=100.0},route-least-load" | filecheck %s --check-prefix=LAX

// Every instance has 400k prefill tokens queued (seconds of work on an H100 with
// Llama-3-8B): 90 (TTFT SLO 1 s) cannot make it anywhere and is refused with reason slo;
// 91 has no TTFT target and 92's 60 s target is met, so both are routed. With a slack of
// 100 x the SLO nothing is refused.
cluster.route_step 1 {now_us = 0, facts = []} {
  %fleet = cluster.fleet {id = [0, 1], role = [both, both], queued = [40, 40], running = [8, 8], free_blocks = [10, 10], total_blocks = [10, 10], position = [0, 0], queued_tokens = [400000, 400000]}
  %req = cluster.arrivals {id = [90, 91, 92], prompt = [2000, 2000, 2000], output = [8, 8, 8], ttft_slo_ms = [1000, 0, 60000], tbt_slo_ms = [100, 0, 100]}
}

// CHECK:      cluster.route_step 1 {now_us = 0, facts = ["routed", "slo-checked"]}
// CHECK:      cluster.reject %req {id = [90], why = [slo]}
// CHECK-NEXT: cluster.route %req {id = [91, 92], instance = [0, 1], decode = [0, 1], hit_blocks = [0, 0], why = [least_load, least_load]}

// LAX-NOT:    cluster.reject
// LAX:        cluster.route %req {id = [90, 91, 92]
