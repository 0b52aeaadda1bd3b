// RUN: not schedir opt %s 2>&1 | filecheck %s
// More free blocks than the pool holds.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 30, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024} {
}

// CHECK: schedir: error: {{.*}}sched-free-gt-total.mlir:4:1: sched.step: free_blocks = 30 exceeds total_blocks = 20
// CHECK-NOT: Traceback
