// RUN: not schedir opt %s 2>&1 | filecheck %s
// A queue whose total is shorter than its prompt.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %w = req.queue waiting {id = [3], prompt = [40], computed = [0], total = [39], max_tokens = [8], priority = [1], arrival = [7], status = [waiting], blocks = [0]}
}

// CHECK: schedir: error: {{.*}}req-total-lt-prompt.mlir:5:3: req.queue waiting: need prompt <= total and computed <= total + placeholders; request(s) [3]
// CHECK-NOT: Traceback
