// RUN: not schedir opt %s 2>&1 | filecheck %s
// More cached-free blocks than free blocks.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 11, total_blocks = 20, max_model_len = 1024} {
}

// CHECK: schedir: error: {{.*}}sched-cached-gt-free.mlir:4:1: sched.step: cached_free_blocks = 11 exceeds free_blocks = 10
// CHECK-NOT: Traceback
