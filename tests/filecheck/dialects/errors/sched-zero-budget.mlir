// RUN: not schedir opt %s 2>&1 | filecheck %s
// A zero token budget.

sched.step 0 {token_budget = 0, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024} {
}

// CHECK: schedir: error: {{.*}}sched-zero-budget.mlir:4:1: sched.step: token_budget must be positive
// CHECK-NOT: Traceback
