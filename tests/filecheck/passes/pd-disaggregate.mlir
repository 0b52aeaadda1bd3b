// RUN: schedir opt %s -p pd-disaggregate | filecheck %s
// RUN: schedir opt %s -p mooncake-pd | filecheck %s

// Prefill instances 0 and 1, decode instances 2 (position 0) and 3 (position 1). 80 hits
// its chain on prefill instance 1 (cache); 81 hits nothing and goes to the least loaded
// prefill instance, 1 again (load 1 against 4). Decode: the least loaded decode instance,
// the prefill's position first among equals (80: 3, at 1's position; then 81: 2, less
// loaded). The whole prompt's KV moves (2048 tokens x 128 KiB = 256 MiB): 1 -> 3 over the
// local link (100 GB/s, 10 µs), 1 -> 2 across the network (25 GB/s, 50 µs).
cluster.route_step 1 {now_us = 0, facts = []} {
  %fleet = cluster.fleet {id = [0, 1, 2, 3], role = [prefill, prefill, decode, decode], queued = [4, 0, 0, 0], running = [0, 0, 3, 3], free_blocks = [10, 10, 10, 10], total_blocks = [10, 10, 10, 10], position = [0, 1, 0, 1]}
  %req = cluster.arrivals {id = [80, 81], prompt = [2048, 1024], output = [8, 8], ttft_slo_ms = [0, 0], tbt_slo_ms = [0, 0]}
  cluster.digest %fleet {id = [1, 1], hash = [11, 12]}
  cluster.prefix %req {id = [80, 80, 80, 80, 81, 81], hash = [11, 12, 13, 14, 21, 22]}
}

// CHECK:      %[[R:[0-9]+]] = cluster.route %req {id = [80, 81], instance = [1, 1], decode = [3, 2], hit_blocks = [2, 0], why = [disaggregated, disaggregated]}
// CHECK-NEXT: cluster.transfer %[[R]] {id = [80, 81], src = [1, 1], dst = [3, 2], bytes = [268435456, 134217728], latency_us = [2695, 5419]}
// CHECK-NEXT: cluster.yield %[[R]]
