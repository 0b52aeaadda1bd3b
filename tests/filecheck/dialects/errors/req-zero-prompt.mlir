// RUN: not schedir opt %s 2>&1 | filecheck %s
// A queue with an empty prompt.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %w = req.queue waiting {id = [3], prompt = [0], computed = [0], total = [0], max_tokens = [8], priority = [1], arrival = [7], status = [waiting], blocks = [0]}
}

// CHECK: schedir: error: {{.*}}req-zero-prompt.mlir:5:3: req.queue: column 'prompt' must be positive; request(s) [3]
// CHECK-NOT: Traceback
