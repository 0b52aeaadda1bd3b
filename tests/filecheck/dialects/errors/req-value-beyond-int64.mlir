// RUN: not schedir opt %s 2>&1 | filecheck %s
// A column value that does not fit in int64.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  %run = req.queue running {id = [9223372036854775808], prompt = [10], computed = [12], total = [13], max_tokens = [32], priority = [0], arrival = [5], status = [running], blocks = [1]}
}

// CHECK: schedir: error: {{.*}}req-value-beyond-int64.mlir:5:35
// CHECK-NOT: Traceback
// CHECK: value 9223372036854775808 in column 'id' does not fit in int64
