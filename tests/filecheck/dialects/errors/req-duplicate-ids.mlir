// RUN: not schedir opt %s 2>&1 | filecheck %s
// A request id listed twice in a queue.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %w = req.queue waiting {id = [3, 3], prompt = [40, 50], computed = [0, 0], total = [40, 50], max_tokens = [8, 8], priority = [1, 0], arrival = [7, 8], status = [waiting, waiting], blocks = [0, 0]}
}

// CHECK: schedir: error: {{.*}}req-duplicate-ids.mlir:5:3: req.queue: request id(s) [3] appear more than once
// CHECK-NOT: Traceback
