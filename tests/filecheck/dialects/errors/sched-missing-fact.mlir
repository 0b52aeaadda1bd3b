// RUN: not schedir opt %s 2>&1 | filecheck %s
// A step without its token budget.

sched.step 0 {max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024} {
}

// CHECK: schedir: error: {{.*}}sched-missing-fact.mlir:{{(4:1|4:129)}}
// CHECK: sched.step is missing fact(s): token_budget
// CHECK-NOT: Traceback
