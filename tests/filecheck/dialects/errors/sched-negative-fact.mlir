// RUN: not schedir opt %s 2>&1 | filecheck %s
// A negative fact.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = -1, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024} {
}

// CHECK: schedir: error: {{.*}}sched-negative-fact.mlir:4:1: sched.step: free_blocks = -1 is negative
// CHECK-NOT: Traceback
