// RUN: not schedir opt %s 2>&1 | filecheck %s
// A syntax error: a missing '=' after a column name.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %w = req.queue waiting {id [3], prompt = [40], computed = [0], total = [40], max_tokens = [8], priority = [1], arrival = [7], status = [waiting], blocks = [0]}
}

// CHECK: schedir: error: {{.*}}syntax-error.mlir:5:30
// CHECK: after column name 'id'
// CHECK-NOT: Traceback
