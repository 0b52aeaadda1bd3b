// RUN: not schedir opt %s 2>&1 | filecheck %s
// A rejection with a deferral reason.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %w = req.queue waiting {id = [3, 4], prompt = [40, 50], computed = [0, 0], total = [40, 50], max_tokens = [8, 8], priority = [1, 0], arrival = [7, 8], status = [waiting, waiting], blocks = [0, 0]}
  req.reject %w {id = [3], reason = [memory]}
}

// CHECK: schedir: error: {{.*}}req-reject-deferral-reason.mlir:6:3: req.reject: request 3 has reason 'memory', not a rejection reason (exceeds_cache, slo, too_long)
// CHECK-NOT: Traceback
