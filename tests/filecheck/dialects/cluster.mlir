// RUN: schedir opt %s | schedir opt - | filecheck %s
// RUN: schedir opt %s --generic | schedir opt - | filecheck %s

// Every op of the cluster dialect, in its custom syntax: a routing step over a fleet of
// four instances (one prefill-only, one decode-only), three arrivals with their prefix
// block hashes; request 17 goes where its prefix is cached, 19 is disaggregated (prefill
// on 2, decode on 3, its KV transferred), 18 is refused for its SLO; a hot prefix is
// migrated and another replicated.

cluster.route_step 7 {now_us = 1000, facts = ["digest"]} {
  %fleet = cluster.fleet {id = [0, 1, 2, 3], role = [both, both, prefill, decode], queued = [3, 0, 5, 1], running = [10, 2, 0, 20], free_blocks = [100, 900, 50, 10], total_blocks = [1000, 1000, 1000, 1000], position = [0, 0, 1, 1]}
  %req = cluster.arrivals {id = [17, 18, 19], prompt = [2048, 512, 4096], output = [128, 64, 256], ttft_slo_ms = [2000, 100, 0], tbt_slo_ms = [100, 100, 0]}
  cluster.digest %fleet {id = [0, 0, 1], hash = [11, 12, 11]}
  cluster.prefix %req {id = [17, 17, 19], hash = [11, 12, 40]}
  %r = cluster.route %req {id = [17, 19], instance = [0, 2], decode = [0, 3], hit_blocks = [2, 0], why = [cache, disaggregated]}
  cluster.reject %req {id = [18], why = [slo]}
  cluster.transfer %r {id = [19], src = [2], dst = [3], bytes = [4194304], latency_us = [300]}
  cluster.migrate %fleet {hash = [11], src = [0], dst = [2], bytes = [65536], benefit_us = [900]}
  cluster.replicate %fleet {hash = [12], src = [0], dst = [1], bytes = [65536], benefit_us = [400]} attributes {note = "hot"}
  cluster.yield %r
}

// CHECK:      cluster.route_step 7 {now_us = 1000, facts = ["digest"]} {
// CHECK-NEXT:   %fleet = cluster.fleet {id = [0, 1, 2, 3], role = [both, both, prefill, decode], queued = [3, 0, 5, 1], running = [10, 2, 0, 20], free_blocks = [100, 900, 50, 10], total_blocks = [1000, 1000, 1000, 1000], position = [0, 0, 1, 1]}
// CHECK-NEXT:   %req = cluster.arrivals {id = [17, 18, 19], prompt = [2048, 512, 4096], output = [128, 64, 256], ttft_slo_ms = [2000, 100, 0], tbt_slo_ms = [100, 100, 0]}
// CHECK-NEXT:   cluster.digest %fleet {id = [0, 0, 1], hash = [11, 12, 11]}
// CHECK-NEXT:   cluster.prefix %req {id = [17, 17, 19], hash = [11, 12, 40]}
// CHECK-NEXT:   %r = cluster.route %req {id = [17, 19], instance = [0, 2], decode = [0, 3], hit_blocks = [2, 0], why = [cache, disaggregated]}
// CHECK-NEXT:   cluster.reject %req {id = [18], why = [slo]}
// CHECK-NEXT:   cluster.transfer %r {id = [19], src = [2], dst = [3], bytes = [4194304], latency_us = [300]}
// CHECK-NEXT:   cluster.migrate %fleet {hash = [11], src = [0], dst = [2], bytes = [65536], benefit_us = [900]}
// CHECK-NEXT:   cluster.replicate %fleet {hash = [12], src = [0], dst = [1], bytes = [65536], benefit_us = [400]} attributes {note = "hot"}
// CHECK-NEXT:   cluster.yield %r
// CHECK-NEXT: }
