// RUN: not schedir opt %s 2>&1 | filecheck %s
// An op that no dialect defines.

sched.step 0 {token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 2, total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []} {
  req.frobnicate
}

// CHECK: schedir: error: {{.*}}syntax-unknown-op.mlir:{{(5:3|6:1)}}
// CHECK: Operation req.frobnicate is not registered
// CHECK-NOT: Traceback
