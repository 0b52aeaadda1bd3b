// RUN: not schedir opt %s 2>&1 | filecheck %s
// An unknown status code.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %w = req.queue waiting {id = [3], prompt = [40], computed = [0], total = [40], max_tokens = [8], priority = [1], arrival = [7], status = [7], blocks = [0]}
}

// CHECK: schedir: error: {{.*}}req-unknown-status-code.mlir:5:3: req.queue waiting: unknown status for request(s) [3]
// CHECK-NOT: Traceback
