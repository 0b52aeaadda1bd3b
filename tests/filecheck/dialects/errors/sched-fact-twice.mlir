// RUN: not schedir opt %s 2>&1 | filecheck %s
// A step fact given twice.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 0, total_blocks = 20, max_model_len = 1024, max_seqs = 8} {
}

// CHECK: schedir: error: {{.*}}sched-fact-twice.mlir:4:{{(148|157)}}
// CHECK: step fact 'max_seqs' given twice
// CHECK-NOT: Traceback
