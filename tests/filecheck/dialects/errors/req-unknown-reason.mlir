// RUN: not schedir opt %s 2>&1 | filecheck %s
// An unknown reason keyword (a parse error).

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %w = req.queue waiting {id = [3, 4], prompt = [40, 50], computed = [0, 0], total = [40, 50], max_tokens = [8, 8], priority = [1, 0], arrival = [7, 8], status = [waiting, waiting], blocks = [0, 0]}
  req.defer %w {id = [3], reason = [bogus]}
}

// CHECK: schedir: error: {{.*}}req-unknown-reason.mlir:6:{{(37|42)}}
// CHECK: unknown reason 'bogus' (expected one of: budget, max_seqs, memory, blocked, policy, in_flight, too_long, exceeds_cache, slo)
// CHECK-NOT: Traceback
